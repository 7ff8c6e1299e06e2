"""Distributed-training plumbing: rank / world size, loaders sharded with DistributedSampler, the model
wrapper, and gathering predictions from every process back into dataset order.

The launch itself (spawn or torchrun) lives in ddp_launch.py.
"""
import contextlib
import inspect
import logging
import math
import socket

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

# ddp_launch builds the wrapper as distributed.TTDistributedDataParallel; it is defined in parallel.py.
from .parallel import TTDistributedDataParallel  # noqa: F401

logger = logging.getLogger(__name__)


def is_distributed():
    return dist.is_available() and dist.is_initialized()


def get_rank():
    return dist.get_rank() if is_distributed() else 0


def get_world_size():
    return dist.get_world_size() if is_distributed() else 1


def is_main_process():
    return get_rank() == 0


def find_free_port():
    """A TCP port that is free on this machine right now (the OS picks it, so parallel runs do not collide
    on a fixed number)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('', 0))
        return sock.getsockname()[1]


def skip_grad_sync(ddp_model, skip):
    """DDP's no_sync() when ``skip`` (a micro-batch that does not update the weights), else nothing."""
    if skip and ddp_model is not None:
        return ddp_model.no_sync()
    return contextlib.nullcontext()


# ---------------------------------------------------------------------------------------------- model


class DDPFeed:
    """What the loop calls for losses and predictions during a DDP fit: the training loss goes through the
    DDP wrapper (gradient all-reduce); evaluation and predictions use the plain model, which needs no
    gradient synchronisation."""

    def __init__(self, ddp_model, plain_feed, batch_model_feed_def=None):
        self.ddp_model = ddp_model
        self.plain_feed = plain_feed
        self.batch_model_feed_def = batch_model_feed_def

    def get_loss(self, batch_data, criterion, device):
        if self.batch_model_feed_def is not None:
            return self.batch_model_feed_def.get_loss(self.ddp_model, batch_data, criterion, device)
        return self.ddp_model.get_loss(batch_data, criterion, device)

    def get_loss_eval(self, batch_data, criterion, device):
        return self.plain_feed.get_loss_eval(batch_data, criterion, device)

    def get_predictions(self, batch_data, device):
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

    def __init__(self, sampler, num_replicas, rank, seed=0, pad=True):
        self.sampler = sampler
        self.num_replicas = num_replicas
        self.rank = rank
        self.seed = seed
        self.pad = pad
        self.epoch = 0
        self.last_items = []        # what the last pass yielded here, to put gathered predictions in order

    def set_epoch(self, epoch):
        self.epoch = epoch
        if callable(getattr(self.sampler, 'set_epoch', None)):
            self.sampler.set_epoch(epoch)

    def __len__(self):
        if self.pad:
            return math.ceil(len(self.sampler) / self.num_replicas)
        return len(range(self.rank, len(self.sampler), self.num_replicas))

    def __iter__(self):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + self.epoch)
            items = list(self.sampler)
        if items and self.pad:
            total = math.ceil(len(items) / self.num_replicas) * self.num_replicas
            items = (items * math.ceil(total / len(items)))[:total]
        self.last_items = items[self.rank::self.num_replicas]
        return iter(self.last_items)


def _loader_kwargs(loader):
    """Every DataLoader argument this torch version accepts, read back from the loader."""
    accepted = inspect.signature(DataLoader.__init__).parameters
    kwargs = {}
    for name in ('num_workers', 'collate_fn', 'pin_memory', 'timeout', 'worker_init_fn', 'multiprocessing_context',
                 'generator', 'prefetch_factor', 'persistent_workers', 'pin_memory_device', 'in_order'):
        if name in accepted and hasattr(loader, name):
            kwargs[name] = getattr(loader, name)
    return kwargs


def _sampler_seed(loader, shared_seed):
    generator = getattr(loader.sampler, 'generator', None) or getattr(loader, 'generator', None)
    return generator.initial_seed() if generator is not None else shared_seed


def distribute_loader(loader, num_replicas, rank, evaluation=False, shared_seed=0):
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
            sampler = SequentialSampler(loader.dataset)
        new_sampler = ShardedSampler(sampler, num_replicas, rank, seed, pad=False)
    elif type(sampler) is SequentialSampler or plain_random:
        new_sampler = DistributedSampler(loader.dataset, num_replicas=num_replicas, rank=rank, shuffle=plain_random,
                                         seed=seed)
    else:
        new_sampler = ShardedSampler(sampler, num_replicas, rank, seed)
    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=new_sampler,
                      drop_last=loader.drop_last, **kwargs), new_sampler


def distribute_train_loop_loaders(train_loop_obj, shared_seed):
    """Give the loop's three loaders their DistributedSamplers and register DistributedSamplerSetEpoch
    (once: a second fit updates the registered one)."""
    from .callbacks.ddp import DistributedSamplerSetEpoch
    loop = train_loop_obj
    world_size, rank = get_world_size(), get_rank()
    loop.train_loader, train_sampler = distribute_loader(loop.train_loader, world_size, rank, False, shared_seed)
    loop.validation_loader, val_sampler = distribute_loader(loop.validation_loader, world_size, rank, True,
                                                            shared_seed)
    loop.test_loader, test_sampler = distribute_loader(loop.test_loader, world_size, rank, True, shared_seed)
    existing = [cb for cb in loop.callbacks if isinstance(cb, DistributedSamplerSetEpoch)]
    if existing:
        existing[0].train_sampler, existing[0].validation_sampler, existing[0].test_sampler = \
            train_sampler, val_sampler, test_sampler
    else:
        loop.callbacks_handler.register_callbacks([DistributedSamplerSetEpoch(train_sampler, val_sampler,
                                                                              test_sampler)])


# ---------------------------------------------------------------------------------------------- gathering


def _rank_sample_indices(data_loader):
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


def _num_items(value):
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.shape[0] if value.ndim > 0 else None
    if isinstance(value, (list, tuple)):
        return len(value)
    return None


def _map_tensors(value, fn):
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, fn) for v in value)
    return value


def _concat(parts):
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


def _take(value, order):
    if isinstance(value, torch.Tensor):
        return value[torch.as_tensor(order, dtype=torch.long, device=value.device)]
    if isinstance(value, np.ndarray):
        return value[np.asarray(order, dtype=np.int64)]
    if isinstance(value, (list, tuple)):
        return type(value)(value[i] for i in order)
    if isinstance(value, dict):
        return {k: _take(v, order) for k, v in value.items()}
    return value


def _take_if_per_sample(value, order, total):
    if isinstance(value, dict):
        return {k: _take_if_per_sample(v, order, total) for k, v in value.items()}
    return _take(value, order) if _num_items(value) == total else value


def gather_predictions(data_loader, y_pred, y_true, metadata):
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
    gathered = [None] * get_world_size()
    dist.all_gather_object(gathered, payload)

    y_pred = _concat([g[0][0] for g in gathered])
    y_true = _concat([g[0][1] for g in gathered])
    metadatas = [g[0][2] for g in gathered]
    metadata = None if any(m is None for m in metadatas) else _concat_metadata(metadatas)
    if all(g[1] is not None for g in gathered):
        flat = [i for g in gathered for i in g[1]]
        order, seen = [], set()
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


def _concat_metadata(metadatas):
    keys = list(metadatas[0])
    joined = {}
    for key in keys:
        parts = [m[key] for m in metadatas if key in m]
        try:
            joined[key] = _concat(parts)
        except TypeError:
            joined[key] = parts
    return joined
