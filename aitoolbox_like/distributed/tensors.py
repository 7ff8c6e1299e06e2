"""The tensors of a sharded model (FSDP2's DTensors): whole or local values, copying a whole value into a shard,
averaging plain tensors over the processes, and the optimizer rebuilt over the sharded parameters. Callbacks use
these to stay correct under ``gpu_mode='fsdp'``."""
from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
import torch.distributed as dist

from .processes import get_world_size, is_distributed

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

logger = logging.getLogger(__name__)


# torch.distributed.tensor and torch.distributed.fsdp take most of a second to import; a process that never shards
# anything should not pay it at `import aitoolbox_like` (each restart of a run would). No DTensor or FSDP module can
# exist before its module is imported, so until then the answer is "no" without importing it.
def _loaded_class(module_name: str, class_name: str) -> Any:
    module = sys.modules.get(module_name)
    return getattr(module, class_name, None) if module is not None else None


def is_dtensor(value: Any) -> TypeGuard[DTensor]:
    """True for a ``torch.distributed.tensor.DTensor``: what FSDP2 (``gpu_mode='fsdp'``) turns parameters,
    gradients and optimizer state into (each process holds one shard)."""
    dtensor = _loaded_class('torch.distributed.tensor', 'DTensor')
    return dtensor is not None and isinstance(value, dtensor)


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """The whole value of ``value``: gathered from every process for a DTensor (a collective: every rank must
    call it), ``value`` itself otherwise."""
    return value.full_tensor() if is_dtensor(value) else value


def local_tensor(value: torch.Tensor) -> torch.Tensor:
    """This process's shard of a DTensor (no communication), ``value`` itself otherwise. What rank-restricted
    callbacks (histograms, printed statistics) may read under FSDP without a collective."""
    return value.to_local() if is_dtensor(value) else value


def copy_full_into(target: torch.Tensor, source: torch.Tensor) -> None:
    """``target.copy_(source)`` where ``target`` may be a DTensor shard and ``source`` the whole (plain) value:
    each process keeps the part of ``source`` that its shard holds. No communication."""
    if is_dtensor(target) and not is_dtensor(source):
        from torch.distributed.tensor import distribute_tensor
        source = distribute_tensor(source.to(target.device), target.device_mesh, target.placements,
                                   src_data_rank=None)
    target.copy_(source)


def average_over_processes_(tensors: Iterable[torch.Tensor]) -> None:
    """Replace each of ``tensors`` (plain tensors, e.g. BatchNorm statistics) in place by its mean over the processes:
    a collective, every rank calls it with the same tensors in the same order. Nothing to do in a single process."""
    if not is_distributed():
        return
    world_size = get_world_size()
    for tensor in tensors:
        # SUM then divide: gloo has no AVG reduction.
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor.div_(world_size)


def is_fsdp_model(model: Any) -> bool:
    """True when ``model`` (or one of its sub-modules) was sharded with FSDP2's ``fully_shard`` and its process group
    is up (``fully_shard`` needs one; a sharded model whose group is gone can neither train nor gather its state)."""
    fsdp_module = _loaded_class('torch.distributed.fsdp', 'FSDPModule')
    # The group first: a single-process fit (most of them) answers without walking the model's modules, a cost each
    # checkpoint paid (about 0.1 ms for a small transformer) once a library imported FSDP's module.
    return fsdp_module is not None and dist.is_available() and dist.is_initialized() and \
        isinstance(model, torch.nn.Module) and any(isinstance(m, fsdp_module) for m in model.modules())


def rebuild_optimizer(optimizer: Any, old_names: dict[int, str], new_params: dict[str, torch.nn.Parameter]) -> Any:
    """The same optimizer (class, hyperparameters, parameter groups) over the model's new parameters.

    ``fully_shard`` replaces each parameter by a new DTensor parameter, so an optimizer built before sharding
    holds stale tensors that training would never update. Each group keeps its hyperparameters (its ``lr``,
    ``weight_decay``, ...); ``old_names`` maps ``id(old parameter)`` to its name, ``new_params`` the names to the
    sharded parameters. The optimizer is built as ``type(optimizer)(groups, **optimizer.defaults)`` (torch
    optimizers' ``defaults`` are their constructor's keyword arguments). State already in the optimizer (a second
    fit) is not carried over: a warning says so (resume from a checkpoint to continue with it)."""
    groups = []
    for group in optimizer.param_groups:
        params = []
        for param in group['params']:
            name = old_names.get(id(param))
            if name is None or name not in new_params:
                raise ValueError(f'the optimizer {type(optimizer).__qualname__} holds a parameter that is not one of '
                                 f"the model's named parameters; with gpu_mode='fsdp' the optimizer must be built over "
                                 f'model.parameters() (it is rebuilt over the sharded parameters)')
            params.append(new_params[name])
        groups.append({**{k: v for k, v in group.items() if k != 'params'}, 'params': params})
    if any(optimizer.state.values()):
        logger.warning("gpu_mode='fsdp': the state of %s (e.g. momentum) is not carried over to the optimizer rebuilt "
                       "over the sharded parameters; resume from a checkpoint to continue it",
                       type(optimizer).__qualname__)
    try:
        return type(optimizer)(groups, **optimizer.defaults)
    except TypeError as error:
        raise TypeError(f"gpu_mode='fsdp' rebuilds the optimizer over the sharded parameters as "
                        f"{type(optimizer).__qualname__}(param_groups, **optimizer.defaults), which failed ({error}); "
                        f"build it in each process instead (e.g. in on_multiprocess_start, over loop.model.parameters()"
                        f" once the model is sharded)") from error
