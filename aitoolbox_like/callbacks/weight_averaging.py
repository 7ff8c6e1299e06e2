"""Weight averaging callbacks: an exponential moving average of the weights (EMA) and stochastic weight averaging
(SWA, on ``torch.optim.swa_utils``), sharded models (FSDP) included.

Both keep their averages in checkpoints (``state_dict`` under their ``state_key``), so a resumed run continues
with the same averages, to the bit. Neither changes the training trajectory: the weights the optimizer steps are
never replaced during training (EMA swaps its weights in only around evaluation passes and puts the training
weights back afterwards, bit for bit).
"""
import logging
import math
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
from torch.optim import swa_utils

from .. import distributed
from ._common import check_int
from .abstract import AbstractCallback

logger = logging.getLogger(__name__)


# -------------------------------------------------------------------- the weights of a model that may be sharded


def named_tensors(model: torch.nn.Module) -> List[Tuple[str, torch.Tensor]]:
    """The model's parameters and buffers by state_dict key, as detached tensors sharing their storage (writing
    into them writes into the model)."""
    return list(model.state_dict().items())


def like(value: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """``value`` (e.g. loaded from a checkpoint, on the CPU) on ``live``'s device and dtype; under FSDP, where
    ``live`` is a DTensor shard and ``value`` the whole tensor, this process's shard of it (no communication)."""
    if distributed.is_dtensor(live) and not distributed.is_dtensor(value):
        shard = live.detach().clone()
        distributed.copy_full_into(shard, value.to(dtype=live.dtype))
        return shard
    return value.to(device=live.device, dtype=live.dtype)


def full_cpu(value: torch.Tensor) -> torch.Tensor:
    """A CPU copy of the whole tensor: gathered from every process under FSDP (a collective)."""
    return distributed.full_tensor(value.detach()).cpu().clone()


def copy_all(targets: List[torch.Tensor], sources: List[torch.Tensor]) -> None:
    """Each source into its target, in place (the shard of a whole source under FSDP)."""
    for target, source in zip(targets, sources):
        distributed.copy_full_into(target, source)      # copy_, or the shard of a whole tensor under FSDP


# ------------------------------------------------------------------------------------ exponential moving average


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


# ----------------------------------------------------------------------------------- stochastic weight averaging


_BATCH_NORMS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.SyncBatchNorm)


def _copy_value(target: torch.Tensor, value: torch.Tensor) -> None:
    """``target.copy_(value)`` where either may be an FSDP shard (DTensor): a plain target of a sharded value gets the
    whole value (gathered: a collective), a sharded target of a plain value keeps its shard of it."""
    if distributed.is_dtensor(value) and not distributed.is_dtensor(target):
        value = distributed.full_tensor(value)
    distributed.copy_full_into(target, value)


class _ShardedAverage:
    """SWA's running mean of an FSDP model's weights, sharded like the weights: ``AveragedModel`` deep-copies the
    module, which FSDP refuses. It keeps what ``AveragedModel.module`` keeps, by state_dict key: the parameters
    averaged (and the floating-point buffers, with ``use_buffers``), the other buffers copied at every update."""

    def __init__(self, model: torch.nn.Module, use_buffers: bool) -> None:
        self.live = named_tensors(model)
        parameters = {name for name, _ in model.named_parameters()}
        self.averaged_idx = [i for i, (name, t) in enumerate(self.live)
                             if name in parameters or (use_buffers and t.is_floating_point())]
        averaged = set(self.averaged_idx)
        self.copied_idx = [i for i in range(len(self.live)) if i not in averaged]
        self.parameter_idx = [i for i, (name, _) in enumerate(self.live) if name in parameters]
        self.values = [t.detach().clone() for _, t in self.live]
        self.n_averaged = 0

    @torch.no_grad()
    def update(self) -> None:
        """``AveragedModel.update_parameters``: a copy the first time, then ``avg += (w - avg) / (n + 1)``."""
        live = [t for _, t in self.live]
        if self.n_averaged == 0:
            for value, tensor in zip(self.values, live):
                value.copy_(tensor)
        else:
            average = swa_utils.get_swa_multi_avg_fn()
            # Shards (parameters) and plain tensors (buffers, with use_buffers) in separate foreach calls.
            for sharded in (True, False):
                chosen = [i for i in self.averaged_idx if distributed.is_dtensor(live[i]) == sharded]
                if chosen:
                    average([self.values[i] for i in chosen], [live[i] for i in chosen], self.n_averaged)
            for i in self.copied_idx:
                self.values[i].copy_(live[i])
        self.n_averaged += 1

    def state_dict(self) -> Dict[str, torch.Tensor]:
        """Whole CPU tensors with ``AveragedModel.state_dict()``'s keys (gathered: every rank calls it), so the state
        resumes with or without FSDP."""
        state = {'n_averaged': torch.tensor(self.n_averaged, dtype=torch.long)}
        state.update({f'module.{name}': full_cpu(value) for (name, _), value in zip(self.live, self.values)})
        return state

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        """Take ``AveragedModel.state_dict()``'s keys (whole tensors): each process keeps its shards."""
        missing = [name for name, _ in self.live if f'module.{name}' not in state]
        if missing or 'n_averaged' not in state:
            raise ValueError(f'StochasticWeightAveraging: the saved average has no value for '
                             f'{(missing or ["n_averaged"])[:5]}; was it saved for another model?')
        self.values = [like(state[f'module.{name}'], t) for name, t in self.live]
        self.n_averaged = int(state['n_averaged'])

    @torch.no_grad()
    def copy_into(self, model: torch.nn.Module, buffers: bool) -> None:
        """The averaged parameters (and, with ``buffers``, every buffer) into ``model``'s tensors of the same names."""
        targets = dict(model.state_dict())
        chosen = range(len(self.live)) if buffers else self.parameter_idx
        for i in chosen:
            _copy_value(targets[self.live[i][0]], self.values[i])


def _is_plain(value: Any) -> bool:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


class StochasticWeightAveraging(AbstractCallback):
    """Stochastic weight averaging with ``torch.optim.swa_utils``: from epoch ``swa_start_epoch`` on, the weights at
    the end of every epoch are averaged (``AveragedModel``) and the learning rate is annealed to ``swa_lr``
    (``SWALR``); at the end of training the model takes the averaged weights, with BatchNorm statistics recomputed
    over the train loader (``update_bn``).

    What the callback does equals this hand-written loop (tests/callbacks/test_weight_averaging.py checks it to the
    bit)::

        for epoch in range(num_epochs):
            train_one_epoch()
            if epoch >= swa_start_epoch:
                if swa_model is None:     # at the end of the first SWA epoch
                    swa_model = AveragedModel(model, use_buffers=use_buffers)
                    swa_scheduler = SWALR(optimizer, swa_lr, anneal_epochs, anneal_strategy)
                swa_model.update_parameters(model)
                swa_scheduler.step()
        with torch.random.fork_rng():     # the loop's RNG is not moved
            update_bn(train_loader, swa_model, device)
        model <- swa_model's parameters (and BatchNorm statistics / buffers)

    (SWALR is built when averaging starts, with the learning rate then as its starting point; built at the start of
    training, as torch's example does, it would apply ``swa_lr`` at once when ``anneal_epochs=0``.) The end-of-epoch
    losses and checkpoints of the SWA epochs are those of the training weights; the averaged model is in the
    callback's checkpoint state, so resume is exact. After fit ``loop.model`` holds the averaged weights, and
    ModelTrainEndSave (which runs after this callback) saves them.

    Under FSDP (gpu_mode='fsdp') the average is kept sharded like the weights (``swa_model`` stays None:
    AveragedModel's deep copy of a sharded module is refused by FSDP), with the same arithmetic; the checkpoint state
    is gathered whole, in AveragedModel's format, so it resumes with or without FSDP, on any number of processes.
    ``update_bn`` then runs on the sharded model itself, each process over its share of the train data, and the
    BatchNorm statistics are averaged over the processes afterwards: with the equal batch counts the distributed
    sampler gives, that is what update_bn over all the processes' batches in one process gives.

    Other learning-rate schedules keep stepping after ``swa_start_epoch``: this callback (execution order 2) runs
    after them at every epoch end, so SWALR's rate is the one used, but SWALR anneals from whatever rate it finds;
    stop them at ``swa_start_epoch`` for the textbook schedule.

    Args:
        swa_start_epoch (int or float): the first epoch (0-based) whose end is averaged; a float in (0, 1) is a
            fraction of the fit's ``num_epochs`` (``int(fraction * num_epochs)``, as in Lightning).
        swa_lr (float, list or None): the SWA learning rate (one per param group allowed); None keeps the rate the
            optimizer has when averaging starts.
        anneal_epochs (int): epochs over which SWALR anneals to ``swa_lr``.
        anneal_strategy (str): 'cos' or 'linear'.
        update_bn (bool): recompute BatchNorm statistics of the averaged model over the train loader at the end.
        use_buffers (bool): average buffers too (AveragedModel's ``use_buffers``).
        batch_to_input (callable or None): what ``update_bn`` feeds the model for a batch; None: torch's rule (the
            batch itself, or its first element for a list / tuple).
        optimizer_idx (int or None): which optimizer of a MultiOptimizer SWALR drives; None for a single one.
    """

    def __init__(self, swa_start_epoch: Union[int, float] = 0.8, swa_lr: Union[float, List[float], None] = None,
                 anneal_epochs: int = 10, anneal_strategy: str = 'cos', update_bn: bool = True,
                 use_buffers: bool = False, batch_to_input: Optional[Callable[[Any], Any]] = None,
                 optimizer_idx: Optional[int] = None) -> None:
        super().__init__('Stochastic weight averaging', execution_order=2)
        if isinstance(swa_start_epoch, bool) or not isinstance(swa_start_epoch, (int, float)) \
                or (isinstance(swa_start_epoch, float) and not 0. < swa_start_epoch < 1.) \
                or (isinstance(swa_start_epoch, int) and swa_start_epoch < 0):
            raise ValueError(f'StochasticWeightAveraging: swa_start_epoch must be an epoch index >= 0 or a fraction '
                             f'of the epochs in (0, 1), got {swa_start_epoch!r}')
        check_int('anneal_epochs', anneal_epochs, 0, who='StochasticWeightAveraging')
        if anneal_strategy not in ('cos', 'linear'):
            raise ValueError(f"StochasticWeightAveraging: anneal_strategy must be 'cos' or 'linear', got "
                             f"{anneal_strategy!r}")
        check_int('optimizer_idx', optimizer_idx, 0, allow_none=True, who='StochasticWeightAveraging')
        self.swa_start_epoch = swa_start_epoch
        self.swa_lr = swa_lr
        self.anneal_epochs = anneal_epochs
        self.anneal_strategy = anneal_strategy
        self.update_bn = update_bn
        self.use_buffers = use_buffers
        self.batch_to_input = batch_to_input
        self.optimizer_idx = optimizer_idx
        #: the averaged model (``AveragedModel``), from the end of the first SWA epoch on (None under FSDP).
        self.swa_model: Optional[swa_utils.AveragedModel] = None
        #: the SWA learning-rate schedule (``SWALR``), built with swa_model.
        self.swa_scheduler: Optional[swa_utils.SWALR] = None
        self._sharded: Optional[_ShardedAverage] = None       # the average under FSDP, instead of swa_model
        self._pending: Optional[Dict[str, Any]] = None

    @property
    def averaging_started(self) -> bool:
        """Whether an average exists (from the end of the first SWA epoch on, or loaded from a checkpoint)."""
        return self.swa_model is not None or self._sharded is not None

    def resolved_start_epoch(self) -> int:
        """``swa_start_epoch`` as an epoch index (a fraction resolved with the fit's ``num_epochs``)."""
        start = self.swa_start_epoch
        if isinstance(start, int):
            return start
        num_epochs = self.train_loop_obj.num_epochs
        if num_epochs is None:
            raise ValueError('StochasticWeightAveraging: swa_start_epoch is a fraction but the number of epochs is '
                             'unknown (a train loader without len()); give an epoch index')
        return int(start * num_epochs)

    def _optimizer(self) -> torch.optim.Optimizer:
        optimizers = self.train_loop_obj.optimizers
        if self.optimizer_idx is None:
            if len(optimizers) > 1:
                raise ValueError(f'StochasticWeightAveraging: the TrainLoop has {len(optimizers)} optimizers; pass '
                                 f'optimizer_idx=<index> to say which one SWALR drives')
            return optimizers[0]
        if self.optimizer_idx >= len(optimizers):
            raise ValueError(f'StochasticWeightAveraging: optimizer_idx={self.optimizer_idx} but the TrainLoop has '
                             f'{len(optimizers)} optimizer(s)')
        return optimizers[self.optimizer_idx]

    def _build(self) -> None:
        optimizer = self._optimizer()
        swa_lr = self.swa_lr if self.swa_lr is not None else [group['lr'] for group in optimizer.param_groups]
        model = self.train_loop_obj.model
        if distributed.is_fsdp_model(model):
            self._sharded = _ShardedAverage(model, self.use_buffers)
        else:
            self.swa_model = swa_utils.AveragedModel(model, use_buffers=self.use_buffers)
        self.swa_scheduler = swa_utils.SWALR(optimizer, swa_lr,  # type: ignore[arg-type]  # a list is accepted
                                             anneal_epochs=self.anneal_epochs,
                                             anneal_strategy=self.anneal_strategy)  # type: ignore[arg-type]

    # ---- hooks ------------------------------------------------------------------------------------------------

    def on_train_loop_registration(self) -> None:
        """Check the optimizer choice early."""
        if self.train_loop_obj.optimizer is not None:
            self._optimizer()

    def on_train_begin(self) -> None:
        """Rebuild the averaged model and SWALR from loaded state (a resume past swa_start_epoch)."""
        self._apply_pending()

    def on_epoch_end(self) -> None:
        """From swa_start_epoch on: average the weights and step SWALR."""
        loop = self.train_loop_obj
        if loop.epoch < self.resolved_start_epoch():
            return
        if not self.averaging_started:
            logger.info('Stochastic weight averaging starts at the end of epoch %d', loop.epoch)
            self._build()
        assert self.swa_scheduler is not None
        if self._sharded is not None:
            self._sharded.update()
        else:
            assert self.swa_model is not None
            self.swa_model.update_parameters(loop.model)
        with warnings.catch_warnings():
            # SWALR is built after the optimizer's first steps, which torch's step-order check cannot see.
            warnings.filterwarnings('ignore', message=r'Detected call of `lr_scheduler\.step\(\)` before')
            self.swa_scheduler.step()

    def on_train_end(self) -> None:
        """Recompute BatchNorm statistics (update_bn) and give the model the averaged weights."""
        swa_model, loop = self.swa_model, self.train_loop_obj
        if loop.interrupted:        # the run continues from its checkpoint; the average is applied at its real end
            return
        if not self.averaging_started:
            logger.warning('StochasticWeightAveraging: training ended before swa_start_epoch=%s; the model keeps its '
                           'trained weights', self.swa_start_epoch)
            return
        if swa_model is None:       # FSDP: the sharded model itself takes the average, then its BatchNorm update
            self.transfer_weights(loop.model)
            if self.update_bn:
                self._update_bn(loop.model)
                distributed.average_over_processes_(
                    [buffer for module in loop.model.modules() if isinstance(module, _BATCH_NORMS)
                     for buffer in (module.running_mean, module.running_var) if buffer is not None])
        else:
            if self.update_bn:
                self._update_bn(swa_model)
            self.transfer_weights(loop.model)
        loop.purge_prediction_cache()

    def _update_bn(self, model: torch.nn.Module) -> None:
        loop = self.train_loop_obj
        loader = loop.train_loader
        if self.batch_to_input is not None:
            to_input = self.batch_to_input
            loader = (to_input(batch) for batch in loop.train_loader)
        # Iterating the loader draws from the RNG; the training RNG is left as it was.
        devices = [loop.device] if loop.device.type == 'cuda' else []
        with torch.random.fork_rng(devices=devices):
            swa_utils.update_bn(loader, model, device=loop.device)

    @torch.no_grad()
    def transfer_weights(self, model: torch.nn.Module) -> None:
        """Copy the averaged parameters into ``model``, and its buffers too with ``use_buffers`` (all of them) or
        ``update_bn`` (the BatchNorm statistics, which update_bn recomputed). Under FSDP the parameters (and, with
        ``use_buffers``, the buffers) only: update_bn runs on the model afterwards; ``model`` is the sharded model, or
        a plain one of the same structure (then the average is gathered: every rank must call this)."""
        if self._sharded is not None:
            self._sharded.copy_into(model, buffers=self.use_buffers)
            return
        swa_model = self.swa_model
        if swa_model is None:
            raise RuntimeError('StochasticWeightAveraging: nothing averaged yet')
        averaged = swa_model.module
        for param, averaged_param in zip(model.parameters(), averaged.parameters()):
            param.copy_(averaged_param)
        if self.use_buffers:
            for buffer, averaged_buffer in zip(model.buffers(), averaged.buffers()):
                buffer.copy_(averaged_buffer)
        elif self.update_bn:
            for target_module, source_module in zip(model.modules(), averaged.modules()):
                if isinstance(source_module, _BATCH_NORMS):
                    for buffer, averaged_buffer in zip(target_module.buffers(), source_module.buffers()):
                        buffer.copy_(averaged_buffer)

    # ---- state ------------------------------------------------------------------------------------------------

    def state_dict(self) -> Optional[Dict[str, Any]]:
        """The averaged model (``AveragedModel.state_dict()``; under FSDP the same keys, gathered whole: every rank
        calls this) and SWALR's counters, once averaging started."""
        if not self.averaging_started or self.swa_scheduler is None:
            return None
        scheduler_state = {k: v for k, v in self.swa_scheduler.state_dict().items() if _is_plain(v)}
        if self._sharded is not None:
            averaged = self._sharded.state_dict()
        else:
            assert self.swa_model is not None
            averaged = {k: v.detach().cpu().clone() for k, v in self.swa_model.state_dict().items()}
        return {'swa_model': averaged, 'swa_scheduler': scheduler_state}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore the averaged model and SWALR (built once the model is on its device)."""
        self._pending = state_dict
        if self.train_loop_obj is not None and self.averaging_started:
            self._apply_pending()

    def _apply_pending(self) -> None:
        state, self._pending = self._pending, None
        if state is None:
            return
        if not self.averaging_started:
            # SWALR's construction steps it once; for anneal_epochs > 0 that leaves the learning rate as it is, and
            # the loaded counters then continue the schedule.
            self._build()
        assert self.swa_scheduler is not None
        if self._sharded is not None:
            self._sharded.load_state_dict(state['swa_model'])
        else:
            assert self.swa_model is not None
            self.swa_model.load_state_dict(state['swa_model'])
        self.swa_scheduler.load_state_dict(state['swa_scheduler'])

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(swa_start_epoch={self.swa_start_epoch}, swa_lr={self.swa_lr}, '
                f'anneal_epochs={self.anneal_epochs})')
