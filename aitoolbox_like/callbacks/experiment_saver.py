"""What the saving callbacks share (:class:`ExperimentSaverBase`): the experiment folder, the hyperparameter files,
the uploader and the checkpoint writes, synchronous or in the background. The saving callbacks themselves, and where
their files go: :mod:`aitoolbox_like.callbacks.model_save`, which re-exports the base."""
import logging
import os
from typing import Any, Optional

import torch.distributed as dist

from .. import distributed, sharded_checkpoint
from ..engine import loop_state
from ..checkpoint import AsyncCheckpointWriter, atomic_torch_save
from ..experiment import (Experiment, ExperimentUploader, get_experiment, get_uploader, model_file_name,
                          normalize_cloud_save_mode, write_pointer)
from ..storage.base import validate_key_part
from .abstract import AbstractCallback

# The logger of the saving callbacks' module, whose messages these are.
logger = logging.getLogger('aitoolbox_like.callbacks.model_save')


class ExperimentSaverBase(AbstractCallback):
    """What the saving callbacks share: the experiment folder, the hyperparameter files and the uploader."""

    # Read by the loop before callbacks register (loop_state.prepare_fit): this callback names the experiment.
    defines_experiment = True

    def __init__(self, callback_name, project_name, experiment_name, local_model_result_folder_path, hyperparams,
                 cloud_save_mode='s3', bucket_name='model-result', cloud_dir_prefix='', endpoint_url=None,
                 execution_order=100, device_idx_execution=0, async_save=True):
        super().__init__(callback_name, execution_order, device_idx_execution)
        if local_model_result_folder_path is None:
            raise ValueError(f'{type(self).__name__}: local_model_result_folder_path is required (the folder under '
                             f'which <project>/<experiment>_<timestamp> is created)')
        self.project_name = project_name
        self.experiment_name = experiment_name
        self.local_model_result_folder_path = os.path.expanduser(os.fspath(local_model_result_folder_path))
        self.hyperparams = hyperparams
        normalize_cloud_save_mode(cloud_save_mode)      # fail now on a wrong mode, not at the first epoch
        self.cloud_save_mode = cloud_save_mode
        self.bucket_name = bucket_name
        self.cloud_dir_prefix = cloud_dir_prefix
        self.endpoint_url = endpoint_url
        # Set at registration, before any hook that uses it runs.
        self.experiment: Experiment = None  # type: ignore[assignment]  # None only until registration
        self.uploader: Optional[ExperimentUploader] = None
        # async_save: checkpoint files are written by this writer's background thread (None: on the training thread).
        self.async_save = bool(async_save)
        self.async_writer: Optional[AsyncCheckpointWriter] = AsyncCheckpointWriter() if async_save else None
        # FSDP with async_save: the host buffers this rank's shards are copied into (made at the first sharded
        # save, in the process that trains; released at the end of fit).
        self._stager: Any = None
        validate_key_part(project_name, 'project_name')
        validate_key_part(experiment_name, 'experiment_name')

    def on_train_loop_registration(self):
        loop = self.train_loop_obj
        if self.hyperparams is not None and not isinstance(self.hyperparams, dict):
            raise TypeError(f'{type(self).__name__}: hyperparams must be a dict of hyperparameter names to values (or '
                            f'None), got {type(self.hyperparams).__qualname__}')
        if not callable(getattr(loop.optimizer, 'state_dict', None)):
            raise AttributeError(f'{type(self).__name__}: the optimizer {type(loop.optimizer).__qualname__} has no '
                                 f'state_dict(), so checkpoints could not restore it; use a torch optimizer or '
                                 f'MultiOptimizer')
        self.experiment = get_experiment(loop, self.project_name, self.experiment_name,
                                         self.local_model_result_folder_path)
        if loop.is_main_process():
            self.uploader = get_uploader(loop, self.experiment, self.cloud_save_mode, self.bucket_name,
                                         self.cloud_dir_prefix, self.endpoint_url)
            if not loop.lazy_experiment_save:
                self.save_hyperparams()

    def save_hyperparams(self):
        """hyperparams_list.txt, the experiment script and source_code.zip (once), and hyperparams.json in the
        bookkeeping folder."""
        return self.experiment.save_hyperparams(self.hyperparams, self.uploader)

    def on_train_begin(self):
        # The bucket is checked and the experiment's prefix claimed here, before the first step: never when the
        # callback is created or registered (also outside fit), where no upload is due yet.
        if self.uploader is not None:
            self.uploader.start()

    @property
    def experiment_dir_path(self):
        return self.experiment.claim()

    def _model_file_name(self, epoch=None, iteration_idx=None):
        return model_file_name(self.experiment_name, self.train_loop_obj.experiment_timestamp, epoch, iteration_idx)

    def wait_for_pending_save(self):
        """Block until the checkpoint being written in the background (if any) is complete: its file, pointers and
        upload queued. Raises CheckpointError if that write failed. Does nothing with ``async_save=False``."""
        if self.async_writer is not None:
            self.async_writer.wait()

    def on_train_end(self):
        # The end of fit returns only once the last checkpoint is complete (before the loop waits for uploads).
        try:
            self.wait_for_pending_save()
        finally:
            self._close_stager()

    def on_exception(self, exception):
        try:
            self.wait_for_pending_save()
        except Exception as error:
            # fit is already failing with `exception`; the failed write is reported, not lost.
            logger.error('%s: %s (while fit failed with %s)', type(self).__name__, error, type(exception).__name__)
            exception.add_note(f'also: {error}')
        finally:
            self._close_stager()

    def _save_state(self, subdir, file_name, mid_epoch=False, pointer=None, after_write=None, wait=False,
                    checkpoint=None, all_ranks=False):
        """Write the loop's full state atomically into ``<experiment>/<subdir>/<file_name>``, then point
        ``pointer`` at it, queue its upload and run ``after_write(path)``; returns the file's path.

        With ``async_save`` the training thread only waits for the previous write and copies the state to host
        memory; the rest runs in the background (``wait=True``: wait for it before returning). ``checkpoint``: the
        state to write, already built (an FSDP export, gathered by every rank); None: built here (``all_ranks``:
        with every rank taking part, loop_state.build_checkpoint)."""
        loop = self.train_loop_obj
        self.wait_for_pending_save()        # one write in flight at most; its error is raised here
        self.save_hyperparams()
        if checkpoint is None:
            checkpoint = loop_state.build_checkpoint(loop, self.hyperparams, mid_epoch=mid_epoch,
                                                     all_ranks=all_ranks)
        folder = self.experiment.subdir(subdir)
        path = os.path.join(folder, file_name)
        experiment_dir = self.experiment.dir_path
        temp_dir = self.experiment.temp_dir()
        uploader = self.uploader

        def write(state):
            atomic_torch_save(state, path, temp_dir=temp_dir)
            if pointer:
                # After the file is complete: a reader following the pointer always finds a whole checkpoint.
                write_pointer(experiment_dir, pointer, path)
            if uploader is not None:
                uploader.upload_experiment_file(path)
            if after_write is not None:
                after_write(path)

        if self.async_writer is None:
            write(checkpoint)
        else:
            self.async_writer.submit(path, write, self.async_writer.snapshot(checkpoint))
            if wait:
                self.async_writer.wait()
        return path


    def _save_sharded_state(self, subdir, folder_name, mid_epoch=False, pointer=None, after_write=None, wait=False,
                            named=None):
        """FSDP: every rank writes its shards into the folder ``<experiment>/<subdir>/<folder_name>`` (DCP, see
        aitoolbox_like/sharded_checkpoint.py); rank 0 then points ``pointer`` at its marker file, queues the
        upload (marker last, the cloud pointer set after it) and runs ``after_write``. Returns the folder's path
        (rank 0's name); None on the other ranks of an asynchronous save, which learn it in the background and then
        call ``named(path)``.

        With ``async_save`` the training thread waits for the previous save and copies this rank's shards (and, on
        rank 0, the train state) to host memory; DCP's write, the rename, the pointer and the upload follow in the
        background, and so do the save's collectives (rank 0's folder name to the other ranks, the running losses'
        mean over ranks) (``wait=True``: all of it on this thread, before returning)."""
        loop = self.train_loop_obj
        main = loop.is_main_process()
        self.wait_for_pending_save()
        folder = None
        if main:
            self.save_hyperparams()
            folder = os.path.join(self.experiment.subdir(subdir), folder_name)
        # wait=True (a preemption or on_exception save): the caller waits for the whole save anyway, so it is
        # written on this thread, without a host copy of the shards or a stager (on_exception comes after the
        # stager was closed).
        writer = self.async_writer if not wait else None
        # Rank 0's train state of an asynchronous save: a copy that training does not change (the writer's
        # snapshot); other ranks' is not written.
        snapshot = writer.snapshot if writer is not None and main else None
        # On every rank: a callback's state may gather sharded tensors (a collective). The mean of the running
        # losses over ranks, another collective, is left to the save (in the background when it is asynchronous).
        state, losses = loop_state.begin_checkpoint(loop, self.hyperparams, mid_epoch=mid_epoch, weights=False,
                                                    snapshot=snapshot)
        train_state: Optional[dict] = state if writer is None or main else None
        if writer is not None and self._stager is None:
            self._stager = sharded_checkpoint.new_stager()
        # Mid-epoch, with another training step next: the copy of the parameters and optimizer state goes on
        # during its forward and backward, and its optimizer step waits for it.
        until_step = writer is not None and mid_epoch and sharded_checkpoint.next_step_follows(loop)
        save = sharded_checkpoint.begin_save(loop, folder, train_state,
                                             self._stager if writer is not None else None, until_step,
                                             losses.complete if losses is not None else None)
        experiment_dir = self.experiment.dir_path
        uploader = self.uploader

        def complete(_):
            marker = save.finish()
            written = os.path.dirname(marker)       # rank 0's folder, known on every rank once finish returned
            if not main:
                if named is not None:
                    named(written)
                return
            if pointer:
                write_pointer(experiment_dir, pointer, marker)     # every rank's shards are written by now
            if uploader is not None:
                files = sharded_checkpoint.upload_order(written)
                # The marker last: in the bucket a sharded checkpoint counts once its marker is there.
                for path in files:
                    uploader.upload_experiment_file(path)
            if after_write is not None:
                after_write(written)

        if writer is None:
            complete(None)
            if distributed.is_distributed():
                dist.barrier()      # synchronous: the checkpoint is complete on every rank on return
        else:
            # Ranks other than 0 do not know rank 0's name yet: their writes are described by the file name.
            writer.submit(save.folder or folder_name, complete, None)
        return save.folder

    def _close_stager(self):
        stager, self._stager = self._stager, None
        sharded_checkpoint.close_stager(stager)
