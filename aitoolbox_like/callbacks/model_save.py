"""Saving callbacks: checkpoints during training, the final model and results at its end, and what they share
(:class:`ExperimentSaverBase`: the experiment folder, the hyperparameter files, the uploader and the checkpoint
writes, synchronous or in the background).

Files go to ``<local folder>/<project>/<experiment>_<timestamp>/`` (AIToolbox's layout, nothing else) and, with
``cloud_save_mode='s3'`` (``'gcs'``, ``'azure'``), to the same keys under ``s3://<bucket>/<cloud_dir_prefix>/``
(``gs://``, ``az://``) through a background uploader (training does not wait for the network), which checks the
bucket at the start of fit. Our pointers, claim, journal and temporary files live in the experiment's bookkeeping
folder (aitoolbox_like.experiment). Checkpoints hold the full training state (aitoolbox_like.engine.loop_state) so
``fit(resume_from=...)`` continues exactly where a run stopped.

With ``async_save=True`` (the default) a save only copies the state to host memory on the training thread; the
file, its pointers and its upload are written by a background thread (checkpoint.AsyncCheckpointWriter), at most
one at a time. The next save, the end of fit (on_train_end / on_exception) and ``wait_for_pending_save()`` wait for
it, and raise its error if it failed. Under FSDP (sharded checkpoints, one folder written by every rank) the same
holds on each rank: its shards are copied to host memory and written by ``torch.distributed.checkpoint.async_save``
(aitoolbox_like.checkpoint.sharded).
"""
import copy
import logging
import math
import os
from typing import Any, Optional

import torch.distributed as dist

from .. import distributed
from ..checkpoint import sharded as sharded_checkpoint
from ..checkpoint.files import AsyncCheckpointWriter, atomic_torch_save
from ..engine import loop_state
from ..experiment import (BEST_POINTER, CHECKPOINT_DIR, LATEST_POINTER, MODEL_DIR, RESULTS_DIR, Experiment,
                          ExperimentUploader, get_experiment, get_uploader, model_file_name, normalize_cloud_save_mode,
                          write_pointer)
from ..results.savers import write_experiment_results
from ..storage.base import validate_key_part
from ..storage.local import remove_folder
from ._common import lower_is_better, missing_monitor_message
from .abstract import AbstractCallback

logger = logging.getLogger(__name__)


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
            self._close_background_writers()

    def on_exception(self, exception):
        try:
            self.wait_for_pending_save()
        except Exception as error:
            # fit is already failing with `exception`; the failed write is reported, not lost.
            logger.error('%s: %s (while fit failed with %s)', type(self).__name__, error, type(exception).__name__)
            exception.add_note(f'also: {error}')
        finally:
            self._close_background_writers()

    def _save_state(self, subdir, file_name, mid_epoch=False, pointer=None, after_write=None, wait=False,
                    checkpoint=None, all_ranks=False, fsdp=None):
        """Write the loop's full state atomically into ``<experiment>/<subdir>/<file_name>``, then point
        ``pointer`` at it, queue its upload and run ``after_write(path)``; returns the file's path.

        With ``async_save`` the training thread only waits for the previous write and copies the state to host
        memory; the rest runs in the background (``wait=True``: wait for it before returning). ``checkpoint``: the
        state to write, already built (an FSDP export, gathered by every rank); None: built here (``all_ranks``:
        with every rank taking part, loop_state.build_checkpoint; ``fsdp``: whether the model is sharded, where the
        caller knows)."""
        loop = self.train_loop_obj
        self.wait_for_pending_save()        # one write in flight at most; its error is raised here
        self.save_hyperparams()
        writer = self.async_writer
        if checkpoint is None:
            # With async_save, built as the writer's snapshot: one walk copies it and checks it loads.
            checkpoint = loop_state.build_checkpoint(loop, self.hyperparams, mid_epoch=mid_epoch, all_ranks=all_ranks,
                                                     snapshot=writer.snapshot if writer is not None else None,
                                                     fsdp=fsdp)
        elif writer is not None:
            checkpoint = writer.snapshot(checkpoint)
        experiment = self.experiment
        experiment_dir = experiment.claim()
        path = os.path.join(experiment_dir, subdir, file_name)
        uploader = self.uploader

        def write(state):
            # The folders are made here, with async_save in the background: file-system calls, each save.
            experiment.subdir(subdir)
            atomic_torch_save(state, path, temp_dir=experiment.temp_dir())
            if pointer:
                # After the file is complete: a reader following the pointer always finds a whole checkpoint.
                write_pointer(experiment_dir, pointer, path)
            if uploader is not None:
                uploader.upload_experiment_file(path)
            if after_write is not None:
                after_write(path)

        if writer is None:
            write(checkpoint)
        else:
            writer.submit(path, write, checkpoint)
            if wait:
                writer.wait()
        return path


    def _save_sharded_state(self, subdir, folder_name, mid_epoch=False, pointer=None, after_write=None, wait=False,
                            named=None):
        """FSDP: every rank writes its shards into the folder ``<experiment>/<subdir>/<folder_name>`` (DCP, see
        aitoolbox_like/checkpoint/sharded.py); rank 0 then points ``pointer`` at its marker file, queues the
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

    def _close_background_writers(self):
        """The end of fit: the sharded saves' stager and the writer thread are let go (a later save starts them
        again)."""
        stager, self._stager = self._stager, None
        sharded_checkpoint.close_stager(stager)
        if self.async_writer is not None:
            self.async_writer.close()


# ------------------------------------------------------------------------------------------ the saving callbacks


class ModelCheckpoint(ExperimentSaverBase):
    """Save the full training state after every epoch into ``<experiment>/checkpoint_model/``.

    Files are ``model_<experiment>_<timestamp>_E<epoch>.pth``; the text files ``latest_checkpoint.txt`` and
    ``best_checkpoint.txt`` in the experiment's bookkeeping folder
    (``<local_model_result_folder_path>/.aitoolbox_like/<project>/<experiment folder>/``, outside the project
    folder) name the newest complete one (resume with ``fit(resume_from=...)``) and the one with the best
    ``monitor`` value. A checkpoint is saved every epoch whatever the monitor (as in AIToolbox); a
    monitor the loop never computes (``loss`` / ``val_loss`` with ``end_auto_eval=False``) only leaves the ranking
    out, said once at the start of fit.

    Args:
        project_name (str): folder name (a plain name, no path separators).
        experiment_name (str): folder name (a plain name, no path separators).
        local_model_result_folder_path (str): root folder of the projects.
        hyperparams (dict): saved as hyperparams_list.txt / hyperparams.json and in every checkpoint.
        cloud_save_mode (str): 's3' (or 'aws_s3' / 'aws') uploads to S3 too, 'gcs' (or 'google_storage' /
            'google storage') to Google Cloud Storage, 'azure' to Azure Blob Storage; 'local' keeps files local only.
        bucket_name (str): the bucket (Azure: the container).
        cloud_dir_prefix (str): key prefix in the bucket.
        rm_subopt_local_models (bool or str): delete local epoch checkpoints that are not among the
            ``num_best_checkpoints_kept`` best by ``monitor`` (a str names the metric, as in AIToolbox). The newest
            checkpoint is always kept, so a run can resume. Cloud copies are kept; with a cloud, a checkpoint is deleted
            locally only once its upload is confirmed (a sharded checkpoint folder of an FSDP fit: whole, once every
            file in it is confirmed).
        num_best_checkpoints_kept (int): how many best checkpoints survive rm_subopt_local_models.
        monitor (str or None): history metric that ranks checkpoints; None: 'val_loss' with a validation
            loader, else the loop's training loss (``train_loss_name``: 'accumulated_loss', or 'loss' with
            ``eval_train_set``). 'val_loss' named on a loop without a validation loader is refused at the start of
            fit.
        mode ('auto', 'min', 'max'): whether lower or higher is better; 'auto': lower for losses and errors.
        endpoint_url (str or None): the cloud's endpoint (an S3-compatible server, a GCS emulator, an Azure account
            URL); None: the client's own (AWS_ENDPOINT_URL_S3, STORAGE_EMULATOR_HOST, AZURE_STORAGE_CONNECTION_STRING
            are honoured).
        async_save (bool): write checkpoints in a background thread (training waits only for a copy of the state in
            host memory); the pointers, the upload and rm_subopt_local_models follow once the file is complete. The
            next save and the end of fit wait for it and raise its error. False: write on the training thread.
            Under FSDP each rank copies its shards to host memory and torch.distributed.checkpoint.async_save writes
            them; rank 0 completes the folder and moves the pointers once every rank's shards are written.
    """

    # Read by the FSDP launcher (distributed/launch.py): under gpu_mode='fsdp' every rank writes its shards of a checkpoint,
    # so this callback then runs on every rank (device_idx_execution=None); rank 0 alone writes the other files.
    collective_when_sharded = True
    # Read by the DDP launcher: every rank takes part in building a checkpoint (its RNG states and running losses
    # go into rank 0's file), so this callback runs on every rank there too; rank 0 alone writes.
    collective_when_distributed = True
    # fit(resume_from='auto') needs a callback that writes checkpoints to resume from (loop_state.check_auto_resume).
    writes_checkpoints = True

    def __init__(self, project_name, experiment_name, local_model_result_folder_path, hyperparams,
                 cloud_save_mode='s3', bucket_name='model-result', cloud_dir_prefix='', rm_subopt_local_models=False,
                 num_best_checkpoints_kept=2, monitor=None, mode='auto', endpoint_url=None, async_save=True):
        super().__init__('Model checkpoint at end of epoch', project_name, experiment_name,
                         local_model_result_folder_path, hyperparams, cloud_save_mode, bucket_name, cloud_dir_prefix,
                         endpoint_url, execution_order=100, device_idx_execution=0, async_save=async_save)
        if mode not in ('auto', 'min', 'max'):
            raise ValueError(f"mode must be 'auto', 'min' or 'max', got {mode!r}")
        if isinstance(num_best_checkpoints_kept, bool) or not isinstance(num_best_checkpoints_kept, int) \
                or num_best_checkpoints_kept < 1:
            raise ValueError(f'num_best_checkpoints_kept must be an int >= 1, got {num_best_checkpoints_kept!r}')
        if isinstance(rm_subopt_local_models, str) and monitor is None:
            monitor = rm_subopt_local_models
        self.rm_subopt_local_models = bool(rm_subopt_local_models)
        self.num_best_checkpoints_kept = num_best_checkpoints_kept
        self.monitor = monitor
        self.mode = mode
        self.scored = []        # [[score, epoch, file name]] of the epoch checkpoints, oldest first
        self.latest_checkpoint_path = None
        #: (epoch, iteration_idx) of the latest save_checkpoint() in this process (iteration_idx None: at the epoch's
        #: end), on every rank that calls it; None before the first.
        self.saved_at = None
        self._nan_reported = False
        self._monitor_missing_reported = False

    @property
    def state_key(self):
        return f'{type(self).__name__}[{self.project_name}/{self.experiment_name}]'

    def state_dict(self):
        # Each entry holds a score, an epoch and a file name, none of which changes in place: a copy of each list, not
        # a deepcopy of all of them (taken at every save, over a list that grows by one entry per epoch).
        return {'scored': [list(entry) for entry in self.scored]}

    def load_state_dict(self, state_dict):
        self.scored = copy.deepcopy(state_dict.get('scored', []))

    def _monitor_name(self):
        if self.monitor is not None:
            return self.monitor
        loop = self.train_loop_obj
        return 'val_loss' if loop.validation_loader is not None else loop.train_loss_name

    def _lower_is_better(self):
        if self.mode != 'auto':
            return self.mode == 'min'
        return lower_is_better(self._monitor_name())

    def on_train_begin(self):
        # What can be known before the first step: a monitor the loop never computes. Checkpoints are saved every
        # epoch whatever the monitor (as AIToolbox does); only the ranking needs it.
        loop = self.train_loop_obj
        monitor = self._monitor_name()
        if monitor == 'val_loss' and loop.validation_loader is None and self.monitor is not None:
            # Asked for by name, and never in the history (AIToolbox fails at the first epoch's end too).
            raise ValueError(f"{type(self).__name__}: monitor='val_loss' but the TrainLoop has no validation_loader; "
                             f"pass one, or monitor={loop.train_loss_name!r}")
        if monitor in ('loss', 'val_loss') and not loop.end_auto_eval:
            self._report_monitor_unavailable(
                f'{monitor!r} is computed by the end-of-epoch evaluation, which end_auto_eval=False turns off')
        elif monitor == 'loss' and not loop.eval_train_set:
            self._report_monitor_unavailable(
                "'loss', the loss over the whole training set, is computed only with the TrainLoop's "
                "eval_train_set=True; 'accumulated_loss' is the epoch's training loss")
        super().on_train_begin()        # the bucket, once the configuration is known to be right

    def _report_monitor_unavailable(self, why):
        # Said once; _ranking_known does not repeat it for each epoch.
        if self._monitor_missing_reported:
            return
        self._monitor_missing_reported = True
        skipped = ['no best_checkpoint.txt is written']
        if self.rm_subopt_local_models:
            skipped.append('rm_subopt_local_models deletes no checkpoint')
        asked = self.rm_subopt_local_models or self.monitor is not None
        logger.log(logging.WARNING if asked else logging.INFO,
                   '%s saves a checkpoint every epoch, but cannot rank them: the monitor %s; %s. Set '
                   'end_auto_eval=True (or an epoch interval), or monitor= a metric a callback computes.',
                   type(self).__name__, why, ' and '.join(skipped))

    def _current_score(self):
        loop = self.train_loop_obj
        name = self._monitor_name()
        value = loop.train_history.value_in_epoch(name, loop.epoch)
        if not isinstance(value, (int, float)):
            if not loop.train_history.get(name) and not self._monitor_missing_reported:
                # A misspelt monitor would otherwise never mark a best checkpoint, silently.
                self._monitor_missing_reported = True
                logger.warning(missing_monitor_message(type(self).__name__, name, list(loop.train_history.keys()),
                                                       loop.epoch))
            return None
        if math.isnan(value):
            # A diverged epoch must never become the best checkpoint.
            if not self._nan_reported:
                logger.warning('%s: the monitored %r is NaN in epoch %d; a NaN epoch is never the best checkpoint',
                               type(self).__name__, name, loop.epoch)
                self._nan_reported = True
            return None
        return float(value)

    def _best_files(self):
        sign = 1 if self._lower_is_better() else -1
        ranked = sorted((s for s in self.scored if s[0] is not None), key=lambda s: sign * s[0])
        return [s[2] for s in ranked]

    def on_epoch_end(self):
        self.save_checkpoint(wait=not self.train_loop_obj.epochs_running)

    def save_checkpoint(self, iteration_idx=None, wait=False, all_ranks=None):
        """Save the full training state (after batch ``iteration_idx`` when given, else at the epoch's end) and
        return the checkpoint's path (None on ranks other than 0, which write nothing; under FSDP they write their
        shards, and return the folder's path, except with ``async_save`` and ``wait=False``, where they learn it in
        the background: ``latest_checkpoint_path`` has it once the save is complete). With ``async_save`` the file
        is written in the background; ``wait=True`` returns only once it is complete (its pointers written, its
        upload queued).

        ``all_ranks``: in a distributed fit, whether every rank calls this at the same step (then the checkpoint
        holds each rank's RNG states and running losses: ``loop_state.build_checkpoint(all_ranks=True)``). None:
        whether this callback runs on every rank (as the launcher arranges); pass False from code that runs on one
        rank only (e.g. while fit is failing)."""
        loop = self.train_loop_obj
        self.saved_at = (loop.epoch, iteration_idx)
        sharded = distributed.is_fsdp_model(loop.model)     # FSDP: every rank writes its shards
        if all_ranks is None:
            all_ranks = self.device_idx_execution is None
        all_ranks = all_ranks and distributed.is_distributed()
        if not loop.is_main_process() and not sharded:
            if all_ranks:
                # Rank 0 builds the checkpoint at this step; this rank's part of it is gathered (no weights here).
                loop_state.build_checkpoint(loop, mid_epoch=iteration_idx is not None, weights=False, all_ranks=True)
            return None
        self.wait_for_pending_save()        # the previous checkpoint is complete before the ranking changes
        mid_epoch = iteration_idx is not None
        file_name = self._model_file_name(loop.epoch, iteration_idx)
        if sharded:
            file_name = sharded_checkpoint.folder_name(file_name)
        if not mid_epoch:
            self.scored = [s for s in self.scored if s[2] != file_name] + [[self._current_score(), loop.epoch,
                                                                             file_name]]
        # Decided now, on the training thread; applied once the new file is complete (in the background with
        # async_save), so the pointer never names an unfinished file and deletion only sees complete checkpoints.
        best = self._best_files()
        remove = self.rm_subopt_local_models and self._ranking_known(best)

        def after_write(path):
            folder = os.path.dirname(path)
            if not mid_epoch:
                self._update_best(folder, best)
            if remove:
                self._remove_suboptimal(folder, file_name, best)

        if sharded:
            path = self._save_sharded_state(CHECKPOINT_DIR, file_name, mid_epoch, LATEST_POINTER, after_write, wait,
                                            named=self._named_latest)
            if path is None:
                # Another rank than 0, saving asynchronously: _named_latest sets the path once the save knows it.
                return None
        else:
            path = self._save_state(CHECKPOINT_DIR, file_name, mid_epoch=mid_epoch, pointer=LATEST_POINTER,
                                    after_write=after_write, wait=wait, all_ranks=all_ranks, fsdp=False)
        self.latest_checkpoint_path = path
        return path

    def _named_latest(self, path):
        # Called by the background writer of an asynchronous sharded save on ranks other than 0, once rank 0's
        # folder name is known there (before the save counts as complete: wait_for_pending_save sees it set).
        self.latest_checkpoint_path = path

    def _ranking_known(self, best):
        if best:
            return True
        # No value of the monitor yet (a wrong name, or a metric not computed so far): nothing is known to be
        # worse, so nothing is deleted.
        if not self._monitor_missing_reported:
            logger.warning('%s: rm_subopt_local_models ranks checkpoints by %r, which has no value in the history '
                           '(its metrics: %s); no checkpoint is deleted until it has one. Check monitor=.',
                           type(self).__name__, self._monitor_name(), sorted(self.train_loop_obj.train_history))
            self._monitor_missing_reported = True
        return False

    def _update_best(self, folder, best):
        if best:
            target = os.path.join(folder, best[0])
            if os.path.isdir(target):       # a sharded checkpoint: pointers name its marker file
                target = os.path.join(target, sharded_checkpoint.MARKER)
            write_pointer(self.experiment.dir_path, BEST_POINTER, target)

    def _remove_suboptimal(self, folder, newest, best):
        # Runs once `newest` is complete; any earlier write is complete too (one in flight at most), and a file
        # being written is a temporary file at the experiment root (a sharded folder being written has a hidden
        # temporary name): only complete checkpoints are listed here.
        keep = set(best[:self.num_best_checkpoints_kept]) | {newest}
        for name in os.listdir(folder):
            if not name.startswith(f'model_{self.experiment_name}_') or name in keep \
                    or not name.endswith(('.pth', sharded_checkpoint.SUFFIX)):
                continue
            path = os.path.join(folder, name)
            if self.uploader is not None:
                # The uploader owns files it still has to send: it deletes this checkpoint (a sharded folder once
                # each of its files is confirmed) when its upload is confirmed (deleting it now would lose it while
                # the cloud is down).
                self.uploader.remove_local_file(path)
                continue
            try:
                if os.path.isdir(path):
                    remove_folder(path)
                else:
                    os.remove(path)
                logger.debug('Removed sub-optimal checkpoint %s', name)
            except FileNotFoundError:
                pass


class ModelIterationCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that also saves every ``save_frequency`` training batches (global batch index, as in
    AIToolbox: after batches idx = k * save_frequency, k >= 1), as ``..._E<epoch>_ITER<idx>.pth``. These
    mid-epoch checkpoints resume inside the epoch, with the same data order as the uninterrupted run.
    ``async_save`` as in ModelCheckpoint."""

    def __init__(self, save_frequency, project_name, experiment_name, local_model_result_folder_path, hyperparams,
                 cloud_save_mode='s3', bucket_name='model-result', cloud_dir_prefix='', rm_subopt_local_models=False,
                 num_best_checkpoints_kept=2, monitor=None, mode='auto', endpoint_url=None, async_save=True):
        if isinstance(save_frequency, bool) or not isinstance(save_frequency, int) or save_frequency < 1:
            raise ValueError(f'save_frequency must be an int >= 1 (training batches between checkpoints), got '
                             f'{save_frequency!r}')
        super().__init__(project_name, experiment_name, local_model_result_folder_path, hyperparams, cloud_save_mode,
                         bucket_name, cloud_dir_prefix, rm_subopt_local_models, num_best_checkpoints_kept, monitor,
                         mode, endpoint_url, async_save)
        self.save_frequency = save_frequency

    def on_batch_end(self):
        idx = self.train_loop_obj.total_iteration_idx
        if idx > 0 and idx % self.save_frequency == 0:
            if self.train_loop_obj.is_main_process():
                logger.info('Saving model checkpoint at the training iteration: %d', idx)
            # Hooks driven by hand, outside fit (AIToolbox code does): the file is complete when the hook returns,
            # as AIToolbox's synchronous save; in a fit it is written in the background and fit waits at its end.
            self.save_checkpoint(iteration_idx=idx, wait=not self.train_loop_obj.epochs_running)


class ModelTrainEndSave(ExperimentSaverBase):
    """At the end of training: save the final model (full state) into ``<experiment>/model/`` and evaluate the
    result packages on the validation and/or test set, writing the results into ``<experiment>/results/`` as
    AIToolbox does: ``results_hyperParams_hist_<experiment>_<timestamp>.p`` (a pickle of the results,
    hyperparameters, training history, ``y_true`` and ``y_predicted``) and ``plots/<metric>.png``.

    Runs on every process of a distributed run (predictions are gathered from all ranks); only rank 0 writes.
    With ``async_save`` (default) the final model is written in the background while the results are written;
    on_train_end returns once both are complete.
    """

    def __init__(self, project_name, experiment_name, local_model_result_folder_path, hyperparams,
                 val_result_package=None, test_result_package=None, cloud_save_mode='s3', bucket_name='model-result',
                 cloud_dir_prefix='', endpoint_url=None, async_save=True):
        super().__init__('Model save at the end of training', project_name, experiment_name,
                         local_model_result_folder_path, hyperparams, cloud_save_mode, bucket_name, cloud_dir_prefix,
                         endpoint_url, execution_order=101, device_idx_execution=None, async_save=async_save)
        if val_result_package is None and test_result_package is None:
            raise ValueError('ModelTrainEndSave: give val_result_package and/or test_result_package (both are None)')
        for name, package in (('val_result_package', val_result_package), ('test_result_package', test_result_package)):
            if package is not None and not callable(getattr(package, 'prepare_result_package', None)):
                raise TypeError(f'{name} must be a result package (AbstractResultPackage), got '
                                f'{type(package).__qualname__}')
        self.val_result_package = val_result_package
        self.test_result_package = test_result_package
        self.result_package: Any = None
        self.saved_files = []

    def on_train_loop_registration(self):
        super().on_train_loop_registration()
        self._set_package_paths()

    def _set_package_paths(self):
        for package in (self.val_result_package, self.test_result_package):
            if package is not None and hasattr(package, 'set_experiment_dir_path_for_additional_results'):
                package.set_experiment_dir_path_for_additional_results(
                    self.project_name, self.experiment_name, self.train_loop_obj.experiment_timestamp,
                    self.local_model_result_folder_path)

    def on_train_begin(self):
        # Checked when a fit starts, not at registration: a callback may still set the loaders (in each DDP
        # process), and AIToolbox registers this callback on loops without them.
        loop = self.train_loop_obj
        if self.val_result_package is not None and loop.validation_loader is None:
            raise ValueError('ModelTrainEndSave: val_result_package needs a validation_loader in the TrainLoop')
        if self.test_result_package is not None and loop.test_loader is None:
            raise ValueError('ModelTrainEndSave: test_result_package needs a test_loader in the TrainLoop')
        super().on_train_begin()
        # Claiming the cloud prefix at the start of fit may have moved the experiment to a free name (<ts>_1).
        self._set_package_paths()

    def on_train_end(self):
        loop = self.train_loop_obj
        if loop.interrupted:
            # Not the final model: the run continues from its checkpoint, and saves at its real end.
            logger.info('%s: training was interrupted (%s); the final model is saved when the run ends',
                        type(self).__name__, loop.interrupted)
            return
        packages = []
        # Suffixes are added to copies: AIToolbox appended '_VAL' to the user's package on every fit.
        for package, predict, loss, suffix in (
                (self.val_result_package, loop.predict_on_validation_set, loop.evaluate_loss_on_validation_set,
                 '_VAL'),
                (self.test_result_package, loop.predict_on_test_set, loop.evaluate_loss_on_test_set, '_TEST')):
            if package is None:
                continue
            y_pred, y_true, _ = predict()
            additional = {}
            if getattr(package, 'requires_loss', False):
                additional['loss'] = loss(float_dict_format=True)
            package.prepare_result_package(y_true, y_pred, hyperparameters=self.hyperparams,
                                           additional_results=additional)
            labelled = copy.copy(package)
            labelled.pkg_name = f'{package.pkg_name or type(package).__name__}{suffix}'
            packages.append(labelled)
        if len(packages) == 2:
            self.result_package = packages[1] + packages[0]
        else:
            self.result_package = packages[0]
        # FSDP: the whole model is gathered to rank 0 by every rank (a collective) for the single-file export.
        export = loop_state.build_checkpoint(loop, self.hyperparams) if distributed.is_fsdp_model(loop.model) else None
        if loop.is_main_process():
            self.saved_files = self._save_experiment(export)

    def _save_experiment(self, checkpoint=None):
        loop = self.train_loop_obj
        model_path = self._save_state(MODEL_DIR, self._model_file_name(), checkpoint=checkpoint)
        # AIToolbox's results files: the pickle (labels included) and plots/, then the packages' own files.
        saved = write_experiment_results(
            self.experiment.subdir(RESULTS_DIR), self.experiment_name, loop.experiment_timestamp,
            self.result_package, training_history=loop.train_history, save_true_pred_labels=True,
            temp_dir=self.experiment.temp_dir())
        # The final model was written in the background while the results were written: complete before fit ends.
        self.wait_for_pending_save()
        files = [model_path] + [path for _, path in saved if os.path.isfile(path)]
        if self.uploader is not None:
            for path in files[1:]:
                try:
                    self.uploader.upload_experiment_file(path)
                except ValueError:
                    logger.warning('%s is outside the experiment folder; not uploaded', path)
        return files
