"""Data over the processes of a distributed run: each process reads its share of a loader (sharded samplers that
keep every other DataLoader argument, an epoch's order that a resumed run on another number of processes splits
again), and predictions gathered from every process back into dataset order."""
from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, Sampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

from .processes import get_rank, get_world_size

logger = logging.getLogger(__name__)


class ShardedSampler:
    """This process's share of any sampler or batch sampler: rank r takes items r, r + num_replicas, ... of
    one pass. With ``pad`` (training) the pass is first padded, repeating from the start as DistributedSampler
    does, so that every process gets the same number of batches; evaluation needs no padding, so its losses
    and predictions count every sample exactly once.

    Every process must see the same items. Samplers drawing from torch's global random generator are run
    under a generator seeded with ``seed + epoch``; a sampler with its own generator must be seeded the same
    in every process (a generator pickled into spawned processes is).
    """

    def __init__(self, sampler: Any, num_replicas: int, rank: int, seed: int = 0, pad: bool = True) -> None:
        self.sampler = sampler
        self.num_replicas = num_replicas
        self.rank = rank
        self.seed = seed
        self.pad = pad
        self.epoch = 0
        self.last_items: list[Any] = []        # what the last pass yielded here, to put gathered predictions in order

    def set_epoch(self, epoch: int) -> None:
        """Reseed the shuffling for ``epoch`` (and pass it on to a sampler that has ``set_epoch``)."""
        self.epoch = epoch
        if callable(getattr(self.sampler, 'set_epoch', None)):
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        if self.pad:
            return math.ceil(len(self.sampler) / self.num_replicas)
        return len(range(self.rank, len(self.sampler), self.num_replicas))

    def __iter__(self) -> Iterator[Any]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + self.epoch)
            items = list(self.sampler)
        if items and self.pad:
            total = math.ceil(len(items) / self.num_replicas) * self.num_replicas
            items = (items * math.ceil(total / len(items)))[:total]
        self.last_items = items[self.rank::self.num_replicas]
        return iter(self.last_items)


def epoch_order(sampler: Any) -> list[Any] | None:
    """The whole data order of the current epoch (set_epoch already called) that ``sampler``, one process's
    DistributedSampler or ShardedSampler, takes its share of: the same on every process and for any number of
    processes. None for any other sampler."""
    if isinstance(sampler, DistributedSampler):
        whole: DistributedSampler[Any] = DistributedSampler(sampler.dataset, num_replicas=1, rank=0,
                                                            shuffle=sampler.shuffle, seed=sampler.seed, drop_last=False)
        whole.set_epoch(sampler.epoch)
        return list(whole)
    if isinstance(sampler, ShardedSampler):
        whole_sharded = ShardedSampler(sampler.sampler, 1, 0, sampler.seed, pad=False)
        whole_sharded.epoch = sampler.epoch
        return list(whole_sharded)
    return None


class RemainingOrderSampler(Sampler[Any]):
    """This process's share of an epoch's data order after its first ``samples_done`` samples: what is left of an
    epoch interrupted by a checkpoint, split between ``num_replicas`` processes (possibly another number than the
    run that saved it had). As DistributedSampler does, the share is padded by repeating the first samples left
    when they do not divide evenly, so every process runs the same number of batches."""

    def __init__(self, order: list[Any], samples_done: int, num_replicas: int, rank: int) -> None:
        self.order = order
        left = order[samples_done:]
        if left and len(left) % num_replicas:
            total = math.ceil(len(left) / num_replicas) * num_replicas
            left = (left * math.ceil(total / len(left)))[:total]
        self.items = left[rank::num_replicas]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.items)


def loader_with_sampler(loader: DataLoader[Any], sampler: Sampler[Any]) -> DataLoader[Any]:
    """``loader`` with another sampler and every other DataLoader argument kept."""
    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler, drop_last=loader.drop_last,
                      **_loader_kwargs(loader))


def _loader_kwargs(loader: DataLoader[Any]) -> dict[str, Any]:
    """Every DataLoader argument this torch version accepts, read back from the loader."""
    accepted = inspect.signature(DataLoader.__init__).parameters
    kwargs: dict[str, Any] = {}
    for name in ('num_workers', 'collate_fn', 'pin_memory', 'timeout', 'worker_init_fn', 'multiprocessing_context',
                 'generator', 'prefetch_factor', 'persistent_workers', 'pin_memory_device', 'in_order'):
        if name in accepted and hasattr(loader, name):
            kwargs[name] = getattr(loader, name)
    return kwargs


def _sampler_seed(loader: DataLoader[Any], shared_seed: int) -> int:
    generator = getattr(loader.sampler, 'generator', None) or getattr(loader, 'generator', None)
    return generator.initial_seed() if generator is not None else shared_seed


def distribute_loader(loader: Iterable[Any] | None, num_replicas: int, rank: int, evaluation: bool = False,
                      shared_seed: int = 0
                      ) -> tuple[Iterable[Any] | None, ShardedSampler | DistributedSampler[Any] | None]:
    """Rebuild ``loader`` so this process reads only its share of the data, keeping every other DataLoader
    argument. Returns ``(new_loader, object_to_call_set_epoch_on_or_None)``.

    Args:
        evaluation: a validation / test loader: read in dataset order (a shuffling sampler becomes sequential)
            and without padding, so every sample counts once in losses and gathered predictions.
        shared_seed: shuffling seed when the loader has no generator; must be equal in every process.
    """
    if loader is None:
        return None, None
    if not isinstance(loader, DataLoader):
        logger.warning('%s is not a torch DataLoader, so it cannot be sharded: every process reads all of it. '
                       'Shard it yourself by aitoolbox_like.distributed.get_rank() / get_world_size().',
                       type(loader).__qualname__)
        return loader, None
    if isinstance(loader.dataset, IterableDataset):
        logger.warning('A DataLoader over an IterableDataset cannot be given a DistributedSampler: the dataset must '
                       'yield only this process\'s share itself (use aitoolbox_like.distributed.get_rank() and '
                       'get_world_size() in its __iter__).')
        return loader, None
    sampler, batch_sampler = loader.sampler, loader.batch_sampler
    if isinstance(batch_sampler, ShardedSampler):
        return loader, batch_sampler          # already sharded (a second fit)
    if isinstance(sampler, (DistributedSampler, ShardedSampler)):
        return loader, sampler
    seed = _sampler_seed(loader, shared_seed)
    kwargs = _loader_kwargs(loader)
    if loader.batch_size is None and batch_sampler is not None:     # the user's own batch_sampler
        new_batch_sampler = ShardedSampler(batch_sampler, num_replicas, rank, seed, pad=not evaluation)
        return DataLoader(loader.dataset, batch_sampler=new_batch_sampler, **kwargs), new_batch_sampler

    plain_random = type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None
    if evaluation:
        if type(sampler) is SequentialSampler or plain_random:
            sampler = SequentialSampler(cast(Sized, loader.dataset))   # map-style: IterableDataset returned above
        new_sampler: ShardedSampler | DistributedSampler[Any] = ShardedSampler(sampler, num_replicas, rank, seed,
                                                                                pad=False)
    elif type(sampler) is SequentialSampler or plain_random:
        new_sampler = DistributedSampler(loader.dataset, num_replicas=num_replicas, rank=rank, shuffle=plain_random,
                                         seed=seed)
    else:
        new_sampler = ShardedSampler(sampler, num_replicas, rank, seed)
    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=new_sampler,
                      drop_last=loader.drop_last, **kwargs), new_sampler


def distribute_train_loop_loaders(train_loop_obj: Any, shared_seed: int
                                  ) -> tuple[ShardedSampler | DistributedSampler[Any] | None, ...]:
    """Give the loop's three loaders their DistributedSamplers; returns the samplers (train, validation, test),
    which the loop keeps as ``distributed_samplers`` (the default DistributedSamplerSetEpoch callback sets their epoch)."""
    loop = train_loop_obj
    world_size, rank = get_world_size(), get_rank()
    loop.train_loader, train_sampler = distribute_loader(loop.train_loader, world_size, rank, False, shared_seed)
    loop.validation_loader, val_sampler = distribute_loader(loop.validation_loader, world_size, rank, True,
                                                            shared_seed)
    loop.test_loader, test_sampler = distribute_loader(loop.test_loader, world_size, rank, True, shared_seed)
    return train_sampler, val_sampler, test_sampler


# ---------------------------------------------------------------------------------------------- gathering


def _rank_sample_indices(data_loader: Any) -> list[int] | None:
    """Dataset indices this process read from ``data_loader`` in its last pass, in order, or None if the
    loader is not sharded by us or a DistributedSampler."""
    batch_sampler = getattr(data_loader, 'batch_sampler', None)
    if isinstance(batch_sampler, ShardedSampler):
        return [int(i) for batch in batch_sampler.last_items for i in batch]
    sampler = getattr(data_loader, 'sampler', None)
    if isinstance(sampler, ShardedSampler):
        return [int(i) for i in sampler.last_items]
    if isinstance(sampler, DistributedSampler):
        return [int(i) for i in sampler]      # deterministic for the sampler's epoch
    return None


def _num_items(value: Any) -> int | None:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.shape[0] if value.ndim > 0 else None
    if isinstance(value, (list, tuple)):
        return len(value)
    return None


def _map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, fn) for v in value)
    return value


def _concat(parts: list[Any]) -> Any:
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat([p.reshape(1) if p.dim() == 0 else p for p in parts])
    if isinstance(first, np.ndarray):
        return np.concatenate(parts, axis=0)
    if isinstance(first, (list, tuple)):
        return type(first)(item for part in parts for item in part)
    if isinstance(first, dict):
        return {k: _concat([p[k] for p in parts]) for k in first}
    raise TypeError(f'cannot join predictions of type {type(first).__qualname__} gathered from the processes; '
                    f'make pred_transform_fn return a tensor, numpy array, list or dict of these')


def _take(value: Any, order: list[int]) -> Any:
    if isinstance(value, torch.Tensor):
        return value[torch.as_tensor(order, dtype=torch.long, device=value.device)]
    if isinstance(value, np.ndarray):
        return value[np.asarray(order, dtype=np.int64)]
    if isinstance(value, (list, tuple)):
        return type(value)(value[i] for i in order)
    if isinstance(value, dict):
        return {k: _take(v, order) for k, v in value.items()}
    return value


def _take_if_per_sample(value: Any, order: list[int], total: int) -> Any:
    if isinstance(value, dict):
        return {k: _take_if_per_sample(v, order, total) for k, v in value.items()}
    return _take(value, order) if _num_items(value) == total else value


def gather_predictions(data_loader: Any, y_pred: Any, y_true: Any, metadata: dict[str, Any] | None
                       ) -> tuple[Any, Any, dict[str, Any] | None]:
    """Collect ``(y_pred, y_true, metadata)`` from every process (all must call it).

    When the loader is sharded by a DistributedSampler (or by the loop), the padding samples the sampler
    repeated are dropped and the result is in dataset order; otherwise the processes' results are joined in
    rank order.
    """
    indices = _rank_sample_indices(data_loader)
    count = _num_items(y_pred)
    if indices is not None and (count is None or len(indices) < count):
        indices = None
    elif indices is not None:
        indices = indices[:count]
    device = y_pred.device if isinstance(y_pred, torch.Tensor) else None
    payload = (_map_tensors((y_pred, y_true, metadata), torch.Tensor.cpu), indices)
    gathered: list[Any] = [None] * get_world_size()
    dist.all_gather_object(gathered, payload)

    y_pred = _concat([g[0][0] for g in gathered])
    y_true = _concat([g[0][1] for g in gathered])
    metadatas = [g[0][2] for g in gathered]
    metadata = None if any(m is None for m in metadatas) else _concat_metadata(metadatas)
    if all(g[1] is not None for g in gathered):
        flat = [i for g in gathered for i in g[1]]
        order: list[int] = []
        seen: set[int] = set()
        for position in sorted(range(len(flat)), key=flat.__getitem__):
            if flat[position] not in seen:       # DistributedSampler padding repeats indices
                seen.add(flat[position])
                order.append(position)
        total = len(flat)
        y_pred, y_true = _take_if_per_sample(y_pred, order, total), _take_if_per_sample(y_true, order, total)
        metadata = _take_if_per_sample(metadata, order, total) if metadata is not None else None
    else:
        logger.warning('Predictions gathered from %d processes are joined in rank order: the loader is not sharded '
                       'by a DistributedSampler, so dataset order and padding cannot be restored.', len(gathered))
    if device is not None and device.type != 'cpu':
        y_pred, y_true, metadata = _map_tensors((y_pred, y_true, metadata), lambda t: t.to(device))
    return y_pred, y_true, metadata


def _concat_metadata(metadatas: list[dict[str, Any]]) -> dict[str, Any]:
    keys = list(metadatas[0])
    joined: dict[str, Any] = {}
    for key in keys:
        parts = [m[key] for m in metadatas if key in m]
        try:
            joined[key] = _concat(parts)
        except TypeError:
            joined[key] = parts
    return joined
