"""Weight averaging callbacks: an exponential moving average of the weights (EMA) and stochastic weight averaging
(SWA, on ``torch.optim.swa_utils``).

Both keep their averages in checkpoints (``state_dict`` under their ``state_key``), so a resumed run continues
with the same averages, to the bit. Neither changes the training trajectory: the weights the optimizer steps are
never replaced during training (EMA swaps its weights in only around evaluation passes and puts the training
weights back afterwards, bit for bit).

StochasticWeightAveraging is defined in ``swa`` and importable from here.
"""
import logging
import math
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import torch
from torch.optim import swa_utils

from ._common import check_int
from ._weight_tensors import copy_all, full_cpu, like, named_tensors
from .abstract import AbstractCallback
from .swa import StochasticWeightAveraging  # noqa: F401  (importable from here, with EMA)

if TYPE_CHECKING:
    from ..engine.train_loop import TrainLoop

logger = logging.getLogger(__name__)


class ExponentialMovingAverage(AbstractCallback):
    """Keep an exponential moving average of the model's weights (parameters and floating-point buffers) and use it
    for evaluation and for the final model.

    After every ``update_every``-th optimizer update that was really applied (not on gradient-accumulation
    micro-batches, not when the fp16 GradScaler skipped the step: ``loop.optimizer_update_applied``)::

        ema = decay_t * ema + (1 - decay_t) * weights        (torch._foreach_lerp_, on the device: no host sync)

    Integer buffers (BatchNorm's ``num_batches_tracked``) are copied. The average starts as a copy of the weights
    when training starts.

    Warm-up (``use_warmup=True``): ``decay_t = decay * (1 - exp(-n / warmup_steps))`` where ``n`` counts the EMA
    updates made so far, this one included (the SuperGradients / YOLOv5 ramp): early averages follow the weights
    closely and the full ``decay`` is reached after a few ``warmup_steps``. Without warm-up ``decay_t = decay``.

    Evaluation (``evaluate_with_ema=True``): every evaluation pass of the loop (the end-of-epoch losses,
    ``predict_on_*``, ``evaluate_loss_on_*``, the end-of-training test loss, the result packages of
    ModelTrainEndSave) runs with the EMA weights: they are copied into the model in ``on_eval_begin`` and the
    training weights are copied back in ``on_eval_end``. So 'loss' / 'val_loss' and the metrics in the history are
    the EMA model's.

    End of training (``swap_at_end=True``): in ``on_train_end`` (before ModelTrainEndSave, which has execution
    order 101) the model takes the EMA weights, so the final saved model and anything done with ``loop.model``
    after ``fit`` use them. The training weights are kept in this callback (and in its checkpoint state): a later
    ``fit`` with this callback, or a resume from that final checkpoint, puts them back in ``on_train_begin`` and
    continues training exactly. Epoch / iteration checkpoints always hold the training weights in
    ``model_state_dict`` and the average in the callback state.

    Args:
        decay (float): the EMA decay, in [0, 1).
        use_warmup (bool): ramp the decay up as above.
        warmup_steps (int): the time constant of the warm-up ramp, in EMA updates.
        update_every (int): update the average every k applied optimizer updates.
        evaluate_with_ema (bool): evaluate with the EMA weights.
        swap_at_end (bool): the model holds the EMA weights after fit.
        execution_order (float): the callback's order; the default 0 runs before the savers.
    """

    def __init__(self, decay: float = 0.999, use_warmup: bool = False, warmup_steps: int = 2000,
                 update_every: int = 1, evaluate_with_ema: bool = True, swap_at_end: bool = True,
                 execution_order: float = 0) -> None:
        super().__init__('Exponential moving average of the weights', execution_order=execution_order)
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0. <= decay < 1.:
            raise ValueError(f'ExponentialMovingAverage: decay must be a number in [0, 1), got {decay!r}')
        check_int('warmup_steps', warmup_steps, 1, who='ExponentialMovingAverage')
        check_int('update_every', update_every, 1, who='ExponentialMovingAverage')
        self.decay = float(decay)
        self.use_warmup = use_warmup
        self.warmup_steps = warmup_steps
        self.update_every = update_every
        self.evaluate_with_ema = evaluate_with_ema
        self.swap_at_end = swap_at_end
        #: EMA updates made so far.
        self.num_updates = 0
        #: applied optimizer updates seen so far (update_every counts these).
        self.num_optimizer_updates = 0
        #: the averaged tensors by state_dict key, on the model's device (None until training starts).
        self.ema: Optional[Dict[str, torch.Tensor]] = None
        self._live: List[Tuple[str, torch.Tensor]] = []
        self._float_idx: List[int] = []
        self._other_idx: List[int] = []
        self._backup: Optional[List[torch.Tensor]] = None       # training weights while the EMA is swapped in
        self._training_weights: Optional[Dict[str, torch.Tensor]] = None   # kept after swap_at_end
        self._pending: Optional[Dict[str, Any]] = None

    @property
    def state_key(self) -> str:
        """``ExponentialMovingAverage_<decay>``, so two averages with different decays keep separate state."""
        return f'{type(self).__name__}_{self.decay}'

    # ---- the average ------------------------------------------------------------------------------------------

    def current_decay(self, num_updates: Optional[int] = None) -> float:
        """The decay used by the ``num_updates``-th EMA update (default: the next one)."""
        n = self.num_updates + 1 if num_updates is None else num_updates
        if not self.use_warmup:
            return self.decay
        return self.decay * (1. - math.exp(-n / self.warmup_steps))

    def _bind(self) -> None:
        """Find the model's tensors (again: the loop moves the model to its device after registration)."""
        self._live = named_tensors(self.train_loop_obj.model)
        self._float_idx = [i for i, (_, t) in enumerate(self._live) if t.is_floating_point()]
        self._other_idx = [i for i, (_, t) in enumerate(self._live) if not t.is_floating_point()]
        if self.ema is None:
            self.ema = {name: t.detach().clone() for name, t in self._live}
        else:
            missing = sorted(set(name for name, _ in self._live) - set(self.ema))
            if missing:
                raise ValueError(f'ExponentialMovingAverage: the average has no value for {missing[:5]}; was it '
                                 f'saved for another model?')
            # Same device and dtype as the weights (a checkpoint is loaded on the CPU).
            self.ema = {name: like(self.ema[name], t) for name, t in self._live}

    def _ema_list(self) -> List[torch.Tensor]:
        ema = self.ema
        assert ema is not None
        return [ema[name] for name, _ in self._live]

    @torch.no_grad()
    def update(self) -> None:
        """Make one EMA update from the model's current weights (what on_batch_end does after an update)."""
        if not self._live:
            self._bind()
        self.num_updates += 1
        ema = self._ema_list()
        if self._float_idx:
            # torch's EMA function: one torch._foreach_lerp_ over all floating-point tensors, on their device.
            lerp = swa_utils.get_ema_multi_avg_fn(self.current_decay(self.num_updates))
            lerp([ema[i] for i in self._float_idx], [self._live[i][1] for i in self._float_idx], None)
        for i in self._other_idx:
            ema[i].copy_(self._live[i][1])

    @torch.no_grad()
    def _swap_in(self) -> None:
        """Copy the EMA weights into the model, keeping the training weights (once: a pass that ended early never
        called on_eval_end, so the backup taken first is kept)."""
        live = [t for _, t in self._live]
        if self._backup is None:
            self._backup = [t.clone() for t in live]
        copy_all(live, self._ema_list())

    @torch.no_grad()
    def _swap_out(self) -> None:
        if self._backup is not None:
            copy_all([t for _, t in self._live], self._backup)
            self._backup = None

    @torch.no_grad()
    def copy_to(self, model: torch.nn.Module) -> None:
        """Load the EMA weights into ``model`` (a module with the same state_dict keys, e.g. a copy of the model)."""
        if self.ema is None:
            raise RuntimeError('ExponentialMovingAverage: no average yet (training has not started)')
        model.load_state_dict(self.ema)

    def ema_state_dict(self) -> Dict[str, torch.Tensor]:
        """The averaged weights as a state_dict of the model (CPU copies). Under FSDP (gpu_mode='fsdp') the average
        is sharded like the weights and this gathers it: every process must call it."""
        if self.ema is None:
            raise RuntimeError('ExponentialMovingAverage: no average yet (training has not started)')
        return {name: full_cpu(t) for name, t in self.ema.items()}

    # ---- hooks ------------------------------------------------------------------------------------------------

    def on_train_begin(self) -> None:
        """Bind to the model on its device; put the training weights back after swap_at_end; apply loaded state."""
        self._bind()
        self._apply_pending()
        if self._training_weights is not None:
            with torch.no_grad():
                weights = self._training_weights
                copy_all([t for _, t in self._live], [weights[name] for name, _ in self._live])
            self._training_weights = None
            self.train_loop_obj.purge_prediction_cache()

    def on_batch_end(self) -> None:
        """After an applied optimizer update: count it, and update the average every ``update_every`` updates."""
        loop = self.train_loop_obj
        if not any(loop.optimizer_update_applied(i) for i in range(len(loop.optimizers))):
            return
        self.num_optimizer_updates += 1
        if self.num_optimizer_updates % self.update_every == 0:
            self.update()

    def on_eval_begin(self, dataset_info: Dict[str, Any]) -> None:
        """Swap the EMA weights in for the pass (evaluate_with_ema)."""
        if self.evaluate_with_ema and self.ema is not None and self._live and self._training_weights is None:
            self._swap_in()

    def on_eval_end(self, dataset_info: Dict[str, Any]) -> None:
        """Put the training weights back."""
        self._swap_out()

    def on_train_end(self) -> None:
        """swap_at_end: the model takes the EMA weights; the training weights are kept for a later fit."""
        self._swap_out()
        if not self.swap_at_end or self.ema is None or not self._live or self.train_loop_obj.interrupted:
            return
        with torch.no_grad():
            self._training_weights = {name: t.detach().clone() for name, t in self._live}
            copy_all([t for _, t in self._live], self._ema_list())
        # Cached predictions and losses at this position were made with the weights before the swap.
        self.train_loop_obj.purge_prediction_cache()

    def on_exception(self, exception: BaseException) -> None:
        """A pass that failed never reached on_eval_end: put the training weights back."""
        self._swap_out()

    # ---- state ------------------------------------------------------------------------------------------------

    def state_dict(self) -> Optional[Dict[str, Any]]:
        """The average, the counters and, after swap_at_end, the training weights (CPU copies)."""
        if self.ema is None:
            return None
        state: Dict[str, Any] = {'ema': self.ema_state_dict(), 'num_updates': self.num_updates,
                                 'num_optimizer_updates': self.num_optimizer_updates}
        if self._training_weights is not None:
            state['training_weights'] = {k: full_cpu(v) for k, v in self._training_weights.items()}
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore the average and the counters (applied to the model's device once it is known)."""
        self._pending = state_dict
        if self._live:
            self._apply_pending()

    def _apply_pending(self) -> None:
        state, self._pending = self._pending, None
        if state is None:
            return
        self._backup = None
        self.num_updates = int(state['num_updates'])
        self.num_optimizer_updates = int(state['num_optimizer_updates'])
        self.ema = {k: v.clone() for k, v in state['ema'].items()}
        training = state.get('training_weights')
        self._training_weights = {k: v.clone() for k, v in training.items()} if training is not None else None
        self._bind()

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(decay={self.decay}, use_warmup={self.use_warmup}, '
                f'update_every={self.update_every})')
