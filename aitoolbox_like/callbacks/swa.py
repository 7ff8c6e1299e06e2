"""Stochastic weight averaging (SWA, on ``torch.optim.swa_utils``), sharded models included (re-exported by
:mod:`aitoolbox_like.callbacks.weight_averaging`, with what both averaging callbacks promise)."""
import logging
import warnings
from typing import Any, Callable, Dict, List, Optional, Union

import torch
from torch.optim import swa_utils

from .. import distributed
from ._common import check_int
from ._weight_tensors import full_cpu, like, named_tensors
from .abstract import AbstractCallback

# The logger of the weight-averaging callbacks' module, whose messages these are.
logger = logging.getLogger('aitoolbox_like.callbacks.weight_averaging')

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
