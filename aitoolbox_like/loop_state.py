"""The full state of a TrainLoop as one weights_only-loadable checkpoint dict, and resuming from it.

Layout of a checkpoint (``format_version`` 1)::

    format_version, kind='aitoolbox_like.train_state'
    model_state_dict                     the model's weights (plain module, never the DDP wrapper)
    optimizer_state_dict                 dict, or a list of dicts for a MultiOptimizer, or None
    schedulers_state_dict                list, one per scheduler callback (AIToolbox's key; also in 'callbacks')
    amp                                  GradScaler state ({} when not using fp16)
    epoch, iteration_idx                 AIToolbox's keys: the epoch and the global batch index
    hyperparams, hyperparams_json        the hyperparameters (JSON-safe copy, and the JSON text)
    loop                                 {'epochs_completed', 'epoch', 'iteration', 'total_iteration_idx',
                                          'grad_accumulation'}
    train_history                        TrainingHistory.state_dict()
    callbacks                            {callback.state_key: callback.state_dict()}
    rng                                  {'torch', 'cuda', 'python', 'numpy', 'loader_generators'} now
    data_position                        {'epoch', 'batches_done' (None: the epoch is complete),
                                          'epoch_start_rng', 'loss_batch_accum', 'grads'}
    experiment                           {'project_name', 'experiment_name', 'experiment_timestamp'}

Exactness: the data order of an epoch comes from the global RNG when the train loader's iterator is
created. A checkpoint taken inside an epoch therefore also keeps the RNG state from the start of that
epoch; a resumed run rebuilds the same permutation from it, skips the batches already trained, then
restores the RNG state of the checkpoint. Evaluation runs under fork_rng in the loop, so it never moves
the training RNG.
"""
import json
import logging
import os
import random
import shutil
import tempfile

from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple, cast

import torch

from . import distributed, sharded_checkpoint
from .checkpoint import FORMAT_VERSION, CheckpointError, check_weights_only_safe, load_checkpoint, load_model_weights
from .experiment import BEST_POINTER, CHECKPOINT_DIR, LATEST_POINTER, LEGACY_LATEST_POINTER  # noqa: F401
from .experiment import find_cloud_checkpoint, find_latest_cloud_checkpoint, get_experiment, is_cloud_mode
from .experiment import bookkeeping_dir, read_pointer, run_owner_alive  # noqa: F401  (read_pointer: kept importable)
from .multi_loss_optim import MultiLoss
from .storage.base import join_key, validate_key
from .storage.local import remove_stray_temp_files
from .storage.urls import is_cloud_url, open_storage, split_url, storage_for_mode

if TYPE_CHECKING:
    from .experiment import Experiment
    from .train_loop import TrainLoop

logger = logging.getLogger(__name__)

CHECKPOINT_KIND = 'aitoolbox_like.train_state'


# ---------------------------------------------------------------------------------------------- RNG


def _loader_generators(loop):
    loader = loop.train_loader
    found = {}
    for name, owner in (('loader', loader), ('sampler', getattr(loader, 'sampler', None)),
                        ('batch_sampler', getattr(getattr(loader, 'batch_sampler', None), 'sampler', None))):
        generator = getattr(owner, 'generator', None)
        if isinstance(generator, torch.Generator):
            found[name] = generator
    return found


def capture_rng_state(loop):
    """Every random-number state the training trajectory can depend on."""
    state = {'torch': torch.get_rng_state(), 'python': _python_rng_state()}
    numpy_state = _numpy_rng_state()
    if numpy_state is not None:
        state['numpy'] = numpy_state
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = list(torch.cuda.get_rng_state_all())
    state['loader_generators'] = {name: g.get_state() for name, g in _loader_generators(loop).items()}
    return state


def restore_rng_state(loop, state):
    torch.set_rng_state(state['torch'])
    if 'python' in state:
        version, internal, gauss = state['python']
        random.setstate((version, tuple(internal), gauss))
    if 'numpy' in state:
        _set_numpy_rng_state(state['numpy'])
    if state.get('cuda') and torch.cuda.is_available():
        cuda_states = state['cuda']
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            logger.warning('Checkpoint has CUDA RNG states of %d devices, this machine has %d; CUDA RNG not restored',
                           len(cuda_states), torch.cuda.device_count())
    generators = _loader_generators(loop)
    for name, generator_state in state.get('loader_generators', {}).items():
        if name in generators:
            generators[name].set_state(generator_state)


def _python_rng_state():
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _numpy_rng_state():
    try:
        import numpy as np
    except ImportError:
        return None
    name, keys, pos, has_gauss, cached = cast(Tuple[str, Any, int, int, float], np.random.get_state(legacy=True))
    return {'name': name, 'keys': torch.from_numpy(keys.astype(np.int64)), 'pos': int(pos),
            'has_gauss': int(has_gauss), 'cached_gaussian': float(cached)}


def _set_numpy_rng_state(state):
    import numpy as np
    np.random.set_state((state['name'], state['keys'].numpy().astype(np.uint32), state['pos'],
                         state['has_gauss'], state['cached_gaussian']))


# ---------------------------------------------------------------------------------------------- build


def _plain_losses(losses):
    return [{'multiloss': dict(loss.loss_dict)} if isinstance(loss, MultiLoss) else loss for loss in losses]


def _rebuild_losses(losses):
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


def _unpack_losses(losses):
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
    return [_unpack_losses(rank_losses) for rank_losses in _gather(sent, group)]


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


def _train_batch_size(loop):
    batch_size = getattr(loop.train_loader, 'batch_size', None)
    return batch_size if isinstance(batch_size, int) and batch_size > 0 else None


def samples_done_in_epoch(loop):
    """How many samples of the epoch's data order (the order of the whole data set, before it is split between
    processes) the batches trained so far in this epoch consumed, over every process; None when unknown (a loader
    without a batch size). The position a run resumes from when the number of processes changed: after k batches of
    B samples on each of W processes, a DistributedSampler has handed out exactly the first k * B * W samples of the
    epoch's permutation."""
    batch_size = _train_batch_size(loop)
    if batch_size is None:
        return None
    return loop.epoch_samples_offset + (loop.iteration + 1) * batch_size * loop.world_size


def _train_sampler_seed(loop):
    samplers = loop.distributed_samplers
    seed = getattr(samplers[0], 'seed', None) if samplers else None
    return seed if isinstance(seed, int) else None


def build_checkpoint(loop, hyperparams=None, mid_epoch=False, weights=True, all_ranks=False):
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
    """
    checkpoint, losses = begin_checkpoint(loop, hyperparams, mid_epoch, weights, all_ranks)
    if losses is not None:
        losses.complete(checkpoint)
    return checkpoint


def begin_checkpoint(loop: 'TrainLoop', hyperparams: Any = None, mid_epoch: bool = False, weights: bool = True,
                     all_ranks: bool = False, snapshot: Optional[Callable[[Any], Any]] = None
                     ) -> Tuple[Dict[str, Any], Optional[LossesOverRanks]]:
    """:func:`build_checkpoint`'s dict, and what is left of it: the mean over ranks of the running losses of an FSDP
    fit's mid-epoch checkpoint without ``all_ranks`` (a collective, which build_checkpoint runs at once), or None.
    Until ``losses.complete(checkpoint)`` has run, the dict holds this rank's own running losses there. The same
    arguments and collectives otherwise: every rank calls it where build_checkpoint would be called, and completes
    the losses at the same point as the others (an asynchronous sharded save: in its background writer).

    ``snapshot`` (``AsyncCheckpointWriter.snapshot``): the dict returned is then a copy that training does not
    change, for a write in the background: what may be shared with the loop, its callbacks or its optimizer is
    copied by ``snapshot``; the RNG states are not (see _copy_but_rng_states)."""
    model = loop.model
    optimizer = loop.optimizer
    fsdp = distributed.is_fsdp_model(model)
    if fsdp or not weights:
        model_state, optimizer_state = sharded_checkpoint.full_state(loop) if weights else ({}, None)
        if optimizer_state is not None:
            optimizer_state = sharded_checkpoint.index_keyed(loop, optimizer_state)
    else:
        model_state = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in model.state_dict().items()}
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
                 'world_size': loop.world_size, 'batch_size': _train_batch_size(loop),
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
    _check_weights_only_safe_but_rng_states(checkpoint)
    if snapshot is not None:
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


# ---------------------------------------------------------------------------------------------- restore


def optimizer_class_names(loop):
    """The class of each optimizer the loop steps (checkpoints record them, so a resume with another optimizer
    class is refused instead of failing a step later)."""
    return [type(optimizer).__qualname__ for optimizer in loop.optimizers] if loop.optimizer is not None else []


def validate_checkpoint(loop, checkpoint, source='checkpoint', check_optimizer_groups=True):
    """Check that ``checkpoint`` fits the loop's model and optimizer(s), before anything is changed: a load that
    would fail part-way must fail here, with the model, the optimizer and the experiment folder untouched.

    ``check_optimizer_groups=False`` leaves out the optimizers' parameter groups, which a stage-switching callback
    (BackboneFinetuning) re-creates from its own restored state before the optimizer state is loaded."""
    if not isinstance(checkpoint, dict) or 'model_state_dict' not in checkpoint:
        raise CheckpointError(f'{source} is not a training checkpoint (no model_state_dict); pass a file written by '
                              f'ModelCheckpoint / ModelIterationCheckpoint / ModelTrainEndSave')
    if checkpoint.get(sharded_checkpoint.FOLDER_KEY):
        return      # sharded weights: DCP checks them against the model when they are loaded
    _check_model_fits(loop.model, checkpoint['model_state_dict'], source)
    optimizer_state = checkpoint.get('optimizer_state_dict')
    if optimizer_state is None or loop.optimizer is None:
        return      # no optimizer yet (a callback sets it): checked again when the checkpoint is applied
    if not callable(getattr(loop.optimizer, 'load_state_dict', None)):
        raise CheckpointError(f'{source} holds optimizer state but the optimizer '
                              f'{type(loop.optimizer).__qualname__} has no load_state_dict()')
    saved_classes = checkpoint.get('optimizer_class')
    own_classes = optimizer_class_names(loop)
    if saved_classes is not None and list(saved_classes) != own_classes:
        raise CheckpointError(f'{source} was saved with the optimizer {", ".join(saved_classes)}, but this TrainLoop '
                              f'has {", ".join(own_classes)}: its state (e.g. Adam\'s moments) does not fit. Build the '
                              f'same optimizer class as the saved run, or load only the weights '
                              f'(PyTorchLocalModelLoader / checkpoint.load_model_weights)')
    states = optimizer_state if isinstance(optimizer_state, list) else [optimizer_state]
    optimizers = list(loop.optimizers)
    if len(states) != len(optimizers):
        raise CheckpointError(f'{source} holds the state of {len(states)} optimizer(s), this TrainLoop has '
                              f'{len(optimizers)}')
    if check_optimizer_groups:
        for idx, (optimizer, state) in enumerate(zip(optimizers, states)):
            _check_optimizer_fits(optimizer, state, f'{source} (optimizer {idx})')


def _check_model_fits(model, state_dict, source):
    own = model.state_dict()
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    reshaped = [f'{k} {tuple(state_dict[k].shape)} vs {tuple(own[k].shape)}' for k in own
                if k in state_dict and isinstance(state_dict[k], torch.Tensor) and isinstance(own[k], torch.Tensor)
                and state_dict[k].shape != own[k].shape]
    details = ([f'missing {missing[:5]}'] if missing else []) + ([f'unexpected {unexpected[:5]}'] if unexpected else []) \
        + ([f'different shapes {reshaped[:5]}'] if reshaped else [])
    if details:
        raise CheckpointError(f'{source} was saved from a different model than {type(model).__qualname__}: '
                              f'{"; ".join(details)}. Nothing was loaded.')


def _check_optimizer_fits(optimizer, state, source):
    groups = getattr(optimizer, 'param_groups', None)
    if groups is None or not isinstance(state, dict) or 'param_groups' not in state:
        return      # a duck-typed optimizer: its own load_state_dict decides
    saved_groups = state['param_groups']
    if len(saved_groups) != len(groups) or any(len(s['params']) != len(g['params'])
                                               for s, g in zip(saved_groups, groups)):
        raise CheckpointError(f'{source}: the saved optimizer has parameter groups of sizes '
                              f'{[len(g["params"]) for g in saved_groups]}, this one '
                              f'{[len(g["params"]) for g in groups]}; was it built over other parameters?')
    params = {saved_id: param for s, g in zip(saved_groups, groups) for saved_id, param in zip(s['params'], g['params'])}
    for saved_id, param_state in state.get('state', {}).items():
        param = params.get(saved_id)
        if param is None:
            continue
        for name, value in param_state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                raise CheckpointError(f'{source}: its state {name!r} has shape {tuple(value.shape)} for a parameter of '
                                      f'shape {tuple(param.shape)}; was it saved with a different model?')


def _load_weights_optimizer_scaler(loop, checkpoint, source):
    """The model weights, the optimizer state and the grad-scaler state of a validated checkpoint."""
    optimizer_state = checkpoint.get('optimizer_state_dict')
    if checkpoint.get(sharded_checkpoint.FOLDER_KEY):       # a sharded (FSDP) checkpoint: DCP reshards
        sharded_checkpoint.load_model_and_optimizer(loop, checkpoint[sharded_checkpoint.FOLDER_KEY], source)
    elif distributed.is_fsdp_model(loop.model):              # a whole checkpoint into a sharded model
        sharded_checkpoint.load_full_state(loop, checkpoint['model_state_dict'], optimizer_state)
    else:
        _load_model(loop, checkpoint['model_state_dict'], source)
    if optimizer_state is not None and not distributed.is_fsdp_model(loop.model):
        if not callable(getattr(loop.optimizer, 'load_state_dict', None)):
            raise CheckpointError(f'{source} holds optimizer state but the optimizer '
                                  f'{type(loop.optimizer).__qualname__} has no load_state_dict()')
        try:
            loop.optimizer.load_state_dict(optimizer_state)
        except (ValueError, KeyError, IndexError, TypeError, RuntimeError) as error:
            raise CheckpointError(f'{source}: its optimizer state does not fit the optimizer of this TrainLoop '
                                  f'({error}); was it saved with a different model or optimizer?') from error
    amp_state = checkpoint.get('amp')
    if amp_state and loop.amp_scaler is not None and loop.amp_scaler.is_enabled():
        loop.amp_scaler.load_state_dict(amp_state)


def apply_checkpoint(loop, checkpoint, source='checkpoint', restore_rng=True, restore_position=True):
    """Load a checkpoint dict into the loop: weights, optimizer, scaler, history, counters, callbacks and RNG.
    A checkpoint in AIToolbox's layout restores what it has (weights, optimizer, schedulers, scaler, epoch).

    Returns the position inside an epoch to continue from (a dict for :meth:`ResumePlan.reopen_epoch`), or None
    when the checkpoint was taken at an epoch's end (or ``restore_position`` is False)."""
    validate_checkpoint(loop, checkpoint, source, check_optimizer_groups=False)
    if checkpoint.get('kind') == CHECKPOINT_KIND:
        # First: a stage-switching callback (e.g. BackboneFinetuning past its unfreeze epoch) rebuilds the
        # optimizer's parameter groups from its state, so the saved optimizer state then fits.
        loop.callbacks_handler.load_callbacks_state_dict(checkpoint.get('callbacks', {}))
    validate_checkpoint(loop, checkpoint, source)
    _load_weights_optimizer_scaler(loop, checkpoint, source)

    if checkpoint.get('kind') != CHECKPOINT_KIND:
        _apply_aitoolbox_checkpoint(loop, checkpoint)
        loop.purge_prediction_cache()
        return None

    loop.train_history.load_state_dict(checkpoint['train_history'])
    counters = checkpoint['loop']
    loop.epochs_completed = counters['epochs_completed']
    # The epoch training continues with (AIToolbox sets it too: callbacks read it in on_train_begin).
    loop.epoch = counters['epochs_completed']
    loop.iteration = counters['iteration']
    loop.total_iteration_idx = counters['total_iteration_idx']
    rng = _own_rank_state(loop, checkpoint['rng'], checkpoint.get('rng_ranks'))
    if restore_rng:
        restore_rng_state(loop, rng)
    _continue_data_order(loop, counters)
    position = checkpoint['data_position']
    resume_position = None
    if restore_position and position.get('batches_done') is not None:
        resume_position = {'epoch': position['epoch'], 'batches_done': position['batches_done'],
                           'epoch_start_rng': _own_rank_state(loop, position['epoch_start_rng'],
                                                              position.get('epoch_start_rng_ranks')),
                           'rng': rng, 'grads': position['grads'],
                           'loss_batch_accum': _own_rank_losses(loop, counters, position),
                           'history': checkpoint['train_history'], 'callbacks': checkpoint.get('callbacks', {}),
                           # Known by position only in a DistributedSampler's order (the saved run's seed kept).
                           'samples_done': position.get('samples_done') if isinstance(
                               counters.get('train_sampler_seed'), int) else None,
                           'sample_offset': position.get('sample_offset', 0),
                           'world_size': counters.get('world_size', 1)}
    loop.purge_prediction_cache()
    logger.info('Resumed from %s: %d epoch(s) done, global batch %d%s', source, loop.epochs_completed,
                loop.total_iteration_idx + 1,
                f", {position['batches_done']} batch(es) into epoch {position['epoch']}" if resume_position else '')
    return resume_position


def _own_rank_state(loop, rank0_state, rank_states):
    """This rank's RNG state from a checkpoint: its own when the checkpoint kept every rank's (and this rank existed
    in the saved run), else rank 0's."""
    rank = loop.global_rank
    if isinstance(rank_states, list) and rank < len(rank_states) and rank_states[rank] is not None:
        return rank_states[rank]
    return rank0_state


def _own_rank_losses(loop, counters, position):
    """The running losses this rank continues the epoch with: its own when the checkpoint kept every rank's and the
    number of ranks is the same, else the means over the saved run's ranks (_losses_over_ranks)."""
    every_rank = position.get('loss_batch_accum_ranks')
    if isinstance(every_rank, list) and len(every_rank) == loop.world_size == counters.get('world_size'):
        return _unpack_losses(every_rank[loop.global_rank])
    return _unpack_losses(position['loss_batch_accum'])


def _continue_data_order(loop, counters):
    """Keep the saved run's data order: the shuffling seed of its DistributedSampler (a script that never seeds torch
    draws a new one in each run), and say when the global batch size changed with the number of processes."""
    seed = counters.get('train_sampler_seed')
    samplers = loop.distributed_samplers
    if isinstance(seed, int) and samplers and isinstance(getattr(samplers[0], 'seed', None), int):
        samplers[0].seed = seed
    saved_size, saved_world = counters.get('batch_size'), counters.get('world_size')
    batch_size = _train_batch_size(loop)
    if saved_size and saved_world and batch_size and saved_size * saved_world != batch_size * loop.world_size \
            and loop.is_main_process():
        logger.warning('The global batch size changes from %d (%d per process x %d processes) when the checkpoint was '
                       'saved to %d (%d x %d) now: each optimizer step averages over a different number of samples, '
                       'and a learning rate tuned for the old size may need scaling', saved_size * saved_world,
                       saved_size, saved_world, batch_size * loop.world_size, batch_size, loop.world_size)


def _load_model(loop, state_dict, source):
    load_model_weights(loop.model, state_dict, source)


def _apply_aitoolbox_checkpoint(loop, checkpoint):
    schedulers = loop.get_schedulers()
    saved = checkpoint.get('schedulers_state_dict') or []
    if schedulers and len(saved) == len(schedulers):
        for scheduler, state in zip(schedulers, saved):
            scheduler.load_state_dict(state)
    elif saved or schedulers:
        logger.warning('Checkpoint has %d scheduler state(s), the loop has %d scheduler callback(s); schedulers not '
                       'restored', len(saved), len(schedulers))
    if isinstance(checkpoint.get('epoch'), int):
        loop.epochs_completed = checkpoint['epoch'] + 1
        loop.epoch = checkpoint['epoch'] + 1
    if isinstance(checkpoint.get('iteration_idx'), int):
        loop.total_iteration_idx = checkpoint['iteration_idx']


# ---------------------------------------------------------------------------------------------- resume


class ResumePlan:
    """How the current fit continues a saved run; the loop owns it as ``loop.resume_plan``.

    Made by ``fit(resume_from=...)`` (from where to resume) or by ModelLoadContinueTraining (an already loaded
    checkpoint). Its steps, each done once even when a DDP process calls them again:

    1. :meth:`load` before callbacks register: read the checkpoint, so the run continues in its experiment folder;
    2. :meth:`apply` once callbacks are registered and the model is on its device: weights, optimizer, history,
       counters, callback state, RNG;
    3. :meth:`reopen_epoch` at the start of the epoch the checkpoint was taken in, when it was taken mid-epoch.

    Args:
        source: what to resume from: a file path, an experiment folder, ``'s3://bucket/key'`` (or ``gs://``,
            ``az://``), ``'latest'``, or
            ``'auto'`` (the newest checkpoint if there is one, else a fresh start: :func:`find_auto_checkpoint`).
        checkpoint: an already loaded checkpoint dict (then ``source`` only names it in messages).
    """

    def __init__(self, source: Any, checkpoint: Optional[Dict[str, Any]] = None) -> None:
        self.source = source
        self.checkpoint = checkpoint
        self.source_name = source if checkpoint is None else str(source)
        self.applied = False
        self.found = True       # False: resume_from='auto' found nothing to resume
        self.position: Optional[Dict[str, Any]] = None      # where inside an epoch to continue, once applied

    def load(self, loop: 'TrainLoop', experiment: Optional['Experiment'], callbacks: Any = None) -> None:
        """Read the checkpoint (once) and move the run into its experiment folder. With ``resume_from='auto'`` and
        nothing to resume, the plan stays empty (:attr:`found` is False) and the run starts from scratch."""
        if self.checkpoint is None and self.source == AUTO:
            found = find_auto_checkpoint(loop, experiment, callbacks)
            if found is None:
                self.found = False
                return
            self.checkpoint, self.source_name = found
        elif self.checkpoint is None:
            self.checkpoint, self.source_name = load_resume_checkpoint(loop, self.source, experiment, callbacks)
        # Before the run moves into the checkpoint's folder: a checkpoint that does not fit changes nothing.
        validate_checkpoint(loop, self.checkpoint, self.source_name, check_optimizer_groups=False)
        adopt_experiment(loop, self.checkpoint, experiment)

    def load_weights_now(self, loop: 'TrainLoop') -> bool:
        """Put the checkpoint's weights, optimizer state and grad-scaler state into the loop now, before ``apply``
        (which puts them in again with the rest): what AIToolbox's ModelLoadContinueTraining loads at
        registration, so that the loop predicts with the loaded model without a fit, and schedulers registered
        after it are built on the saved optimizer state. Returns False (nothing changed) when that cannot be done
        before every callback is registered: a sharded checkpoint or model, or an optimizer whose parameter groups
        a callback has yet to rebuild."""
        checkpoint = self.checkpoint
        assert checkpoint is not None, 'load() runs first'
        if checkpoint.get(sharded_checkpoint.FOLDER_KEY) or distributed.is_fsdp_model(loop.model):
            return False
        try:
            validate_checkpoint(loop, checkpoint, self.source_name)
        except CheckpointError:
            return False        # apply() loads it, or names what does not fit, once every callback is registered
        if not callable(getattr(loop.optimizer, 'load_state_dict', None)):
            # No optimizer yet (AIToolbox code may set it later): the weights now, the rest when fit starts.
            checkpoint = dict(checkpoint, optimizer_state_dict=None)
        _load_weights_optimizer_scaler(loop, checkpoint, self.source_name)
        loop.purge_prediction_cache()
        return True

    def apply(self, loop: 'TrainLoop') -> None:
        """Put the checkpoint's state into the loop (once)."""
        if not self.applied and self.found:
            self.position = apply_checkpoint(loop, self.checkpoint, self.source_name)
            self.applied = True

    def resumes_inside(self, epoch: int) -> bool:
        """True when the run continues inside ``epoch`` (the checkpoint was taken after one of its batches)."""
        return self.position is not None and self.position['epoch'] == epoch

    def reopen_epoch(self, loop: 'TrainLoop') -> Tuple[Iterator[Any], int, Any]:
        """The train loader's iterator for the epoch being resumed, positioned after the samples the checkpoint
        already trained, the index of the next batch, and the loader the iterator comes from (its len() is the
        epoch's number of batches).

        The data order of an epoch comes from the RNG state at the epoch's start, which the checkpoint kept: the
        same permutation is rebuilt, the trained batches are skipped, then the checkpoint's own RNG state, history,
        callback state, running losses and accumulated gradients are put back (on_epoch_begin just ran again for
        this epoch; its effects were already in the checkpoint). When the number of processes changed since the
        checkpoint, the samples it trained are known by their position in the epoch's order: the rest of that
        order is split between the processes of this run (:func:`remaining_epoch_loader`)."""
        resume = self.position
        assert resume is not None, 'reopen_epoch() is called only when resumes_inside(epoch)'
        self.position = None
        if resume['epoch_start_rng'] is not None:
            restore_rng_state(loop, resume['epoch_start_rng'])
            loop.epoch_start_rng = resume['epoch_start_rng']
        else:
            logger.warning('The checkpoint was taken outside fit, without the RNG state of its epoch start: the '
                           'resumed epoch skips %d batches of a new data order, so with a shuffling loader some '
                           'samples of this epoch are trained twice and some not at all', resume['batches_done'])
            loop.epoch_start_rng = capture_rng_state(loop)
        loader, start = loop.train_loader, resume['batches_done']
        loop.epoch_samples_offset = 0
        if resume['world_size'] != loop.world_size or resume['sample_offset']:
            remaining = remaining_epoch_loader(loop, resume['samples_done'])
            if remaining is not None:
                loader, start = remaining, 0
                loop.epoch_samples_offset = resume['samples_done']
                if loop.is_main_process():
                    logger.info('Resuming epoch %d on %d process(es) (the checkpoint was saved by %d): %d samples of '
                                'its order were trained, the other %d are split between the processes',
                                loop.epoch, loop.world_size, resume['world_size'], resume['samples_done'],
                                len(remaining.sampler.order) - resume['samples_done'])
            elif loop.is_main_process():
                logger.warning('The checkpoint was saved by %d process(es), this run has %d, and the train loader\'s '
                               'data order cannot be rebuilt (only a DataLoader whose sampler the distributed fit '
                               'set up can): the resumed epoch skips %d batches per process, so some samples of it '
                               'are trained twice or not at all', resume['world_size'], loop.world_size,
                               resume['batches_done'])
        iterator = iter(loader)
        if loader is loop.train_loader:
            for done in range(start):
                try:
                    next(iterator)
                except StopIteration:
                    raise CheckpointError(f'the checkpoint was taken after {start} batches of epoch {loop.epoch}, '
                                          f'but the train loader now has only {done}; resume with the same data and '
                                          f'batch size') from None
        restore_rng_state(loop, resume['rng'])
        loop.train_history.load_state_dict(resume['history'])
        loop.callbacks_handler.load_callbacks_state_dict(resume['callbacks'])
        loop.loss_batch_accum = [loss.to(loop.device) if isinstance(loss, torch.Tensor) else loss
                                 for loss in _rebuild_losses(resume['loss_batch_accum'])]
        if resume['grads'] is not None:
            for param, grad in zip(loop.model.parameters(), resume['grads']):
                param.grad = None if grad is None else grad.to(param.device)
        return iterator, start, loader


def remaining_epoch_loader(loop: 'TrainLoop', samples_done: Optional[int]) -> Any:
    """A loader over the samples of the current epoch's order after the first ``samples_done``, split between the
    processes of this run as the DistributedSampler splits a whole epoch (padded by repeating its first samples when
    they do not divide evenly, so every process runs the same number of batches), keeping every other DataLoader
    argument. None when the order cannot be rebuilt: ``samples_done`` unknown, or a train loader whose sampler the
    distributed fit did not set up."""
    samplers = loop.distributed_samplers
    sampler = samplers[0] if samplers else None
    if samples_done is None or sampler is None:
        return None
    order = distributed.epoch_order(sampler)
    if order is None:
        return None
    return distributed.loader_with_sampler(
        loop.train_loader, distributed.RemainingOrderSampler(order, samples_done, loop.world_size, loop.global_rank))


# ---------------------------------------------------------------------------------------------- resume_from='auto'


AUTO = 'auto'


def _all_callbacks(loop, callbacks):
    given = list(callbacks) if isinstance(callbacks, (list, tuple)) else []
    found: List[Any] = []
    for cb in list(loop.callbacks) + list(loop.callbacks_handler.cached_callbacks) + given:
        if not any(cb is other for other in found):
            found.append(cb)
    return found


def check_auto_resume(loop: 'TrainLoop', callbacks: Any) -> None:
    """``fit(resume_from='auto')`` before anything starts: some callback must write the checkpoints a restarted run
    resumes from (it sets ``writes_checkpoints``: ModelCheckpoint, ModelIterationCheckpoint, the tracking loops'
    savers, RayTrainReport); without one every restart would silently train from zero again."""
    if not any(getattr(cb, 'writes_checkpoints', False) for cb in _all_callbacks(loop, callbacks)):
        raise ValueError("fit(resume_from='auto') continues from the run's newest checkpoint, but no registered "
                         'callback writes checkpoints, so every restart would train from scratch: add a '
                         'ModelCheckpoint or ModelIterationCheckpoint (or use TrainLoopCheckpoint; under Ray, '
                         'aitoolbox_like.integrations.ray.RayTrainReport), or leave resume_from out')


def _find_here(loop, experiment, callbacks):
    """What rank 0 would resume from: ('path', path, None), ('loaded', source name, checkpoint) or None."""
    for cb in _all_callbacks(loop, callbacks):
        finder = getattr(cb, 'find_resume_checkpoint', None)
        if not callable(finder):
            continue
        found = finder(loop)
        if isinstance(found, dict):
            return 'loaded', f'the checkpoint of {type(cb).__name__}', found
        if found is not None:
            return 'path', os.fspath(found), None
    if experiment is None:
        return None
    path = find_latest_local(experiment)
    if path is not None:
        return 'path', path, None
    remote = _find_latest_in_cloud(loop, experiment, callbacks)
    if remote is not None:
        checkpoint, uri = remote
        return 'loaded', uri, checkpoint
    return None


def find_auto_checkpoint(loop: 'TrainLoop', experiment: Optional['Experiment'],
                         callbacks: Any = None) -> Optional[Tuple[Dict[str, Any], str]]:
    """``resume_from='auto'``: the checkpoint to continue from, as ``(checkpoint, source name)``, or None to start
    from scratch (logged). Looked for in this order: a callback's ``find_resume_checkpoint(loop)`` (e.g. Ray Train's
    checkpoint), the experiment's newest complete local checkpoint, its newest copy in the cloud (a new machine). In a
    distributed run rank 0 decides and every rank resumes from the same checkpoint: each reads the file itself
    when it sees it, else rank 0 sends its copy (a collective)."""
    check_auto_resume(loop, callbacks)
    distributed_run = distributed.is_distributed() and distributed.get_world_size() > 1
    found = _find_here(loop, experiment, callbacks) if distributed.get_rank() == 0 else None
    if distributed_run:
        choice: List[Any] = [found[:2] if found is not None else None]
        torch.distributed.broadcast_object_list(choice, src=0)
        if choice[0] is not None and found is None:
            found = (choice[0][0], choice[0][1], None)
        elif choice[0] is None:
            found = None
    if found is None:
        where = f'{experiment.project_name}/{experiment.experiment_name} in {experiment.root}' if experiment else \
            'this run (no experiment folder)'
        if loop.is_main_process():
            logger.info("fit(resume_from='auto'): no checkpoint of %s yet: training from scratch", where)
        return None
    kind, source, checkpoint = found
    if kind == 'path' and checkpoint is None and (not distributed_run or _visible_everywhere(source)):
        checkpoint, source = load_resume_checkpoint(loop, source, experiment, callbacks)
    elif distributed_run:
        if kind == 'path' and loop.is_main_process():
            checkpoint, _ = load_resume_checkpoint(loop, source, experiment, callbacks)
        shipped: List[Any] = [checkpoint]
        torch.distributed.broadcast_object_list(shipped, src=0)
        checkpoint = shipped[0]
    if loop.is_main_process():
        logger.info("fit(resume_from='auto'): resuming from %s", source)
    return checkpoint, source


def _visible_everywhere(path):
    """Every rank sees the file ``path`` (a shared file system, or one machine): a collective."""
    visible: List[Any] = [None] * distributed.get_world_size()
    torch.distributed.all_gather_object(visible, os.path.exists(path))
    return all(visible)


def _experiment_callbacks(loop, callbacks):
    """Callbacks that say which experiment the run writes to (saving callbacks, ModelLoadContinueTraining): they
    set ``defines_experiment``. Found by that attribute so this core module needs no callback module."""
    found = []
    # Not validated yet (the handler does that, with a clear error): look only inside a list.
    callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else []
    for cb in list(loop.callbacks) + list(loop.callbacks_handler.cached_callbacks) + callbacks:
        if getattr(cb, 'defines_experiment', False) and cb not in found:
            found.append(cb)
    return found


def _experiment_for(loop, callbacks):
    experiment = get_experiment(loop)
    if experiment is not None:
        return experiment
    for cb in _experiment_callbacks(loop, callbacks):
        names = (cb.project_name, cb.experiment_name, cb.local_model_result_folder_path)
        if None not in names:
            return get_experiment(loop, *names)
    return None


def prepare_fit(loop, callbacks):
    """Start of a fit, before callbacks register: load the checkpoint to resume from (so the run continues in
    the checkpoint's experiment folder) and claim the experiment folder of a tracking loop. Safe to call again in
    the same fit (a DDP process prepares before its own registration, then trains)."""
    experiment = _experiment_for(loop, callbacks)
    if loop.resume_plan is not None:
        loop.resume_plan.load(loop, experiment, callbacks)
        if not loop.resume_plan.found:
            loop.resume_plan = None         # resume_from='auto' with nothing to resume: a fresh start
    continuing = any(getattr(cb, 'continues_experiment', False) for cb in _experiment_callbacks(loop, callbacks))
    # A ModelLoadContinueTraining continues an existing folder: claiming a new one first would leave it empty.
    if experiment is not None and not experiment.claimed and not loop.lazy_experiment_save and not continuing:
        experiment.claim()


def adopt_experiment(loop, checkpoint, experiment):
    """A resumed run keeps writing to the experiment folder of its checkpoint."""
    saved: Any = checkpoint.get('experiment') if isinstance(checkpoint, dict) else None
    timestamp = saved.get('experiment_timestamp') if isinstance(saved, dict) else None
    if not isinstance(timestamp, str):
        return
    if experiment is None:
        loop.experiment_timestamp = timestamp
        return
    if (saved.get('project_name'), saved.get('experiment_name')) != (experiment.project_name,
                                                                     experiment.experiment_name):
        logger.info('Resuming a checkpoint of experiment %s/%s under %s/%s: a new experiment folder is used',
                    saved.get('project_name'), saved.get('experiment_name'), experiment.project_name,
                    experiment.experiment_name)
        return
    if loop.is_main_process():
        experiment.adopt(timestamp)
    else:
        loop.experiment_timestamp = timestamp
        experiment.claimed = True


# ---------------------------------------------------------------------------------------------- locating


def find_checkpoint_in_dir(path):
    """The newest complete checkpoint of an experiment folder, given the folder itself or its checkpoint_model
    folder: the one its ``latest_checkpoint.txt`` names, else (a run that died before writing any pointer, or a
    folder of checkpoints from elsewhere) the newest checkpoint file."""
    path = os.path.normpath(path)
    experiment_dir = os.path.dirname(path) if os.path.basename(path) == CHECKPOINT_DIR else path
    found = read_pointer(experiment_dir, LATEST_POINTER)
    if found:
        return found
    for folder in dict.fromkeys((os.path.join(experiment_dir, CHECKPOINT_DIR), path)):
        if os.path.isdir(folder):
            files = [os.path.join(folder, f) for f in os.listdir(folder)
                     if f.endswith(('.pth', '.pt')) and not f.startswith('.')]
            # Sharded (FSDP) checkpoints: complete folders only, named by their marker file as pointers do.
            files += [os.path.join(folder, f, sharded_checkpoint.MARKER) for f in os.listdir(folder)
                      if f.endswith(sharded_checkpoint.SUFFIX) and sharded_checkpoint.is_sharded_checkpoint(
                          os.path.join(folder, f))]
            if files:
                return max(files, key=os.path.getmtime)
    return None


def find_latest_local(experiment):
    project_dir = os.path.join(experiment.root, experiment.project_name)
    prefix = f'{experiment.experiment_name}_'
    try:
        names = sorted((n for n in os.listdir(project_dir) if n.startswith(prefix)), reverse=True)
    except OSError:
        return None
    for name in names:
        # Falls back to the newest file when a run died between a checkpoint and its pointer.
        found = find_checkpoint_in_dir(os.path.join(project_dir, name))
        if found:
            return found
    return None


def remove_unfinished_writes_of_dead_runs(experiment):
    """The temporary files of writes that runs of this experiment's name left when they were killed before their
    first checkpoint (no checkpoint in their folder): removed where the run is known to be dead (its process, on this
    machine, is gone); a run still alive, or on another machine, keeps its folder untouched. Returns the removed
    paths."""
    project_dir = os.path.join(experiment.root, experiment.project_name)
    prefix = f'{experiment.experiment_name}_'
    try:
        names = [n for n in os.listdir(project_dir) if n.startswith(prefix)]
    except OSError:
        return []
    removed = []
    for name in names:
        folder = os.path.join(project_dir, name)
        if find_checkpoint_in_dir(folder) is None and run_owner_alive(folder) is False:
            removed += remove_stray_temp_files(folder) + remove_stray_temp_files(bookkeeping_dir(folder))
    return removed


def load_resume_checkpoint(loop, resume_from, experiment=None, callbacks=None, map_location='cpu',
                           allow_unsafe_pickle=False, endpoint_url=None):
    """Load the checkpoint ``resume_from`` names: a file, an experiment folder, a cloud URL (``s3://bucket/key``,
    ``gs://bucket/key``, ``az://container/key``) or 'latest'. ``endpoint_url`` is the cloud's endpoint (None: the
    client's own resolution, e.g. AWS_ENDPOINT_URL_S3 or STORAGE_EMULATOR_HOST). Returns ``(checkpoint, source)``."""
    if isinstance(resume_from, dict):
        return resume_from, 'the given checkpoint dict'
    resume_from = os.fspath(resume_from)
    if is_cloud_url(resume_from):
        return _load_from_cloud(resume_from, map_location, allow_unsafe_pickle, endpoint_url, experiment)
    if resume_from == 'latest':
        if experiment is None:
            raise ValueError("fit(resume_from='latest') needs to know the experiment: use a TrainLoopCheckpoint (or "
                             'pass a ModelCheckpoint callback), or give the checkpoint path instead')
        path = find_latest_local(experiment)
        if path is None:
            remote = _find_latest_in_cloud(loop, experiment, callbacks)
            if remote is not None:
                return remote
            cleaned = remove_unfinished_writes_of_dead_runs(experiment)
            note = (f' (removed {len(cleaned)} unfinished write(s) left by runs killed before their first '
                    f'checkpoint: {", ".join(cleaned)})' if cleaned else '')
            raise FileNotFoundError(f"fit(resume_from='latest'): no checkpoint of experiment "
                                    f'{experiment.project_name}/{experiment.experiment_name} in {experiment.root}'
                                    f'{note}; start the run without resume_from (or with resume_from=\'auto\', '
                                    f'which starts from scratch when there is no checkpoint)')
    else:
        path = os.path.abspath(os.path.expanduser(resume_from))
        if os.path.isdir(path) and not sharded_checkpoint.is_sharded_checkpoint(path):
            found = find_checkpoint_in_dir(path)
            if found is None:
                raise FileNotFoundError(f'resume_from={resume_from!r}: no checkpoint in this folder')
            path = found
    if sharded_checkpoint.is_sharded_checkpoint(path):
        return sharded_checkpoint.load_train_state(path, map_location), path
    return load_checkpoint(path, map_location=map_location, allow_unsafe_pickle=allow_unsafe_pickle), path


def _download_and_load(storage, key, map_location, allow_unsafe_pickle):
    tmp_dir = tempfile.mkdtemp(prefix='aitoolbox_like_resume_')
    try:
        local = os.path.join(tmp_dir, key.rsplit('/', 1)[-1])
        storage.load_file(key, local)
        uri = storage.uri(key)
        # Errors name the cloud address, not the temporary copy (deleted by the time the user reads them).
        return load_checkpoint(local, map_location=map_location, allow_unsafe_pickle=allow_unsafe_pickle,
                               source_name=uri), uri
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _sharded_folder_key(key):
    """The folder key when ``key`` names a sharded checkpoint (its ``.dcp`` folder, its marker or another of its files:
    ``train_state.pt`` or a shard, none of which is a checkpoint on its own), else None."""
    key = key.rstrip('/')
    folder = key.rpartition('/')[0]
    if folder.endswith(sharded_checkpoint.SUFFIX):
        key = folder
    return key if key.endswith(sharded_checkpoint.SUFFIX) else None


def _download_sharded(storage, folder_key, experiment, map_location):
    """A sharded checkpoint in the cloud: its folder is downloaded into the same place of the local experiments root (the
    train state is read now, the shards once the model is sharded: sharded_checkpoint.load_model_and_optimizer)."""
    uri = storage.uri(folder_key)
    if experiment is None:
        raise ValueError(f'resume_from={uri!r}: a sharded (FSDP) checkpoint is downloaded into the local '
                         f'experiment folder before it is loaded, and this TrainLoop has none; use a '
                         f'TrainLoopCheckpoint (or pass a ModelCheckpoint, whose local_model_result_folder_path is the '
                         f'root), or download the folder and give its path')
    parts = folder_key.split('/')
    if len(parts) < 4 or parts[-2] != CHECKPOINT_DIR:
        raise CheckpointError(f'resume_from={uri!r}: expected a sharded checkpoint of an experiment folder, '
                              f'.../<project>/<experiment>_<timestamp>/{CHECKPOINT_DIR}/<name>'
                              f'{sharded_checkpoint.SUFFIX}')
    place = validate_key('/'.join(parts[-4:]), 'sharded checkpoint folder')
    local = sharded_checkpoint.download(storage, folder_key, os.path.join(experiment.root, *place.split('/')))
    return sharded_checkpoint.load_train_state(local, map_location), uri


def _download_target(storage, key, experiment, map_location, allow_unsafe_pickle):
    folder_key = _sharded_folder_key(key)
    if folder_key is not None:
        return _download_sharded(storage, folder_key, experiment, map_location)
    return _download_and_load(storage, key, map_location, allow_unsafe_pickle)


def _pointer_target(storage, pointer_key):
    """The key of the checkpoint a cloud pointer names. A root pointer holds the path inside the experiment
    folder; a legacy ``checkpoint_model/latest`` holds a key whose last part is the file name."""
    folder, _, name = pointer_key.rpartition('/')
    text = storage.read_text(pointer_key).strip()
    if name == LEGACY_LATEST_POINTER:
        return join_key(folder, text.rsplit('/', 1)[-1])
    try:
        validate_key(text, 'pointer target')
    except ValueError:
        raise CheckpointError(f'{storage.uri(pointer_key)} does not name a file inside its experiment folder '
                              f'({text!r})') from None
    return join_key(folder, text)


def _load_from_cloud(uri, map_location, allow_unsafe_pickle, endpoint_url=None, experiment=None):
    scheme, bucket, key = split_url(uri)
    if not bucket or not key:
        raise ValueError(f'resume_from={uri!r}: expected {scheme}://bucket/key/of/checkpoint.pth or '
                         f'{scheme}://bucket/<experiment folder>')
    storage = open_storage(f'{scheme}://{bucket}', endpoint_url=endpoint_url)
    is_pointer = key.rsplit('/', 1)[-1] in (LATEST_POINTER, LEGACY_LATEST_POINTER)
    if _sharded_folder_key(key) is not None:
        return _download_sharded(storage, _sharded_folder_key(key), experiment, map_location)
    if key.endswith(('.pth', '.pt')) or not is_pointer and storage.exists(key):
        return _download_and_load(storage, key, map_location, allow_unsafe_pickle)
    if is_pointer and storage.exists(key):
        # A pointer object of an experiment saved by an earlier version, named explicitly.
        return _download_target(storage, _pointer_target(storage, key), experiment, map_location, allow_unsafe_pickle)
    experiment_key = key[:-len(CHECKPOINT_DIR) - 1] if key.endswith(f'/{CHECKPOINT_DIR}') else key
    # The bucket holds only AIToolbox's files: the newest checkpoint is found by its name.
    found = find_cloud_checkpoint(storage, experiment_key)
    if found is not None:
        return _download_target(storage, found, experiment, map_location, allow_unsafe_pickle)
    raise FileNotFoundError(f'resume_from={uri!r}: no checkpoint there (neither a file nor an experiment folder '
                            f'with checkpoints in {CHECKPOINT_DIR}/)')


def _find_latest_in_cloud(loop, experiment, callbacks):
    details = None
    for cb in _experiment_callbacks(loop, callbacks):
        if is_cloud_mode(getattr(cb, 'cloud_save_mode', None)) and getattr(cb, 'bucket_name', None):
            details = (cb.cloud_save_mode, cb.bucket_name, cb.cloud_dir_prefix or '', getattr(cb, 'endpoint_url', None))
            break
    if details is None:
        return None
    storage = storage_for_mode(details[0], details[1], details[2], endpoint_url=details[3])
    found = find_latest_cloud_checkpoint(storage, experiment.project_name, experiment.experiment_name)
    if found is None:
        return None
    return _download_target(storage, found, experiment, 'cpu', False)
