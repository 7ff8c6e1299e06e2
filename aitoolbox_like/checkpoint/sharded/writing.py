"""Writing a sharded checkpoint: :func:`begin_save` on every rank (this rank's shards, written by DCP now or
copied to host memory for an asynchronous save), :meth:`ShardedSave.finish` (rank 0 completes the folder and renames
it into place), the process group that background writes run their collectives over, and :func:`save` for both at
once."""
from __future__ import annotations

import os
import shutil
import weakref
from concurrent.futures import Future
from typing import Any, Callable, Optional, Protocol

import torch
import torch.distributed as dist

from ... import distributed
from ..files import CheckpointError, atomic_torch_save, fsync_directory
from ...storage.local import mark_temp_live, remove_folder, temp_name_for
from .files import MARKER, TRAIN_STATE_FILE
from .state_dicts import LoopModelAndOptimizers, dcp_module, loop_optimizers, sharded_state_dicts


class LoopPosition(LoopModelAndOptimizers, Protocol):
    """What writing a sharded checkpoint reads of a TrainLoop: its model and optimizers, and where training is
    (whether another step follows the save)."""

    train_loader: Any
    iteration: int
    num_iterations: Optional[int]
    total_iteration_idx: int

    @property
    def epochs_running(self) -> bool: ...


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
                dcp_module().save(copying.result(), checkpoint_id=tmp, process_group=self._group)
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


def begin_save(loop: LoopPosition, folder: str | None, train_state: dict[str, Any] | None, stager: Any = None,
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
    model_state, optimizer_state = sharded_state_dicts(loop)
    state = {'model': model_state, 'optim': optimizer_state}
    optimizers = loop_optimizers(loop)
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
            dcp_module().save(state, checkpoint_id=tmp)
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


def _changed_by_steps_only(loop: LoopPosition, model_state: dict[str, Any]) -> Callable[[tuple[Any, ...]], bool]:
    """Which paths of ``{'model': model_state, 'optim': ...}`` hold tensors that only an optimizer step changes: the
    optimizer's per-parameter state, and the model's parameters (found by their memory), not its buffers."""
    with torch.no_grad():
        memory = {distributed.local_tensor(p).data_ptr() for p in loop.model.parameters()}
        parameters = {key for key, value in model_state.items()
                      if isinstance(value, torch.Tensor) and value.numel() > 0
                      and distributed.local_tensor(value).data_ptr() in memory}
    return lambda path: path[:2] == ('optim', 'state') or (len(path) == 2 and path[0] == 'model'
                                                           and path[1] in parameters)


def next_step_follows(loop: LoopPosition) -> bool:
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


def save(loop: LoopPosition, folder: str | None, train_state: dict[str, Any]) -> str:
    """Write the loop's sharded checkpoint into ``folder`` (``....dcp``) synchronously; every process must call it.

    ``train_state`` is ``loop_state.build_checkpoint(loop, ..., weights=False)``; rank 0's is written. ``folder`` is
    taken from rank 0 (other ranks may pass anything). Returns the marker file's path, complete on return."""
    marker = begin_save(loop, folder, train_state).finish()
    if distributed.is_distributed():
        dist.barrier()      # nobody moves on before the rename
    return marker


def gradients_inside_window_error() -> CheckpointError:
    """What a mid-epoch sharded checkpoint inside a gradient-accumulation window raises (not supported)."""
    return CheckpointError("gpu_mode='fsdp': a mid-epoch checkpoint inside a gradient-accumulation window would have "
                           'to keep the sharded accumulated gradients, which sharded checkpoints do not hold; '
                           'checkpoint on optimizer-update batches (save_frequency a multiple of grad_accumulation)')

