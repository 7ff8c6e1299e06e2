"""Host-memory copies of this rank's shards for asynchronous sharded saves (:class:`HostStager`), the buffers kept
from one save to the next, and the wait an optimizer step makes for a copy still going on."""
from __future__ import annotations

import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, cast

import torch

from ... import distributed


class HostStager:
    """Host-memory copies of this rank's part of a sharded state dict, for asynchronous saves; the buffers are kept
    from one save to the next, like the snapshot of a single-file checkpoint.

    The first save (and a tensor whose place changed: other key, shape, dtype or sharding) copies a tensor with
    torch's DefaultStager (a DTensor stays a DTensor, its local tensor in host memory; pinned when CUDA is
    available); later saves copy each local tensor into the buffer it got before, and build the dicts and lists
    around them anew (so numbers, such as the optimizer's learning rate, are the current ones): no deep copy of the
    DTensors' metadata.

    :meth:`start` may leave the copies of some tensors (``later``: those only an optimizer step changes) to the
    stager's own thread, and :meth:`hold_steps` makes the optimizers' next ``step()`` wait for them. Call
    :meth:`start` / :meth:`stage` only when no save that reads the previous copy is in flight (the saving callback
    waits for its previous save first). The saving callback owns the stager and closes it (:func:`close_stager`) at
    the end of fit.

    ``before_copy`` (class attribute) is a hook for tests: called in the stager's thread before the copies it was
    left (set it to a function that sleeps to make a copy outlast the next step's forward and backward)."""

    before_copy: Callable[[], None] | None = None

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        self._pinned = torch.cuda.is_available()
        self._worker: ThreadPoolExecutor | None = None
        self._copying: Future[Any] | None = None        # the copy the next optimizer step waits for
        self._hooked: weakref.WeakSet[Any] = weakref.WeakSet()
        self._hooks: list[Any] = []

    def stage(self, state: Any) -> Any:
        """A copy of ``state`` (dicts, lists, tuples, numbers, strings, tensors and DTensors) whose tensors are in
        host memory, complete on return."""
        return self.start(state).result()

    def start(self, state: Any, later: Callable[[tuple[Any, ...]], bool] | None = None) -> Future[Any]:
        """Copy ``state`` as :meth:`stage` does, but the CPU tensors at the paths (key tuples) ``later`` accepts in
        the stager's own thread; the Future's result is the whole copy. The caller must make sure that nothing
        changes those tensors before the Future is done: wait for it, or hand it to :meth:`hold_steps`."""
        buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        devices: set[torch.device] = set()
        deferred: list[tuple[torch.Tensor, torch.Tensor]] = []
        if later is not None and self._worker is None:
            # Started by the first save that may leave copies to it (it allocates the buffers, and leaves nothing):
            # starting a thread waits until it runs, which on busy cores can take milliseconds of a later save.
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix='checkpoint-staging')
            self._worker.submit(_started)
        with torch.no_grad():
            staged = self._copy(state, (), buffers, devices, deferred, later)
        for device in devices:
            torch.cuda.synchronize(device)      # the non-blocking copies into pinned buffers are complete
        self._buffers = buffers
        if not deferred:
            done: Future[Any] = Future()
            done.set_result(staged)
            return done
        assert self._worker is not None     # made above: copies are left only where ``later`` is given
        return self._worker.submit(_copy_deferred, staged, deferred, type(self).before_copy)

    def hold_steps(self, optimizers: list[Any], copying: Future[Any]) -> None:
        """Make the next ``step()`` of each of ``optimizers`` wait until ``copying`` is complete (a step pre-hook,
        registered once per optimizer; it costs an attribute check per step when no copy is pending)."""
        for optimizer in optimizers:
            if optimizer not in self._hooked:
                self._hooks.append(optimizer.register_step_pre_hook(self._before_step))
                self._hooked.add(optimizer)
        self._copying = copying

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        copying = self._copying
        if copying is not None:
            start = time.perf_counter()
            # Waits; a failed copy is not this step's error: the save that owns it reports it.
            copying.exception()
            self._copying = None
            _step_waits[0] += time.perf_counter() - start

    def close(self) -> None:
        """Release the host buffers, the thread and the step hooks (after the last save that reads them is
        complete)."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.shutdown(wait=True)
        for hook in self._hooks:
            hook.remove()
        self._hooks, self._hooked, self._copying = [], weakref.WeakSet(), None
        self._buffers = {}

    def __getstate__(self) -> dict[str, Any]:
        # Pickled with its callback (a spawned fit): threads, hooks and futures cannot travel, buffers need not.
        return dict(self.__dict__, _buffers={}, _worker=None, _copying=None, _hooked=weakref.WeakSet(), _hooks=[])

    def _copy(self, value: Any, path: tuple[Any, ...], buffers: dict[tuple[Any, ...], torch.Tensor],
              devices: set[torch.device], deferred: list[tuple[torch.Tensor, torch.Tensor]],
              later: Callable[[tuple[Any, ...]], bool] | None) -> Any:
        if isinstance(value, torch.Tensor):
            staged = self._copy_tensor(value, path, devices, deferred, later)
            buffers[path] = staged
            return staged
        if isinstance(value, dict):
            return {key: self._copy(item, path + (key,), buffers, devices, deferred, later)
                    for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            items = [self._copy(item, path + (i,), buffers, devices, deferred, later) for i, item in enumerate(value)]
            return items if isinstance(value, list) else tuple(items)
        return value

    def _copy_tensor(self, value: torch.Tensor, path: tuple[Any, ...], devices: set[torch.device],
                     deferred: list[tuple[torch.Tensor, torch.Tensor]],
                     later: Callable[[tuple[Any, ...]], bool] | None) -> torch.Tensor:
        kept = self._buffers.get(path)
        if kept is None or not _same_layout(kept, value):
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
            fresh = DefaultStager(StagingOptions(use_pinned_memory=self._pinned, use_shared_memory=False,
                                                 use_async_staging=False, use_non_blocking_copy=False))
            try:
                # A dict, not a Future: this stager stages synchronously.
                staged = cast(dict[str, torch.Tensor], fresh.stage({'tensor': value}))
                return staged['tensor']
            finally:
                fresh.close()       # its cache would keep the buffer alive beyond this stager's own
        source, target = distributed.local_tensor(value), distributed.local_tensor(kept)
        if source.device.type == 'cpu' and later is not None and later(path):
            deferred.append((source, target))
            return kept
        non_blocking = source.is_cuda and target.is_pinned()
        target.copy_(source, non_blocking=non_blocking)
        if non_blocking:
            devices.add(source.device)
        return kept


def _started() -> None:
    """The first task of a stager's thread: makes the executor start it."""


def _copy_deferred(staged: Any, deferred: list[tuple[torch.Tensor, torch.Tensor]],
                   before_copy: Callable[[], None] | None) -> Any:
    """The stager thread's part of :meth:`HostStager.start`: the copies it was left."""
    if before_copy is not None:
        before_copy()
    with torch.no_grad():
        for source, target in deferred:
            target.copy_(source)
    return staged


# Seconds that optimizer steps of this process waited for copies of shards (HostStager.hold_steps), in total.
_step_waits = [0.0]


def step_wait_seconds() -> float:
    """How long, in total, optimizer steps in this process have waited for the copy of a checkpoint's shards to
    host memory (``begin_save(until_step=True)``): the part of the training thread's stall for a checkpoint that
    shows at the next step rather than in the save itself. For monitoring and benchmarks."""
    return _step_waits[0]


def _same_layout(kept: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether the host copy ``kept`` can take ``value``'s data: the same sharding and local shape, dtype, strides."""
    if distributed.is_dtensor(value) != distributed.is_dtensor(kept):
        return False
    if distributed.is_dtensor(value) and distributed.is_dtensor(kept) and (
            value.placements != kept.placements or value.shape != kept.shape or value.stride() != kept.stride()
            or (value.device_mesh is not kept.device_mesh and value.device_mesh != kept.device_mesh)):
        return False
    source, target = distributed.local_tensor(value), distributed.local_tensor(kept)
    return (source.shape == target.shape and source.dtype == target.dtype and source.stride() == target.stride()
            and target.device.type == 'cpu')


def new_stager() -> HostStager:
    """The host-memory stager of asynchronous sharded saves (:class:`HostStager`), one per saving callback."""
    return HostStager()


def close_stager(stager: Any) -> None:
    """Release a stager's host buffers (after its last save is complete)."""
    if stager is not None:
        stager.close()

