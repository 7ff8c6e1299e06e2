"""How per-batch predictions are collected into one result (the TrainLoop's collate/transform defaults)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch


def append_predictions(y_batch: Any, predictions: list[Any]) -> list[Any]:
    """Default ``collate_batch_pred_fn``: collect one batch's output into the list."""
    predictions.append(y_batch)
    return predictions


def append_concat_predictions(y_batch: Any, predictions: list[Any]) -> list[Any]:
    """Extend with a batch that is itself a list (e.g. variable-length outputs), else append."""
    if isinstance(y_batch, list):
        predictions += y_batch
    else:
        predictions.append(y_batch)
    return predictions


def torch_cat_transf(predictions: list[torch.Tensor]) -> torch.Tensor:
    """Default ``pred_transform_fn``: one tensor along the batch dimension."""
    return torch.cat(predictions)


def keep_list_transf(predictions: list[Any]) -> list[Any]:
    """``pred_transform_fn`` that returns the collected per-batch predictions unchanged."""
    return predictions


def combine_prediction_metadata_batches(metadata_list: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge per-batch metadata dicts into one dict: lists are concatenated, tensors and arrays joined
    along the first dimension."""
    combined: dict[str, Any] = {}
    for metadata in metadata_list:
        for key, value in metadata.items():
            combined.setdefault(key, []).append(value)
    for key, values in combined.items():
        first = values[0]
        if isinstance(first, torch.Tensor):
            combined[key] = torch.cat([v.reshape(1) if v.dim() == 0 else v for v in values])
        elif isinstance(first, np.ndarray):
            combined[key] = np.concatenate(values, axis=0)
        elif isinstance(first, (list, tuple)):
            combined[key] = [el for v in values for el in v]
        else:
            combined[key] = list(values)
    return combined


def batch_size_of(batch: Any) -> int:
    """Number of samples in a batch: the first dimension of its first tensor (1 if it has none)."""
    stack: list[Any] = [batch]
    while stack:
        item = stack.pop(0)
        if isinstance(item, torch.Tensor):
            return item.shape[0] if item.dim() > 0 else 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return 1
