"""One training step of TrainLoop, as the algorithm reads: forward under autocast, the loss kept for the epoch
(detached, no host sync), backward (divided for gradient accumulation, scaled under fp16), then on update steps
the optimizer update (unscale once, per optimizer: gradient hooks, step, zero_grad; the scaler's update), and
the same pieces for a custom ``train_step``; the counts of updates schedulers size themselves by."""
import math
import numbers
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import torch

from .. import distributed
from ..callbacks.abstract import AbstractCallback, AbstractScheduler
from ..callbacks.handler import CallbacksHandler

if TYPE_CHECKING:
    from ..amp import AmpPolicy
    from ..model import BatchFeed


class StepMixin:
    """TrainLoop's training step (a part of TrainLoop; the run state it uses is declared in TrainLoop.__init__)."""

    if TYPE_CHECKING:   # what this part uses of TrainLoop: run state (declared in its __init__), other parts
        model: torch.nn.Module
        criterion: Any
        device: torch.device
        train_loader: Any
        batch_model_feed_def: Any
        num_epochs: Optional[int]
        num_iterations: Optional[int]
        grad_accumulation: int
        iteration: int
        loss: Any
        train_step_owner: Any
        optimizer_idx: int
        update_applied: List[bool]
        loss_batch_accum: List[Any]
        ddp_model: Optional[torch.nn.Module]
        amp_scaler: torch.amp.GradScaler
        callbacks: List[AbstractCallback]
        callbacks_handler: CallbacksHandler
        _feed: 'BatchFeed'
        _amp: 'AmpPolicy'
        _epochs_running: bool
        _is_last_batch: bool
        _step_counters: Dict[int, Tuple[Any, Optional[List[int]]]]
        _last_amp_scale: Optional[float]

        @property
        def optimizers(self) -> Sequence[Any]: ...

    def _train_step(self, batch_data):
        # The per-step path: hook lists are read directly (no dispatch method per hook) and nothing here
        # reads a tensor value on the host.
        hooks = self.callbacks_handler.hook_lists
        update = (self.iteration + 1) % self.grad_accumulation == 0 or self._is_last_batch
        # DDP: micro-batches that do not update skip the gradient all-reduce (no_sync must cover the forward too).
        # The try blocks cost nothing unless they catch: they turn common mistakes into errors naming the fix.
        with distributed.skip_grad_sync(self.ddp_model, not update):
            try:
                if self._amp.enabled:
                    with self._amp.autocast():
                        loss = self._feed.get_loss(batch_data, self.criterion, self.device)
                else:
                    loss = self._feed.get_loss(batch_data, self.criterion, self.device)
            except TypeError as error:
                if self.criterion is None and "'NoneType' object is not callable" in str(error):
                    raise TypeError(f'{self._get_loss_name()} called the criterion, but the TrainLoop has '
                                    f'criterion=None: pass one as the TrainLoop\'s sixth argument (e.g. '
                                    f'nn.CrossEntropyLoss())') from error
                raise
            after_loss = hooks['on_after_loss']
            if after_loss:
                self.loss = loss
                for fn in after_loss:
                    fn()
                loss = self.loss
            else:
                self.loss = loss
            try:
                self.loss_batch_accum.append(loss.detach())
            except AttributeError:
                if loss is None:
                    raise TypeError(f'{self._get_loss_name()} returned None; it must return the loss tensor, e.g. '
                                    f'"return criterion(self(x), y)" (is its return statement missing?)') from None
                if isinstance(loss, numbers.Number):
                    raise TypeError(f'{self._get_loss_name()} returned the Python number {loss!r}; return the loss '
                                    f'tensor itself (not loss.item()), so that backward() can reach the '
                                    f'parameters') from None
                self.loss_batch_accum.append(_loss_value(loss))
            loss = self._divide_for_accumulation(loss)
            if self._amp.uses_scaler:
                loss = self.amp_scaler.scale(loss) if isinstance(loss, torch.Tensor) else loss.scale(self.amp_scaler)
            try:
                loss.backward()
            except RuntimeError as error:
                if isinstance(loss, torch.Tensor) and loss.dim() > 0 and loss.numel() != 1:
                    raise ValueError(f'{self._get_loss_name()} returned a loss of shape {tuple(loss.shape)}; return '
                                     f'a scalar (e.g. criterion with reduction=\'mean\', or loss.mean())') from error
                if isinstance(self.loss, torch.Tensor) and not self.loss.requires_grad and torch.is_grad_enabled():
                    raise RuntimeError(f'{self._get_loss_name()} returned a loss that is not connected to the '
                                       f'parameters (it does not require grad), so backward() cannot reach them: '
                                       f'return the loss tensor itself, not loss.detach() or a tensor built from '
                                       f'loss.item(), and compute it outside torch.no_grad()') from error
                raise
        for fn in hooks['on_after_backward']:
            fn()
        if update:
            self._optimizer_update(hooks)

    def _run_custom_step(self, batch_data):
        update = (self.iteration + 1) % self.grad_accumulation == 0 or self._is_last_batch
        owner: Any = self.train_step_owner
        with distributed.skip_grad_sync(self.ddp_model, not update):
            step = owner.train_step
            loss = step(batch_data, self) if owner is self.model else step(batch_data)
        self.loss = loss
        if loss is not None:
            try:
                self.loss_batch_accum.append(loss.detach())
            except AttributeError:
                self.loss_batch_accum.append(_loss_value(loss))

    def forward_loss(self, batch_data: Any) -> Any:
        """The model's training loss for ``batch_data`` (``get_loss`` under the loop's autocast, through the DDP
        wrapper in a DDP fit): the forward pass a custom ``train_step`` starts from."""
        with self._amp.autocast():
            return self._feed.get_loss(batch_data, self.criterion, self.device)

    def backward(self, loss: Any) -> None:
        """Backpropagate ``loss`` as the standard step does: divided by grad_accumulation, scaled by the fp16
        GradScaler; then the on_after_backward hooks. For custom ``train_step`` code."""
        loss = self._divide_for_accumulation(loss)
        if self._amp.uses_scaler:
            loss = self.amp_scaler.scale(loss) if isinstance(loss, torch.Tensor) else loss.scale(self.amp_scaler)
        loss.backward()
        for fn in self.callbacks_handler.hook_lists['on_after_backward']:
            fn()

    def step_optimizers(self, optimizer_indices: Optional[Sequence[int]] = None) -> None:
        """Apply an update with the given optimizers (all by default) as the standard step does: unscale once under
        fp16, on_after_gradient_update, step (GradScaler.step under fp16), on_after_optimizer_step, zero_grad, then
        the scaler update; ``update_applied`` records what was applied (schedulers read it). For custom
        ``train_step`` code; call it on update steps (``should_execute_optimizer_update()``) when accumulating."""
        self._optimizer_update(self.callbacks_handler.hook_lists, optimizer_indices)

    def _divide_for_accumulation(self, loss):
        # A tensor divided by 1 is the same tensor bit for bit, so that kernel is skipped; any other loss object
        # (MultiLoss, a user's class) is divided as AIToolbox always did, since its division may do more.
        if self.grad_accumulation > 1 or not isinstance(loss, torch.Tensor):
            return loss / self.grad_accumulation
        return loss

    def _get_loss_name(self) -> str:
        feed_def = self.batch_model_feed_def
        owner = feed_def if feed_def is not None else self.model
        return f'{type(owner).__qualname__}.get_loss'

    def _optimizer_update(self, hooks, optimizer_indices=None):
        all_optimizers = self.optimizers
        indices = range(len(all_optimizers)) if optimizer_indices is None else optimizer_indices
        optimizers = [all_optimizers[i] for i in indices]
        uses_scaler = self._amp.uses_scaler
        applied = self.update_applied = [optimizer_indices is None or i in indices for i in range(len(all_optimizers))]
        if uses_scaler:
            for optimizer in optimizers:     # once, so callbacks see and clip the real gradients
                self.amp_scaler.unscale_(optimizer)
        for idx, optimizer in zip(indices, optimizers):
            self.optimizer_idx = idx
            for fn in hooks['on_after_gradient_update']:
                fn(idx)
            if uses_scaler:
                applied[idx] = self._scaled_step(optimizer)
            else:
                optimizer.step()
            for fn in hooks['on_after_optimizer_step']:
                fn()
            optimizer.zero_grad()
        if uses_scaler:
            if self._last_amp_scale is None and _any_fused(all_optimizers):
                # The first update has no earlier scale to compare with: read it before update() (one sync, once).
                self._last_amp_scale = self.amp_scaler.get_scale()
            self.amp_scaler.update()
            self._mark_fused_skips(all_optimizers, applied)
        self.optimizer_idx = 0

    def _scaled_step(self, optimizer):
        """GradScaler.step, and whether it applied the update. GradScaler calls optimizer.step() only when the
        gradients are finite, and a post-step hook counts the real calls: no host sync."""
        entry = self._step_counters.get(id(optimizer))
        if entry is None or entry[0] is not optimizer:
            register = getattr(optimizer, 'register_step_post_hook', None)
            counter: Optional[List[int]] = None
            if callable(register):
                counter = [0]
                register(lambda opt, args, kwargs, counter=counter: counter.__setitem__(0, counter[0] + 1))
            entry = self._step_counters[id(optimizer)] = (optimizer, counter)
        counter = entry[1]
        before = counter[0] if counter is not None else None
        self.amp_scaler.step(optimizer)
        return counter is None or counter[0] != before

    def _mark_fused_skips(self, optimizers, applied):
        # A fused optimizer gets the inf flag inside step(), which GradScaler then always calls; a skipped update
        # shows as a lower loss scale after update(). One host sync per update, only for fused optimizers.
        if not _any_fused(optimizers):
            return
        scale = self.amp_scaler.get_scale()
        skipped = self._last_amp_scale is not None and scale < self._last_amp_scale
        self._last_amp_scale = scale
        for idx, optimizer in enumerate(optimizers):
            if getattr(optimizer, 'defaults', {}).get('fused') and skipped:
                applied[idx] = False

    def optimizer_update_applied(self, optimizer_idx: int = 0) -> bool:
        """True when this batch was an optimizer-update step and optimizer ``optimizer_idx`` really changed the
        weights: False on gradient-accumulation micro-batches and when the fp16 GradScaler skipped the update
        (inf/NaN gradients). Reliable from on_batch_end of the batch (for non-fused optimizers already in
        on_after_optimizer_step). Schedulers step on it."""
        return self.should_execute_optimizer_update() and optimizer_idx < len(self.update_applied) \
            and self.update_applied[optimizer_idx]

    @property
    def is_last_batch(self) -> bool:
        """True during the last batch of the epoch (or of num_iterations)."""
        return self._is_last_batch

    def should_execute_optimizer_update(self) -> bool:
        """True on the batches where the optimizer steps: every grad_accumulation-th batch of the epoch and
        the last batch of the epoch (or of num_iterations)."""
        if (self.iteration + 1) % self.grad_accumulation == 0 or self._is_last_batch:
            return True
        if self._epochs_running:
            return False        # the loop marks the last batch itself (also for loaders without len())
        # Outside fit, AIToolbox code sets loop.iteration itself and asks: the last batch of the epoch updates too.
        try:
            return self.iteration == len(self.train_loader) - 1
        except TypeError:
            return False

    def get_schedulers(self) -> List[AbstractCallback]:
        """The registered learning-rate scheduler callbacks (checkpoints save their state)."""
        return [cb for cb in self.callbacks if isinstance(cb, AbstractScheduler)]

    def get_num_training_steps(self) -> int:
        """AIToolbox's count of training steps: ``num_iterations // grad_accumulation``, or
        ``len(train_loader) // grad_accumulation * num_epochs``. It leaves out the update that ends an epoch
        whose batches are not a multiple of ``grad_accumulation``; :meth:`get_num_optimizer_updates` counts
        them (the schedulers of this library use that one)."""
        if self.num_epochs is None and not self.num_iterations:
            raise RuntimeError('get_num_training_steps() is known only once fit() has started')
        if self.num_iterations:
            return self.num_iterations // self.grad_accumulation
        try:
            per_epoch = len(self.train_loader)
        except TypeError:
            raise RuntimeError('get_num_training_steps() needs a train_loader with len() or fit(num_iterations=...)')
        return int(per_epoch // self.grad_accumulation * (self.num_epochs or 0))

    def get_num_optimizer_updates(self) -> int:
        """Number of optimizer updates of the whole run up to num_epochs / num_iterations, counting the
        updates of earlier fits (both are totals), so a resumed schedule keeps its length. The last partial
        accumulation window of each epoch counts as an update."""
        if self.num_epochs is None and not self.num_iterations:
            raise RuntimeError('get_num_optimizer_updates() is known only once fit() has started')
        try:
            per_epoch = len(self.train_loader)
        except TypeError:
            if self.num_iterations:
                return math.ceil(self.num_iterations / self.grad_accumulation)
            raise RuntimeError('get_num_optimizer_updates() needs a train_loader with len() or '
                               'fit(num_iterations=...)')
        total_batches = self.num_iterations or per_epoch * (self.num_epochs or 0)
        full_epochs, rest = divmod(total_batches, per_epoch)
        return full_epochs * math.ceil(per_epoch / self.grad_accumulation) + math.ceil(rest / self.grad_accumulation)


def _any_fused(optimizers):
    return any(getattr(o, 'defaults', {}).get('fused') for o in optimizers)


def _loss_value(loss):
    """The number of a loss object that is not a tensor (AIToolbox users return duck-typed losses that only
    support backward()); None when it cannot be read. Reading it syncs with the device, but only for such losses."""
    for read in (lambda: loss.item(), lambda: float(loss)):
        try:
            return float(read())
        except (AttributeError, TypeError, ValueError):
            continue
    return None
