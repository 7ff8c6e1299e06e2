"""BigDL Orca's validation metrics (``bigdl.orca.learn.metrics``) for its PyTorch estimator, with Orca's names and
Orca's arithmetic: ``Estimator.from_torch(metrics=[Accuracy()])`` or ``runner_for(loop).metrics = [...]``.

An Orca metric is named (``get_name()``) and makes, for each validation pass, a fresh accumulator
(``get_pytorch_metric()``) that Orca's runner calls with each batch's ``(output, target)`` and asks for the result
(``compute()``). A plain function ``f(output, target)`` is a metric too, named after the function, whose result is
the mean of its batch values (Orca's ``CustomizedMetric``).
"""
from abc import ABC, abstractmethod
from typing import Any, Callable, Dict, List, Sequence, Union

import torch



class Accumulator(ABC):
    """One validation pass's value of a metric: ``accumulator(output, target)`` per batch, then ``compute()``."""

    @abstractmethod
    def __call__(self, preds: torch.Tensor, targets: torch.Tensor) -> None:
        """Add a batch."""

    @abstractmethod
    def compute(self) -> Any:
        """The pass's value."""


class Metric(ABC):
    """Orca's metric: a name and a fresh accumulator per validation pass."""

    @abstractmethod
    def get_name(self) -> str:
        """The name the results carry (``val_<name, lower case>`` in a fit's statistics)."""

    @abstractmethod
    def get_pytorch_metric(self) -> Accumulator:
        """A fresh accumulator."""


class _Ratio(Accumulator):
    """Counts ``correct`` over ``total`` as int64 tensors, as Orca's accuracies do (float ratio at the end)."""

    def __init__(self) -> None:
        self.correct = torch.tensor(0)
        self.total = torch.tensor(0)

    def compute(self) -> torch.Tensor:
        return self.correct.float() / self.total


class _TopOne(_Ratio):
    """Orca's Accuracy: class scores (one more dimension than the target) become their argmax, same-shaped float
    outputs become ``>= 0.5``; then the share of elements equal to the target."""

    def __call__(self, preds: torch.Tensor, targets: torch.Tensor) -> None:
        if preds.ndim not in (targets.ndim, targets.ndim + 1):
            raise RuntimeError('preds the same or one more dimensions than targets')
        if preds.ndim == targets.ndim + 1:
            preds = torch.argmax(preds, dim=-1)
        if preds.ndim == targets.ndim and preds.is_floating_point():
            preds = (preds >= 0.5).long()
        self.correct += torch.sum(torch.eq(preds, targets))
        self.total += targets.numel()


class _SparseCategorical(_Ratio):
    def __call__(self, preds: torch.Tensor, targets: torch.Tensor) -> None:
        batch = targets.size(0)
        if preds.ndim == targets.ndim:
            targets = torch.squeeze(targets, dim=-1)
        predicted = torch.argmax(preds, dim=-1).type_as(targets)
        self.correct += torch.sum(torch.eq(predicted, targets))
        self.total += batch


class _Categorical(_Ratio):
    def __call__(self, preds: torch.Tensor, targets: torch.Tensor) -> None:
        self.correct += torch.sum(torch.eq(torch.argmax(preds, dim=-1), torch.argmax(targets, dim=-1)))
        self.total += targets.size(0)


class _Binary(_Ratio):
    def __call__(self, preds: torch.Tensor, targets: torch.Tensor, threshold: float = 0.5) -> None:
        self.correct += torch.sum(torch.eq(torch.gt(preds, torch.tensor(threshold)), targets))
        self.total += targets.size(0)


class _TopFive(_Ratio):
    def __call__(self, preds: torch.Tensor, targets: torch.Tensor) -> None:
        batch = targets.size(0)
        top = preds.topk(5, dim=-1, largest=True, sorted=True)[1].type_as(targets).t()
        self.correct += top.eq(targets.view(1, -1).expand_as(top)).contiguous().view(-1).sum()
        self.total += batch


class _Error(Accumulator):
    """Orca's MSE / MAE: the summed error over every element, divided by their count."""

    def __init__(self, squared: bool) -> None:
        self.squared = squared
        self.total = torch.tensor(0)
        self.error = torch.tensor(0.0)

    def __call__(self, preds: torch.Tensor, targets: torch.Tensor) -> None:
        if preds.shape != targets.shape:
            raise RuntimeError('preds and targets are expected to have the same shape')
        difference = torch.sub(preds, targets)
        self.error += torch.sum(torch.square(difference) if self.squared else torch.abs(difference))
        self.total += targets.numel()

    def compute(self) -> torch.Tensor:
        return self.error / self.total


class Accuracy(Metric):
    """Top-1 accuracy (binary: outputs ``>= 0.5``).

    Args:
        zero_based_label (bool): Orca's argument; labels must start from 0 (Orca's PyTorch metric refuses False).
    """

    def __init__(self, zero_based_label: bool = True) -> None:
        if not zero_based_label:
            raise ValueError('Accuracy(zero_based_label=False): Orca\'s PyTorch accuracy supports zero-based labels '
                             'only; set zero_based_label=True')
        self.zero_based_label = zero_based_label

    def get_name(self) -> str:
        return 'Accuracy'

    def get_pytorch_metric(self) -> Accumulator:
        return _TopOne()


class SparseCategoricalAccuracy(Metric):
    """Top-1 accuracy of class scores against integer labels (a trailing label dimension of 1 squeezed)."""

    def get_name(self) -> str:
        return 'SparseCategoricalAccuracy'

    def get_pytorch_metric(self) -> Accumulator:
        return _SparseCategorical()


class CategoricalAccuracy(Metric):
    """Top-1 accuracy of class scores against one-hot targets."""

    def get_name(self) -> str:
        return 'CategoricalAccuracy'

    def get_pytorch_metric(self) -> Accumulator:
        return _Categorical()


class BinaryAccuracy(Metric):
    """The share of ``output > 0.5`` equal to the target."""

    def get_name(self) -> str:
        return 'BinaryAccuracy'

    def get_pytorch_metric(self) -> Accumulator:
        return _Binary()


class Top5Accuracy(Metric):
    """The share of targets among the five highest class scores."""

    def get_name(self) -> str:
        return 'Top5Accuracy'

    def get_pytorch_metric(self) -> Accumulator:
        return _TopFive()


class MSE(Metric):
    """Mean squared error over every element."""

    def get_name(self) -> str:
        return 'MSE'

    def get_pytorch_metric(self) -> Accumulator:
        return _Error(squared=True)


class MAE(Metric):
    """Mean absolute error over every element."""

    def get_name(self) -> str:
        return 'MAE'

    def get_pytorch_metric(self) -> Accumulator:
        return _Error(squared=False)


class _MeanOfBatches(Accumulator):
    def __init__(self, function: Callable[[Any, Any], Any]) -> None:
        self.function = function
        self.value: Any = 0
        self.steps = 0

    def __call__(self, preds: Any, targets: Any) -> None:
        self.value += self.function(preds, targets)
        self.steps += 1

    def compute(self) -> Any:
        return self.value / self.steps


class CustomizedMetric(Metric):
    """Orca's wrapper of a function ``f(output, target)``: named after it, its result the mean of its batch values.

    Args:
        compute_function: the function.
    """

    def __init__(self, compute_function: Callable[[Any, Any], Any]) -> None:
        self.compute_function = compute_function

    def get_name(self) -> str:
        return self.compute_function.__name__

    def get_pytorch_metric(self) -> Accumulator:
        return _MeanOfBatches(self.compute_function)


def metric_accumulators(metrics: Union[None, Any, Sequence[Any]]) -> Dict[str, Accumulator]:
    """``{name: fresh accumulator}`` of Orca metrics (one, a list, or plain functions), as Orca's runner makes them
    for each validation pass (``Metric.convert_metrics_dict``)."""
    if metrics is None:
        return {}
    listed: List[Any] = list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]
    accumulators: Dict[str, Accumulator] = {}
    for metric in listed:
        if isinstance(metric, Metric):
            accumulators[metric.get_name()] = metric.get_pytorch_metric()
        elif callable(metric) and hasattr(metric, '__name__'):
            wrapped = CustomizedMetric(metric)
            accumulators[wrapped.get_name()] = wrapped.get_pytorch_metric()
        else:
            raise TypeError(f'Orca metrics are aitoolbox_like.adapters.orca metrics (Accuracy(), MAE(), ...) or '
                            f'functions f(output, target); got {type(metric).__qualname__}')
    return accumulators
