"""Schedules written as a factor of the step count, on LambdaLR: AIToolbox's warm-up schedules (per optimizer
update, HuggingFace's formulas) and warm-up + decay schedules per epoch or per update (re-exported by
:mod:`aitoolbox_like.callbacks.train_schedule`)."""
import math
from typing import Any, Callable, Optional

import torch
from torch.optim import lr_scheduler as torch_lr_scheduler

from ._common import check_int
from .lr_schedulers import LambdaLRScheduler, OptimizerIdx, check_interval

# ---- warm-up schedules of AIToolbox (per optimizer update, HuggingFace formulas) ---------------------------

def _warmup_factor(step: float, num_warmup_steps: int, start_factor: float = 0.) -> float:
    return start_factor + (1. - start_factor) * step / max(1, num_warmup_steps)


class ConstantWithWarmupScheduler(LambdaLRScheduler):
    """Linear warm-up from 0 to the optimizer's learning rate over ``num_warmup_steps`` updates, then constant."""

    def __init__(self, num_warmup_steps: int, last_epoch: int = -1, **kwargs: Any) -> None:
        def lr_lambda(step: int) -> float:
            return _warmup_factor(step, num_warmup_steps) if step < num_warmup_steps else 1.
        super().__init__(lr_lambda, execute_epoch_end=False, execute_batch_end=True, last_epoch=last_epoch, **kwargs)
        self.callback_name = 'Warmed up constant learning rate scheduler'


class CosineWithWarmupScheduler(LambdaLRScheduler):
    """Linear warm-up over ``num_warmup_steps`` updates, then cosine decay to 0 at ``num_training_steps``
    (``num_cycles=0.5``: half a cosine wave)."""

    def __init__(self, num_warmup_steps: int, num_training_steps: int, num_cycles: float = 0.5, last_epoch: int = -1,
                 **kwargs: Any) -> None:
        def lr_lambda(step: int) -> float:
            if step < num_warmup_steps:
                return _warmup_factor(step, num_warmup_steps)
            progress = (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)
            return max(0., 0.5 * (1. + math.cos(math.pi * float(num_cycles) * 2. * progress)))
        super().__init__(lr_lambda, execute_epoch_end=False, execute_batch_end=True, last_epoch=last_epoch, **kwargs)
        self.callback_name = 'Warmed up cosine decreasing learning rate scheduler'


class HardRestartsCosineWithWarmupScheduler(LambdaLRScheduler):
    """Linear warm-up, then ``num_cycles`` cosine decays to 0, each restarting at the full learning rate."""

    def __init__(self, num_warmup_steps: int, num_training_steps: int, num_cycles: float = 0.5, last_epoch: int = -1,
                 **kwargs: Any) -> None:
        def lr_lambda(step: int) -> float:
            if step < num_warmup_steps:
                return _warmup_factor(step, num_warmup_steps)
            progress = (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)
            if progress >= 1.:
                return 0.
            return max(0., 0.5 * (1. + math.cos(math.pi * ((float(num_cycles) * progress) % 1.))))
        super().__init__(lr_lambda, execute_epoch_end=False, execute_batch_end=True, last_epoch=last_epoch, **kwargs)
        self.callback_name = 'Warmed up hard restarts cosine learning rate scheduler'


class LinearWithWarmupScheduler(LambdaLRScheduler):
    """Linear warm-up over ``num_warmup_steps`` updates, then linear decay to 0 at ``num_training_steps``."""

    def __init__(self, num_warmup_steps: int, num_training_steps: int, last_epoch: int = -1,
                 **kwargs: Any) -> None:
        def lr_lambda(step: int) -> float:
            if step < num_warmup_steps:
                return _warmup_factor(step, num_warmup_steps)
            return max(0., (num_training_steps - step) / max(1, num_training_steps - num_warmup_steps))
        super().__init__(lr_lambda, execute_epoch_end=False, execute_batch_end=True, last_epoch=last_epoch, **kwargs)
        self.callback_name = 'Warmed up linearly decreasing learning rate scheduler'


# ---- warm-up + decay schedules, per epoch or per update ---------------------------------------------------

class _WarmupDecayScheduler(LambdaLRScheduler):
    """factor(t) = linear warm-up from ``warmup_start_factor`` to 1 for t < W, then ``decay(t - W)``."""

    def __init__(self, callback_name: str, interval: str, num_warmup_steps: int, warmup_start_factor: float,
                 optimizer_idx: OptimizerIdx) -> None:
        interval = check_interval(interval, type(self).__name__)
        check_int('num_warmup_steps', num_warmup_steps, 0, who=type(self).__name__)
        if not 0. <= warmup_start_factor <= 1.:
            raise ValueError(f'{type(self).__name__}: warmup_start_factor must be in [0, 1], got {warmup_start_factor}')
        super().__init__(None, execute_epoch_end=interval == 'epoch', execute_batch_end=interval == 'step',
                         optimizer_idx=optimizer_idx)
        self.callback_name = callback_name
        self.interval = interval
        self.num_warmup_steps = num_warmup_steps
        self.warmup_start_factor = warmup_start_factor

    def decay(self, t: int) -> float:
        """The factor ``t`` steps after the warm-up (1 here: constant)."""
        return 1.

    def prepare(self) -> None:
        """Resolve arguments that need the running fit (e.g. the number of training steps)."""

    def lr_factor(self, t: int) -> float:
        """The learning-rate factor at step ``t``: the warm-up, then ``decay``."""
        w = self.num_warmup_steps
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
    optimizer updates (interval='step'), then constant."""

    def __init__(self, num_warmup_steps: int, interval: str = 'step', start_factor: float = 0.,
                 optimizer_idx: OptimizerIdx = None) -> None:
        super().__init__('Linear warm-up learning rate scheduler', interval, num_warmup_steps, start_factor,
                         optimizer_idx)


class ExponentialScheduler(_WarmupDecayScheduler):
    """lr x ``gamma ** t`` after an optional linear warm-up."""

    def __init__(self, gamma: float, interval: str = 'epoch', num_warmup_steps: int = 0,
                 warmup_start_factor: float = 0., optimizer_idx: OptimizerIdx = None) -> None:
        super().__init__('Exponential learning rate scheduler', interval, num_warmup_steps, warmup_start_factor,
                         optimizer_idx)
        self.gamma = gamma

    def decay(self, t: int) -> float:
        """``gamma ** t``."""
        return self.gamma ** t


class _DecayToMinScheduler(_WarmupDecayScheduler):
    """Decay from lr to ``min_lr_factor`` x lr over the ``num_training_steps - num_warmup_steps`` steps after the
    warm-up (``num_training_steps`` None: the whole fit, in updates or epochs per interval), then constant."""

    def __init__(self, callback_name: str, num_training_steps: Optional[int], min_lr_factor: float, interval: str,
                 num_warmup_steps: int, warmup_start_factor: float, optimizer_idx: OptimizerIdx) -> None:
        super().__init__(callback_name, interval, num_warmup_steps, warmup_start_factor, optimizer_idx)
        self.num_training_steps = num_training_steps
        self.min_lr_factor = min_lr_factor
        self._decay_steps: Optional[int] = None     # set by prepare(), when the scheduler is built

    def prepare(self) -> None:
        """Resolve the number of decay steps from the fit."""
        self._decay_steps = max(1, self._total_steps() - self.num_warmup_steps)

    def _decay_steps_set(self) -> int:
        decay_steps = self._decay_steps
        assert decay_steps is not None, 'prepare() runs before the scheduler uses decay()'
        return decay_steps

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


class PolynomialScheduler(_DecayToMinScheduler):
    """Polynomial decay ``(1 - t / T) ** power`` from lr to ``min_lr_factor`` x lr over the steps after an optional
    warm-up; ``num_training_steps`` None means the whole fit (updates or epochs, per interval)."""

    def __init__(self, num_training_steps: Optional[int] = None, power: float = 1., min_lr_factor: float = 0.,
                 interval: str = 'step', num_warmup_steps: int = 0, warmup_start_factor: float = 0.,
                 optimizer_idx: OptimizerIdx = None) -> None:
        super().__init__('Polynomial learning rate scheduler', num_training_steps, min_lr_factor, interval,
                         num_warmup_steps, warmup_start_factor, optimizer_idx)
        self.power = power

    def decay(self, t: int) -> float:
        """Polynomial decay to ``min_lr_factor``."""
        decay_steps = self._decay_steps_set()
        remaining = 1. - min(t, decay_steps) / decay_steps
        return self.min_lr_factor + (1. - self.min_lr_factor) * remaining ** self.power


class CosineScheduler(_DecayToMinScheduler):
    """Cosine decay from lr to ``min_lr_factor`` x lr over the steps after an optional warm-up (then constant);
    ``num_training_steps`` None means the whole fit (updates or epochs, per interval)."""

    def __init__(self, num_training_steps: Optional[int] = None, min_lr_factor: float = 0., interval: str = 'step',
                 num_warmup_steps: int = 0, warmup_start_factor: float = 0.,
                 optimizer_idx: OptimizerIdx = None) -> None:
        super().__init__('Cosine learning rate scheduler', num_training_steps, min_lr_factor, interval,
                         num_warmup_steps, warmup_start_factor, optimizer_idx)

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
        super().__init__('Function learning rate scheduler', interval, 0, 0., optimizer_idx)
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
