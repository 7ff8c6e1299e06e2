"""SuperGradients' learning-rate callbacks: the warm-ups and the ``lr_mode`` schedules SG's trainer builds from the
training params, with SG's class names, constructor keywords and formulas, written for the adapter.

Each works on the loop's optimizer as SG's do on SG's: a learning rate per parameter group, looked up by the group's
``'name'`` (SG's trainer names its groups; :func:`name_param_groups` names a loop's unnamed ones the same way:
``'default'`` for a single group, ``'group_<i>'`` for several). A group whose name the schedule does not know gets
the schedule's only rate when it has one (``initial_lr`` given as a number), so an unnamed optimizer works too.

:class:`~aitoolbox_like.adapters.supergradients.TrainingParamsCallback` builds them from ``training_params``
(``warmup_mode``, ``lr_mode``); they can also be built by hand, as SG's trainer builds them:
``CosineLRScheduler(train_loader_len=..., net=model, training_params=params, update_param_groups=False,
**params.to_dict())``.
"""
import difflib
import logging
import math
import numbers
from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np
import torch

from .callback import Callback, PhaseCallback
from .context import PhaseContext
from .params import TrainingParams, name_param_groups  # noqa: F401 (re-exported)
from .phases import Phase

logger = logging.getLogger(__name__)


def _as_params(training_params: Any) -> TrainingParams:
    if isinstance(training_params, TrainingParams):
        return training_params
    return TrainingParams(training_params or {})


def _per_group(value: Any, groups: Sequence[str], what: str) -> Dict[str, float]:
    """A number for every group, or a mapping {group: number} kept as given."""
    if isinstance(value, Mapping):
        return {str(name): float(lr) for name, lr in value.items()}
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return {name: float(value) for name in groups}
    raise TypeError(f'{what} must be a number or a mapping {{param group name: number}}, got {value!r}')


class LRCallbackBase(PhaseCallback):
    """SG's base of the learning-rate callbacks: ``__call__`` runs :meth:`perform_scheduling` when
    :meth:`is_lr_scheduling_enabled`; subclasses implement both and set ``self.lr`` then call :meth:`update_lr`.

    Args:
        phase (Phase or str): when ``__call__`` runs.
        initial_lr (float or Mapping): the learning rate the schedule starts from: a number (kept as
            ``{'default': lr}``, as SG keeps it) or ``{param group name: lr}``.
        update_param_groups (bool): SG's flag for models that update their own groups; kept, not used here.
        train_loader_len (int): batches per epoch.
        net: the model.
        training_params (Mapping): the run's training params (a dict is read as a :class:`TrainingParams`).
        **kwargs: the other training params (SG's trainer passes all of them); ignored.
    """

    def __init__(self, phase: Union[Phase, str], initial_lr: Any, update_param_groups: bool = False,
                 train_loader_len: Optional[int] = None, net: Any = None, training_params: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(phase)
        if initial_lr is None:
            raise ValueError(f'{type(self).__name__}: initial_lr is None; give training_params["initial_lr"] (or '
                             f'build it through TrainingParamsCallback, which reads it from the optimizer)')
        self.initial_lr: Dict[str, float] = _per_group(initial_lr, ['default'], 'initial_lr')
        self.lr: Dict[str, float] = dict(self.initial_lr)
        self.update_param_groups = update_param_groups
        self.train_loader_len = train_loader_len
        self.net = net
        self.training_params = _as_params(training_params)

    def __call__(self, context: PhaseContext, **kwargs: Any) -> None:
        if self.is_lr_scheduling_enabled(context):
            self.perform_scheduling(context)

    def is_lr_scheduling_enabled(self, context: PhaseContext) -> bool:
        """Whether this phase call changes the learning rate."""
        raise NotImplementedError(f'{type(self).__name__} must implement is_lr_scheduling_enabled(context)')

    def perform_scheduling(self, context: PhaseContext) -> None:
        """Set ``self.lr`` for this phase call and apply it (:meth:`update_lr`)."""
        raise NotImplementedError(f'{type(self).__name__} must implement perform_scheduling(context)')

    def update_lr(self, optimizer: Any, epoch: Optional[int], batch_idx: Optional[int] = None) -> None:
        """Write ``self.lr`` into the optimizer's parameter groups (see :func:`group_lr`)."""
        apply_lr(optimizer, self.lr, type(self).__name__)

    def _steps_per_epoch(self) -> int:
        if not self.train_loader_len:
            raise ValueError(f'{type(self).__name__} updates per batch and needs train_loader_len (the train loader '
                             f'has no len())')
        return int(self.train_loader_len)

    def _max_epochs(self) -> int:
        max_epochs = self.training_params.max_epochs
        if max_epochs is None:
            raise ValueError(f'{type(self).__name__} needs training_params["max_epochs"]')
        return int(max_epochs)

    def _scheduling_epochs(self, context: PhaseContext) -> bool:
        """Between the warm-up and the cool-down: SG's per-step schedules run there."""
        params = self.training_params
        return params.lr_warmup_epochs <= context.epoch < self._max_epochs() - params.lr_cooldown_epochs


def group_lr(lrs: Mapping, group: Mapping, index: int, who: str = 'the schedule') -> float:
    """The learning rate of one parameter group: ``lrs[group['name']]``; for a group whose name ``lrs`` lacks (or an
    unnamed one), the only rate of ``lrs`` when it has one; otherwise a KeyError naming both sides."""
    name = group.get('name')
    if name in lrs:
        return float(lrs[name])
    values = set(lrs.values())
    if len(lrs) == 1 or len(values) == 1:
        return float(next(iter(lrs.values())))
    raise KeyError(f'{who}: parameter group {index} ({"named " + repr(name) if name is not None else "unnamed"}) '
                   f'has no learning rate in initial_lr, which names {sorted(lrs)}; name the groups (param group '
                   f'"name") as initial_lr does, or give initial_lr as one number')


def apply_lr(optimizer: Any, lrs: Mapping, who: str = 'the schedule') -> None:
    """Set every parameter group's ``'lr'`` from ``lrs`` (:func:`group_lr`)."""
    for i, group in enumerate(optimizer.param_groups):
        group['lr'] = group_lr(lrs, group, i, who)


class LinearEpochLRWarmup(LRCallbackBase):
    """SG's ``LinearEpochLRWarmup``: at the start of epochs 0..``lr_warmup_epochs``, the learning rate climbs in
    equal steps from ``warmup_initial_lr`` (default: ``initial_lr / (lr_warmup_epochs + 1)``) to ``initial_lr``.

    Args:
        **kwargs: :class:`LRCallbackBase`'s (``initial_lr``, ``training_params``, ...).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(Phase.TRAIN_EPOCH_START, **kwargs)
        params = self.training_params
        epochs = params.lr_warmup_epochs
        if params.warmup_initial_lr is None:
            self.warmup_initial_lr = {name: lr / (epochs + 1) for name, lr in self.initial_lr.items()}
        else:
            self.warmup_initial_lr = _per_group(params.warmup_initial_lr, list(self.initial_lr), 'warmup_initial_lr')
        self.warmup_step_size = {name: (lr - self.warmup_initial_lr[name]) / epochs if epochs > 0 else 0.0
                                 for name, lr in self.initial_lr.items()}

    def is_lr_scheduling_enabled(self, context: PhaseContext) -> bool:
        epochs = self.training_params.lr_warmup_epochs
        return epochs > 0 and context.epoch <= epochs

    def perform_scheduling(self, context: PhaseContext) -> None:
        for name in self.initial_lr:
            self.lr[name] = self.warmup_initial_lr[name] + context.epoch * self.warmup_step_size[name]
        self.update_lr(context.optimizer, context.epoch)


class LinearBatchLRWarmup(Callback):
    """SG's ``LinearBatchLRWarmup``: before each of the first ``lr_warmup_steps`` training batches (at most one
    epoch's), the learning rate climbs linearly from ``warmup_initial_lr`` to ``initial_lr`` (both ends included).

    Args:
        warmup_initial_lr (float or Mapping): the first batch's learning rate.
        initial_lr (float or Mapping): the learning rate reached at the last warm-up batch.
        train_loader_len (int): batches per epoch.
        lr_warmup_steps (int): warm-up batches.
        training_params (Mapping): the run's training params.
        net: the model.
        **kwargs: the other training params; ignored.
    """

    def __init__(self, warmup_initial_lr: Any, initial_lr: Any, train_loader_len: int, lr_warmup_steps: int,
                 training_params: Any = None, net: Any = None, **kwargs: Any) -> None:
        super().__init__()
        if warmup_initial_lr is None:
            raise TypeError('LinearBatchLRWarmup needs warmup_initial_lr (a number or {param group name: number})')
        if lr_warmup_steps > train_loader_len:
            logger.warning('LinearBatchLRWarmup: lr_warmup_steps=%d is more than the %d batches of an epoch; the '
                           'warm-up ends with the first epoch', lr_warmup_steps, train_loader_len)
        self.initial_lr = _per_group(initial_lr, ['default'], 'initial_lr')
        self.lr = dict(self.initial_lr)
        start = _per_group(warmup_initial_lr, list(self.initial_lr), 'warmup_initial_lr')
        self.lr_warmup_steps = min(int(lr_warmup_steps), int(train_loader_len))
        self.learning_rates = {name: np.linspace(start[name], lr, num=self.lr_warmup_steps)
                               for name, lr in self.initial_lr.items()}
        self.train_loader_len = train_loader_len
        self.training_params = _as_params(training_params)
        self.net = net

    def on_train_batch_start(self, context: PhaseContext) -> None:
        step = context.epoch * self.train_loader_len + (context.batch_idx or 0)
        if step < self.lr_warmup_steps:
            for name, rates in self.learning_rates.items():
                self.lr[name] = float(rates[step])
            self.update_lr(context.optimizer, context.epoch, context.batch_idx)

    def update_lr(self, optimizer: Any, epoch: Optional[int], batch_idx: Optional[int] = None) -> None:
        """Write ``self.lr`` into the optimizer's parameter groups."""
        apply_lr(optimizer, self.lr, type(self).__name__)


class StepLRScheduler(LRCallbackBase):
    """SG's ``StepLRScheduler``: after each epoch from the end of the warm-up on, ``initial_lr`` times
    ``lr_decay_factor`` to the number of ``lr_updates`` epochs reached. ``step_lr_update_freq`` instead spaces the
    updates every that many epochs (between the warm-up and the cool-down).

    Args:
        lr_updates (Sequence[int]): the epochs after which the rate decays.
        lr_decay_factor (float): the factor of each decay.
        step_lr_update_freq (float or None): epochs between decays (instead of ``lr_updates``).
        **kwargs: :class:`LRCallbackBase`'s.
    """

    def __init__(self, lr_updates: Sequence[int], lr_decay_factor: float, step_lr_update_freq: Optional[float] = None,
                 **kwargs: Any) -> None:
        super().__init__(Phase.TRAIN_EPOCH_END, **kwargs)
        updates = list(lr_updates or [])
        if step_lr_update_freq and updates:
            raise ValueError('StepLRScheduler: give either lr_updates or step_lr_update_freq, not both')
        if not step_lr_update_freq and not updates:
            raise ValueError('StepLRScheduler needs lr_updates (epochs) or step_lr_update_freq')
        params = self.training_params
        if step_lr_update_freq:
            last = self._max_epochs() - params.lr_cooldown_epochs
            epochs = (int(math.ceil(step_lr_update_freq * k)) for k in range(1, last))
            updates = [epoch for epoch in epochs if params.lr_warmup_epochs <= epoch < last]
        elif params.lr_cooldown_epochs > 0:
            logger.warning('StepLRScheduler: lr_cooldown_epochs has no effect with explicit lr_updates')
        self.lr_updates = updates
        self.lr_decay_factor = lr_decay_factor

    def is_lr_scheduling_enabled(self, context: PhaseContext) -> bool:
        return self.training_params.lr_warmup_epochs <= context.epoch

    def perform_scheduling(self, context: PhaseContext) -> None:
        decays = sum(1 for epoch in self.lr_updates if epoch <= context.epoch)
        for name, lr in self.initial_lr.items():
            self.lr[name] = lr * self.lr_decay_factor ** decays
        self.update_lr(context.optimizer, context.epoch)


class ExponentialLRScheduler(LRCallbackBase):
    """SG's ``ExponentialLRScheduler``: after each optimizer step between the warm-up and the cool-down,
    ``initial_lr * lr_decay_factor ** (epochs since the warm-up, counted in batches)``.

    Args:
        lr_decay_factor (float): the factor per epoch.
        **kwargs: :class:`LRCallbackBase`'s.
    """

    def __init__(self, lr_decay_factor: float, **kwargs: Any) -> None:
        super().__init__(Phase.TRAIN_BATCH_STEP, **kwargs)
        self.lr_decay_factor = lr_decay_factor

    def is_lr_scheduling_enabled(self, context: PhaseContext) -> bool:
        return self._scheduling_epochs(context)

    def perform_scheduling(self, context: PhaseContext) -> None:
        per_epoch = self._steps_per_epoch()
        done = per_epoch * (context.epoch - self.training_params.lr_warmup_epochs) + (context.batch_idx or 0)
        for name, lr in self.initial_lr.items():
            self.lr[name] = lr * self.lr_decay_factor ** (done / per_epoch)
        self.update_lr(context.optimizer, context.epoch, context.batch_idx)


class PolyLRScheduler(LRCallbackBase):
    """SG's ``PolyLRScheduler``: after each optimizer step between the warm-up and the cool-down,
    ``initial_lr * (1 - done / total) ** 0.9`` over the optimizer updates (``batch_accumulate`` batches each).

    Args:
        max_epochs (int): the run's epochs.
        **kwargs: :class:`LRCallbackBase`'s.
    """

    def __init__(self, max_epochs: int, **kwargs: Any) -> None:
        super().__init__(Phase.TRAIN_BATCH_STEP, **kwargs)
        self.max_epochs = max_epochs

    def is_lr_scheduling_enabled(self, context: PhaseContext) -> bool:
        return self._scheduling_epochs(context)

    def perform_scheduling(self, context: PhaseContext) -> None:
        params = self.training_params
        per_epoch = self._steps_per_epoch()
        epochs = self.max_epochs - params.lr_warmup_epochs - params.lr_cooldown_epochs
        done = (per_epoch * (context.epoch - params.lr_warmup_epochs) + (context.batch_idx or 0)) \
            / params.batch_accumulate
        total = per_epoch * epochs / params.batch_accumulate
        for name, lr in self.initial_lr.items():
            self.lr[name] = lr * (1.0 - done / total) ** 0.9
        self.update_lr(context.optimizer, context.epoch, context.batch_idx)


class CosineLRScheduler(LRCallbackBase):
    """SG's ``CosineLRScheduler``: after each optimizer step from the end of the warm-up (epochs, or
    ``lr_warmup_steps`` batches) to the cool-down, a cosine from ``initial_lr`` towards
    ``initial_lr * cosine_final_lr_ratio`` (:meth:`compute_learning_rate`).

    Args:
        max_epochs (int): the run's epochs.
        cosine_final_lr_ratio (float): where the cosine ends, relative to ``initial_lr``.
        **kwargs: :class:`LRCallbackBase`'s.
    """

    def __init__(self, max_epochs: int, cosine_final_lr_ratio: float, **kwargs: Any) -> None:
        super().__init__(Phase.TRAIN_BATCH_STEP, **kwargs)
        self.max_epochs = max_epochs
        self.cosine_final_lr_ratio = cosine_final_lr_ratio

    def is_lr_scheduling_enabled(self, context: PhaseContext) -> bool:
        warmup_steps = self.training_params.lr_warmup_steps
        if warmup_steps > 0:
            return self._steps_per_epoch() * context.epoch + (context.batch_idx or 0) >= warmup_steps
        return self._scheduling_epochs(context)

    def perform_scheduling(self, context: PhaseContext) -> None:
        params = self.training_params
        per_epoch = self._steps_per_epoch()
        epochs = self.max_epochs - params.lr_warmup_epochs - params.lr_cooldown_epochs
        done = per_epoch * (context.epoch - params.lr_warmup_epochs) + (context.batch_idx or 0)
        step = max(0, done - params.lr_warmup_steps)
        total = per_epoch * epochs - params.lr_warmup_steps
        for name, lr in self.initial_lr.items():
            self.lr[name] = float(self.compute_learning_rate(step, total, lr, self.cosine_final_lr_ratio))
        self.update_lr(context.optimizer, context.epoch, context.batch_idx)

    @classmethod
    def compute_learning_rate(cls, step: Union[float, np.ndarray], total_steps: float, initial_lr: float,
                              final_lr_ratio: float) -> Union[float, np.ndarray]:
        """The rate at ``step`` of ``total_steps``: ``initial_lr * (ratio + (1 - ratio) * (1 + cos(pi * step /
        (total_steps + 1))) / 2)`` (numbers or NumPy arrays of steps)."""
        half_cosine = 0.5 * (1.0 + np.cos(np.pi * np.asarray(step, dtype=float) / (total_steps + 1)))
        rate = initial_lr * (final_lr_ratio + (1.0 - final_lr_ratio) * half_cosine)
        return float(rate) if np.ndim(rate) == 0 else rate


class FunctionLRScheduler(LRCallbackBase):
    """SG's ``FunctionLRScheduler``: after each optimizer step between the warm-up and the cool-down, the rate
    ``lr_schedule_function(initial_lr=, epoch=, iter=, max_epoch=, iters_per_epoch=)`` returns (epochs counted
    from the end of the warm-up; ``max_epoch`` the epochs between warm-up and cool-down).

    Args:
        max_epochs (int): the run's epochs.
        lr_schedule_function (Callable): the schedule.
        **kwargs: :class:`LRCallbackBase`'s.
    """

    def __init__(self, max_epochs: int, lr_schedule_function: Callable[..., float], **kwargs: Any) -> None:
        super().__init__(Phase.TRAIN_BATCH_STEP, **kwargs)
        if not callable(lr_schedule_function):
            raise TypeError(f'FunctionLRScheduler: lr_schedule_function must be callable, got '
                            f'{lr_schedule_function!r}')
        self.lr_schedule_function = lr_schedule_function
        self.max_epochs = max_epochs

    def is_lr_scheduling_enabled(self, context: PhaseContext) -> bool:
        return self._scheduling_epochs(context)

    def perform_scheduling(self, context: PhaseContext) -> None:
        params = self.training_params
        for name, lr in self.initial_lr.items():
            self.lr[name] = self.lr_schedule_function(
                initial_lr=lr, epoch=context.epoch - params.lr_warmup_epochs, iter=context.batch_idx,
                max_epoch=self.max_epochs - params.lr_warmup_epochs - params.lr_cooldown_epochs,
                iters_per_epoch=self.train_loader_len)
        self.update_lr(context.optimizer, context.epoch, context.batch_idx)


class LRSchedulerCallback(PhaseCallback):
    """SG's ``LRSchedulerCallback``: steps a torch scheduler at ``phase`` once the warm-up epochs are over;
    ``ReduceLROnPlateau`` steps on ``metrics_dict[metric_name]`` (an SG name, e.g. the validation loss
    ``'CrossEntropyLoss'`` or a metric's class name, at ``VALIDATION_EPOCH_END``).

    Args:
        scheduler: the torch scheduler.
        phase (Phase or str): when it steps.
        metric_name (str or None): the metric a ``ReduceLROnPlateau`` watches.
    """

    def __init__(self, scheduler: Any, phase: Union[Phase, str], metric_name: Optional[str] = None) -> None:
        super().__init__(phase)
        self.scheduler = scheduler
        self.metric_name = metric_name

    def __call__(self, context: PhaseContext) -> None:
        if context.epoch < context.lr_warmup_epochs:
            return
        if self.metric_name is None:
            self.scheduler.step()
            return
        metrics = context.metrics_dict or {}
        if self.metric_name not in metrics:
            raise KeyError(f'LRSchedulerCallback: metric_name={self.metric_name!r} is not in the metrics of phase '
                           f'{self.phase.name}: {sorted(metrics)}')
        self.scheduler.step(metrics[self.metric_name])

    def __repr__(self) -> str:
        return f'LRSchedulerCallback: {self.scheduler!r}'


# SG's lr_mode and warmup_mode names (with SG's older names), and the callback class of each.
LR_SCHEDULERS: Dict[str, type] = {
    'StepLRScheduler': StepLRScheduler, 'step': StepLRScheduler,
    'PolyLRScheduler': PolyLRScheduler, 'poly': PolyLRScheduler,
    'CosineLRScheduler': CosineLRScheduler, 'cosine': CosineLRScheduler,
    'ExponentialLRScheduler': ExponentialLRScheduler, 'exp': ExponentialLRScheduler,
    'FunctionLRScheduler': FunctionLRScheduler, 'function': FunctionLRScheduler,
}
LR_WARMUPS: Dict[str, type] = {
    'LinearEpochLRWarmup': LinearEpochLRWarmup, 'linear_epoch_step': LinearEpochLRWarmup,
    'LinearBatchLRWarmup': LinearBatchLRWarmup, 'linear_batch_step': LinearBatchLRWarmup,
}


def _unknown(kind: str, name: Any, known: List[str]) -> ValueError:
    close = difflib.get_close_matches(str(name), known, n=3, cutoff=0.5)
    hint = f'; did you mean {" or ".join(repr(c) for c in close)}?' if close else ''
    return ValueError(f'unknown {kind} {name!r}{hint} (known: {", ".join(known)})')


def warmup_callback(params: TrainingParams, train_loader_len: Optional[int], net: Any) -> Optional[Any]:
    """The warm-up callback of ``params.warmup_mode`` (a name, or a callback class built as SG builds it), or None
    when ``warmup_mode`` is None."""
    mode = params.warmup_mode
    if mode is None:
        return None
    if isinstance(mode, str):
        if mode not in LR_WARMUPS:
            raise _unknown('warmup_mode', mode, [name for name in LR_WARMUPS if name[0].isupper()])
        cls = LR_WARMUPS[mode]
    elif isinstance(mode, type):
        cls = mode
    else:
        raise TypeError(f'warmup_mode must be a name ({", ".join(n for n in LR_WARMUPS if n[0].isupper())}), a '
                        f'callback class or None, got {mode!r}')
    if cls is LinearBatchLRWarmup and not params.lr_warmup_steps:
        return None     # no warm-up batches: nothing to do (and no warmup_initial_lr needed)
    if cls is LinearBatchLRWarmup and train_loader_len is None:
        raise ValueError('warmup_mode LinearBatchLRWarmup needs a train loader with len()')
    return cls(train_loader_len=train_loader_len, net=net, training_params=params, update_param_groups=False,
               **params.to_dict())


def lr_mode_callback(params: TrainingParams, train_loader_len: Optional[int], net: Any, optimizer: Any) -> Any:
    """The learning-rate callback of ``params.lr_mode``: an SG schedule by name, or a torch scheduler as SG writes
    it, ``{'StepLR': {**its arguments, 'phase': Phase..., 'metric_name': ...}}`` (``metric_name`` for
    ``ReduceLROnPlateau``)."""
    mode = params.lr_mode
    if isinstance(mode, str):
        if mode not in LR_SCHEDULERS:
            raise _unknown('lr_mode', mode, [name for name in LR_SCHEDULERS if name[0].isupper()])
        return LR_SCHEDULERS[mode](train_loader_len=train_loader_len, net=net, training_params=params,
                                   update_param_groups=False, **params.to_dict())
    if isinstance(mode, Mapping) and len(mode) == 1:
        name, arguments = next(iter(mode.items()))
        scheduler_class = getattr(torch.optim.lr_scheduler, str(name), None)
        if not isinstance(scheduler_class, type):
            torch_names = sorted(n for n in dir(torch.optim.lr_scheduler)
                                 if isinstance(getattr(torch.optim.lr_scheduler, n), type) and n[0].isupper()
                                 and n.endswith(('LR', 'Plateau', 'Restarts')))
            raise _unknown('torch scheduler in lr_mode', name, torch_names)
        arguments = dict(arguments or {})
        phase = arguments.pop('phase', None)
        metric_name = arguments.pop('metric_name', None)
        if phase is None:
            raise ValueError(f"lr_mode={{{name!r}: ...}} needs 'phase' (when the scheduler steps, e.g. "
                             f"Phase.TRAIN_EPOCH_END)")
        if name == 'ReduceLROnPlateau' and metric_name is None:
            raise ValueError("lr_mode={'ReduceLROnPlateau': ...} needs 'metric_name' (the metric it watches)")
        return LRSchedulerCallback(scheduler_class(optimizer, **arguments), phase=phase, metric_name=metric_name)
    raise ValueError(f'lr_mode must be an SG schedule name ({", ".join(n for n in LR_SCHEDULERS if n[0].isupper())}) '
                     f'or {{torch scheduler name: {{arguments, "phase": ...}}}}, got {mode!r}')
