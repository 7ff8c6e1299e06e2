"""Learning-rate schedule callbacks.

Every scheduler callback wraps one ``torch.optim.lr_scheduler`` object (``self.scheduler``) bound to one
optimizer of the loop, and steps it either at the end of every epoch or after every optimizer update.
Update-level ("step") schedules advance only when the optimizer really stepped: not on gradient-accumulation
micro-batches and not when the fp16 GradScaler skipped the update because of inf/NaN gradients.

A fit with any scheduler also gets one :class:`LRMonitor` (added by callbacks/defaults.py), which writes the
learning rate of every parameter group into the train history once per epoch.

The scheduler callbacks are defined in ``lr_schedulers`` (torch's schedulers) and ``warmup_schedules`` (schedules
as factors of the step count), and importable from here.
"""
import logging

from .abstract import AbstractCallback
# AbstractScheduler, the scheduler callbacks and the schedules, importable from here where AIToolbox has them.
from .abstract import AbstractScheduler
from .lr_schedulers import (INTERVALS, GeneralLRSchedulerCallback, LambdaLRScheduler, LRLambda, LRSchedulerCallback,
                            MultiStepLRScheduler, OneCycleScheduler, OptimizerIdx, ReduceLROnPlateauMetricScheduler,
                            ReduceLROnPlateauScheduler, StepLRScheduler)
from .warmup_schedules import (ConstantWithWarmupScheduler, CosineScheduler, CosineWithWarmupScheduler,
                               ExponentialScheduler, FunctionScheduler, HardRestartsCosineWithWarmupScheduler,
                               LinearWarmupScheduler, LinearWithWarmupScheduler, PolynomialScheduler)

logger = logging.getLogger(__name__)


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
