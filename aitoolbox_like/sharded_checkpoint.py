"""Sharded checkpoints of an FSDP fit (``gpu_mode='fsdp'``), written and read with ``torch.distributed.checkpoint``
(DCP).

A sharded checkpoint is a folder, ``checkpoint_model/model_<experiment>_<timestamp>_E<epoch>.dcp/``::

    train_state.pt       the rest of the training state (loop_state.build_checkpoint without weights: history,
                         counters, RNG, callbacks' state, ...), written by rank 0, weights_only-loadable
    __<rank>_0.distcp    each process's shards of the model and the optimizer state (DCP's files)
    .metadata            DCP's index of the shards, written last, once every rank's shards are written

The folder is written under a hidden temporary name (``.<name>.dcp.<12 hex>.tmp``, next to the final one) and
renamed by rank 0 once DCP's save has completed (its ``.metadata`` is written by rank 0 after every rank reported
its files), so a folder with the final name is complete; its ``.metadata`` file is the marker of completeness, and
the ``latest_checkpoint.txt`` pointer names that file (written after the rename). A killed write leaves only the
temporary folder, removed when the experiment is resumed (storage.local.remove_stray_temp_files). To a cloud the other
files are uploaded first and ``.metadata`` last, with the cloud pointer set once it is uploaded (the uploader sends
in order); :func:`download` brings such a folder back for a resume.

Asynchronous saves (the saving callbacks' ``async_save=True``): :func:`begin_save` copies this rank's shards to host
memory (:class:`HostStager`: into the buffers of the previous save); :meth:`ShardedSave.finish`, run by the
callback's background writer thread, writes that copy with ``torch.distributed.checkpoint.save`` over a gloo process
group of its own (:func:`checkpoint_process_group`: DCP's planning collectives run there, off the training thread)
and completes the folder. The save's other collectives run there too (rank 0 tells the other ranks the folder's
names; the train state's running losses are averaged over the ranks): after the first save, which makes the group,
the training thread of an asynchronous save runs no collective of its own. For a mid-epoch checkpoint followed by
another training step (``until_step=True``) the copy of the parameters and of the optimizer state goes on in the
stager's thread during that step's forward and backward, and each optimizer's ``step()`` waits for it (a step
pre-hook) before it changes them.

Model and optimizer go through ``torch.distributed.checkpoint.state_dict.get_state_dict`` / ``set_state_dict``:
keys are parameter names (FQNs), values DTensors. DCP reshards on load, so a checkpoint written by N processes
resumes on M processes, in a single process without a process group included (then the model is a plain module).
"""
from __future__ import annotations

import logging
import os
import shutil
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Iterator, cast

import torch
import torch.distributed as dist

from . import distributed
from .checkpoint import CheckpointError, atomic_torch_save, fsync_directory, load_checkpoint
from .storage.base import Storage, join_key, validate_key
from .storage.local import exclusive_lock, mark_temp_live, remove_folder, temp_name_for

if TYPE_CHECKING:
    from .train_loop import TrainLoop

logger = logging.getLogger(__name__)


# torch.distributed.checkpoint, and the DTensor and FSDP modules it imports, take about a second to import: every
# process of a run that never writes a sharded checkpoint (each restart of one) would pay it at `import
# aitoolbox_like`. They are imported at the first sharded save or load instead.
def _dcp() -> Any:
    import torch.distributed.checkpoint as dcp
    return dcp


def _state_dict_api() -> Any:
    import torch.distributed.checkpoint.state_dict as state_dict_api
    return state_dict_api


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


def _broadcast(value: Any, group: Any = None) -> Any:
    """Rank 0's ``value`` on every rank (a collective over ``group``, None: the default group)."""
    if not distributed.is_distributed():
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0, group=group)
    return holder[0]


def checkpoint_process_group() -> Any:
    """The process group of background checkpoint writes: a gloo group of every rank, made once per default group.

    A checkpoint written in the background runs DCP's collectives (the gather of the save plans and of the written
    files' index) from another thread than training; on their own group they never interleave with training's
    collectives (FSDP's all-gathers, loss reductions), and gloo runs them on the CPU, as
    ``torch.distributed.checkpoint.async_save`` requires. A collective itself: every rank calls it at the same point
    (the first asynchronous sharded save)."""
    world, group = (ref() for ref in _checkpoint_group) if _checkpoint_group else (None, None)
    if world is None or world is not dist.group.WORLD or group is None:
        group = dist.new_group(backend='gloo')
        _checkpoint_group[:] = [weakref.ref(dist.group.WORLD), weakref.ref(group)]
    return group


# Weak references to [the default group the checkpoint group was made for, the checkpoint group]: torch owns both
# (destroy_process_group() ends them where it is called, not at interpreter exit); a new default group (a later fit
# under a new process group) gets a new checkpoint group.
_checkpoint_group: list[weakref.ref[Any]] = []


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


class ShardedSave:
    """One sharded checkpoint being written, started by :func:`begin_save` on every rank.

    :meth:`finish` completes it: writes this rank's shards (from their host copy, in the thread that calls it, for
    an asynchronous save; already written by a synchronous one), then on rank 0 writes ``train_state.pt`` and renames
    the folder into place. Once ``finish`` returned on rank 0, every rank's shards are written (DCP's ``.metadata``
    is written by rank 0 after every rank reported its files) and the folder has its final name.

    ``folder``, ``tmp`` and ``marker`` are rank 0's names. On other ranks an asynchronous save learns them in
    :meth:`finish` (``share_names``: rank 0 broadcasts them there, over the save's group); they are None until then.
    """

    def __init__(self, folder: str | None, tmp: str | None, train_state: dict[str, Any] | None,
                 copying: Future[Any] | None = None, group: Any = None,
                 complete_train_state: Callable[[dict[str, Any] | None, Any], None] | None = None,
                 share_names: bool = False) -> None:
        self.folder = folder
        self.tmp = tmp
        self.marker = os.path.join(folder, MARKER) if folder is not None else None
        self._train_state = train_state
        self._copying = copying
        self._group = group
        self._complete_train_state = complete_train_state
        self._share_names = share_names

    def finish(self) -> str:
        """Complete the checkpoint (every rank: its shards, if not written yet; rank 0: ``train_state.pt``, fsync,
        rename); returns its marker file's path. Every rank calls it (an asynchronous save: in its background
        writer; DCP's collectives run over :func:`checkpoint_process_group`). Raises the error of a failed DCP write
        (on every rank: DCP reports one rank's failure to all); the temporary folder is then removed and the
        previous checkpoints are untouched."""
        main = distributed.is_main_process()
        try:
            # The collectives first: they run while the copy of the shards to host memory may still go on.
            if self._share_names:
                self._share_names = False
                self.folder, self.tmp = _broadcast((self.folder, self.tmp), self._group)
                self.marker = os.path.join(self.folder, MARKER)
            folder, tmp, marker = self.folder, self.tmp, self.marker
            assert folder is not None and tmp is not None and marker is not None    # rank 0's, on every rank now
            if self._complete_train_state is not None:
                complete, self._complete_train_state = self._complete_train_state, None
                complete(self._train_state, self._group)
            if self._copying is not None:
                copying, self._copying = self._copying, None
                _dcp().save(copying.result(), checkpoint_id=tmp, process_group=self._group)
            if main:
                # After DCP's files: the folder only counts once renamed, whatever the order inside.
                atomic_torch_save(self._train_state, os.path.join(tmp, TRAIN_STATE_FILE), temp_dir=tmp)
                self._train_state = None
                fsync_directory(tmp)       # DCP fsyncs its files; this makes their names durable too
                if os.path.isdir(folder):
                    remove_folder(folder)      # a checkpoint of the same name saved again
                os.replace(tmp, folder)
                fsync_directory(os.path.dirname(folder))
        except BaseException:
            if main and self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        finally:
            if main and self.tmp is not None:
                mark_temp_live(self.tmp, False)
        return marker


def begin_save(loop: TrainLoop, folder: str | None, train_state: dict[str, Any] | None, stager: Any = None,
               until_step: bool = False,
               complete_train_state: Callable[[dict[str, Any] | None, Any], None] | None = None) -> ShardedSave:
    """Start writing the loop's sharded checkpoint into ``folder`` (``....dcp``); every process must call it, at
    the same point. Complete it with :meth:`ShardedSave.finish`.

    ``folder`` and ``train_state`` (``loop_state.build_checkpoint(loop, ..., weights=False)``) are rank 0's; other
    ranks may pass None. ``stager`` (:func:`new_stager`): asynchronous: this call returns once this rank's shards
    are copied to host memory, and :meth:`ShardedSave.finish`, in a background thread, writes them over
    :func:`checkpoint_process_group` (``train_state`` must then be a copy that training does not change). None:
    ``dcp.save`` writes them before this call returns.

    ``until_step`` (asynchronous only): return without waiting for the copy of the parameters and optimizer state;
    each of the loop's optimizers waits for it at its next ``step()``. Only where a training step comes next
    (:func:`next_step_follows`), whose forward and backward change neither (code that changes weights in place
    before that optimizer step, e.g. a callback's on_batch_begin, would make the checkpoint inconsistent).

    ``complete_train_state`` (every rank gives one, or none does): a collective that completes ``train_state``
    before it is written (``loop_state.begin_checkpoint``'s ``losses.complete``), called with this rank's
    ``train_state`` and the process group to run over: asynchronous, in :meth:`ShardedSave.finish` over
    :func:`checkpoint_process_group` (off the training thread); else before this call returns."""
    if stager is None and complete_train_state is not None:
        complete_train_state(train_state, None)
        complete_train_state = None
    model_state, optimizer_state = _sharded_state_dicts(loop)
    state = {'model': model_state, 'optim': optimizer_state}
    optimizers = _optimizers(loop)
    into_step = stager is not None and until_step and bool(optimizers) and all(
        isinstance(optimizer, torch.optim.Optimizer) for optimizer in optimizers)
    copying = stager.start(state) if stager is not None and not into_step else None     # complete on return
    names: tuple[str | None, str | None]
    if stager is None:
        names = _names(folder)
    elif distributed.is_main_process():
        # Asynchronous: rank 0 names the folder now, and the other ranks learn the names in finish (a collective
        # of the background writers, not of the training thread).
        if not isinstance(folder, str):
            raise ValueError(_NO_FOLDER)
        names = _choose_names(folder)
    else:
        names = (None, None)
    folder, tmp = names
    try:
        if stager is None:
            assert tmp is not None      # _names gives every rank rank 0's names
            _dcp().save(state, checkpoint_id=tmp)
            return ShardedSave(folder, tmp, train_state)
        # Making the group is a collective of the training thread (once per process group).
        group = checkpoint_process_group() if distributed.is_distributed() else None
        if into_step:
            # The parameters and the optimizer state are copied during the next step's forward and backward (its
            # optimizer step waits for them); the rest (buffers such as BatchNorm statistics, which forward passes
            # change) now.
            copying = stager.start(state, _changed_by_steps_only(loop, model_state))
            stager.hold_steps(optimizers, copying)
        return ShardedSave(folder, tmp, train_state, copying, group, complete_train_state, share_names=True)
    except BaseException:
        if copying is not None:
            copying.exception()     # nothing may read the shards once this call returned
        if distributed.is_main_process() and tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            mark_temp_live(tmp, False)
        raise


def _changed_by_steps_only(loop: TrainLoop, model_state: dict[str, Any]) -> Callable[[tuple[Any, ...]], bool]:
    """Which paths of ``{'model': model_state, 'optim': ...}`` hold tensors that only an optimizer step changes: the
    optimizer's per-parameter state, and the model's parameters (found by their memory), not its buffers."""
    with torch.no_grad():
        memory = {distributed.local_tensor(p).data_ptr() for p in loop.model.parameters()}
        parameters = {key for key, value in model_state.items()
                      if isinstance(value, torch.Tensor) and value.numel() > 0
                      and distributed.local_tensor(value).data_ptr() in memory}
    return lambda path: path[:2] == ('optim', 'state') or (len(path) == 2 and path[0] == 'model'
                                                           and path[1] in parameters)


def next_step_follows(loop: TrainLoop) -> bool:
    """Whether a training step of the current epoch comes after the batch the loop is at (fit is training its
    epochs, the loader has a length and more batches, and num_iterations is not reached): nothing but that step's
    forward and backward run before its optimizer step, whereas the end of an epoch or of training runs
    evaluations and callbacks that may change the weights (swapping averaged weights in, restoring the best ones)."""
    if not loop.epochs_running:
        return False
    try:
        length = len(loop.train_loader)
    except TypeError:
        return False
    if loop.iteration + 1 >= length:
        return False
    return not loop.num_iterations or loop.total_iteration_idx + 1 < loop.num_iterations


_NO_FOLDER = 'sharded_checkpoint.begin_save: rank 0 must give the checkpoint folder'


def _names(folder: str | None) -> tuple[str, str]:
    """(folder, temporary folder): rank 0's, on every rank (a collective)."""
    names = None
    if distributed.is_main_process() and isinstance(folder, str):
        names = _choose_names(folder)
    names = _broadcast(names)
    if names is None:
        raise ValueError(_NO_FOLDER)
    return names[0], names[1]


def _choose_names(folder: str) -> tuple[str, str]:
    """Rank 0's (folder, temporary folder) of a checkpoint to be written into ``folder``; the temporary folder is
    marked live (storage.local.mark_temp_live) until the save is complete or failed."""
    # Written under a hidden temporary name next to the final one (a killed write leaves only a folder that
    # remove_stray_temp_files deletes when the experiment is resumed), renamed once complete.
    tmp = os.path.join(os.path.dirname(folder), temp_name_for(os.path.basename(folder)))
    mark_temp_live(tmp)
    return folder, tmp


def _sharded_state_dicts(loop: TrainLoop) -> tuple[dict[str, Any], dict[str, Any]]:
    """``get_state_dict(model, optimizers)``: this rank's part of the model and optimizer state, keyed by parameter
    name. An optimizer without per-parameter state (SGD without momentum), once known as such, gets its state dict
    built here from its current parameter groups: DCP's helper would otherwise, at every save, fill a zero gradient
    for every parameter and run a step with learning rate 0 (its way of creating the state of an optimizer that has
    none yet), the cost of a pass over the whole model, for the same result."""
    optimizers = _optimizers(loop)
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
    model_state, optimizer_state = _state_dict_api().get_state_dict(loop.model, optimizers)
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
    state = _state_dict_api().get_model_state_dict(model)
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


def save(loop: TrainLoop, folder: str | None, train_state: dict[str, Any]) -> str:
    """Write the loop's sharded checkpoint into ``folder`` (``....dcp``) synchronously; every process must call it.

    ``train_state`` is ``loop_state.build_checkpoint(loop, ..., weights=False)``; rank 0's is written. ``folder`` is
    taken from rank 0 (other ranks may pass anything). Returns the marker file's path, complete on return."""
    marker = begin_save(loop, folder, train_state).finish()
    if distributed.is_distributed():
        dist.barrier()      # nobody moves on before the rename
    return marker


def upload_order(folder: str) -> list[str]:
    """The files of a complete sharded checkpoint in the order they must be uploaded: the marker last, so that a
    cloud pointer set after it never names a folder with missing shards."""
    names = sorted(n for n in os.listdir(folder) if n != MARKER)
    return [os.path.join(folder, n) for n in names] + [os.path.join(folder, MARKER)]


def download(storage: Storage, folder_key: str, local_folder: str) -> str:
    """Download the sharded checkpoint stored under ``folder_key`` (all its shards, ``.metadata`` and
    ``train_state.pt``) into ``local_folder``, atomically: into a hidden temporary folder next to it, renamed once
    complete (a failed or killed download leaves no folder under the final name). Returns ``local_folder``.

    A complete local folder of that name is used as it is (it may hold what is not uploaded yet). Several processes
    of one machine may call it at once: one downloads (under a lock on the parent folder), the others then find the
    folder complete. CheckpointError if the stored folder is incomplete (no ``.metadata``: its upload never
    finished)."""
    local_folder = os.path.abspath(local_folder)
    parent = os.path.dirname(local_folder)
    os.makedirs(parent, exist_ok=True)
    with exclusive_lock(parent):
        if is_sharded_checkpoint(local_folder):
            logger.info('%s is already here (%s); not downloaded again', storage.uri(folder_key), local_folder)
            return local_folder
        names = [key[len(folder_key) + 1:] for key in storage.list(folder_key + '/')]
        if MARKER not in names or TRAIN_STATE_FILE not in names:
            raise CheckpointError(f'{storage.uri(folder_key)} is not a complete sharded checkpoint (no {MARKER} or '
                                  f'{TRAIN_STATE_FILE}; its upload may not have finished): resume from an earlier '
                                  f'one, or from its experiment folder (whose pointer names complete checkpoints only)')
        tmp = os.path.join(parent, temp_name_for(os.path.basename(local_folder)))
        mark_temp_live(tmp)
        try:
            os.makedirs(tmp)
            for name in names:
                target = os.path.join(tmp, *validate_key(name, 'file of a sharded checkpoint').split('/'))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                storage.load_file(join_key(folder_key, name), target)
            fsync_directory(tmp)
            if os.path.isdir(local_folder):
                remove_folder(local_folder)       # an incomplete leftover of that name
            os.replace(tmp, local_folder)
            fsync_directory(parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            mark_temp_live(tmp, False)
    logger.info('Downloaded %s (%d files) into %s', storage.uri(folder_key), len(names), local_folder)
    return local_folder


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
    model_state, optimizer_state = _state_dict_api().get_state_dict(loop.model, optimizers)
    try:
        # dcp.load fills the tensors of these dicts in place, reading this rank's part from every file needed.
        _dcp().load({'model': model_state, 'optim': optimizer_state}, checkpoint_id=folder)
        _state_dict_api().set_state_dict(loop.model, optimizers, model_state_dict=model_state,
                                         optim_state_dict=optimizer_state)
    except (RuntimeError, ValueError, KeyError) as error:
        raise CheckpointError(f'{source}: its sharded model / optimizer state does not fit this TrainLoop '
                              f'({error}); was it saved with a different model or optimizer?') from error


def full_state(loop: TrainLoop) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The whole model state dict and optimizer state (keyed by parameter name), gathered to rank 0 on the CPU
    (other ranks get empty dicts); a collective under FSDP: every process must call it."""
    options = _state_dict_api().StateDictOptions(full_state_dict=True, cpu_offload=True)
    optimizers = _optimizers(loop)
    if not optimizers:
        return _state_dict_api().get_model_state_dict(loop.model, options=options), None
    return _state_dict_api().get_state_dict(loop.model, optimizers, options=options)


def load_full_state(loop: TrainLoop, model_state: dict[str, Any], optimizer_state: Any) -> None:
    """Load a whole (unsharded) model state dict, and optimizer state, into the loop's model, which may be sharded
    (each rank keeps its part) or plain. ``optimizer_state`` is keyed by parameter name (as :func:`full_state`
    returns it) or by index (a plain ``optimizer.state_dict()``, e.g. from a single-process checkpoint)."""
    options = _state_dict_api().StateDictOptions(full_state_dict=True)
    _state_dict_api().set_model_state_dict(loop.model, model_state, options=options)
    optimizers = _optimizers(loop)
    if optimizer_state is None or not optimizers:
        return
    if isinstance(optimizer_state, list):       # a MultiOptimizer's state dicts
        optimizer_state = _merge_by_name(loop, optimizers, optimizer_state)
    elif not _keyed_by_name(optimizer_state):
        optimizer_state = _merge_by_name(loop, optimizers, [optimizer_state])
    _state_dict_api().set_optimizer_state_dict(loop.model, optimizers, optimizer_state, options=options)


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
           'checkpoint_folder', 'checkpoint_process_group', 'HostStager', 'new_stager', 'close_stager', 'ShardedSave',
           'begin_save', 'next_step_follows', 'step_wait_seconds', 'save', 'upload_order', 'download',
           'load_train_state', 'load_model_and_optimizer', 'full_state', 'load_full_state', 'index_keyed',
           'gradients_inside_window_error']
