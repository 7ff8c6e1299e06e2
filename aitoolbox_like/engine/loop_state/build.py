"""The loop's full state as a checkpoint dict (the layout is in the package's docstring): weights, optimizer,
counters, history, callback state, RNG states and the position inside an epoch, with the epoch's running losses
(averaged over the ranks of a distributed fit) packed so that a checkpoint late in a long epoch stays small."""
import copy
import json
import logging
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import torch

from ... import distributed
from ...checkpoint import sharded as sharded_checkpoint
from ...checkpoint.files import FORMAT_VERSION, check_weights_only_safe
from ...model.multi_loss_optim import MultiLoss
from .rng import capture_rng_state

if TYPE_CHECKING:
    from ..train_loop import TrainLoop

logger = logging.getLogger(__name__)

CHECKPOINT_KIND = 'aitoolbox_like.train_state'

def _plain_losses(losses):
    return [{'multiloss': dict(loss.loss_dict)} if isinstance(loss, MultiLoss) else loss for loss in losses]

def rebuild_losses(losses):
    return [MultiLoss(loss['multiloss']) if isinstance(loss, dict) else loss for loss in losses]

def _losses_over_ranks(losses, gathered):
    """The running losses of every rank (``gathered``, every rank's list) averaged batch by batch: under FSDP and DDP
    every rank builds the checkpoint, and rank 0's own losses alone would make each rank of the resumed run count
    rank 0's. Every rank of a resumed run with another number of ranks restores these means (one with the same number
    its own list, ``loss_batch_accum_ranks``), and the epoch's 'accumulated_loss' (the mean over ranks of each rank's
    mean) comes out as in the uninterrupted run. Ranks with different numbers of batches (a loader not sharded
    evenly): each keeps its own ``losses``."""
    means = _mean_over_ranks(gathered)
    return losses if means is None else means

def _mean_over_ranks(gathered):
    """Every rank's running losses (lists of tensors or dicts of them) averaged batch by batch; None when they cannot
    be (lists of different lengths, or values of another kind)."""
    if len({len(rank_losses) for rank_losses in gathered}) != 1 or any(
            not isinstance(loss, (torch.Tensor, dict)) for rank_losses in gathered for loss in rank_losses):
        return None

    def mean(values):
        if isinstance(values[0], dict):
            return {k: mean([v[k] for v in values]) for k in values[0]}
        return torch.stack([torch.as_tensor(v, dtype=torch.float64) for v in values]).mean().to(values[0].dtype)

    # Every list has the same length here.
    return [mean([rank_losses[i] for rank_losses in gathered]) for i in range(len(gathered[0]))]

class LossesOverRanks:
    """The collective part of an FSDP checkpoint's train state (``build_checkpoint`` without ``all_ranks``): the
    mean over ranks of the epoch's running losses (see _losses_over_ranks), kept apart by :func:`begin_checkpoint`
    so that a save may run it later, in another thread and over another process group (an asynchronous sharded
    save runs it in its background writer), from this rank's losses as they were when the checkpoint was built."""

    def __init__(self, losses: List[Any]) -> None:
        # A copy (one stacked tensor, or a new list of detached tensors): batches trained meanwhile change nothing.
        self._sent = _losses_to_send(losses)

    def complete(self, checkpoint: Optional[Dict[str, Any]], group: Any = None) -> None:
        """Gather every rank's losses (a collective over ``group``, None: the default group; every rank calls it at
        the same point) and put their means into ``checkpoint`` (the one begin_checkpoint built on this rank, or a
        copy of it; None where it is not kept). Losses that cannot be averaged leave the rank's own in place."""
        means = _mean_over_ranks(_gather_losses(self._sent, group))
        if checkpoint is not None and means is not None:
            checkpoint['data_position']['loss_batch_accum'] = _pack_losses(means)

def _pack_losses(losses):
    if losses and all(isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.dtype == losses[0].dtype
                      for loss in losses):
        return {'stacked': torch.stack([loss.detach().cpu() for loss in losses])}
    return losses

def unpack_losses(losses):
    if isinstance(losses, dict) and 'stacked' in losses:
        return list(losses['stacked'].unbind())
    return losses

def _losses_to_send(losses):
    """This rank's running losses as :func:`_gather_losses` sends them: on the CPU, detached, and as one stacked tensor
    when they can be (a list of 0-d tensors would be pickled and loaded tensor by tensor, a cost growing with the
    epoch's batches)."""
    return _pack_losses([_losses_to_cpu(loss) for loss in losses])

def _gather_losses(sent, group=None):
    """Every rank's running losses, from each rank's :func:`_losses_to_send` (a collective over ``group``)."""
    return [unpack_losses(rank_losses) for rank_losses in _gather(sent, group)]

def _losses_to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    return {k: _losses_to_cpu(v) for k, v in value.items()} if isinstance(value, dict) else value

def _json_safe(hyperparams):
    text = json.dumps(hyperparams if hyperparams is not None else {}, default=repr)
    return text, json.loads(text)

def _gather(value, group=None):
    gathered: List[Any] = [None] * torch.distributed.get_world_size(group)
    torch.distributed.all_gather_object(gathered, value, group=group)
    return gathered

def train_batch_size(loop):
    batch_size = getattr(loop.train_loader, 'batch_size', None)
    return batch_size if isinstance(batch_size, int) and batch_size > 0 else None

def samples_done_in_epoch(loop):
    """How many samples of the epoch's data order (the order of the whole data set, before it is split between
    processes) the batches trained so far in this epoch consumed, over every process; None when unknown (a loader
    without a batch size). The position a run resumes from when the number of processes changed: after k batches of
    B samples on each of W processes, a DistributedSampler has handed out exactly the first k * B * W samples of the
    epoch's permutation."""
    batch_size = train_batch_size(loop)
    if batch_size is None:
        return None
    return loop.epoch_samples_offset + (loop.iteration + 1) * batch_size * loop.world_size

def _train_sampler_seed(loop):
    samplers = loop.distributed_samplers
    seed = getattr(samplers[0], 'seed', None) if samplers else None
    return seed if isinstance(seed, int) else None

def optimizer_class_names(loop):
    """The class of each optimizer the loop steps (checkpoints record them, so a resume with another optimizer
    class is refused instead of failing a step later)."""
    return [type(optimizer).__qualname__ for optimizer in loop.optimizers] if loop.optimizer is not None else []

def build_checkpoint(loop, hyperparams=None, mid_epoch=False, weights=True, all_ranks=False, snapshot=None,
                     fsdp=None):
    """The loop's full state as a checkpoint dict.

    Args:
        mid_epoch (bool): taken inside an epoch (after a batch), not after the epoch's end.
        weights (bool): include the model and optimizer state. With an FSDP-sharded model (gpu_mode='fsdp') the
            whole state is gathered to rank 0 (a collective: every process calls build_checkpoint, rank 0's result
            is the one to save); ``weights=False`` leaves them out, for a sharded checkpoint whose weights DCP writes
            (sharded_checkpoint.begin_save).
        all_ranks (bool): every process of the process group calls build_checkpoint at this same point (a
            collective; the saving callbacks do so at their save steps). The checkpoint then holds every rank's RNG
            states and the running losses of the epoch averaged over the ranks, so each rank of a resumed run
            continues with its own random stream and the epoch's loss counts every rank. False (a save by rank 0
            alone, e.g. while fit is failing): rank 0's own, and a resumed run gives them to every rank.
        snapshot (``AsyncCheckpointWriter.snapshot``): return a copy that training does not change, for a write in
            the background (see begin_checkpoint).
        fsdp (bool): whether the model is sharded with FSDP, where the caller has just found out (None: found here,
            a walk over the model's modules).
    """
    checkpoint, losses = begin_checkpoint(loop, hyperparams, mid_epoch, weights, all_ranks, snapshot, fsdp)
    if losses is not None:
        losses.complete(checkpoint)
    return checkpoint

def begin_checkpoint(loop: 'TrainLoop', hyperparams: Any = None, mid_epoch: bool = False, weights: bool = True,
                     all_ranks: bool = False, snapshot: Optional[Callable[[Any], Any]] = None,
                     fsdp: Optional[bool] = None) -> Tuple[Dict[str, Any], Optional[LossesOverRanks]]:
    """:func:`build_checkpoint`'s dict, and what is left of it: the mean over ranks of the running losses of an FSDP
    fit's mid-epoch checkpoint without ``all_ranks`` (a collective, which build_checkpoint runs at once), or None.
    Until ``losses.complete(checkpoint)`` has run, the dict holds this rank's own running losses there. The same
    arguments and collectives otherwise: every rank calls it where build_checkpoint would be called, and completes
    the losses at the same point as the others (an asynchronous sharded save: in its background writer).

    ``snapshot`` (``AsyncCheckpointWriter.snapshot``): the dict returned is then a copy that training does not
    change, for a write in the background: what may be shared with the loop, its callbacks or its optimizer is
    copied by ``snapshot``; the RNG states are not (see _copy_but_rng_states). The snapshot's walk is then the check
    that everything in it loads with ``weights_only=True``, and it copies the weights to host memory."""
    model = loop.model
    optimizer = loop.optimizer
    if fsdp is None:
        fsdp = distributed.is_fsdp_model(model)
    if fsdp or not weights:
        model_state, optimizer_state = sharded_checkpoint.full_state(loop) if weights else ({}, None)
        if optimizer_state is not None:
            optimizer_state = sharded_checkpoint.index_keyed(loop, optimizer_state)
    else:
        # A snapshot copies the tensors to host memory itself (state_dict's are detached).
        model_state = dict(model.state_dict()) if snapshot is not None else \
            {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in model.state_dict().items()}
        optimizer_state = optimizer.state_dict() if callable(getattr(optimizer, 'state_dict', None)) else None
    hyperparams_json, hyperparams_plain = _json_safe(hyperparams)
    handler = loop.callbacks_handler
    data_position: Dict[str, Any] = {'epoch': loop.epoch, 'batches_done': None, 'epoch_start_rng': None,
                                     'loss_batch_accum': [], 'grads': None}
    losses: Optional[LossesOverRanks] = None
    gather = all_ranks and distributed.is_distributed() and loop.world_size > 1
    if mid_epoch:
        data_position.update(batches_done=loop.iteration + 1,
                             epoch_start_rng=loop.epoch_start_rng,
                             loss_batch_accum=_plain_losses(loop.loss_batch_accum),
                             samples_done=samples_done_in_epoch(loop),
                             sample_offset=loop.epoch_samples_offset)
        if data_position['epoch_start_rng'] is None:
            # Hooks driven by hand outside fit (AIToolbox code does): there is no epoch start to record. The
            # checkpoint is still written; resuming it continues after the same number of batches, with a warning.
            logger.warning('Mid-epoch checkpoint taken outside fit: the RNG state of the epoch start is unknown, so '
                           'a run resumed from it skips %d batches of a new data order', loop.iteration + 1)
        if gather:
            every_rank = _gather_losses(_losses_to_send(_plain_losses(loop.loss_batch_accum)))
            data_position['loss_batch_accum_ranks'] = every_rank
            data_position['loss_batch_accum'] = _losses_over_ranks(data_position['loss_batch_accum'], every_rank)
            data_position['epoch_start_rng_ranks'] = _gather(loop.epoch_start_rng)
        elif fsdp and loop.world_size > 1:
            losses = LossesOverRanks(data_position['loss_batch_accum'])
        if not loop.should_execute_optimizer_update():
            # Inside a gradient-accumulation window: the accumulated gradients are part of the state.
            if fsdp:
                raise sharded_checkpoint.gradients_inside_window_error()
            data_position['grads'] = [None if p.grad is None else p.grad.detach().cpu().clone()
                                      for p in model.parameters()]
    rng = capture_rng_state(loop)
    experiment = loop.experiment
    checkpoint = {
        'format_version': FORMAT_VERSION,
        'kind': CHECKPOINT_KIND,
        'model_state_dict': model_state,
        'optimizer_state_dict': optimizer_state,
        'optimizer_class': optimizer_class_names(loop),
        'schedulers_state_dict': [cb.state_dict() for cb in loop.get_schedulers()],
        'amp': loop.amp_scaler.state_dict() if loop.amp_scaler is not None else {},
        'epoch': loop.epoch,
        'iteration_idx': loop.total_iteration_idx,
        'hyperparams': hyperparams_plain,
        'hyperparams_json': hyperparams_json,
        'loop': {'epochs_completed': loop.epoch if mid_epoch else loop.epochs_completed,
                 'epoch': loop.epoch, 'iteration': loop.iteration,
                 'total_iteration_idx': loop.total_iteration_idx, 'grad_accumulation': loop.grad_accumulation,
                 'world_size': loop.world_size, 'batch_size': train_batch_size(loop),
                 'train_sampler_seed': _train_sampler_seed(loop)},
        'train_history': loop.train_history.state_dict(),
        'callbacks': handler.callbacks_state_dict(),
        'rng': rng,
        'data_position': data_position,
        'experiment': {
            'project_name': experiment.project_name if experiment else getattr(loop, 'project_name', None),
            'experiment_name': experiment.experiment_name if experiment else getattr(loop, 'experiment_name', None),
            'experiment_timestamp': loop.experiment_timestamp},
    }
    if gather:
        checkpoint['rng_ranks'] = _gather(rng)
    # One tensor per list, not one record per batch: a checkpoint late in a long epoch stays small.
    data_position['loss_batch_accum'] = _pack_losses(data_position['loss_batch_accum'])
    if 'loss_batch_accum_ranks' in data_position:
        data_position['loss_batch_accum_ranks'] = [_pack_losses(rank_losses)
                                                   for rank_losses in data_position['loss_batch_accum_ranks']]
    if snapshot is None:
        _check_weights_only_safe_but_rng_states(checkpoint)
    else:
        checkpoint = _copy_but_rng_states(checkpoint, snapshot)
    return checkpoint, losses

# The keys of a checkpoint, and of its 'data_position', that hold RNG states (capture_rng_state's dicts).
_RNG_KEYS = ('rng', 'rng_ranks')
_POSITION_RNG_KEYS = ('epoch_start_rng', 'epoch_start_rng_ranks')

def _without_rng_states(checkpoint: Dict[str, Any]) -> Dict[str, Any]:
    """``checkpoint`` with None in place of its RNG states (shallow copies of it and of its 'data_position'; the
    keys and their order the same)."""
    position = checkpoint['data_position']
    return {**checkpoint, **{key: None for key in _RNG_KEYS if key in checkpoint},
            'data_position': {**position, **{key: None for key in _POSITION_RNG_KEYS if key in position}}}

def _check_weights_only_safe_but_rng_states(checkpoint: Dict[str, Any]) -> None:
    """check_weights_only_safe(checkpoint), less the RNG states: capture_rng_state makes them of tensors, numbers
    and strings only, and walking their Python RNG state (625 numbers each) was a good part of the time a save
    holds the training thread. Errors name the same places as check_weights_only_safe(checkpoint)."""
    check_weights_only_safe(_without_rng_states(checkpoint))

def _copy_but_rng_states(checkpoint: Dict[str, Any], snapshot: Callable[[Any], Any]) -> Dict[str, Any]:
    """``snapshot(checkpoint)``, but the RNG states kept as they are: capture_rng_state made them anew for this
    checkpoint (nothing else holds them), or the loop holds them and replaces them rather than changing them
    (``epoch_start_rng``, and every rank's, gathered), so a background write may read them while training goes on.
    Copying them would walk the 625 numbers of each Python RNG state on the training thread."""
    copied = snapshot(_without_rng_states(checkpoint))
    position = checkpoint['data_position']
    copied.update({key: checkpoint[key] for key in _RNG_KEYS if key in checkpoint})
    copied['data_position'].update({key: position[key] for key in _POSITION_RNG_KEYS if key in position})
    return copied

def copy_tree(value: Any, copy_tensor: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``value`` (dicts, lists and tuples of tensors and plain values) with every tensor copied by ``copy_tensor``
    and everything else deep-copied."""
    if isinstance(value, torch.Tensor):
        return copy_tensor(value.detach())
    if isinstance(value, dict):
        return type(value)((k, copy_tree(v, copy_tensor)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(copy_tree(v, copy_tensor) for v in value)
    return copy.deepcopy(value)

def build_snapshot(loop: 'TrainLoop', copy_tensor: Callable[[torch.Tensor], torch.Tensor]) -> Dict[str, Any]:
    """The loop's state after this batch as a mid-epoch checkpoint dict kept in memory (for
    ``TrainLoop.restart_from``): :func:`build_checkpoint`'s layout, with every tensor of the weights, the optimizer
    state and the callbacks' state copied by ``copy_tensor`` (a clone on the device, or a copy into pinned host memory
    that does not wait), and nothing read from the device on the host (only the fp16 GradScaler's state is, when it is
    on). Taken between two optimizer updates (no accumulated gradients); not for a sharded (FSDP) model."""
    model, optimizer = loop.model, loop.optimizer
    model_state = {k: copy_tensor(v.detach()) if isinstance(v, torch.Tensor) else copy.deepcopy(v)
                   for k, v in model.state_dict().items()}
    optimizer_state = copy_tree(optimizer.state_dict(), copy_tensor) \
        if callable(getattr(optimizer, 'state_dict', None)) else None
    handler = loop.callbacks_handler
    return {
        'format_version': FORMAT_VERSION,
        'kind': CHECKPOINT_KIND,
        'model_state_dict': model_state,
        'optimizer_state_dict': optimizer_state,
        'optimizer_class': optimizer_class_names(loop),
        'schedulers_state_dict': [copy_tree(cb.state_dict(), copy_tensor) for cb in loop.get_schedulers()],
        'amp': loop.amp_scaler.state_dict() if loop.amp_scaler.is_enabled() else {},
        'epoch': loop.epoch,
        'iteration_idx': loop.total_iteration_idx,
        'hyperparams': {}, 'hyperparams_json': '{}',
        'loop': {'epochs_completed': loop.epoch, 'epoch': loop.epoch, 'iteration': loop.iteration,
                 'total_iteration_idx': loop.total_iteration_idx, 'grad_accumulation': loop.grad_accumulation,
                 'world_size': loop.world_size, 'batch_size': train_batch_size(loop),
                 'train_sampler_seed': _train_sampler_seed(loop)},
        'train_history': loop.train_history.state_dict(),
        'callbacks': copy_tree(handler.callbacks_state_dict(), copy_tensor),
        'rng': capture_rng_state(loop),
        # The running losses are detached tensors the loop never changes: kept as they are.
        'data_position': {'epoch': loop.epoch, 'batches_done': loop.iteration + 1,
                          'epoch_start_rng': loop.epoch_start_rng, 'loss_batch_accum': list(loop.loss_batch_accum),
                          'grads': None, 'samples_done': samples_done_in_epoch(loop),
                          'sample_offset': loop.epoch_samples_offset},
        'experiment': {'project_name': None, 'experiment_name': None,
                       'experiment_timestamp': loop.experiment_timestamp},
    }
