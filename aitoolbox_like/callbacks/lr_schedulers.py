"""The scheduler callbacks over torch's schedulers (AIToolbox's ``schedulers.basic``): any
``torch.optim.lr_scheduler`` class stepped per epoch or per applied update (:class:`GeneralLRSchedulerCallback`,
:class:`LRSchedulerCallback`), and AIToolbox's named ones (ReduceLROnPlateau, LambdaLR, StepLR, MultiStepLR,
OneCycle). How they step: :mod:`aitoolbox_like.callbacks.train_schedule`, which re-exports them."""
import inspect
import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence, Tuple, Union

import torch
from torch.optim import lr_scheduler as torch_lr_scheduler

from ..multi_loss_optim import MultiLoss
from ._common import check_int
from .abstract import AbstractCallback, AbstractScheduler

if TYPE_CHECKING:
    from ..engine.train_loop import TrainLoop

#: When a schedule steps: after every epoch, or after every optimizer update that was applied.
INTERVALS = ('epoch', 'step')

#: Which optimizer of the loop a schedule drives: its index, the optimizer itself, or None (the only one).
OptimizerIdx = Union[int, torch.optim.Optimizer, None]
#: ``LambdaLR``'s factor function(s) of the step count.
LRLambda = Union[Callable[[int], float], Sequence[Callable[[int], float]]]


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
        optimizer, loop_idx = self._resolve_optimizer()
        if self.scheduler is None or self._built_for is not optimizer:
            self.optimizer, self._loop_optimizer_idx, self._built_for = optimizer, loop_idx, optimizer
            self.scheduler = self.build_scheduler(optimizer)
            if self._pending_state is not None:
                self._load_scheduler_state(self._pending_state)
                self._pending_state = None

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

    Args:
        scheduler: a torch scheduler class (built with ``**kwargs`` at registration), a function
            ``optimizer -> scheduler``, or a scheduler already built on the loop's optimizer.
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
        if isinstance(scheduler, type):
            return scheduler(optimizer, **self.scheduler_args)
        return scheduler(optimizer)

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

    def on_batch_end(self) -> None:
        """Step after an applied optimizer update, until the cycle is complete."""
        if self.optimizer_stepped() and self.scheduler.last_epoch < self.scheduler.total_steps:
            self.scheduler.step()

    def on_epoch_end(self) -> None:
        """Nothing: the schedule steps per update."""
