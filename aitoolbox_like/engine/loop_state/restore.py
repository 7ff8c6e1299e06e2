"""A checkpoint dict into the loop: checked against the model and the optimizer(s) before anything changes (a load
that would fail part-way fails first, with nothing changed), then weights, optimizer, grad scaler, history,
counters, callback state and RNG; the position inside an epoch is returned for the resume plan."""
import logging

import torch

from ... import distributed
from ...checkpoint import sharded as sharded_checkpoint
from ...checkpoint.files import CheckpointError, load_model_weights
from .build import CHECKPOINT_KIND, optimizer_class_names, train_batch_size, unpack_losses
from .rng import restore_rng_state

logger = logging.getLogger(__name__)

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

def load_weights_optimizer_scaler(loop, checkpoint, source):
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
    load_weights_optimizer_scaler(loop, checkpoint, source)

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
        return unpack_losses(every_rank[loop.global_rank])
    return unpack_losses(position['loss_batch_accum'])

def _continue_data_order(loop, counters):
    """Keep the saved run's data order: the shuffling seed of its DistributedSampler (a script that never seeds torch
    draws a new one in each run), and say when the global batch size changed with the number of processes."""
    seed = counters.get('train_sampler_seed')
    samplers = loop.distributed_samplers
    if isinstance(seed, int) and samplers and isinstance(getattr(samplers[0], 'seed', None), int):
        samplers[0].seed = seed
    saved_size, saved_world = counters.get('batch_size'), counters.get('world_size')
    batch_size = train_batch_size(loop)
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
