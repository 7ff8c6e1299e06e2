"""Sharded checkpoints of an FSDP fit (``gpu_mode='fsdp'``), written and read with ``torch.distributed.checkpoint``
(DCP).

A sharded checkpoint is a folder, ``checkpoint_model/model_<experiment>_<timestamp>_E<epoch>.dcp/``::

    train_state.pt       the rest of the training state (loop_state.build_checkpoint without weights: history,
                         counters, RNG, callbacks' state, ...), written by rank 0, weights_only-loadable
    __<rank>_0.distcp    each process's shards of the model and the optimizer state (DCP's files)
    .metadata            DCP's index of the shards, written last, once every rank's shards are written

The folder is written as ``<name>.tmp`` and renamed by rank 0 once ``dcp.save`` has returned on every rank, so a
folder with the final name is complete; its ``.metadata`` file is the marker of completeness, and the
``latest_checkpoint.txt`` pointer names that file (written after the rename). To S3 the other files are uploaded
first and ``.metadata`` last, with the cloud pointer set once it is uploaded (the uploader sends in order).

Model and optimizer go through ``torch.distributed.checkpoint.state_dict.get_state_dict`` / ``set_state_dict``:
keys are parameter names (FQNs), values DTensors. DCP reshards on load, so a checkpoint written by N processes
resumes on M processes, in a single process without a process group included (then the model is a plain module).
"""
from __future__ import annotations

import logging
import os
import shutil
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict, set_state_dict)

from . import distributed
from .checkpoint import CheckpointError, atomic_torch_save, load_checkpoint

if TYPE_CHECKING:
    from .train_loop import TrainLoop

logger = logging.getLogger(__name__)

SUFFIX = '.dcp'
MARKER = '.metadata'             # DCP's own metadata file: written last, so its presence means complete
TRAIN_STATE_FILE = 'train_state.pt'
#: Key of a loaded sharded checkpoint's train state that names its folder (set on load, never saved).
FOLDER_KEY = 'sharded_checkpoint'


def folder_name(file_name: str) -> str:
    """``model_..._E3.pth`` -> ``model_..._E3.dcp``: the folder a sharded checkpoint of that name is written to."""
    root, ext = os.path.splitext(file_name)
    return (root if ext in ('.pth', '.pt') else file_name) + SUFFIX


def is_sharded_checkpoint(path: str | os.PathLike[str]) -> bool:
    """True for a complete sharded checkpoint: its folder, or its ``.metadata`` marker (what pointers name)."""
    path = os.fspath(path)
    folder = os.path.dirname(path) if os.path.basename(path) == MARKER else path
    return os.path.isdir(folder) and os.path.isfile(os.path.join(folder, MARKER)) \
        and os.path.isfile(os.path.join(folder, TRAIN_STATE_FILE))


def checkpoint_folder(path: str | os.PathLike[str]) -> str:
    """The folder of a sharded checkpoint given the folder or its marker file."""
    path = os.fspath(path)
    return os.path.dirname(path) if os.path.basename(path) == MARKER else path


def _optimizers(loop: TrainLoop) -> list[Any]:
    return list(loop.optimizers) if loop.optimizer is not None else []


def _broadcast(value: Any) -> Any:
    if not distributed.is_distributed():
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def save(loop: TrainLoop, folder: str | None, train_state: dict[str, Any]) -> str:
    """Write the loop's sharded checkpoint into ``folder`` (``....dcp``); every process must call it.

    ``train_state`` is ``loop_state.build_checkpoint(loop, ..., weights=False)``; rank 0's is written. ``folder`` is
    taken from rank 0 (other ranks may pass anything). Returns the marker file's path, complete on return."""
    folder = _broadcast(folder)
    if not isinstance(folder, str):
        raise ValueError('sharded_checkpoint.save: rank 0 must give the checkpoint folder')
    tmp = folder + '.tmp'
    if distributed.is_main_process():
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        atomic_torch_save(train_state, os.path.join(tmp, TRAIN_STATE_FILE), temp_dir=tmp)
    if distributed.is_distributed():
        dist.barrier()
    model_state, optimizer_state = get_state_dict(loop.model, _optimizers(loop))
    dcp.save({'model': model_state, 'optim': optimizer_state}, checkpoint_id=tmp)
    # dcp.save returns on every rank after the coordinator wrote .metadata, i.e. after every shard is written.
    if distributed.is_main_process():
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    if distributed.is_distributed():
        dist.barrier()      # nobody moves on (e.g. to the next save of the same name) before the rename
    return os.path.join(folder, MARKER)


def upload_order(folder: str) -> list[str]:
    """The files of a complete sharded checkpoint in the order they must be uploaded: the marker last, so that a
    cloud pointer set after it never names a folder with missing shards."""
    names = sorted(n for n in os.listdir(folder) if n != MARKER)
    return [os.path.join(folder, n) for n in names] + [os.path.join(folder, MARKER)]


def load_train_state(path: str | os.PathLike[str], map_location: Any = 'cpu') -> dict[str, Any]:
    """The training state of a sharded checkpoint (folder or marker), with ``FOLDER_KEY`` naming the folder; its
    model and optimizer are loaded later, by :func:`load_model_and_optimizer`, once the model is sharded."""
    folder = checkpoint_folder(path)
    if not is_sharded_checkpoint(folder):
        raise CheckpointError(f'{folder} is not a complete sharded checkpoint (no {MARKER} or {TRAIN_STATE_FILE})')
    state = load_checkpoint(os.path.join(folder, TRAIN_STATE_FILE), map_location=map_location)
    if not isinstance(state, dict):
        raise CheckpointError(f'{folder}/{TRAIN_STATE_FILE} is not a training state')
    state[FOLDER_KEY] = folder
    return state


def load_model_and_optimizer(loop: TrainLoop, folder: str, source: str) -> None:
    """Load the model and optimizer state of the sharded checkpoint ``folder`` into the loop: sharded (every
    process must call it; DCP reads each rank's part, whatever the number of processes that wrote it) or a plain
    module in a single process."""
    optimizers = _optimizers(loop)
    model_state, optimizer_state = get_state_dict(loop.model, optimizers)
    try:
        # dcp.load fills the tensors of these dicts in place, reading this rank's part from every file needed.
        dcp.load({'model': model_state, 'optim': optimizer_state}, checkpoint_id=folder)
        set_state_dict(loop.model, optimizers, model_state_dict=model_state, optim_state_dict=optimizer_state)
    except (RuntimeError, ValueError, KeyError) as error:
        raise CheckpointError(f'{source}: its sharded model / optimizer state does not fit this TrainLoop '
                              f'({error}); was it saved with a different model or optimizer?') from error


def full_state(loop: TrainLoop) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The whole model state dict and optimizer state (keyed by parameter name), gathered to rank 0 on the CPU
    (other ranks get empty dicts); a collective under FSDP: every process must call it."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    optimizers = _optimizers(loop)
    if not optimizers:
        return get_model_state_dict(loop.model, options=options), None
    return get_state_dict(loop.model, optimizers, options=options)


def load_full_state(loop: TrainLoop, model_state: dict[str, Any], optimizer_state: Any) -> None:
    """Load a whole (unsharded) model state dict, and optimizer state, into the loop's model, which may be sharded
    (each rank keeps its part) or plain. ``optimizer_state`` is keyed by parameter name (as :func:`full_state`
    returns it) or by index (a plain ``optimizer.state_dict()``, e.g. from a single-process checkpoint)."""
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(loop.model, model_state, options=options)
    optimizers = _optimizers(loop)
    if optimizer_state is None or not optimizers:
        return
    if isinstance(optimizer_state, list):       # a MultiOptimizer's state dicts
        optimizer_state = _merge_by_name(loop, optimizers, optimizer_state)
    elif not _keyed_by_name(optimizer_state):
        optimizer_state = _merge_by_name(loop, optimizers, [optimizer_state])
    set_optimizer_state_dict(loop.model, optimizers, optimizer_state, options=options)


def index_keyed(loop: TrainLoop, optimizer_state: dict[str, Any]) -> Any:
    """An optimizer state keyed by parameter name (DCP's helpers, :func:`full_state`) in ``optimizer.state_dict()``'s
    own layout (parameters numbered in group order), so that a single-process loop loads it with
    ``optimizer.load_state_dict``; a list of such dicts for a MultiOptimizer (as the loop's checkpoints keep it)."""
    if not optimizer_state:
        return optimizer_state      # not rank 0 of a gathered state: nothing here
    flat_groups = list(optimizer_state['param_groups'])
    states = []
    for optimizer in _optimizers(loop):
        own_groups, flat_groups = flat_groups[:len(optimizer.param_groups)], flat_groups[len(optimizer.param_groups):]
        index = 0
        groups, state = [], {}
        for group in own_groups:
            numbers = []
            for fqn in group['params']:
                if fqn in optimizer_state['state']:
                    state[index] = optimizer_state['state'][fqn]
                numbers.append(index)
                index += 1
            groups.append({**{k: v for k, v in group.items() if k != 'params'}, 'params': numbers})
        states.append({'state': state, 'param_groups': groups})
    return states if hasattr(loop.optimizer, 'optimizer_list') else states[0]     # a MultiOptimizer: a list


def _keyed_by_name(optimizer_state: dict[str, Any]) -> bool:
    groups = optimizer_state.get('param_groups', [])
    return bool(groups) and all(isinstance(p, str) for g in groups for p in g['params'])


def _merge_by_name(loop: TrainLoop, optimizers: list[Any], states: list[dict[str, Any]]) -> dict[str, Any]:
    """Index-keyed optimizer state dicts -> one state keyed by parameter name, as DCP's helpers expect."""
    names = {id(p): n for n, p in loop.model.named_parameters()}
    merged: dict[str, Any] = {'state': {}, 'param_groups': []}
    for optimizer, state in zip(optimizers, states):
        for group, saved_group in zip(optimizer.param_groups, state['param_groups']):
            fqns = [names[id(p)] for p in group['params']]
            by_index = dict(zip(saved_group['params'], fqns))
            merged['param_groups'].append({**{k: v for k, v in saved_group.items() if k != 'params'},
                                           'params': fqns})
            for index, fqn in by_index.items():
                if index in state['state']:
                    merged['state'][fqn] = state['state'][index]
    return merged


def gradients_inside_window_error() -> CheckpointError:
    """What a mid-epoch sharded checkpoint inside a gradient-accumulation window raises (not supported)."""
    return CheckpointError("gpu_mode='fsdp': a mid-epoch checkpoint inside a gradient-accumulation window would have "
                           'to keep the sharded accumulated gradients, which sharded checkpoints do not hold; '
                           'checkpoint on optimizer-update batches (save_frequency a multiple of grad_accumulation)')


__all__ = ['SUFFIX', 'MARKER', 'TRAIN_STATE_FILE', 'FOLDER_KEY', 'folder_name', 'is_sharded_checkpoint',
           'checkpoint_folder', 'save', 'upload_order', 'load_train_state', 'load_model_and_optimizer', 'full_state',
           'load_full_state', 'index_keyed', 'gradients_inside_window_error']
