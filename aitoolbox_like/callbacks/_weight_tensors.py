"""The weights of a model that may be sharded (FSDP), as the weight-averaging callbacks read and write them: by
state_dict key, whole on the CPU, or this process's shard of a whole tensor."""
from typing import List, Tuple

import torch

from .. import distributed


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
