"""The :class:`Experiment` of a run: the experiment folder (and cloud prefix) the run claims as its own, writes its
files into, and whose uploads it waits for at the end of fit; :func:`get_experiment` gives a loop its one
Experiment."""
import logging
import os
import shutil
import socket
import time
import uuid
from typing import Any, Dict, List, Optional

from ..storage.base import StorageError, UploadsIncompleteError, validate_key_part
from ..storage.journal import UploadJournal
from ..storage.local import remove_stray_temp_files, write_text_atomically
from ..storage.uploader import UploadFailure
from .hyperparams import copy_experiment_script, hyperparams_to_json, write_hyperparams_text, zip_source_dirs
from .stop_waiting import SignalsCutWaits, WaitCutShort
from .layout import (BEST_POINTER, CHECKPOINT_DIR, HYPERPARAMS_JSON, HYPERPARAMS_TXT, LATEST_POINTER, MODEL_DIR,
                     PENDING_UPLOADS, RESULTS_DIR, SOURCE_ZIP, absolute_folder, bookkeeping_dir)
from .uploads import BOOKKEEPING_DIR, MARKER_FILE, ExperimentUploader, sync_command

logger = logging.getLogger(__name__)

# What the experiment writes itself (its folder's files, its bookkeeping's): loop.experiment_files may not take these
# names.
_RESERVED_NAMES = {HYPERPARAMS_TXT, HYPERPARAMS_JSON, SOURCE_ZIP, CHECKPOINT_DIR, MODEL_DIR, RESULTS_DIR,
                   LATEST_POINTER, BEST_POINTER, PENDING_UPLOADS, BOOKKEEPING_DIR}


def _check_results_root(root):
    """Refuse a results root that is, or lies under, a file (before anything is created under it)."""
    existing = root
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise NotADirectoryError(
            f'local_model_result_folder_path={root!r}: {existing!r} is a file, not a folder; pass the folder that '
            f'experiment folders go into (it is created when missing)')


def run_owner_alive(experiment_dir):
    """Whether the process that claimed the experiment folder ``experiment_dir`` still runs: True or False when it
    ran on this machine, None when that cannot be told (another machine sharing the folder, a marker written by an
    earlier version, no marker)."""
    try:
        with open(os.path.join(bookkeeping_dir(experiment_dir), MARKER_FILE)) as f:
            lines = f.read().split('\n')
    except OSError:
        return None
    host, _, pid = (lines[1] if len(lines) > 1 else '').partition(' ')
    if host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:         # a process of another user has that pid now: not ours, but it cannot be told
        return None
    return True


class Experiment:
    """Where one run writes: ``<root>/<project>/<experiment>_<loop.experiment_timestamp>``.

    ``claim()`` makes the folder this run's own. Two runs started in the same second get the same
    timestamp; the second one to claim finds the folder claimed by the other (the ``run`` file of its bookkeeping
    folder) and moves to ``<ts>_1`` (``_2``, ...), updating ``loop.experiment_timestamp`` so every callback follows.
    With cloud uploads the experiment's prefix in the bucket (container) is claimed the same way when the uploads start (the
    start of fit): a claim object created only if absent, so runs on different machines never share a prefix, and
    the local folder takes the name claimed in the cloud.
    """

    def __init__(self, loop, project_name, experiment_name, local_model_result_folder_path):
        self.loop = loop
        self.project_name = validate_key_part(project_name, 'project_name')
        self.experiment_name = validate_key_part(experiment_name, 'experiment_name')
        self.root = absolute_folder(local_model_result_folder_path)
        self.run_id = uuid.uuid4().hex
        self.claimed = False
        # True once the run continues an existing experiment (resume): its folder and cloud prefix are taken over.
        self.continued = False
        self.uploaders = {}
        self._cloud_claims: List['ExperimentUploader'] = []
        self._base_timestamp = None
        self._journal: Optional[UploadJournal] = None
        self._reported_unfinished = None
        self._waits_cut_short = False     # a stop signal cut a wait for the uploads short: later ones do not wait
        self._files_written: Dict[str, str] = {}    # the loop's experiment_files as last written: {name: text}
        # The experiment folder whose hyperparams_list.txt this run saw complete (a saver calls save_hyperparams at
        # every save: the file-system check is made once).
        self._hyperparams_saved_in: Optional[str] = None

    @property
    def journal(self) -> UploadJournal:
        """The journal of unconfirmed uploads, ``pending_uploads.json`` in the bookkeeping folder, naming files
        relative to the experiment folder (it follows the folder when the claim renames it)."""
        if self._journal is None:
            self._journal = UploadJournal(os.path.join(self.work_dir, PENDING_UPLOADS), base_dir=self.dir_path)
        self._journal.path = os.path.join(self.work_dir, PENDING_UPLOADS)
        self._journal.base_dir_override = self.dir_path
        return self._journal

    @property
    def folder_name(self):
        return f'{self.experiment_name}_{self.loop.experiment_timestamp}'

    @property
    def dir_path(self):
        return os.path.join(self.root, self.project_name, self.folder_name)

    @property
    def work_dir(self):
        """Our bookkeeping folder of the experiment (see the module's docstring): the claim, the pointers, the
        upload journal, hyperparams.json and the temporary files of atomic writes. Nothing is created."""
        return bookkeeping_dir(self.dir_path)

    @property
    def key_prefix(self):
        """The experiment folder as a storage key (relative to the cloud prefix)."""
        return f'{self.project_name}/{self.folder_name}'

    def matches(self, project_name, experiment_name, local_model_result_folder_path):
        return (project_name, experiment_name, absolute_folder(local_model_result_folder_path)) == \
            (self.project_name, self.experiment_name, self.root)

    def adopt(self, experiment_timestamp):
        """Continue the experiment of a checkpoint: write to its folder again (resume). Temporary files a killed
        save left there are removed, and the uploads its journal lists are queued again."""
        validate_key_part(f'{self.experiment_name}_{experiment_timestamp}', 'experiment_timestamp')
        self.loop.experiment_timestamp = experiment_timestamp
        self.claimed = True
        self.continued = True
        os.makedirs(self.dir_path, exist_ok=True)
        os.makedirs(self.work_dir, exist_ok=True)
        self._write_marker(exclusive=False)
        self._remove_stray_temp_files()
        for uploader in self._cloud_claims:
            uploader.claim_prefix(self.key_prefix, self.run_id, exclusive=False)
            uploader.resume_pending()

    def _remove_stray_temp_files(self):
        # The bookkeeping folder holds the temporary files; the experiment folder is cleaned too, for the savers
        # without a TrainLoop (they write their temporary files beside their results).
        remove_stray_temp_files(self.work_dir)
        remove_stray_temp_files(self.dir_path)

    def claim(self):
        """Create the experiment folder for this run (once); returns its path. In a distributed run only rank 0
        writes, so only rank 0 creates the folder; no collective is involved, so any rank may call this at any
        time (a rank-0-only callback included)."""
        if not self.claimed:
            if self.loop.is_main_process():
                self._claim_here()
            self.claimed = True
        return self.dir_path

    def _claim_here(self):
        _check_results_root(self.root)
        base = self._base_timestamp = self.loop.experiment_timestamp
        suffix = 0
        while True:
            self.loop.experiment_timestamp = base if suffix == 0 else f'{base}_{suffix}'
            if self._claim_name(self._cloud_claims):
                break
            suffix += 1
        if suffix:
            logger.info('Experiment folder %s_%s was taken by another run; using %s', self.experiment_name, base,
                        self.dir_path)
        self._remove_stray_temp_files()

    def _claim_name(self, cloud_claims):
        """Claim the current name locally and in every bucket of ``cloud_claims``; on any refusal give back what
        was claimed here and return False."""
        os.makedirs(self.work_dir, exist_ok=True)
        fresh = self._write_marker(exclusive=True)
        if not fresh and self._read_marker() != self.run_id:
            return False
        os.makedirs(self.dir_path, exist_ok=True)
        done: List[Any] = []
        for uploader in cloud_claims:
            if not uploader.claim_prefix(self.key_prefix, self.run_id):
                for other in done:
                    other.release_prefix(self.key_prefix, self.run_id)
                if fresh:
                    self._release_local(self.dir_path)
                return False
            done.append(uploader)
        return True

    def _release_local(self, folder):
        work = bookkeeping_dir(folder)
        try:
            os.remove(os.path.join(work, MARKER_FILE))
        except OSError:
            pass
        for path in (work, folder, os.path.dirname(work), os.path.dirname(os.path.dirname(work))):
            try:
                os.rmdir(path)      # only when empty: what another run or the user put there stays
            except OSError:
                pass

    def discard_untrained(self) -> bool:
        """Remove the experiment folder of a run that failed before its first training step (a wrong argument, a
        callback's check): it holds only what the set-up wrote (hyperparameters, the claim), and a leftover folder
        per failed try would bury the real runs. Only a folder this run claimed itself, in this process, and not yet
        in a bucket; afterwards the next try claims a folder again. Returns True when it was removed."""
        if not self.claimed or self.continued or self._cloud_claims or not self.loop.is_main_process() \
                or self._read_marker() != self.run_id:
            return False
        shutil.rmtree(self.dir_path, ignore_errors=True)
        shutil.rmtree(self.work_dir, ignore_errors=True)
        self._release_local(self.dir_path)
        try:
            os.rmdir(os.path.dirname(self.dir_path))     # the project folder, when this run was its only one
        except OSError:
            pass
        self.claimed = False
        self._files_written = {}
        self._hyperparams_saved_in = None
        logger.info('Removed the experiment folder %s: the run failed before its first training step', self.dir_path)
        return True

    def add_cloud_claim(self, uploader):
        """Claim the experiment's prefix in ``uploader``'s bucket too (done when the uploader starts, at the start of
        fit).

        Before the folder is claimed, the claim waits for :meth:`claim`. A continued experiment takes its prefix
        over. Else, when another run holds the prefix of this name, the experiment moves to the next free name
        (``_1``, ``_2``, ... free locally and in every bucket), and the local folder moves with it, so the local
        folder and the cloud prefix always have the same name.
        """
        self._cloud_claims.append(uploader)
        try:
            self._add_cloud_claim(uploader)
        except BaseException:
            self._cloud_claims.remove(uploader)
            raise

    def _add_cloud_claim(self, uploader):
        if not self.claimed or not self.loop.is_main_process():
            return
        if self.continued:
            uploader.claim_prefix(self.key_prefix, self.run_id, exclusive=False)
            return
        if uploader.claim_prefix(self.key_prefix, self.run_id):
            return
        if any(u.uploader.unconfirmed() for u in self._cloud_claims):
            raise StorageError(f'the cloud prefix {uploader.storage.uri(self.key_prefix)} belongs to another run, and '
                               f'this run has already uploaded files under its name; give every uploader of a run '
                               f'the same experiment before training starts')
        old_dir, old_work, old_timestamp = self.dir_path, self.work_dir, self.loop.experiment_timestamp
        others = [u for u in self._cloud_claims if u is not uploader]
        base = self._base_timestamp or old_timestamp
        suffix = 0
        while True:
            suffix += 1
            self.loop.experiment_timestamp = f'{base}_{suffix}'
            if self.loop.experiment_timestamp != old_timestamp and self._claim_name(self._cloud_claims):
                break
        new_dir = self.dir_path
        # Move what this run already wrote (its claim aside) under the new name, then give the old name back.
        for source, target in ((old_dir, new_dir), (old_work, self.work_dir)):
            for name in os.listdir(source) if os.path.isdir(source) else ():
                if not (source == old_work and name == MARKER_FILE):
                    os.replace(os.path.join(source, name), os.path.join(target, name))
        self._release_local(old_dir)
        old_prefix = f'{self.project_name}/{self.experiment_name}_{old_timestamp}'
        for other in others:
            other.release_prefix(old_prefix, self.run_id)
        logger.info('The cloud prefix %s belongs to another run; this run uses %s (local folder %s)',
                    uploader.storage.uri(old_prefix), uploader.storage.uri(self.key_prefix), new_dir)

    def release_cloud_claims(self, uploaders=None):
        """Delete this run's claim objects in the buckets (of ``uploaders``; None: all) whose uploads are all
        confirmed (the end of fit): the bucket then holds only the experiment's files. The prefix stays taken for
        other runs by those files."""
        if not self.claimed or not self.loop.is_main_process():
            return
        for uploader in self._cloud_claims:
            if uploaders is not None and uploader not in uploaders:
                continue
            if uploader.uploader.unconfirmed():
                continue        # the claim stays until its uploads are in the bucket (a later run or the sync)
            try:
                uploader.release_prefix(self.key_prefix, self.run_id)
            except Exception as error:
                logger.warning('Could not delete the claim %s of this run (%s: %s); it is safe to delete',
                               uploader.storage.uri(uploader.claim_key(self.key_prefix)), type(error).__name__,
                               error)

    def _write_marker(self, exclusive):
        path = os.path.join(self.work_dir, MARKER_FILE)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
        try:
            fd = os.open(path, flags, 0o666)
        except FileExistsError:
            return False
        with os.fdopen(fd, 'w') as f:
            # The owner's machine and process after the id: a later start can tell that a run died (run_owner_alive).
            f.write(f'{self.run_id}\n{socket.gethostname()} {os.getpid()}\n')
        return True

    def _read_marker(self):
        path = os.path.join(self.work_dir, MARKER_FILE)
        try:
            with open(path) as f:
                return f.readline().strip()
        except OSError:
            return None

    def wait_for_uploads(self, after_exception=False):
        """Wait for the pending uploads of every uploader, ``ExperimentUploader.wait_timeout_s`` seconds at most
        in all (``exception_wait_timeout_s`` when fit is failing), and return the uploads that are not in the
        storage: those that failed, and those still pending at the time limit. The loop calls this at the end of
        fit.

        What is not uploaded is logged once, in one message that lists the files and gives the command that
        uploads them later (:func:`sync_command`); the uploads still pending go on in the background while the
        process lives, and the journal keeps them for a later process. With
        ``ExperimentUploader.upload_failure = 'raise'`` an :class:`UploadsIncompleteError` is raised after the
        message (not while fit is already failing). The claim objects of the buckets whose uploads are all
        confirmed are deleted (:meth:`release_cloud_claims`).
        """
        signals = SignalsCutWaits()
        try:
            with signals.installed():
                return self._wait_for_uploads(after_exception, signals)
        finally:
            self.release_cloud_claims()
            signals.redeliver()     # the process ends as the signal asks, once what is not uploaded is reported

    def _wait_for_uploads(self, after_exception, signals):
        for u in self.uploaders.values():
            if not u.started and u.held_count and not after_exception:
                logger.warning('%d file(s) of %s are not uploaded to %s: the uploads were never started (they start '
                               'at the start of fit); upload them with a fit into this experiment', u.held_count,
                               self.dir_path, u.storage.uri(self.key_prefix))
        uploaders = [u for u in self.uploaders.values() if u.started]
        if not uploaders:
            return []
        limit = max(u.wait_timeout_s for u in uploaders)
        if after_exception:
            limit = min(limit, max(u.exception_wait_timeout_s for u in uploaders))
        if self._waits_cut_short:
            limit = 0.0         # a stop signal already cut this process's wait short
        deadline = time.monotonic() + limit
        failures = []
        try:
            with signals.waiting():
                for uploader in uploaders:
                    pending = uploader.pending_count
                    if pending:
                        logger.info('Waiting for %d upload(s) to %s to finish (at most %.0f s)', pending,
                                    uploader.storage.uri(self.key_prefix), max(deadline - time.monotonic(), 0.0))
                    failures += uploader.uploader.wait(deadline - time.monotonic())
        except WaitCutShort as cut:
            self._waits_cut_short = True
            logger.warning('%s: stopped waiting for the uploads of %s', cut, self.dir_path)
        unfinished = [(u, job) for u in uploaders for job in u.uploader.unconfirmed()]
        unfinished_ids = {job.id for _, job in unfinished}
        failed_ids = {f.job_id for u in uploaders for f in u.uploader.failures}
        for u, job in unfinished:
            if job.id not in failed_ids:       # still queued or being retried
                failures.append(UploadFailure(key=job.key, local_path=job.local_path, attempts=0,
                                              error=f'not uploaded within {limit:.0f} s (still queued'
                                                    f'{"; last error: " + job.last_error if job.last_error else ""})',
                                              latest_pointer_key=job.latest_pointer_key, job_id=job.id))
        lost = [f for f in failures if f.job_id not in unfinished_ids]
        if not unfinished and not lost:
            return failures
        signature = frozenset((job.id for _, job in unfinished))
        if after_exception and signature == self._reported_unfinished:
            return []       # already reported (and raised) by the wait this one follows
        self._reported_unfinished = signature
        lines = [f'  {os.path.relpath(job.local_path, self.dir_path)} -> {u.storage.uri(job.key)}'
                 f'{" (" + job.last_error + ")" if job.last_error else ""}' for u, job in unfinished]
        waited = 'a stop signal cut the wait short' if self._waits_cut_short else \
            f'after waiting {limit:.0f} s (ExperimentUploader.wait_timeout_s)'
        message = (f'{len(unfinished)} file(s) of the experiment {self.dir_path} are not in the cloud yet, {waited}:\n'
                   + '\n'.join(lines))
        command = sync_command(self.dir_path)
        if unfinished:
            message += (f'\nThe local files are complete and kept, and {self.journal.path} lists them. Upload them '
                        f'later with:\n    {command}\n(a run resumed into this experiment uploads them too).')
        if lost:
            message += '\nNot uploaded and cannot be any more (the local file is gone):\n' + '\n'.join(
                f'  {f.local_path} -> {f.key} ({f.error})' for f in lost)
        logger.error(message)
        option = max((u.upload_failure for u in uploaders), key=lambda o: o == 'raise')
        if option == 'raise' and not after_exception:
            raise UploadsIncompleteError(message, [job.local_path for _, job in unfinished] +
                                         [f.local_path for f in lost], command)
        return failures

    # ---- files of the experiment --------------------------------------------------------------

    def subdir(self, name):
        path = os.path.join(self.claim(), name)
        os.makedirs(path, exist_ok=True)
        return path

    def temp_dir(self):
        """Where the atomic writes into the experiment folder put their temporary files: the bookkeeping folder
        (created here), so that a write never shows in the experiment folder before it is complete, and a killed
        one leaves nothing there. When the project folder is on another filesystem (a mount, a symbolic link) the
        rename could not be atomic from there: the experiment folder itself then."""
        folder = self.claim()
        os.makedirs(self.work_dir, exist_ok=True)
        try:
            same_filesystem = os.stat(self.work_dir).st_dev == os.stat(folder).st_dev
        except OSError:
            same_filesystem = False
        return self.work_dir if same_filesystem else folder

    def save_hyperparams(self, hyperparams, uploader=None):
        """Write hyperparams_list.txt, copy the experiment script and zip the source folders (AIToolbox's files),
        and hyperparams.json into the bookkeeping folder, once per experiment folder (a resumed run keeps the
        original files). The loop's ``experiment_files`` are written too, whenever their text changed (see
        :meth:`save_experiment_files`). Returns the paths written into the experiment folder."""
        folder = self.claim()
        written = self.save_experiment_files(uploader)
        txt_path = os.path.join(folder, HYPERPARAMS_TXT)
        if self._hyperparams_saved_in == folder or os.path.exists(txt_path):
            self._hyperparams_saved_in = folder
            return written
        hyperparams = hyperparams if hyperparams is not None else {}
        upload_from = len(written)
        temp_dir = self.temp_dir()
        write_text_atomically(os.path.join(self.work_dir, HYPERPARAMS_JSON), hyperparams_to_json(hyperparams))

        script = hyperparams.get('experiment_file_path') if isinstance(hyperparams, dict) else None
        if script:
            target = copy_experiment_script(folder, hyperparams, temp_dir=temp_dir)
            if target is not None:
                written.append(target)
        source_dirs = hyperparams.get('source_dirs_paths') if isinstance(hyperparams, dict) else None
        if source_dirs:
            zip_path = os.path.join(folder, SOURCE_ZIP)
            zip_source_dirs(source_dirs, zip_path, temp_dir=temp_dir)
            written.append(zip_path)
        # Written last: its presence means the set is complete.
        write_hyperparams_text(txt_path, hyperparams, temp_dir=temp_dir)
        written.append(txt_path)
        self._hyperparams_saved_in = folder
        if uploader is not None:
            for path in written[upload_from:]:
                uploader.upload_at_start(path)
        return written

    def save_experiment_files(self, uploader=None):
        """Write the loop's ``experiment_files`` ({file name: text}, e.g. the recipe command line's ``recipe.yaml``
        and ``command_line.txt``) atomically at the root of the experiment folder and queue their upload; a file
        whose text is already there is left alone, so a resumed run rewrites only what changed. Returns the paths
        written."""
        files = getattr(self.loop, 'experiment_files', None) or {}
        written = []
        for name, text in files.items():
            validate_key_part(name, 'experiment_files name')
            if name in _RESERVED_NAMES:
                raise ValueError(f'loop.experiment_files: {name!r} is a file the experiment writes itself; give the '
                                 f'file another name')
            if not isinstance(text, str):
                raise TypeError(f'loop.experiment_files[{name!r}] must be text (str), got {type(text).__qualname__}')
            if self._files_written.get(name) == text:
                continue
            path = os.path.join(self.claim(), name)
            try:
                with open(path, encoding='utf-8') as f:
                    unchanged = f.read() == text
            except OSError:
                unchanged = False
            if not unchanged:
                write_text_atomically(path, text, temp_dir=self.temp_dir())
                written.append(path)
                if uploader is not None:
                    uploader.upload_at_start(path)
            self._files_written[name] = text
        return written


def get_experiment(loop, project_name=None, experiment_name=None, local_model_result_folder_path=None):
    """The loop's Experiment, created from the given names (or the tracking loop's) on first use."""
    experiment = loop.experiment
    project_name = project_name if project_name is not None else getattr(loop, 'project_name', None)
    experiment_name = experiment_name if experiment_name is not None else getattr(loop, 'experiment_name', None)
    folder = local_model_result_folder_path if local_model_result_folder_path is not None else \
        getattr(loop, 'local_model_result_folder_path', None)
    if experiment is not None:
        if None in (project_name, experiment_name, folder) or \
                experiment.matches(project_name, experiment_name, folder):
            return experiment
        raise ValueError(f'two saving callbacks on one TrainLoop name different experiments: '
                         f'{experiment.project_name}/{experiment.experiment_name} in {experiment.root} and '
                         f'{project_name}/{experiment_name} in {folder}; give them the same project_name, '
                         f'experiment_name and local_model_result_folder_path')
    if None in (project_name, experiment_name, folder):
        return None
    experiment = Experiment(loop, project_name, experiment_name, folder)
    loop.experiment = experiment
    return experiment

