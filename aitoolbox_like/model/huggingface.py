"""Hugging Face transformers models on the TrainLoop: dict batches, a forward that returns its own loss.

A transformers model takes a batch as keywords (``model(**batch)``, the batch a dict of ``input_ids``,
``attention_mask``, ``labels``, ...) and returns a ``ModelOutput`` whose ``loss`` it computed from the ``labels``
and whose ``logits`` are its predictions. :class:`HFModelWrap` trains such a model in one line of set-up, with
``criterion=None``; :class:`HFFeedDefinition` is the feed definition it uses, for a ``ModelWrap`` of your own.

Nothing here imports transformers: the model is duck-typed (a forward taking keywords and returning an object or
dict with ``loss`` and ``logits``), so this module costs nothing to a user who does not train one, and any model
following that convention works the same way.

:func:`is_transformers_schedule` tells transformers' learning-rate schedules apart (they count optimizer updates, so
the scheduler callbacks refuse to step one per epoch).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.optim import lr_scheduler as torch_lr_scheduler

from .feeds import AbstractModelFeedDefinition, ModelWrap


def _describe(batch_data: Any) -> str:
    if isinstance(batch_data, (tuple, list)):
        return f'a {type(batch_data).__qualname__} of {len(batch_data)} elements'
    return f'a {type(batch_data).__qualname__}'


def _output_field(output: Any, key: str) -> Any:
    # A ModelOutput is a Mapping holding only the fields that are not None; a plain dict output works the same way.
    if isinstance(output, Mapping):
        return output.get(key)
    return getattr(output, key, None)


class HFFeedDefinition(AbstractModelFeedDefinition):
    """Feed a dict batch to a model as keywords and take its own loss: ``model(**batch).loss``.

    The batch is a dict of tensors (a ``BatchEncoding`` or any mapping), as a DataLoader over a data set of dicts
    gives it (its default collate, or a transformers data collator). Tensors are moved to the loop's device;
    other values are passed as they are.

    - Training and evaluation loss: with ``criterion=None`` (the usual case), the loss the model computed from
      the batch's ``labels`` (averaged when a multi-device wrapper returns one per device). With a criterion,
      the labels are kept out of the forward pass and the loss is ``criterion(logits, labels)`` (e.g. class
      weights, label smoothing of your own).
    - Predictions: ``(logits, labels, {})``: the model's ``logits`` (detached) and the batch's labels as they
      came (``None`` when the batch has none). Class logits are argmax-ed by the classification result packages.
    - ``get_loss_and_predictions`` gives both from one forward pass, for an evaluation that wants the loss and
      the predictions.

    Args:
        label_key (str): the batch's key of the labels (``'labels'``, as transformers' models name them).
        logits_key (str): the output's field of the predictions (``'logits'``).
    """

    def __init__(self, label_key: str = 'labels', logits_key: str = 'logits') -> None:
        self.label_key = label_key
        self.logits_key = logits_key

    # ---- the batch and the forward pass ----------------------------------------------------------------

    def _inputs(self, batch_data: Any, device: torch.device | str, drop_labels: bool) -> dict[str, Any]:
        if not isinstance(batch_data, Mapping):
            raise TypeError(f'HFFeedDefinition calls model(**batch), so a batch must be a dict of tensors (keys such '
                            f'as input_ids, attention_mask, {self.label_key}), but it is {_describe(batch_data)}: '
                            f'make the data set return dicts (DataLoader\'s default collate stacks them), or use '
                            f'TTBasicModel / MultiGPUModelWrap for (inputs..., target) batches')
        return {key: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
                for key, value in batch_data.items() if not (drop_labels and key == self.label_key)}

    def _labels(self, batch_data: Mapping[str, Any]) -> Any:
        labels = batch_data.get(self.label_key)
        return labels.detach() if isinstance(labels, torch.Tensor) else labels

    def _logits(self, output: Any) -> Any:
        logits = _output_field(output, self.logits_key)
        if logits is None:
            raise ValueError(f'HFFeedDefinition: the model\'s output ({type(output).__qualname__}) has no '
                             f'{self.logits_key!r}; pass HFFeedDefinition(logits_key=...) (or HFModelWrap(model, '
                             f'logits_key=...)) naming the field that holds its predictions')
        return logits

    def _loss(self, model: nn.Module, batch_data: Mapping[str, Any], output: Any, criterion: Any,
              device: torch.device | str) -> Any:
        if criterion is not None:
            labels = batch_data.get(self.label_key)
            if labels is None:
                raise ValueError(f'HFFeedDefinition: a criterion is given but the batch has no {self.label_key!r} '
                                 f'(it has {sorted(batch_data)}); pass HFFeedDefinition(label_key=...) or '
                                 f'criterion=None to use the loss the model computes')
            moved = labels.to(device, non_blocking=True) if isinstance(labels, torch.Tensor) else labels
            return criterion(self._logits(output), moved)
        if not isinstance(output, Mapping) and not hasattr(output, 'loss'):
            raise TypeError(f'HFFeedDefinition: the model\'s forward returned {type(output).__qualname__}, not a '
                            f'ModelOutput with a loss; a transformers model returns one (leave return_dict at its '
                            f'default); for another model pass a criterion, or use TTBasicModel')
        loss = _output_field(output, 'loss')
        if loss is None:
            raise ValueError(f'the model ({type(model).__qualname__}) returned no loss: it computes one only when the '
                             f'batch has its labels, and this batch has the keys {sorted(batch_data)}; put the '
                             f'labels under {self.label_key!r} (or pass HFFeedDefinition(label_key=...)), or pass '
                             f'the TrainLoop a criterion to compute the loss from the logits')
        # torch.nn.DataParallel gathers one loss per device.
        return loss.mean() if isinstance(loss, torch.Tensor) and loss.dim() > 0 else loss

    # ---- the feed definition -----------------------------------------------------------------------------

    def get_loss(self, model: nn.Module, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """The model's own loss, ``model(**batch).loss`` (or ``criterion(logits, labels)`` with a criterion)."""
        output = model(**self._inputs(batch_data, device, drop_labels=criterion is not None))
        return self._loss(model, batch_data, output, criterion, device)

    def get_predictions(self, model: nn.Module, batch_data: Any,
                        device: torch.device) -> tuple[Any, Any, dict[str, Any] | None]:
        """``(logits, labels, {})`` of one batch: the output's logits (detached) and the batch's labels."""
        output = model(**self._inputs(batch_data, device, drop_labels=False))
        return self._logits(output).detach(), self._labels(batch_data), {}

    def get_loss_and_predictions(self, model: nn.Module, batch_data: Any, criterion: Any,
                                 device: torch.device) -> tuple[Any, Any, Any, dict[str, Any] | None]:
        """``(loss, logits, labels, {})`` from one forward pass: what ``get_loss_eval`` and ``get_predictions``
        give, for an evaluation that wants both."""
        output = model(**self._inputs(batch_data, device, drop_labels=criterion is not None))
        loss = self._loss(model, batch_data, output, criterion, device)
        return loss, self._logits(output).detach(), self._labels(batch_data), {}

    def __repr__(self) -> str:
        return f'HFFeedDefinition(label_key={self.label_key!r}, logits_key={self.logits_key!r})'


class HFModelWrap(ModelWrap):
    """A transformers model (or any model called as ``model(**batch)`` that returns its loss and logits), ready
    for the TrainLoop: ``ModelWrap(model, HFFeedDefinition(label_key, logits_key))``.

    Train it with ``criterion=None``; the loop trains and saves ``model`` itself (its ``state_dict`` keys are the
    model's own, so ``model.save_pretrained`` and ``from_pretrained`` keep working).

    Args:
        model: the network, e.g. ``BertForSequenceClassification(config)``.
        label_key (str): the batch's key of the labels.
        logits_key (str): the output's field of the predictions.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
    """

    def __init__(self, model: nn.Module, label_key: str = 'labels', logits_key: str = 'logits') -> None:
        super().__init__(model, HFFeedDefinition(label_key=label_key, logits_key=logits_key))


def is_transformers_schedule(scheduler: Any) -> bool:
    """True for a learning-rate schedule made by transformers (``get_linear_schedule_with_warmup``, the other
    ``get_*_schedule*`` functions, ``get_scheduler``, ``AdafactorSchedule``): a ``LambdaLR`` whose factor
    functions are transformers' own. These count optimizer updates and must be stepped after every update
    (``LRSchedulerCallback(scheduler, interval='step')``)."""
    if not isinstance(scheduler, torch_lr_scheduler.LambdaLR):
        return False
    if type(scheduler).__module__.startswith('transformers.'):
        return True
    for factor in getattr(scheduler, 'lr_lambdas', ()):
        function = getattr(factor, 'func', factor)     # transformers binds its formulas with functools.partial
        if getattr(function, '__module__', None) and function.__module__.startswith('transformers.'):
            return True
    return False
