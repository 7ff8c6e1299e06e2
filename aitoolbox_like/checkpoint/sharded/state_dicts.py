"""A loop's model and optimizer state through ``torch.distributed.checkpoint.state_dict`` (keyed by parameter
name, sharded as DTensors or whole): this rank's part for a sharded save, the sharded load, the whole state gathered
to rank 0 or loaded into a sharded model, and the conversion to ``optimizer.state_dict()``'s numbered layout."""
from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, Protocol

from ..files import CheckpointError


class LoopModelAndOptimizers(Protocol):
    """What these functions read of a TrainLoop: its model (sharded or plain) and optimizers."""

    model: Any
    optimizer: Any

    @property
    def optimizers(self) -> Sequence[Any]: ...


# torch.distributed.checkpoint, and the DTensor and FSDP modules it imports, take about a second to import: every
# process of a run that never writes a sharded checkpoint (each restart of one) would pay it at `import
# aitoolbox_like`. They are imported at the first sharded save or load instead.
def dcp_module() -> Any:
    """``torch.distributed.checkpoint``, imported on first use."""
    import torch.distributed.checkpoint as dcp
    return dcp


def state_dict_api() -> Any:
    """``torch.distributed.checkpoint.state_dict``, imported on first use."""
    import torch.distributed.checkpoint.state_dict as state_dict_api
    return state_dict_api


def loop_optimizers(loop: LoopModelAndOptimizers) -> list[Any]:
    """The loop's optimizers as a list (each of a MultiOptimizer's); empty when it has none."""
    return list(loop.optimizers) if loop.optimizer is not None else []


def sharded_state_dicts(loop: LoopModelAndOptimizers) -> tuple[dict[str, Any], dict[str, Any]]:
    """``get_state_dict(model, optimizers)``: this rank's part of the model and optimizer state, keyed by parameter
    name. An optimizer without per-parameter state (SGD without momentum), once known as such, gets its state dict
    built here from its current parameter groups: DCP's helper would otherwise, at every save, fill a zero gradient
    for every parameter and run a step with learning rate 0 (its way of creating the state of an optimizer that has
    none yet), the cost of a pass over the whole model, for the same result."""
    optimizers = loop_optimizers(loop)
    known = [_STATELESS_GROUPS.get(optimizer) for optimizer in optimizers]
    if optimizers and all(entry is not None and _still_stateless(optimizer, entry[0])
                          for optimizer, entry in zip(optimizers, known)):
        # What DCP's helper returns for them: optimizer.state_dict()'s groups, parameters named.
        groups = []
        for optimizer, entry in zip(optimizers, known):
            for group, fqns in zip(optimizer.param_groups, entry[1]):    # type: ignore[index]  # checked above
                groups.append({**{k: v for k, v in group.items() if k != 'params'}, 'params': list(fqns)})
        return _model_state_dict(loop.model), {'state': {}, 'param_groups': groups}
    fills = [not optimizer.state and all(p.grad is None for g in optimizer.param_groups for p in g['params'])
             for optimizer in optimizers]
    model_state, optimizer_state = state_dict_api().get_state_dict(loop.model, optimizers)
    _learn_stateless(optimizers, fills, optimizer_state)
    return model_state, optimizer_state


def _model_state_dict(model: Any) -> dict[str, Any]:
    """``get_model_state_dict(model)``: this rank's part of the model state, keyed by parameter name. DCP's helper
    takes the module's own ``state_dict()`` and maps each key to its name over the whole model (a walk of every
    module and parameter at each call, a millisecond or more per save); once the two were seen to have the same keys
    (no wrapper prefix to strip, no FSDP1 module whose state_dict DCP would switch to sharded), the module's own is
    the same dict, and is taken as long as its keys stay those."""
    keys = _PLAIN_STATE_KEYS.get(model)
    if keys is not None:
        own = model.state_dict()
        if tuple(own) == keys:
            return own
    state = state_dict_api().get_model_state_dict(model)
    if tuple(model.state_dict()) == tuple(state) and not any(
            isinstance(module, _fsdp1_class()) for module in model.modules()):
        _PLAIN_STATE_KEYS[model] = tuple(state)
    else:
        _PLAIN_STATE_KEYS.pop(model, None)
    return state


def _fsdp1_class() -> Any:
    from torch.distributed.fsdp import FullyShardedDataParallel     # imported by DCP's state_dict module already
    return FullyShardedDataParallel


# Models whose own state_dict() was seen to be get_model_state_dict's -> its keys (see _model_state_dict).
_PLAIN_STATE_KEYS: weakref.WeakKeyDictionary[Any, tuple[str, ...]] = weakref.WeakKeyDictionary()


# Optimizers known to hold no per-parameter state even after a step (DCP's helper stepped them with zero gradients
# and they stayed empty) -> (the ids of their parameters per group, the parameter names per group).
_STATELESS_GROUPS: weakref.WeakKeyDictionary[Any, tuple[list[list[int]], list[list[str]]]] = \
    weakref.WeakKeyDictionary()


def _learn_stateless(optimizers: list[Any], fills: list[bool], optimizer_state: dict[str, Any]) -> None:
    groups = list(optimizer_state.get('param_groups', []))
    for optimizer, filled in zip(optimizers, fills):
        own, groups = groups[:len(optimizer.param_groups)], groups[len(optimizer.param_groups):]
        if filled and not optimizer.state and len(own) == len(optimizer.param_groups):
            ids = [[id(p) for p in group['params']] for group in optimizer.param_groups]
            _STATELESS_GROUPS[optimizer] = (ids, [list(group['params']) for group in own])


def _still_stateless(optimizer: Any, ids: list[list[int]]) -> bool:
    """No state, and the same parameters in the same groups as when it was learned to be stateless."""
    return not optimizer.state and [[id(p) for p in group['params']] for group in optimizer.param_groups] == ids


def load_model_and_optimizer(loop: LoopModelAndOptimizers, folder: str, source: str) -> None:
    """Load the model and optimizer state of the sharded checkpoint ``folder`` into the loop: sharded (every
    process must call it; DCP reads each rank's part, whatever the number of processes that wrote it) or a plain
    module in a single process."""
    optimizers = loop_optimizers(loop)
    model_state, optimizer_state = state_dict_api().get_state_dict(loop.model, optimizers)
    try:
        # dcp.load fills the tensors of these dicts in place, reading this rank's part from every file needed.
        dcp_module().load({'model': model_state, 'optim': optimizer_state}, checkpoint_id=folder)
        state_dict_api().set_state_dict(loop.model, optimizers, model_state_dict=model_state,
                                         optim_state_dict=optimizer_state)
    except (RuntimeError, ValueError, KeyError) as error:
        raise CheckpointError(f'{source}: its sharded model / optimizer state does not fit this TrainLoop '
                              f'({error}); was it saved with a different model or optimizer?') from error


def full_state(loop: LoopModelAndOptimizers) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The whole model state dict and optimizer state (keyed by parameter name), gathered to rank 0 on the CPU
    (other ranks get empty dicts); a collective under FSDP: every process must call it."""
    options = state_dict_api().StateDictOptions(full_state_dict=True, cpu_offload=True)
    optimizers = loop_optimizers(loop)
    if not optimizers:
        return state_dict_api().get_model_state_dict(loop.model, options=options), None
    return state_dict_api().get_state_dict(loop.model, optimizers, options=options)


def load_full_state(loop: LoopModelAndOptimizers, model_state: dict[str, Any], optimizer_state: Any) -> None:
    """Load a whole (unsharded) model state dict, and optimizer state, into the loop's model, which may be sharded
    (each rank keeps its part) or plain. ``optimizer_state`` is keyed by parameter name (as :func:`full_state`
    returns it) or by index (a plain ``optimizer.state_dict()``, e.g. from a single-process checkpoint)."""
    options = state_dict_api().StateDictOptions(full_state_dict=True)
    state_dict_api().set_model_state_dict(loop.model, model_state, options=options)
    optimizers = loop_optimizers(loop)
    if optimizer_state is None or not optimizers:
        return
    if isinstance(optimizer_state, list):       # a MultiOptimizer's state dicts
        optimizer_state = _merge_by_name(loop, optimizers, optimizer_state)
    elif not _keyed_by_name(optimizer_state):
        optimizer_state = _merge_by_name(loop, optimizers, [optimizer_state])
    state_dict_api().set_optimizer_state_dict(loop.model, optimizers, optimizer_state, options=options)


def index_keyed(loop: LoopModelAndOptimizers, optimizer_state: dict[str, Any]) -> Any:
    """An optimizer state keyed by parameter name (DCP's helpers, :func:`full_state`) in ``optimizer.state_dict()``'s
    own layout (parameters numbered in group order), so that a single-process loop loads it with
    ``optimizer.load_state_dict``; a list of such dicts for a MultiOptimizer (as the loop's checkpoints keep it)."""
    if not optimizer_state:
        return optimizer_state      # not rank 0 of a gathered state: nothing here
    flat_groups = list(optimizer_state['param_groups'])
    states = []
    for optimizer in loop_optimizers(loop):
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


def _merge_by_name(loop: LoopModelAndOptimizers, optimizers: list[Any], states: list[dict[str, Any]]) -> dict[str, Any]:
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

