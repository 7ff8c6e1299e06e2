"""What a callback asks of the run it is in, beyond its own state: leave the optimizer update of this step out
(``TrainLoop.skip_update()``) and end the epoch after this batch (``TrainLoop.end_epoch()``).

One rank's request is every rank's: in a distributed fit the ranks agree on each request before acting on it, so
that they never diverge (a rank that stepped its optimizer when another did not would train other weights from then
on, silently). The agreement is one all-reduce (MAX) of a flag over a CPU (gloo) group: no device synchronisation.
It is made only in fits where a registered callback (or the model owning ``train_step``) declares that it may ask,
with ``may_skip_updates = True`` / ``may_end_epochs = True``; the ranks learn at the start of the fit whether any of
them has one (a callback may run on one rank only). Without such a callback a step costs a flag check.
"""
import logging
from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.distributed as dist

from .. import distributed

if TYPE_CHECKING:
    from .train_loop import TrainLoop

logger = logging.getLogger('aitoolbox_like.train_loop')


class StepRequestError(RuntimeError):
    """``skip_update()`` or ``end_epoch()`` called where it cannot take effect (too late in the step, outside fit,
    or in a distributed fit where the ranks cannot agree on it)."""


class RunSteering:
    """The requests of the current fit (``loop.steering``): whether this step's update is to be left out, whether the
    epoch ends after this batch, and the ranks' agreement on both."""

    def __init__(self, loop: 'TrainLoop') -> None:
        self.loop = loop
        #: skip_update() was called: the next optimizer update is left out.
        self.skip_requested = False
        #: end_epoch() was called: the epoch ends after the current batch.
        self.end_epoch_requested = False
        #: In a distributed fit, whether the ranks agree on skips / on epoch ends (decided at the start of fit).
        self.agree_skips = False
        self.agree_epoch_ends = False
        #: total_iteration_idx of the batch whose update point (the moment skips are decided) passed last, and of
        #: the batch whose update was left out last.
        self.decided_in = -2
        self.skipped_in = -2
        #: True from the update point to the end of that update (a skip asked for then comes too late).
        self.in_update = False
        #: Updates left out in this fit.
        self.skipped_updates = 0
        #: restart_from(): the epoch the loop reopens after this batch, or None.
        self.restart_epoch: Optional[int] = None
        self._group: Any = None

    # ---- the start and the end of a fit ---------------------------------------------------------------------

    def start(self) -> None:
        """At the start of a fit, once every callback is registered: forget earlier requests and, in a distributed
        fit, agree whether any rank may ask (every rank calls it at the same point: one small collective)."""
        self.skip_requested = self.end_epoch_requested = self.in_update = False
        self.decided_in = self.skipped_in = -2
        self.restart_epoch = None
        self.skipped_updates = 0
        loop = self.loop
        owners = list(loop.callbacks) + ([loop.train_step_owner] if loop.train_step_owner is not None else [])
        may_skip = any(getattr(owner, 'may_skip_updates', False) is True for owner in owners)
        may_end = any(getattr(owner, 'may_end_epochs', False) is True for owner in owners)
        if loop.world_size > 1:
            flags = torch.tensor([int(may_skip), int(may_end)], dtype=torch.int64,
                                 device=distributed.collective_device(loop.device))
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            may_skip, may_end = (bool(v) for v in flags.tolist())
            if (may_skip or may_end) and self._group is None:
                # A CPU group: flags are reduced without touching the device.
                self._group = dist.group.WORLD if dist.get_backend() == 'gloo' else dist.new_group(backend='gloo')
        self.agree_skips = loop.world_size > 1 and may_skip
        self.agree_epoch_ends = loop.world_size > 1 and may_end

    def finish(self) -> None:
        """At the end of a fit: no process group outlives it (see PreemptionCheckpoint._finish_agreement)."""
        self._group = None
        self.agree_skips = self.agree_epoch_ends = False

    # ---- requests ---------------------------------------------------------------------------------------------

    def request_skip(self) -> None:
        loop = self.loop
        if not loop.epochs_running:
            raise StepRequestError('skip_update() leaves out the optimizer update of a training step: call it during '
                                   'fit, from on_after_loss, on_after_backward or on_after_gradient_update (or a '
                                   'train_step before step_optimizers())')
        if self.in_update or (self.decided_in == loop.total_iteration_idx and loop.train_step_owner is None):
            raise StepRequestError(
                f'skip_update() came after the optimizer update of batch {loop.total_iteration_idx} began (or ended): '
                f'call it from on_after_loss, on_after_backward or on_after_gradient_update of the first optimizer to '
                f'step, before any optimizer steps')
        self._check_agreement(self.agree_skips, 'skip_update()', 'may_skip_updates')
        self.skip_requested = True

    def request_end_epoch(self) -> None:
        loop = self.loop
        if not loop.epochs_running:
            raise StepRequestError('end_epoch() ends the epoch being trained: call it during fit, from a hook between '
                                   'on_epoch_begin and on_batch_end')
        self._check_agreement(self.agree_epoch_ends, 'end_epoch()', 'may_end_epochs')
        self.end_epoch_requested = True

    def _check_agreement(self, agreed: bool, what: str, flag: str) -> None:
        loop = self.loop
        if loop.world_size > 1 and not agreed:
            raise StepRequestError(
                f'{what} in a fit of {loop.world_size} processes: every rank must act on it, so the ranks agree on it '
                f'at each step, which they do only when a registered callback declares it may ask. Set the class '
                f'attribute {flag} = True on the callback that calls {what} (or on the model owning train_step)')

    # ---- decisions --------------------------------------------------------------------------------------------

    def decide_skip(self) -> bool:
        """At the update point (after on_after_gradient_update of the first optimizer to step, before it steps):
        whether this update is left out, agreed by every rank in a distributed fit."""
        loop = self.loop
        skip = self.skip_requested
        if self.agree_skips:
            skip = self._agree(skip)
        self.skip_requested = False
        if skip:
            self.skipped_in = loop.total_iteration_idx
            self.skipped_updates += 1
            logger.debug('the optimizer update of batch %d is left out (skip_update())', loop.total_iteration_idx)
        return skip

    def decide_end_epoch(self) -> bool:
        """After a batch's step (before its on_batch_end) and after its on_batch_end: whether the epoch ends after
        this batch, agreed by every rank in a distributed fit."""
        end = self.end_epoch_requested
        if self.agree_epoch_ends:
            end = self._agree(end)
        return end

    def _agree(self, flag: bool) -> bool:
        value = torch.tensor([1 if flag else 0], dtype=torch.int64)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self._group)
        return bool(value[0])


def close_window_across_ranks(loop: 'TrainLoop', ddp_model: Optional[torch.nn.Module]) -> None:
    """DDP: the gradients of a gradient-accumulation window that ends early (end_epoch() inside it) were accumulated
    under ``no_sync``; average them over the ranks as DDP's reducer does at the window's last micro-batch (each
    gradient divided by the world size, then summed), so the update is the same on every rank."""
    if ddp_model is None or loop.world_size == 1:
        return
    world_size = loop.world_size
    for param in loop.model.parameters():
        if param.grad is not None:
            param.grad.div_(world_size)
            dist.all_reduce(param.grad)
