"""Distributed-training plumbing: rank / world size, loaders sharded with DistributedSampler, the model
wrapper, gathering predictions from every process back into dataset order, and the helpers for FSDP's sharded
tensors (DTensor) that callbacks use.

The launch itself (spawn or torchrun) lives in ddp_launch.py.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sized
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ContextManager, TypeGuard, cast

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, Sampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

# ddp_launch builds the wrapper as distributed.TTDistributedDataParallel; it is defined in parallel.py.
from .parallel import TTDistributedDataParallel  # noqa: F401

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel

    from .model import AbstractModelFeedDefinition, BatchFeed
    from .engine.train_loop import TrainLoop

logger = logging.getLogger(__name__)


def is_distributed() -> bool:
    """True inside an initialised torch.distributed process group."""
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    """This process's rank, 0 when not distributed."""
    return dist.get_rank() if is_distributed() else 0


def get_world_size() -> int:
    """The number of processes, 1 when not distributed."""
    return dist.get_world_size() if is_distributed() else 1


def is_main_process() -> bool:
    """True on rank 0 (and when not distributed): the process that logs and saves."""
    return get_rank() == 0


# Seconds a launcher-started worker waits for every process of its group to join before it gives up (so that a
# failed restart round ends and the launcher starts another, instead of hanging): join_process_group_from_env.
SETUP_TIMEOUT_ENV = 'AITOOLBOX_LIKE_DIST_SETUP_TIMEOUT_S'
DEFAULT_SETUP_TIMEOUT_S = 300.0
_JOINED = 'aitoolbox_like/joined'
_ROUND_TOKEN = 'aitoolbox_like/round'
_stores: list[Any] = []         # the stores of the process group: a store's server lives as long as its object


class ProcessGroupSetupError(RuntimeError):
    """The processes of a distributed run did not all join the process group in time."""


def setup_timeout_s() -> float:
    """The set-up timeout in seconds: ``AITOOLBOX_LIKE_DIST_SETUP_TIMEOUT_S``, else 300."""
    value = os.environ.get(SETUP_TIMEOUT_ENV)
    try:
        return float(value) if value else DEFAULT_SETUP_TIMEOUT_S
    except ValueError:
        raise ValueError(f'{SETUP_TIMEOUT_ENV}={value!r}: expected a number of seconds') from None


def join_process_group_from_env(backend: str) -> None:
    """Join the process group of a worker that a launcher (torchrun, torchelastic) started: ``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` come from the environment, as for ``init_method='env://'``.

    Two differences from torch's own ``env://`` set-up, both for restarts:

    - Under torchrun's c10d rendezvous the launcher shares its own key-value store with the workers
      (``TORCHELASTIC_USE_AGENT_STORE=True``), and that store outlives a restart: a restarted worker can read the
      previous round's peer addresses from it and fail to connect, or wait for peers that are gone
      (pytorch/pytorch#135712). Here the group's keys live under a prefix new in every round: rank 0 publishes a
      random token in the launcher's store, and each other rank uses a published token only once rank 0 has
      answered its own fresh hello under it, so a token left from an earlier round (whose rank 0 is gone) is never
      used. The store stays the launcher's, which outlives every worker.
    - Every rank waits for all ``WORLD_SIZE`` processes to reach the store for at most
      ``AITOOLBOX_LIKE_DIST_SETUP_TIMEOUT_S`` seconds (300 by default), then raises ProcessGroupSetupError: a round
      that cannot form ends, and the launcher restarts it, instead of hanging.
    """
    rank, world_size = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
    address, port = os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])
    limit = setup_timeout_s()
    deadline = time.monotonic() + limit
    if os.environ.get('TORCHELASTIC_USE_AGENT_STORE') == str(True):
        store = _new_round_store(address, port, rank, world_size, deadline)
    else:
        store = dist.TCPStore(address, port, world_size=world_size, is_master=rank == 0,
                              timeout=timedelta(seconds=limit), wait_for_workers=False)
    _wait_for_everyone(store, world_size, deadline, limit)
    store.set_timeout(timedelta(minutes=30))      # torch's default for what later uses the store
    _stores.append(store)
    dist.init_process_group(backend=backend, store=dist.PrefixStore('default_pg', store), rank=rank,
                            world_size=world_size)


def _left(deadline: float) -> float:
    return deadline - time.monotonic()


def _new_round_store(address: str, port: int, rank: int, world_size: int, deadline: float) -> Any:
    """The launcher's store, seen under a prefix that is new in every round: rank 0 publishes a random token, and
    each other rank takes the published token only once rank 0 has answered it under that token (a key named after
    the rank's own fresh random value, so an answer left from an earlier round cannot be taken for one)."""
    launcher_store = dist.TCPStore(address, port, is_master=False, timeout=timedelta(seconds=max(_left(deadline), 1)))
    _stores.append(launcher_store)
    if rank == 0:
        token = uuid.uuid4().hex
        launcher_store.set(_ROUND_TOKEN, token)
        for other in range(1, world_size):
            hello = launcher_store.get(f'{_ROUND_TOKEN}/{token}/hello/{other}').decode()
            launcher_store.set(f'{_ROUND_TOKEN}/{token}/answer/{other}/{hello}', '1')
        return dist.PrefixStore(f'{_ROUND_TOKEN}/{token}', launcher_store)
    greeted = None
    mine = uuid.uuid4().hex
    while _left(deadline) > 0:
        token = launcher_store.get(_ROUND_TOKEN).decode()
        if token != greeted:        # a new token (or the first): say hello under it, once
            launcher_store.set(f'{_ROUND_TOKEN}/{token}/hello/{rank}', mine)
            greeted = token
        if launcher_store.check([f'{_ROUND_TOKEN}/{token}/answer/{rank}/{mine}']):
            return dist.PrefixStore(f'{_ROUND_TOKEN}/{token}', launcher_store)
        time.sleep(0.05)        # rank 0 of this round has not answered yet, or the token is an earlier round's
    raise ProcessGroupSetupError(f'rank {rank}: rank 0 of this round did not answer within '
                                 f'{SETUP_TIMEOUT_ENV}={setup_timeout_s():g} s')


def _wait_for_everyone(store: Any, world_size: int, deadline: float, limit: float) -> None:
    store.add(_JOINED, 1)
    while True:
        joined = store.add(_JOINED, 0)
        if joined >= world_size:
            return
        if _left(deadline) <= 0:
            raise ProcessGroupSetupError(f'only {joined} of {world_size} processes joined the process group within '
                                         f'{limit:g} s ({SETUP_TIMEOUT_ENV}); giving up so that the launcher can '
                                         f'start a new round')
        time.sleep(0.05)


def find_free_port() -> int:
    """A TCP port that is free on this machine right now (the OS picks it, so parallel runs do not collide
    on a fixed number)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('', 0))
        return sock.getsockname()[1]


def skip_grad_sync(ddp_model: torch.nn.Module | None, skip: bool) -> ContextManager[Any]:
    """DDP's no_sync() when ``skip`` (a micro-batch that does not update the weights), else nothing."""
    # DataParallel (gpu_mode='dp') has no gradient synchronisation to skip.
    no_sync = getattr(ddp_model, 'no_sync', None) if skip else None
    if no_sync is not None:
        return no_sync()
    return contextlib.nullcontext()


# ---------------------------------------------------------------------------------------------- model


class DDPFeed:
    """What the loop calls for losses and predictions during a DDP fit: the training loss goes through the
    DDP wrapper (gradient all-reduce); evaluation and predictions use the plain model, which needs no
    gradient synchronisation."""

    def __init__(self, ddp_model: torch.nn.Module, plain_feed: BatchFeed,
                 batch_model_feed_def: AbstractModelFeedDefinition | None = None) -> None:
        self.ddp_model = ddp_model
        self.plain_feed = plain_feed
        self.batch_model_feed_def = batch_model_feed_def

    def get_loss(self, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """The training loss, computed through the DDP wrapper (so backward all-reduces the gradients)."""
        if self.batch_model_feed_def is not None:
            return self.batch_model_feed_def.get_loss(self.ddp_model, batch_data, criterion, device)
        # Without a feed definition the model is a TTModel, which ddp_launch wraps in TTDistributedDataParallel.
        return cast(TTDistributedDataParallel, self.ddp_model).get_loss(batch_data, criterion, device)

    def get_loss_eval(self, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """The evaluation loss, computed on the plain model."""
        return self.plain_feed.get_loss_eval(batch_data, criterion, device)

    def get_predictions(self, batch_data: Any, device: torch.device) -> tuple[Any, Any, dict[str, Any] | None]:
        """``(y_pred, y_true, metadata)`` of one batch, computed on the plain model."""
        return self.plain_feed.get_predictions(batch_data, device)


# ---------------------------------------------------------------------------------------------- data


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


def distribute_train_loop_loaders(train_loop_obj: TrainLoop, shared_seed: int
                                  ) -> tuple[ShardedSampler | DistributedSampler[Any] | None, ...]:
    """Give the loop's three loaders their DistributedSamplers; returns the samplers (train, validation, test),
    which the loop keeps as ``distributed_samplers`` (callbacks/defaults.py sets their epoch)."""
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


# ---------------------------------------------------------------------------------------------- FSDP (sharded tensors)

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
    """True when ``model`` (or one of its sub-modules) was sharded with FSDP2's ``fully_shard``."""
    fsdp_module = _loaded_class('torch.distributed.fsdp', 'FSDPModule')
    return fsdp_module is not None and isinstance(model, torch.nn.Module) and any(
        isinstance(m, fsdp_module) for m in model.modules())


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
