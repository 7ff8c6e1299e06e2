"""SuperGradients' training-run objects as SG callbacks use them: ``TrainingParams`` (``context.training_params``),
``AverageMeter`` (``context.loss_avg_meter``) and ``SGMetricCollection`` (``context.metrics_compute_fn``)."""
import copy
import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple, Union

import torch

if TYPE_CHECKING:
    from ...engine.train_loop import TrainLoop

# SuperGradients 3.7's defaults (super_gradients/training/params.py) for the training params its callbacks, LR
# schedules and metrics read. SG's logger, checkpoint, platform and compile settings have no counterpart here.
SG_DEFAULT_TRAINING_PARAMS: Dict[str, Any] = {
    'max_epochs': None,
    'lr_mode': None,
    'initial_lr': None,
    'lr_updates': [],
    'lr_decay_factor': None,
    'step_lr_update_freq': None,
    'lr_schedule_function': None,
    'cosine_final_lr_ratio': 0.01,
    'warmup_mode': 'LinearEpochLRWarmup',
    'lr_warmup_epochs': 0,
    'lr_warmup_steps': 0,
    'warmup_initial_lr': None,
    'lr_cooldown_epochs': 0,
    'optimizer': 'SGD',
    'optimizer_params': {},
    'criterion_params': {},
    'batch_accumulate': 1,
    'mixed_precision': False,
    'clip_grad_norm': None,
    'ema': False,
    'ema_params': {},
    'average_best_models': True,
    'train_metrics_list': [],
    'valid_metrics_list': [],
    'metric_to_watch': 'Accuracy',
    'greater_metric_to_watch_is_better': True,
    'phase_callbacks': None,
    'max_train_batches': None,
    'max_valid_batches': None,
    'run_validation_freq': 1,
    'run_test_freq': 1,
    'precise_bn': False,
    'resume': False,
}


class TrainingParams(dict):
    """SuperGradients' ``training_params``: SG's defaults overridden by the given values, read as attributes
    (``params.max_epochs``, as SG callbacks read them) or as a dict (``params['max_epochs']``).

    Build SG's LR callbacks from one, as SG's trainer does (``StepLRScheduler(training_params=params,
    **params.to_dict(), ...)``): the SG callbacks of a fit then see it as ``context.training_params``.

    Args:
        params (Mapping): values overriding SG's defaults.
        **entries: more values.
    """

    def __init__(self, params: Optional[Mapping] = None, **entries: Any) -> None:
        super().__init__(copy.deepcopy(SG_DEFAULT_TRAINING_PARAMS))
        self.update(params or {}, **entries)

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f'training_params has no {name!r} (SG\'s names: {", ".join(sorted(self))})') \
                from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_dict(self, include_schema: bool = True) -> Dict[str, Any]:
        """A plain dict of the params (SG's ``HpmStruct.to_dict``; there is no schema here)."""
        return dict(self)

    def override(self, **entries: Any) -> None:
        """Set values, merging nested dicts (SG's ``override``)."""
        for name, value in entries.items():
            current = self.get(name)
            if isinstance(current, dict) and isinstance(value, Mapping):
                merged = dict(current)
                merged.update(value)
                value = merged
            self[name] = value


def name_param_groups(optimizer: Any) -> None:
    """Give the parameter groups of ``optimizer`` that have no ``'name'`` the names SG's trainer gives its groups:
    ``'default'`` for a single group, ``'group_<i>'`` for several (SG's learning-rate callbacks look their rate up by
    it). Named groups keep their names; an object without a ``param_groups`` list is left alone."""
    groups = getattr(optimizer, 'param_groups', None)
    if not isinstance(groups, list):
        return
    for i, group in enumerate(groups):
        if isinstance(group, dict) and 'name' not in group:
            group['name'] = 'default' if len(groups) == 1 else f'group_{i}'


class AverageMeter:
    """SuperGradients' ``AverageMeter``: the batch-size-weighted average of what ``update`` was given."""

    def __init__(self) -> None:
        self._sum: Optional[torch.Tensor] = None
        self._count = 0

    def update(self, value: Union[float, tuple, list, torch.Tensor], batch_size: int) -> None:
        """Add ``value`` (a number or a tensor of loss items) for ``batch_size`` samples."""
        if not isinstance(value, torch.Tensor):
            value = torch.tensor(value)
        self._sum = value * batch_size if self._sum is None else self._sum + value * batch_size
        self._count += batch_size

    @property
    def count(self) -> int:
        """How many samples ``update`` was given."""
        return self._count

    @property
    def average(self) -> Union[float, Tuple[float, ...]]:
        """The average: a float for a scalar, a tuple for a tensor of items (SG's loss items); 0 before any."""
        if self._sum is None:
            return 0
        mean = self._sum / self._count
        return float(mean) if mean.dim() < 1 else tuple(float(v) for v in mean.detach().cpu().reshape(-1))


class EpochLossMeter(AverageMeter):
    """``context.loss_avg_meter`` in training: over the epoch's batch losses as the loop records them
    (``loop.loss_batch_accum``, one entry per batch) until something calls ``update``, as SG's
    ``MetricsUpdateCallback`` does; from then on SG's meter over what it was given."""

    def __init__(self, loop: 'TrainLoop') -> None:
        super().__init__()
        self.loop = loop

    @property
    def average(self) -> Union[float, Tuple[float, ...]]:
        """The mean loss of the epoch's batches so far: a tuple with one value per loss item (SG's form: one for a
        single loss, one per part of a MultiLoss); 0 before the first batch."""
        if self.count:
            return super().average
        losses = [loss for loss in self.loop.loss_batch_accum if loss is not None]
        if not losses:
            return 0
        if isinstance(losses[0], Mapping):
            return tuple(_mean([loss[part] for loss in losses]) for part in losses[0])
        return (_mean(losses),)


def _mean(values: List[Any]) -> float:
    return float(torch.stack([torch.as_tensor(v, dtype=torch.float64).reshape(()) for v in values]).mean())


class SGMetricCollection:
    """``context.metrics_compute_fn``: SG's metric collection (torchmetrics' ``MetricCollection`` interface) over
    the metrics of ``training_params.train_metrics_list`` / ``valid_metrics_list``.

    A metric is anything with ``update``, ``compute`` and ``reset`` (a torchmetrics ``Metric``, or a plain
    object). ``update(**fields)`` hands each metric the fields its ``update`` accepts (SG's
    ``MetricsUpdateCallback`` passes the whole context); ``compute()`` gives ``{name: value}``, a metric
    returning a dict giving one entry per key (SG's component metrics).

    Args:
        metrics: a list of metrics (named by class, as SG names them), a dict ``{name: metric}``, or a
            collection with ``items()``.
    """

    def __init__(self, metrics: Any = None) -> None:
        if metrics is None:
            named: Dict[str, Any] = {}
        elif hasattr(metrics, 'items'):
            named = dict(metrics.items())
        else:
            named = {}
            for metric in metrics:
                name = type(metric).__name__
                if name in named:
                    raise ValueError(f'two metrics named {name!r} in the metrics list: SG names metrics by class')
                named[name] = metric
        self.metrics = named
        self.updates = 0        # update() calls since the last reset()

    def update(self, *args: Any, **fields: Any) -> None:
        """Update every metric with the fields its ``update`` accepts."""
        for metric in self.metrics.values():
            metric.update(*args, **_accepted(metric.update, fields))
        self.updates += 1

    def compute(self) -> Dict[str, Any]:
        """``{name: value}`` of every metric (a dict result gives its entries)."""
        results: Dict[str, Any] = {}
        for name, metric in self.metrics.items():
            value = metric.compute()
            if isinstance(value, Mapping):
                results.update(value)
            else:
                results[name] = value
        return results

    def reset(self) -> None:
        for metric in self.metrics.values():
            metric.reset()
        self.updates = 0

    def to(self, device: Any) -> 'SGMetricCollection':
        for metric in self.metrics.values():
            if callable(getattr(metric, 'to', None)):
                metric.to(device)
        return self

    def titles(self) -> List[str]:
        """The names ``compute()`` gives, known before it runs (SG's metric titles): a metric's
        ``component_names`` when it has them (SG's component metrics), else its name."""
        names: List[str] = []
        for name, metric in self.metrics.items():
            components = getattr(metric, 'component_names', None)
            names += [str(c) for c in components] if components else [name]
        return names

    def items(self) -> Iterator[Tuple[str, Any]]:
        return iter(self.metrics.items())

    def keys(self) -> List[str]:
        return list(self.metrics)

    def __len__(self) -> int:
        return len(self.metrics)

    def __repr__(self) -> str:
        return f'SGMetricCollection({", ".join(self.metrics)})'


def _accepted(function: Any, fields: Dict[str, Any]) -> Dict[str, Any]:
    """The entries of ``fields`` that ``function`` accepts as keywords (all of them when it takes ``**kwargs``)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return fields
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return fields
    names = {p.name for p in parameters if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                       inspect.Parameter.KEYWORD_ONLY)}
    return {name: value for name, value in fields.items() if name in names}
