"""The processes of a distributed run: this process's rank and the world size (0 and 1 outside one), and joining
the process group a launcher (torchrun, SLURM's srun, Ray Train) formed, with a deadline so that a failed restart
round ends instead of hanging."""
from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

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


def collective_device(device: torch.device) -> torch.device:
    """Where a tensor for a collective of the current process group lives: ``device`` under NCCL (which moves only
    GPU tensors), the CPU under gloo."""
    return device if dist.get_backend() == 'nccl' else torch.device('cpu')


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
