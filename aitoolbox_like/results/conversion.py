"""Turning what result packages are given into numpy arrays, and their results into plain Python: tensors (without
importing torch), lists, numpy scalars; and the check that targets and predictions fit each other."""
from __future__ import annotations

import warnings
from typing import Any, Optional

import numpy as np


def is_torch_tensor(obj: object) -> bool:
    """True for a torch.Tensor, without importing torch."""
    cls = type(obj)
    return cls.__module__.split('.')[0] == 'torch' and hasattr(obj, 'detach') and hasattr(obj, 'cpu')


def _detached_cpu(tensor: Any) -> Any:
    """The tensor detached on the CPU, bfloat16 widened to float32 (numpy has no bfloat16)."""
    tensor = tensor.detach().cpu()
    if str(tensor.dtype) == 'torch.bfloat16':
        tensor = tensor.float()
    return tensor


def _tensor_to_numpy(tensor: Any) -> np.ndarray:
    return _detached_cpu(tensor).numpy()


def to_numpy(values: Any, name: str = 'y') -> np.ndarray:
    """Convert a list / tuple / numpy array / torch tensor (or a list of tensors) to a numpy array."""
    if isinstance(values, np.ndarray):
        return values
    if is_torch_tensor(values):
        return _tensor_to_numpy(values)
    if isinstance(values, (list, tuple)) and any(is_torch_tensor(el) for el in values):
        values = [_tensor_to_numpy(el) if is_torch_tensor(el) else el for el in values]
    try:
        return np.asarray(values)
    except ValueError as exc:
        raise ValueError(
            f'{name} could not be converted to a numpy array ({exc}). It is probably a list of '
            f'differently sized elements (e.g. per-batch outputs): concatenate them first '
            f'(np.concatenate / torch.cat) or create the package with np_array=False.'
        ) from exc


def auto_to_numpy(values: Any) -> Any:
    """np_array='auto': convert when the input forms a regular array, otherwise leave it as it is."""
    if isinstance(values, np.ndarray) or is_torch_tensor(values):
        return to_numpy(values)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            array = np.asarray(values)
    except ValueError:
        return values
    if array.dtype == object:
        return values
    return array


def to_python(value: Any) -> Any:
    """Turn numpy / torch scalars and arrays (possibly nested in dicts, lists, tuples) into plain Python."""
    if isinstance(value, dict):
        return {k: to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_python(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.item() if value.ndim == 0 else value.tolist()
    if is_torch_tensor(value):
        value = _detached_cpu(value)
        return value.item() if value.ndim == 0 else value.tolist()
    return value


def _num_samples(values: Any) -> Optional[int]:
    """Number of examples (length of the first axis) or None when it cannot be told."""
    shape = getattr(values, 'shape', None)
    if shape is not None:
        if len(shape) == 0:
            return None
        return int(shape[0])
    try:
        return len(values)
    except TypeError:
        return None


def check_targets_and_predictions(y_true: Any, y_predicted: Any) -> None:
    """Raise ValueError for missing, 0-d, empty or mismatched-length targets / predictions."""
    for name, values in (('y_true', y_true), ('y_predicted', y_predicted)):
        if values is None:
            raise ValueError(f'{name} is None: pass the ground-truth targets and the model predictions '
                             f'to prepare_result_package(y_true, y_predicted).')
        shape = getattr(values, 'shape', None)
        if shape is not None and len(shape) == 0:
            raise ValueError(f'{name} is a scalar: pass one value (or one row) per example, '
                             f'e.g. a 1-D array of length n_examples.')
    n_true, n_pred = _num_samples(y_true), _num_samples(y_predicted)
    if n_true == 0 or n_pred == 0:
        raise ValueError(f'y_true has {n_true} and y_predicted has {n_pred} examples: metrics need at least '
                         f'one example. Check that the evaluation data loader is not empty.')
    if n_true is not None and n_pred is not None and n_true != n_pred:
        raise ValueError(f'y_true has {n_true} examples but y_predicted has {n_pred}: pass one prediction per '
                         f'target (same first dimension), e.g. concatenate all batches of both.')


# ----------------------------------------------------------------------------------------------
# Result packages
