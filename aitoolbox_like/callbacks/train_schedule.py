"""Learning-rate schedule callbacks (AIToolbox's ``schedulers.basic`` and ``schedulers.warmup``, and ours).

Every scheduler callback wraps one ``torch.optim.lr_scheduler`` object (``self.scheduler``) bound to one
optimizer of the loop, and steps it either at the end of every epoch or after every optimizer update.
Update-level ("step") schedules advance only when the optimizer really stepped: not on gradient-accumulation
micro-batches and not when the fp16 GradScaler skipped the update because of inf/NaN gradients.

- Over torch's schedulers: any ``torch.optim.lr_scheduler`` class stepped per epoch or per applied update
  (:class:`GeneralLRSchedulerCallback`, :class:`LRSchedulerCallback`), and AIToolbox's named ones (ReduceLROnPlateau,
  LambdaLR, StepLR, MultiStepLR, OneCycle).
- Schedules written as a factor of the step count, on LambdaLR: AIToolbox's warm-up schedules (per optimizer
  update, HuggingFace's formulas) and warm-up + decay schedules per epoch or per update. Their warm-up is
  ``num_warmup_steps`` or ``warmup_ratio`` (transformers' definition: ``ceil(ratio x total steps)``, the total
  being the fit's optimizer updates unless ``num_training_steps`` is given), resolved when the fit starts.
- transformers' own schedules (``get_linear_schedule_with_warmup`` and the other ``LambdaLR`` it builds) count
  optimizer updates: a callback that would step one per epoch refuses it, naming ``interval='step'``.
- A fit with any scheduler also gets one :class:`LRMonitor` (one of the default callbacks), which writes the
  learning rate of every parameter group into the train history once per epoch.
"""
import inspect
import logging
import math
import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence, Tuple, Union

import torch
from torch.optim import lr_scheduler as torch_lr_scheduler

from ..model.huggingface import is_transformers_schedule
from ..model.multi_loss_optim import MultiLoss
from ._common import check_int
from .abstract import AbstractCallback, AbstractScheduler

if TYPE_CHECKING:
    from ..engine.train_loop import TrainLoop

logger = logging.getLogger(__name__)


#: When a schedule steps: after every epoch, or after every optimizer update that was applied.
INTERVALS = ('epoch', 'step')

#: Which optimizer of the loop a schedule drives: its index, the optimizer itself, or None (the only one).
OptimizerIdx = Union[int, torch.optim.Optimizer, None]
#: ``LambdaLR``'s factor function(s) of the step count.
LRLambda = Union[Callable[[int], float], Sequence[Callable[[int], float]]]


def fit_has_started(loop: 'TrainLoop') -> bool:
    """Whether the loop knows the length of its fit (``num_epochs`` / ``num_iterations``), which a schedule over
    the whole fit needs: a scheduler callback registered before ``fit`` builds its scheduler when the fit starts."""
    return loop.num_epochs is not None or bool(loop.num_iterations)


def check_warmup_arguments(who: str, num_warmup_steps: Optional[float], warmup_ratio: Optional[float],
                           required: bool) -> None:
    """ValueError for a warm-up given twice (``num_warmup_steps`` and ``warmup_ratio``), a ratio outside [0, 1],
    or, when ``required``, neither."""
    if num_warmup_steps is not None and warmup_ratio is not None:
        raise ValueError(f'{who}: got num_warmup_steps={num_warmup_steps!r} and warmup_ratio={warmup_ratio!r}; give '
                         f'one of them: num_warmup_steps counts the warm-up\'s steps, warmup_ratio is its share of '
                         f'the total (ceil(ratio x total steps) warm-up steps, as transformers\' TrainingArguments)')
    if warmup_ratio is not None and (isinstance(warmup_ratio, bool) or not isinstance(warmup_ratio, (int, float))
                                     or not 0. <= warmup_ratio <= 1.):
        raise ValueError(f'{who}: warmup_ratio must be a number in [0, 1] (the share of the total steps spent '
                         f'warming up), got {warmup_ratio!r}')
    if required and num_warmup_steps is None and warmup_ratio is None:
        raise ValueError(f'{who}: pass num_warmup_steps=<steps> or warmup_ratio=<share of the total steps>')


def warmup_steps_for(num_warmup_steps: Optional[float], warmup_ratio: Optional[float],
                     total_steps: Callable[[], int]) -> float:
    """The warm-up's length: ``num_warmup_steps``, or ``ceil(warmup_ratio x total_steps())`` (transformers'
    ``TrainingArguments.get_warmup_steps``), or 0 when neither is given."""
    if warmup_ratio is not None:
        return math.ceil(total_steps() * warmup_ratio)
    return 0 if num_warmup_steps is None else num_warmup_steps


def check_interval(interval: str, who: str) -> str:
    """``interval`` when it is one of :data:`INTERVALS`, else a ValueError naming ``who``."""
    if interval not in INTERVALS:
        raise ValueError(f"{who}: interval must be 'epoch' (step the schedule after every epoch) or 'step' "
                         f"(after every optimizer update), got {interval!r}")
    return interval


class GeneralLRSchedulerCallback(AbstractScheduler, AbstractCallback):
    """Wrap any ``torch.optim.lr_scheduler`` class; it is stepped at the end of every epoch.

    Args:
        scheduler_class: a torch scheduler class, built as ``scheduler_class(optimizer, **kwargs)`` when the
            callback is registered on a TrainLoop.
        optimizer_idx (int, optimizer or None): which optimizer of a MultiOptimizer the schedule drives (an
            index or the optimizer object); None for a single optimizer.
        **kwargs: arguments of the scheduler class.
    """

    interval: str = 'epoch'

    def __init__(self, scheduler_class: Any, optimizer_idx: OptimizerIdx = None, **kwargs: Any) -> None:
        AbstractScheduler.__init__(self)
        AbstractCallback.__init__(self, 'General learn rate scheduler')
        self.scheduler_class = scheduler_class
        self.scheduler_args = kwargs
        self.optimizer_idx = optimizer_idx
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self._loop_optimizer_idx = 0
        self._built_for: Optional[torch.optim.Optimizer] = None

    @property
    def state_key(self) -> str:
        """The class name, with ``_optimizer<idx>`` for a schedule of a given optimizer index."""
        idx = self.optimizer_idx if isinstance(self.optimizer_idx, int) else None
        return type(self).__name__ if idx is None else f'{type(self).__name__}_optimizer{idx}'

    # ---- construction -------------------------------------------------------------------------

    def register_train_loop_object(self, train_loop_obj: 'TrainLoop') -> 'GeneralLRSchedulerCallback':
        """Attach to the loop and build the scheduler on the selected optimizer (again only when the optimizer
        changed), applying state loaded before registration."""
        self.train_loop_obj = train_loop_obj
        self._build_for_loop_optimizer()
        self.on_train_loop_registration()
        return self

    def on_train_begin(self) -> None:
        """Build the scheduler now if the loop had no optimizer at registration (or has another one now)."""
        self._build_for_loop_optimizer()

    def _build_for_loop_optimizer(self) -> None:
        if self.train_loop_obj.optimizer is None:
            return      # a loop built with optimizer=None (AIToolbox code does): fit checks it before the first step
        if not self.ready_to_build():
            return      # registered before fit, the schedule needs the fit's length: built in on_train_begin
        optimizer, loop_idx = self._resolve_optimizer()
        if self.scheduler is None or self._built_for is not optimizer:
            self.optimizer, self._loop_optimizer_idx = optimizer, loop_idx
            scheduler = self.build_scheduler(optimizer)
            self._refuse_update_schedule_per_epoch(scheduler)
            self.scheduler, self._built_for = scheduler, optimizer
            if self._pending_state is not None:
                self._load_scheduler_state(self._pending_state)
                self._pending_state = None

    def ready_to_build(self) -> bool:
        """Whether the scheduler can be built now; False for a schedule that needs the fit's length
        (:func:`fit_has_started`) while it is unknown, i.e. when registered before ``fit`` (it is then built in
        ``on_train_begin``)."""
        return True

    def steps_at_epoch_end(self) -> bool:
        """Whether this callback steps its scheduler after every epoch."""
        return True

    def _refuse_update_schedule_per_epoch(self, scheduler: Any) -> None:
        if self.steps_at_epoch_end() and is_transformers_schedule(scheduler):
            factors = [getattr(f, 'func', f) for f in getattr(scheduler, 'lr_lambdas', ())]
            # transformers names its factor functions _get_<schedule>_lr_lambda: name the function a user called.
            names = sorted({getattr(f, '__name__', type(f).__name__).strip('_').removesuffix('_lr_lambda')
                            for f in factors})
            raise ValueError(f'{type(self).__name__}: the scheduler is one of transformers\' schedules '
                             f'({type(scheduler).__name__} of {", ".join(names) or "transformers"}), which count '
                             f'optimizer updates, but this callback steps it once per epoch; step it after every '
                             f'optimizer update with LRSchedulerCallback(scheduler, interval=\'step\')')

    def build_scheduler(self, optimizer: torch.optim.Optimizer) -> Any:
        """Create the torch scheduler for ``optimizer``; subclasses with computed arguments override it."""
        return self.scheduler_class(optimizer, **self._supported_args())

    def _supported_args(self) -> Dict[str, Any]:
        # AIToolbox-era code passes verbose=True, which torch's schedulers no longer take: it only printed each
        # change, so it is dropped with a warning instead of failing the fit.
        args = dict(self.scheduler_args)
        if 'verbose' in args and isinstance(self.scheduler_class, type):
            try:
                accepted = inspect.signature(self.scheduler_class).parameters
            except (TypeError, ValueError):
                return args
            if 'verbose' not in accepted and not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
                warnings.warn(f'{type(self).__name__}: verbose={args.pop("verbose")!r} ignored: '
                              f'{self.scheduler_class.__name__} in this torch version has no verbose argument '
                              f'(LRMonitor records the learning rate in the history)', UserWarning, stacklevel=3)
        return args

    def _resolve_optimizer(self) -> Tuple[Any, int]:
        loop = self.train_loop_obj
        optimizers = loop.optimizers
        idx = self.optimizer_idx
        who = f'{type(self).__name__}'
        if idx is None:
            if len(optimizers) > 1:
                raise ValueError(f'{who}: the TrainLoop has a MultiOptimizer of {len(optimizers)} optimizers; pass '
                                 f'optimizer_idx=<index> to say which one this schedule drives (one scheduler '
                                 f'callback per optimizer)')
            return optimizers[0], 0
        if isinstance(idx, int) and not isinstance(idx, bool):
            if not 0 <= idx < len(optimizers):
                raise ValueError(f'{who}: optimizer_idx={idx} but the TrainLoop has {len(optimizers)} optimizer(s)')
            return optimizers[idx], idx
        for i, optimizer in enumerate(optimizers):
            if optimizer is idx:
                return optimizer, i
        raise ValueError(f'{who}: optimizer_idx must be an index or one of the TrainLoop\'s optimizers, got '
                         f'{type(idx).__qualname__}')

    # ---- stepping -----------------------------------------------------------------------------

    def optimizer_stepped(self) -> bool:
        """True at on_batch_end when this schedule's optimizer applied an update in this batch (not on
        gradient-accumulation micro-batches, not when the fp16 GradScaler skipped the update)."""
        return self.train_loop_obj.optimizer_update_applied(self._loop_optimizer_idx)

    def step(self) -> None:
        """Step the scheduler."""
        self.scheduler.step()

    def on_epoch_end(self) -> None:
        """Step the scheduler."""
        self.step()

    def __repr__(self) -> str:
        return f'{type(self).__name__}(optimizer_idx={self.optimizer_idx!r})'


class LRSchedulerCallback(GeneralLRSchedulerCallback):
    """Drive any torch scheduler per epoch or per optimizer update, optionally from a monitored metric.

    A schedule of transformers (``get_linear_schedule_with_warmup(...)`` and the other ``get_*_schedule*``)
    counts optimizer updates: give it ``interval='step'``; with ``interval='epoch'`` it is refused when the
    callback is registered (it would move once per epoch).

    Args:
        scheduler: a torch scheduler class or a function ``optimizer -> scheduler`` (either built as
            ``scheduler(optimizer, **kwargs)`` at registration, e.g. ``get_linear_schedule_with_warmup`` with
            ``num_warmup_steps`` and ``num_training_steps``), or a scheduler already built on the loop's optimizer.
        interval (str): 'epoch' steps after every epoch; 'step' after every real optimizer update.
        monitor (str or None): history metric passed to ``scheduler.step(value)`` (ReduceLROnPlateau); the
            schedule steps only in epochs where the metric got a new value. Needs interval='epoch'.
        optimizer_idx: see GeneralLRSchedulerCallback.
        **kwargs: arguments of the scheduler class.
    """

    def __init__(self, scheduler: Any, interval: str = 'epoch', monitor: Optional[str] = None,
                 optimizer_idx: OptimizerIdx = None, **kwargs: Any) -> None:
        super().__init__(scheduler, optimizer_idx=optimizer_idx, **kwargs)
        self.callback_name = 'Learning rate scheduler'
        self.interval = check_interval(interval, 'LRSchedulerCallback')
        self.monitor = monitor
        if monitor is not None:
            if interval != 'epoch':
                raise ValueError("LRSchedulerCallback: monitor= needs interval='epoch' (metrics are computed per "
                                 "epoch)")
            # Runs after the metric callbacks of the same band, which write the monitored value.
            self.execution_order = 1
        is_instance = isinstance(scheduler, (torch_lr_scheduler.LRScheduler, torch_lr_scheduler.ReduceLROnPlateau))
        if is_instance and kwargs:
            raise ValueError(f'LRSchedulerCallback: got a built scheduler and extra arguments {sorted(kwargs)}; '
                             f'pass either the scheduler class with its arguments or a built scheduler')
        if not is_instance and not callable(scheduler):
            raise TypeError(f'LRSchedulerCallback: scheduler must be a torch scheduler class, a function '
                            f'optimizer -> scheduler, or a scheduler object; got {type(scheduler).__qualname__}')

    def build_scheduler(self, optimizer: torch.optim.Optimizer) -> Any:
        """The given scheduler (checked to drive ``optimizer``), or one built from the class / function."""
        scheduler = self.scheduler_class
        if isinstance(scheduler, (torch_lr_scheduler.LRScheduler, torch_lr_scheduler.ReduceLROnPlateau)):
            if scheduler.optimizer is not optimizer:
                raise ValueError('LRSchedulerCallback: the given scheduler was built on an optimizer that is not '
                                 'the TrainLoop\'s (or not the one optimizer_idx selects)')
            return scheduler
        return scheduler(optimizer, **self.scheduler_args)

    def steps_at_epoch_end(self) -> bool:
        """Whether the scheduler steps after every epoch (``interval='epoch'``)."""
        return self.interval == 'epoch'

    def on_epoch_end(self) -> None:
        """Step an epoch schedule (with the monitored value, when set and recorded this epoch)."""
        if self.interval != 'epoch':
            return
        if self.monitor is None:
            self.scheduler.step()
            return
        value = self.train_loop_obj.train_history.value_in_epoch(self.monitor, self.train_loop_obj.epoch)
        if value is None:
            if not self.train_loop_obj.train_history.get(self.monitor):
                raise ValueError(f'LRSchedulerCallback: monitor {self.monitor!r} has no value in the train history; '
                                 f'found {sorted(self.train_loop_obj.train_history.keys())}')
            return
        self.scheduler.step(value)

    def on_batch_end(self) -> None:
        """Step a 'step' schedule after a real optimizer update."""
        if self.interval == 'step' and self.optimizer_stepped():
            self.scheduler.step()


class ReduceLROnPlateauScheduler(GeneralLRSchedulerCallback):
    """``ReduceLROnPlateau`` stepped with the validation loss after every epoch.

    Args:
        main_multi_loss (str or None): with a MultiLoss, the loss to follow; None follows the mean of all losses.
        **kwargs: ReduceLROnPlateau arguments (mode, factor, patience, threshold, cooldown, min_lr, eps).
    """

    def __init__(self, main_multi_loss: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(torch_lr_scheduler.ReduceLROnPlateau, **kwargs)
        self.callback_name = 'Reduce learn rate if the model hits the plateau'
        self.main_multi_loss = main_multi_loss

    def on_train_begin(self) -> None:
        """Check that the TrainLoop has a validation loader (here, before the first step, and not at registration:
        AIToolbox code registers schedulers on loops whose loaders are set later)."""
        if self.train_loop_obj.validation_loader is None:
            raise ValueError('ReduceLROnPlateauScheduler follows the validation loss, but the TrainLoop has no '
                             'validation_loader; pass one, or use ReduceLROnPlateauMetricScheduler(metric_name)')
        super().on_train_begin()

    def on_epoch_end(self) -> None:
        """Step the schedule with the validation loss."""
        val_loss = self.train_loop_obj.evaluate_loss_on_validation_set()
        if isinstance(val_loss, MultiLoss):
            if self.main_multi_loss is None:
                val_loss = torch.stack([v.reshape(()) for v in val_loss.values()]).mean()
            else:
                val_loss = val_loss[self.main_multi_loss]
        self.scheduler.step(float(val_loss))


class ReduceLROnPlateauMetricScheduler(GeneralLRSchedulerCallback):
    """``ReduceLROnPlateau`` stepped with a metric from the train history (e.g. written by
    ModelPerformanceEvaluation). It steps only in epochs where the metric got a new value, so a metric computed
    every k epochs is not counted k times.

    Args:
        metric_name (str): the history key to follow.
        **kwargs: ReduceLROnPlateau arguments; use mode='max' for accuracy-like metrics.
    """

    def __init__(self, metric_name: str, **kwargs: Any) -> None:
        super().__init__(torch_lr_scheduler.ReduceLROnPlateau, **kwargs)
        self.metric_name = metric_name
        self.callback_name = 'Reduce learn rate if the model hits the plateau based on metric in TrainLoop history'
        self.execution_order = 1     # after the metric callbacks (order 0) that write the metric

    @property
    def state_key(self) -> str:
        """The base key with ``_<metric_name>``."""
        return f'{super().state_key}_{self.metric_name}'

    def on_epoch_end(self) -> None:
        """Step the schedule with the metric's value of this epoch (when it got one)."""
        history = self.train_loop_obj.train_history
        value = history.value_in_epoch(self.metric_name, self.train_loop_obj.epoch)
        if value is None:
            if not history.get(self.metric_name):
                raise ValueError(f'ReduceLROnPlateauMetricScheduler: metric {self.metric_name!r} is missing from the '
                                 f'train history (found {sorted(history.keys())}); add the callback that computes it, '
                                 f'e.g. ModelPerformanceEvaluation')
            return
        self.scheduler.step(value)


class LambdaLRScheduler(GeneralLRSchedulerCallback):
    """``LambdaLR``: the learning rate is the initial one times ``lr_lambda(step)``.

    Args:
        lr_lambda (callable or list): factor as a function of the step count (one function per param group
            allowed).
        execute_epoch_end (bool): step after every epoch.
        execute_batch_end (bool): step after every real optimizer update.
        **kwargs: LambdaLR arguments (last_epoch).
    """

    def __init__(self, lr_lambda: Optional[LRLambda], execute_epoch_end: bool = True, execute_batch_end: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(torch_lr_scheduler.LambdaLR, **dict(kwargs, lr_lambda=lr_lambda))
        self.callback_name = 'Lambda learning rate scheduler'
        self.execute_epoch_end = execute_epoch_end
        self.execute_batch_end = execute_batch_end

    def steps_at_epoch_end(self) -> bool:
        """``execute_epoch_end``."""
        return self.execute_epoch_end

    def on_epoch_end(self) -> None:
        """Step the schedule (execute_epoch_end=True)."""
        if self.execute_epoch_end:
            self.scheduler.step()

    def on_batch_end(self) -> None:
        """Step the schedule after a real optimizer update (execute_batch_end=True)."""
        if self.execute_batch_end and self.optimizer_stepped():
            self.scheduler.step()


class StepLRScheduler(GeneralLRSchedulerCallback):
    """``StepLR`` stepped per epoch: multiply the learning rate by ``gamma`` every ``step_size`` epochs."""

    def __init__(self, step_size: int, **kwargs: Any) -> None:
        super().__init__(torch_lr_scheduler.StepLR, **dict(kwargs, step_size=step_size))
        self.callback_name = 'Step learning rate scheduler'


class MultiStepLRScheduler(GeneralLRSchedulerCallback):
    """``MultiStepLR`` stepped per epoch: multiply the learning rate by ``gamma`` at each epoch of
    ``milestones_list``."""

    def __init__(self, milestones_list: Sequence[int], **kwargs: Any) -> None:
        super().__init__(torch_lr_scheduler.MultiStepLR, **dict(kwargs, milestones=milestones_list))
        self.callback_name = 'Multi-step learning rate scheduler'


# ---- one-cycle ---------------------------------------------------------------------------------------------

class OneCycleScheduler(GeneralLRSchedulerCallback):
    """torch's ``OneCycleLR`` (the 1cycle policy), stepped after every applied optimizer update.

    The cycle's length is ``total_steps``, by default the whole run: ``loop.get_num_optimizer_updates()`` when the
    callback is registered (updates, with gradient accumulation and the last partial window of each epoch counted
    as torch would count them by hand). Once the cycle is complete, further updates (a later fit) keep the last
    rate instead of making torch raise. The other arguments are ``OneCycleLR``'s, with its defaults; note that
    ``cycle_momentum=True`` (torch's default) also cycles the optimizer's momentum / Adam's beta1.

    ``pct_start``, ``anneal_strategy``, ``cycle_momentum``, ``base_momentum``, ``max_momentum``, ``div_factor``,
    ``final_div_factor`` and ``three_phase`` are as in ``torch.optim.lr_scheduler.OneCycleLR``.

    Args:
        max_lr (float or list): the peak learning rate (one per param group allowed).
        total_steps (int or None): the cycle's length in optimizer updates; None: the whole run.
        optimizer_idx: which optimizer of a MultiOptimizer the schedule drives (see GeneralLRSchedulerCallback).
    """

    interval = 'step'

    def __init__(self, max_lr: Union[float, Sequence[float]], total_steps: Optional[int] = None,
                 pct_start: float = 0.3, anneal_strategy: str = 'cos', cycle_momentum: bool = True,
                 base_momentum: float = 0.85, max_momentum: float = 0.95, div_factor: float = 25.,
                 final_div_factor: float = 1e4, three_phase: bool = False, optimizer_idx: OptimizerIdx = None) -> None:
        check_int('total_steps', total_steps, 1, allow_none=True, who='OneCycleScheduler')
        super().__init__(torch_lr_scheduler.OneCycleLR, optimizer_idx=optimizer_idx, max_lr=max_lr,
                         pct_start=pct_start, anneal_strategy=anneal_strategy, cycle_momentum=cycle_momentum,
                         base_momentum=base_momentum, max_momentum=max_momentum, div_factor=div_factor,
                         final_div_factor=final_div_factor, three_phase=three_phase)
        self.callback_name = 'One-cycle learning rate scheduler'
        self.total_steps = total_steps

    def build_scheduler(self, optimizer: torch.optim.Optimizer) -> torch_lr_scheduler.OneCycleLR:
        """``OneCycleLR`` over ``total_steps`` (or the whole run's optimizer updates)."""
        total_steps = self.total_steps if self.total_steps is not None \
            else self.train_loop_obj.get_num_optimizer_updates()
        return torch_lr_scheduler.OneCycleLR(optimizer, total_steps=total_steps, **self.scheduler_args)

    def steps_at_epoch_end(self) -> bool:
        """False: the schedule steps per update."""
        return False

    def on_batch_end(self) -> None:
        """Step after an applied optimizer update, until the cycle is complete."""
        if self.optimizer_stepped() and self.scheduler.last_epoch < self.scheduler.total_steps:
            self.scheduler.step()

    def on_epoch_end(self) -> None:
        """Nothing: the schedule steps per update."""


# ---- warm-up schedules of AIToolbox (per optimizer update, HuggingFace formulas) ---------------------------

def _warmup_factor(step: float, num_warmup_steps: float, start_factor: float = 0.) -> float:
    return start_factor + (1. - start_factor) * step / max(1, num_warmup_steps)


class _HFWarmupScheduler(LambdaLRScheduler):
    """The warm-up schedules of AIToolbox: a LambdaLR stepped after every applied optimizer update, following
    ``lr_factor(step)``. The warm-up is ``num_warmup_steps`` or ``warmup_ratio`` of the training steps, and the
    training steps are ``num_training_steps`` or, when None, the whole fit's optimizer updates
    (``loop.get_num_optimizer_updates()``); both are resolved into ``warmup_steps`` and ``training_steps`` when the
    scheduler is built, at registration, or at the start of the fit for a callback registered before it."""

    interval = 'step'

    def __init__(self, callback_name: str, num_warmup_steps: Optional[float], num_training_steps: Optional[int],
                 warmup_ratio: Optional[float], last_epoch: int, kwargs: Dict[str, Any],
                 uses_training_steps: bool = True) -> None:
        check_warmup_arguments(type(self).__name__, num_warmup_steps, warmup_ratio, required=True)
        super().__init__(None, execute_epoch_end=False, execute_batch_end=True, last_epoch=last_epoch, **kwargs)
        self.callback_name = callback_name
        self.num_warmup_steps = num_warmup_steps
        self.num_training_steps = num_training_steps
        self.warmup_ratio = warmup_ratio
        self._uses_training_steps = uses_training_steps
        #: The resolved warm-up and training steps (None until the scheduler is built).
        self.warmup_steps: Optional[float] = None
        self.training_steps: Optional[int] = None

    def _needs_fit_length(self) -> bool:
        return self.num_training_steps is None and (self.warmup_ratio is not None or self._uses_training_steps)

    def ready_to_build(self) -> bool:
        """False while the fit's length is unknown and the schedule needs it."""
        return not self._needs_fit_length() or fit_has_started(self.train_loop_obj)

    def _fit_training_steps(self) -> int:
        if self.num_training_steps is not None:
            return self.num_training_steps
        return self.train_loop_obj.get_num_optimizer_updates()

    def lr_factor(self, step: int) -> float:
        """The learning-rate factor after ``step`` applied updates."""
        raise NotImplementedError

    def build_scheduler(self, optimizer: torch.optim.Optimizer) -> torch_lr_scheduler.LambdaLR:
        """A LambdaLR following ``lr_factor``, once the warm-up and training steps are resolved."""
        if self._needs_fit_length() or self._uses_training_steps:
            self.training_steps = self._fit_training_steps()
        self.warmup_steps = warmup_steps_for(self.num_warmup_steps, self.warmup_ratio, self._fit_training_steps)
        # A plain function, not a bound method: LambdaLR.state_dict() would try to save a method's attributes.
        return torch_lr_scheduler.LambdaLR(optimizer, **dict(self._supported_args(),
                                                             lr_lambda=lambda t: self.lr_factor(t)))

    def _resolved(self) -> Tuple[float, int]:
        assert self.warmup_steps is not None, 'build_scheduler() resolves the warm-up before the schedule is used'
        return self.warmup_steps, self.training_steps or 0


class ConstantWithWarmupScheduler(_HFWarmupScheduler):
    """Linear warm-up from 0 to the optimizer's learning rate over ``num_warmup_steps`` updates (or
    ``warmup_ratio`` of the fit's optimizer updates), then constant."""

    def __init__(self, num_warmup_steps: Optional[float] = None, last_epoch: int = -1,
                 warmup_ratio: Optional[float] = None, **kwargs: Any) -> None:
        super().__init__('Warmed up constant learning rate scheduler', num_warmup_steps, None, warmup_ratio,
                         last_epoch, kwargs, uses_training_steps=False)

    def lr_factor(self, step: int) -> float:
        """``step / warmup`` during the warm-up, then 1."""
        warmup, _ = self._resolved()
        return _warmup_factor(step, warmup) if step < warmup else 1.


class CosineWithWarmupScheduler(_HFWarmupScheduler):
    """Linear warm-up over ``num_warmup_steps`` updates (or ``warmup_ratio`` of the training steps), then cosine
    decay to 0 at ``num_training_steps`` (None: the fit's optimizer updates); ``num_cycles=0.5`` is half a cosine
    wave."""

    def __init__(self, num_warmup_steps: Optional[float] = None, num_training_steps: Optional[int] = None,
                 num_cycles: float = 0.5, last_epoch: int = -1, warmup_ratio: Optional[float] = None,
                 **kwargs: Any) -> None:
        super().__init__('Warmed up cosine decreasing learning rate scheduler', num_warmup_steps, num_training_steps,
                         warmup_ratio, last_epoch, kwargs)
        self.num_cycles = num_cycles

    def lr_factor(self, step: int) -> float:
        """The warm-up, then ``0.5 (1 + cos(2 pi num_cycles progress))``."""
        warmup, total = self._resolved()
        if step < warmup:
            return _warmup_factor(step, warmup)
        progress = (step - warmup) / max(1, total - warmup)
        return max(0., 0.5 * (1. + math.cos(math.pi * float(self.num_cycles) * 2. * progress)))


class HardRestartsCosineWithWarmupScheduler(_HFWarmupScheduler):
    """Linear warm-up, then ``num_cycles`` cosine decays to 0, each restarting at the full learning rate, ending at
    ``num_training_steps`` (None: the fit's optimizer updates)."""

    def __init__(self, num_warmup_steps: Optional[float] = None, num_training_steps: Optional[int] = None,
                 num_cycles: float = 0.5, last_epoch: int = -1, warmup_ratio: Optional[float] = None,
                 **kwargs: Any) -> None:
        super().__init__('Warmed up hard restarts cosine learning rate scheduler', num_warmup_steps,
                         num_training_steps, warmup_ratio, last_epoch, kwargs)
        self.num_cycles = num_cycles

    def lr_factor(self, step: int) -> float:
        """The warm-up, then cosine decays with hard restarts, 0 after the training steps."""
        warmup, total = self._resolved()
        if step < warmup:
            return _warmup_factor(step, warmup)
        progress = (step - warmup) / max(1, total - warmup)
        if progress >= 1.:
            return 0.
        return max(0., 0.5 * (1. + math.cos(math.pi * ((float(self.num_cycles) * progress) % 1.))))


class LinearWithWarmupScheduler(_HFWarmupScheduler):
    """Linear warm-up over ``num_warmup_steps`` updates (or ``warmup_ratio`` of the training steps), then linear
    decay to 0 at ``num_training_steps`` (None: the fit's optimizer updates). transformers' default schedule:
    ``LinearWithWarmupScheduler(warmup_ratio=r)`` is ``TrainingArguments(warmup_steps=r)`` (``warmup_ratio=r`` before
    transformers 5)."""

    def __init__(self, num_warmup_steps: Optional[float] = None, num_training_steps: Optional[int] = None,
                 last_epoch: int = -1, warmup_ratio: Optional[float] = None, **kwargs: Any) -> None:
        super().__init__('Warmed up linearly decreasing learning rate scheduler', num_warmup_steps,
                         num_training_steps, warmup_ratio, last_epoch, kwargs)

    def lr_factor(self, step: int) -> float:
        """The warm-up, then ``(training_steps - step) / (training_steps - warmup)``, not below 0."""
        warmup, total = self._resolved()
        if step < warmup:
            return _warmup_factor(step, warmup)
        return max(0., (total - step) / max(1, total - warmup))


# ---- warm-up + decay schedules, per epoch or per update ---------------------------------------------------

class _WarmupDecayScheduler(LambdaLRScheduler):
    """factor(t) = linear warm-up from ``warmup_start_factor`` to 1 for t < W, then ``decay(t - W)``. W is
    ``num_warmup_steps`` or ``ceil(warmup_ratio x total steps)``, resolved into ``warmup_steps`` when the scheduler
    is built."""

    def __init__(self, callback_name: str, interval: str, num_warmup_steps: Optional[int], warmup_start_factor: float,
                 optimizer_idx: OptimizerIdx, warmup_ratio: Optional[float] = None) -> None:
        interval = check_interval(interval, type(self).__name__)
        check_int('num_warmup_steps', num_warmup_steps, 0, allow_none=True, who=type(self).__name__)
        check_warmup_arguments(type(self).__name__, num_warmup_steps, warmup_ratio, required=False)
        if not 0. <= warmup_start_factor <= 1.:
            raise ValueError(f'{type(self).__name__}: warmup_start_factor must be in [0, 1], got {warmup_start_factor}')
        super().__init__(None, execute_epoch_end=interval == 'epoch', execute_batch_end=interval == 'step',
                         optimizer_idx=optimizer_idx)
        self.callback_name = callback_name
        self.interval = interval
        self.num_warmup_steps = num_warmup_steps
        self.warmup_ratio = warmup_ratio
        self.warmup_start_factor = warmup_start_factor
        self.num_training_steps: Optional[int] = None
        #: The resolved warm-up (None until the scheduler is built).
        self.warmup_steps: Optional[int] = None

    def decay(self, t: int) -> float:
        """The factor ``t`` steps after the warm-up (1 here: constant)."""
        return 1.

    def _needs_fit_length(self) -> bool:
        return self.num_training_steps is None and self.warmup_ratio is not None

    def ready_to_build(self) -> bool:
        """False while the fit's length is unknown and the schedule needs it."""
        return not self._needs_fit_length() or fit_has_started(self.train_loop_obj)

    def prepare(self) -> None:
        """Resolve arguments that need the running fit (the warm-up of a ``warmup_ratio``, the number of training
        steps)."""
        self.warmup_steps = int(warmup_steps_for(self.num_warmup_steps, self.warmup_ratio, self._total_steps))

    def _total_steps(self) -> int:
        if self.num_training_steps is not None:
            return self.num_training_steps
        loop = self.train_loop_obj
        if self.interval == 'step':
            return loop.get_num_optimizer_updates()
        if loop.num_epochs is None:
            raise ValueError(f'{type(self).__name__}: the number of epochs is unknown (a train loader without len()); '
                             f'pass num_training_steps')
        return loop.num_epochs

    def lr_factor(self, t: int) -> float:
        """The learning-rate factor at step ``t``: the warm-up, then ``decay``."""
        w = self.warmup_steps
        assert w is not None, 'prepare() runs before the scheduler uses lr_factor()'
        if t < w:
            return _warmup_factor(t, w, self.warmup_start_factor)
        return self.decay(t - w)

    def build_scheduler(self, optimizer: torch.optim.Optimizer) -> torch_lr_scheduler.LambdaLR:
        """A LambdaLR following ``lr_factor``."""
        self.prepare()
        # A plain function, not a bound method: LambdaLR.state_dict() would try to save a method's attributes.
        return torch_lr_scheduler.LambdaLR(optimizer, lambda t: self.lr_factor(t))


class LinearWarmupScheduler(_WarmupDecayScheduler):
    """Linear warm-up from ``start_factor`` x lr to lr over ``num_warmup_steps`` epochs (interval='epoch') or
    optimizer updates (interval='step'), or over ``warmup_ratio`` of the fit's epochs / updates, then constant."""

    def __init__(self, num_warmup_steps: Optional[int] = None, interval: str = 'step', start_factor: float = 0.,
                 optimizer_idx: OptimizerIdx = None, warmup_ratio: Optional[float] = None) -> None:
        check_warmup_arguments('LinearWarmupScheduler', num_warmup_steps, warmup_ratio, required=True)
        super().__init__('Linear warm-up learning rate scheduler', interval, num_warmup_steps, start_factor,
                         optimizer_idx, warmup_ratio)


class ExponentialScheduler(_WarmupDecayScheduler):
    """lr x ``gamma ** t`` after an optional linear warm-up (``num_warmup_steps``, or ``warmup_ratio`` of the fit's
    epochs / updates)."""

    def __init__(self, gamma: float, interval: str = 'epoch', num_warmup_steps: Optional[int] = None,
                 warmup_start_factor: float = 0., optimizer_idx: OptimizerIdx = None,
                 warmup_ratio: Optional[float] = None) -> None:
        super().__init__('Exponential learning rate scheduler', interval, num_warmup_steps, warmup_start_factor,
                         optimizer_idx, warmup_ratio)
        self.gamma = gamma

    def decay(self, t: int) -> float:
        """``gamma ** t``."""
        return self.gamma ** t


class _DecayToMinScheduler(_WarmupDecayScheduler):
    """Decay from lr to ``min_lr_factor`` x lr over the ``num_training_steps - warmup`` steps after the
    warm-up (``num_training_steps`` None: the whole fit, in updates or epochs per interval), then constant."""

    def __init__(self, callback_name: str, num_training_steps: Optional[int], min_lr_factor: float, interval: str,
                 num_warmup_steps: Optional[int], warmup_start_factor: float, optimizer_idx: OptimizerIdx,
                 warmup_ratio: Optional[float]) -> None:
        super().__init__(callback_name, interval, num_warmup_steps, warmup_start_factor, optimizer_idx, warmup_ratio)
        self.num_training_steps = num_training_steps
        self.min_lr_factor = min_lr_factor
        self._decay_steps: Optional[int] = None     # set by prepare(), when the scheduler is built

    def _needs_fit_length(self) -> bool:
        return self.num_training_steps is None

    def prepare(self) -> None:
        """Resolve the warm-up and the number of decay steps from the fit."""
        super().prepare()
        assert self.warmup_steps is not None
        self._decay_steps = max(1, self._total_steps() - self.warmup_steps)

    def _decay_steps_set(self) -> int:
        decay_steps = self._decay_steps
        assert decay_steps is not None, 'prepare() runs before the scheduler uses decay()'
        return decay_steps


class PolynomialScheduler(_DecayToMinScheduler):
    """Polynomial decay ``(1 - t / T) ** power`` from lr to ``min_lr_factor`` x lr over the steps after an optional
    warm-up (``num_warmup_steps``, or ``warmup_ratio`` of the training steps); ``num_training_steps`` None means the
    whole fit (updates or epochs, per interval)."""

    def __init__(self, num_training_steps: Optional[int] = None, power: float = 1., min_lr_factor: float = 0.,
                 interval: str = 'step', num_warmup_steps: Optional[int] = None, warmup_start_factor: float = 0.,
                 optimizer_idx: OptimizerIdx = None, warmup_ratio: Optional[float] = None) -> None:
        super().__init__('Polynomial learning rate scheduler', num_training_steps, min_lr_factor, interval,
                         num_warmup_steps, warmup_start_factor, optimizer_idx, warmup_ratio)
        self.power = power

    def decay(self, t: int) -> float:
        """Polynomial decay to ``min_lr_factor``."""
        decay_steps = self._decay_steps_set()
        remaining = 1. - min(t, decay_steps) / decay_steps
        return self.min_lr_factor + (1. - self.min_lr_factor) * remaining ** self.power


class CosineScheduler(_DecayToMinScheduler):
    """Cosine decay from lr to ``min_lr_factor`` x lr over the steps after an optional warm-up (``num_warmup_steps``,
    or ``warmup_ratio`` of the training steps), then constant; ``num_training_steps`` None means the whole fit
    (updates or epochs, per interval)."""

    def __init__(self, num_training_steps: Optional[int] = None, min_lr_factor: float = 0., interval: str = 'step',
                 num_warmup_steps: Optional[int] = None, warmup_start_factor: float = 0.,
                 optimizer_idx: OptimizerIdx = None, warmup_ratio: Optional[float] = None) -> None:
        super().__init__('Cosine learning rate scheduler', num_training_steps, min_lr_factor, interval,
                         num_warmup_steps, warmup_start_factor, optimizer_idx, warmup_ratio)

    def decay(self, t: int) -> float:
        """Cosine decay to ``min_lr_factor``."""
        decay_steps = self._decay_steps_set()
        cosine = 0.5 * (1. + math.cos(math.pi * min(t, decay_steps) / decay_steps))
        return self.min_lr_factor + (1. - self.min_lr_factor) * cosine


class FunctionScheduler(_WarmupDecayScheduler):
    """The learning rate is ``lr_fn(t, initial_lr)`` at step t (an epoch or an optimizer update, per interval)."""

    def __init__(self, lr_fn: Callable[[int, float], float], interval: str = 'epoch',
                 optimizer_idx: OptimizerIdx = None) -> None:
        if not callable(lr_fn):
            raise TypeError(f'FunctionScheduler: lr_fn must be a function (step, initial_lr) -> lr, got '
                            f'{type(lr_fn).__qualname__}')
        super().__init__('Function learning rate scheduler', interval, None, 0., optimizer_idx)
        self.lr_fn = lr_fn

    def build_scheduler(self, optimizer: torch.optim.Optimizer) -> torch_lr_scheduler.LambdaLR:
        """A LambdaLR with one factor function per param group: ``lr_fn(t, initial_lr) / initial_lr``."""
        base_lrs = [group.get('initial_lr', group['lr']) for group in optimizer.param_groups]
        if any(lr == 0 for lr in base_lrs):
            raise ValueError('FunctionScheduler: a param group has lr=0; lr_fn gets the initial lr, so set a '
                             'non-zero lr on the optimizer')
        def scaled(base: float) -> Callable[[int], float]:
            # A plain function per group (a lambda, as LambdaLR.state_dict expects), bound to its initial lr.
            return lambda t: self.lr_fn(t, base) / base
        return torch_lr_scheduler.LambdaLR(optimizer, [scaled(base) for base in base_lrs])


# ---- learning rate into the history ----------------------------------------------------------------------

class LRMonitor(AbstractCallback):
    """Writes the learning rate of every param group into the train history at the start of every epoch (the
    rate the epoch's first update uses). Key ``'lr'`` when the loop has one param group in total, else
    ``'lr_<optimizer_idx>_<group_idx>'``. Added by default to every fit with a scheduler callback
    (callbacks/defaults.py); only one LRMonitor per loop writes."""

    def __init__(self) -> None:
        super().__init__('Learning rate monitor', execution_order=0)
        self._active = True

    def on_train_begin(self) -> None:
        """Only the loop's first LRMonitor writes."""
        first = next(cb for cb in self.train_loop_obj.callbacks if isinstance(cb, LRMonitor))
        self._active = first is self

    def on_epoch_begin(self) -> None:
        """Write the learning rates into the train history."""
        if not self._active:
            return
        loop = self.train_loop_obj
        groups = [(o, g, group['lr']) for o, optimizer in enumerate(loop.optimizers)
                  for g, group in enumerate(getattr(optimizer, 'param_groups', ()))]
        if len(groups) == 1:
            loop.insert_metric_result_into_history('lr', float(groups[0][2]))
            return
        for o, g, lr in groups:
            loop.insert_metric_result_into_history(f'lr_{o}_{g}', float(lr))
