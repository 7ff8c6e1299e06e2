"""The experiment folder of a run: its id, the hyperparameter / source files, and the cloud uploader.

Local layout (the same keys in the cloud, under ``<cloud_dir_prefix>/``), as in AIToolbox::

    <local folder>/<project>/<experiment>_<timestamp>/
        checkpoint_model/   model/   results/          only the files AIToolbox writes there
        hyperparams_list.txt   <script>.py   source_code.zip
        hyperparams.json   latest_checkpoint.txt   best_checkpoint.txt   .aitoolbox_like_run     ours
        pending_uploads.json                           ours, only while uploads are unconfirmed

Our own bookkeeping stays at the root, so a script that lists ``checkpoint_model/``, ``model/`` or
``results/`` and loads every file finds only saved models and results; temporary files of atomic writes
are created at the root too, so a crash mid-write leaves nothing partial inside those folders.

One :class:`Experiment` per TrainLoop (``loop.experiment``) so every callback writes to the same folder.
"""
import json
import logging
import os
import shlex
import shutil
import sys
import time
import uuid
import zipfile
from typing import Any, Dict, List, Optional

from ..storage.base import (StorageError, StorageUnreachableError, UploadsIncompleteError, join_key, validate_key,
                            validate_key_part)
from ..storage.journal import JOURNAL_NAME, SyncReport, UploadJournal, sync_journal
from ..storage.local import remove_stray_temp_files, write_atomically, write_text_atomically
from ..storage.uploader import UploadFailure, is_retryable

logger = logging.getLogger(__name__)

S3_SAVE_MODES = ('s3', 'aws_s3', 'aws')
GCS_SAVE_MODES = ('gcs', 'google_storage', 'google storage')
LOCAL_SAVE_MODES = ('local', None, False, '')
MARKER_FILE = '.aitoolbox_like_run'
# The journal of uploads not confirmed yet (storage.journal); the sync command uploads what it lists.
PENDING_UPLOADS = JOURNAL_NAME
ACCESS_CHECK_PREFIX = '.aitoolbox_like_access_check'
HYPERPARAMS_TXT = 'hyperparams_list.txt'
HYPERPARAMS_JSON = 'hyperparams.json'
SOURCE_ZIP = 'source_code.zip'
CHECKPOINT_DIR = 'checkpoint_model'
MODEL_DIR = 'model'
RESULTS_DIR = 'results'
# Root files naming a checkpoint by its path inside the experiment folder ('checkpoint_model/<file>').
LATEST_POINTER = 'latest_checkpoint.txt'
BEST_POINTER = 'best_checkpoint.txt'
# Where versions before the root pointers kept them (content: the bare file name, or a full cloud key).
LEGACY_LATEST_POINTER = 'latest'
# What the experiment writes itself: loop.experiment_files may not take these names.
_RESERVED_NAMES = {HYPERPARAMS_TXT, HYPERPARAMS_JSON, SOURCE_ZIP, CHECKPOINT_DIR, MODEL_DIR, RESULTS_DIR,
                   LATEST_POINTER, BEST_POINTER, MARKER_FILE, PENDING_UPLOADS}
_SKIP_DIRS = {'__pycache__', '.git', '.hg', '.svn', '.ipynb_checkpoints', '.venv', 'venv', '.mypy_cache',
              '.pytest_cache'}


def normalize_cloud_save_mode(cloud_save_mode):
    """'s3' for every AIToolbox S3 alias, 'local' for local-only; Google Cloud Storage is refused."""
    if cloud_save_mode in LOCAL_SAVE_MODES:
        return 'local'
    if isinstance(cloud_save_mode, str) and cloud_save_mode.lower() in S3_SAVE_MODES:
        return 's3'
    if isinstance(cloud_save_mode, str) and cloud_save_mode.lower() in GCS_SAVE_MODES:
        raise ValueError(f'cloud_save_mode={cloud_save_mode!r}: Google Cloud Storage is not supported; use '
                         f"cloud_save_mode='s3' (any S3-compatible endpoint) or 'local'")
    raise ValueError(f"cloud_save_mode must be 's3' (or 'aws_s3' / 'aws') or 'local', got {cloud_save_mode!r}")


def _abs_folder(path):
    return os.path.abspath(os.path.expanduser(os.fspath(path)))


def is_s3_mode(cloud_save_mode):
    """True when files go to S3 (any of AIToolbox's S3 aliases); False for the local-only modes."""
    return normalize_cloud_save_mode(cloud_save_mode) == 's3'


def hyperparams_to_json(hyperparams):
    """JSON text of the hyperparameters; values JSON cannot hold are written as their repr."""
    return json.dumps(hyperparams if hyperparams is not None else {}, default=repr, sort_keys=False, indent=2)


def model_file_name(experiment_name, experiment_timestamp, epoch=None, iteration_idx=None):
    """``model_<experiment>_<timestamp>[_E<epoch>[_ITER<idx>]].pth``: AIToolbox's saved model / checkpoint names."""
    name = f'model_{experiment_name}_{experiment_timestamp}'
    if epoch is not None:
        name += f'_E{epoch}'
        if iteration_idx is not None:
            name += f'_ITER{iteration_idx}'
    return name + '.pth'


def pointer_text(experiment_dir, target_path):
    """How a pointer names ``target_path``: its '/'-separated path inside the experiment folder."""
    rel = os.path.relpath(os.path.abspath(target_path), os.path.abspath(experiment_dir)).replace(os.sep, '/')
    validate_key(rel, 'pointer target')      # refuses a target outside the experiment folder ('..')
    return rel


def write_pointer(experiment_dir, pointer_name, target_path):
    """Atomically (re)write the root file ``pointer_name`` to name ``target_path``; returns the pointer's path.

    Call it only once the target file is complete: a reader following a pointer must find a whole file.
    """
    path = os.path.join(experiment_dir, pointer_name)
    write_text_atomically(path, pointer_text(experiment_dir, target_path))
    return path


def read_pointer(experiment_dir, pointer_name=LATEST_POINTER):
    """The existing file the pointer ``pointer_name`` of an experiment folder names, or None.

    Folders saved before the pointers moved to the root (``checkpoint_model/latest``) are read too.
    """
    target = None
    try:
        with open(os.path.join(experiment_dir, pointer_name), encoding='utf-8') as f:
            text = f.read().strip()
        validate_key(text, 'pointer target')
        target = os.path.join(experiment_dir, *text.split('/'))
    except (OSError, ValueError):
        if pointer_name == LATEST_POINTER:
            try:
                with open(os.path.join(experiment_dir, CHECKPOINT_DIR, LEGACY_LATEST_POINTER), encoding='utf-8') as f:
                    name = f.read().strip().rsplit('/', 1)[-1]
            except OSError:
                name = ''
            if name and name not in ('.', '..'):
                target = os.path.join(experiment_dir, CHECKPOINT_DIR, name)
    return target if target is not None and os.path.isfile(target) else None


def write_hyperparams_text(path, hyperparams, sort_names=False):
    """``hyperparams_list.txt``: one ``name:<TAB>value`` line per hyperparameter (AIToolbox's format)."""
    names = sorted(hyperparams) if sort_names else list(hyperparams)
    write_text_atomically(path, ''.join(f'{name}:\t{hyperparams[name]}\n' for name in names))
    return path


def copy_experiment_script(folder, hyperparams):
    """Copy ``hyperparams['experiment_file_path']`` (the training script) into ``folder``; its new path, or None
    (with a warning saying why) when there is nothing to copy."""
    script = hyperparams.get('experiment_file_path') if isinstance(hyperparams, dict) else None
    if not script:
        logger.warning("hyperparams has no 'experiment_file_path'; the experiment script was not copied into %s "
                       "(set hyperparams['experiment_file_path'] to the training script, e.g. in a notebook)", folder)
        return None
    if not os.path.isfile(script):
        logger.warning("hyperparams['experiment_file_path'] = %r is not a file; the experiment script was not "
                       'copied into the experiment folder', script)
        return None
    target = os.path.join(folder, os.path.basename(script))
    with open(script, 'rb') as src:
        write_atomically(target, lambda dst: shutil.copyfileobj(src, dst))
    return target


def sync_command(folder):
    """The shell command that uploads what the journal of the experiment folder ``folder`` lists."""
    return f'{shlex.quote(os.path.basename(sys.executable) or "python")} -m aitoolbox_like.experiment.sync ' \
           f'{shlex.quote(os.fspath(folder))}'


def sync_experiment(folder, endpoint_url: Optional[str] = None) -> SyncReport:
    """Upload the files the experiment folder's ``pending_uploads.json`` lists (uploads a run queued but could
    not confirm: S3 was down when it ended, or it was killed), to the bucket / prefix / key each entry records.

    ``endpoint_url`` replaces the recorded S3 endpoint. Uploads that fail stay listed (run it again later); the
    command line ``python -m aitoolbox_like.experiment.sync FOLDER`` does the same. Do not run it while a run is
    still training into the folder (that run uploads its own files; both would upload them).
    """
    return sync_journal(_abs_folder(folder), endpoint_url=endpoint_url)


class Experiment:
    """Where one run writes: ``<root>/<project>/<experiment>_<loop.experiment_timestamp>``.

    ``claim()`` makes the folder this run's own. Two runs started in the same second get the same
    timestamp; the second one to claim finds the folder marked by the other and moves to ``<ts>_1``
    (``_2``, ...), updating ``loop.experiment_timestamp`` so every callback follows. With S3 uploads the
    experiment's prefix in the bucket is claimed the same way (a marker object created only if absent), so
    runs on different machines never share a prefix, and the local folder takes the name claimed in S3.
    """

    def __init__(self, loop, project_name, experiment_name, local_model_result_folder_path):
        self.loop = loop
        self.project_name = validate_key_part(project_name, 'project_name')
        self.experiment_name = validate_key_part(experiment_name, 'experiment_name')
        self.root = _abs_folder(local_model_result_folder_path)
        self.run_id = uuid.uuid4().hex
        self.claimed = False
        # True once the run continues an existing experiment (resume): its folder and S3 prefix are taken over.
        self.continued = False
        self.uploaders = {}
        self._cloud_claims: List['ExperimentUploader'] = []
        self._base_timestamp = None
        self._journal: Optional[UploadJournal] = None
        self._reported_unfinished = None
        self._files_written: Dict[str, str] = {}    # the loop's experiment_files as last written: {name: text}

    @property
    def journal(self) -> UploadJournal:
        """The journal of unconfirmed uploads, ``<experiment folder>/pending_uploads.json`` (follows the folder)."""
        path = os.path.join(self.dir_path, PENDING_UPLOADS)
        if self._journal is None:
            self._journal = UploadJournal(path)
        self._journal.path = path
        return self._journal

    @property
    def folder_name(self):
        return f'{self.experiment_name}_{self.loop.experiment_timestamp}'

    @property
    def dir_path(self):
        return os.path.join(self.root, self.project_name, self.folder_name)

    @property
    def key_prefix(self):
        """The experiment folder as a storage key (relative to the cloud prefix)."""
        return f'{self.project_name}/{self.folder_name}'

    def matches(self, project_name, experiment_name, local_model_result_folder_path):
        return (project_name, experiment_name, _abs_folder(local_model_result_folder_path)) == \
            (self.project_name, self.experiment_name, self.root)

    def adopt(self, experiment_timestamp):
        """Continue the experiment of a checkpoint: write to its folder again (resume). Temporary files a killed
        save left there are removed, and the uploads its journal lists are queued again."""
        validate_key_part(f'{self.experiment_name}_{experiment_timestamp}', 'experiment_timestamp')
        self.loop.experiment_timestamp = experiment_timestamp
        self.claimed = True
        self.continued = True
        os.makedirs(self.dir_path, exist_ok=True)
        self._write_marker(exclusive=False)
        self._follow_name()
        remove_stray_temp_files(self.dir_path)
        for uploader in self._cloud_claims:
            uploader.claim_prefix(self.key_prefix, self.run_id, exclusive=False)
            uploader.resume_pending()

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
        self._follow_name()
        remove_stray_temp_files(self.dir_path)

    def _follow_name(self):
        # The journal lives in the experiment folder, whose name the claim may have changed.
        if self._journal is not None:
            self._journal.path = os.path.join(self.dir_path, PENDING_UPLOADS)

    def _claim_name(self, cloud_claims):
        """Claim the current name locally and in every bucket of ``cloud_claims``; on any refusal give back what
        was claimed here and return False."""
        os.makedirs(self.dir_path, exist_ok=True)
        fresh = self._write_marker(exclusive=True)
        if not fresh and self._read_marker() != self.run_id:
            return False
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
        try:
            os.remove(os.path.join(folder, MARKER_FILE))
            os.rmdir(folder)
        except OSError:
            pass

    def add_cloud_claim(self, uploader):
        """Claim the experiment's prefix in ``uploader``'s bucket too (done by the uploader when it is created).

        Before the folder is claimed, the claim waits for :meth:`claim`. A continued experiment takes its prefix
        over. Else, when another run holds the prefix of this name, the experiment moves to the next free name
        (``_1``, ``_2``, ... free locally and in every bucket), and the local folder moves with it, so the local
        folder and the S3 prefix always have the same name.
        """
        self._cloud_claims.append(uploader)
        if not self.claimed or not self.loop.is_main_process():
            return
        if self.continued:
            uploader.claim_prefix(self.key_prefix, self.run_id, exclusive=False)
            return
        if uploader.claim_prefix(self.key_prefix, self.run_id):
            return
        if any(u.uploader.unconfirmed() for u in self._cloud_claims):
            raise StorageError(f'the S3 prefix {uploader.storage.uri(self.key_prefix)} belongs to another run, and '
                               f'this run has already uploaded files under its name; give every uploader of a run '
                               f'the same experiment before training starts')
        old_dir, old_timestamp = self.dir_path, self.loop.experiment_timestamp
        others = [u for u in self._cloud_claims if u is not uploader]
        base = self._base_timestamp or old_timestamp
        suffix = 0
        while True:
            suffix += 1
            self.loop.experiment_timestamp = f'{base}_{suffix}'
            if self.loop.experiment_timestamp != old_timestamp and self._claim_name(self._cloud_claims):
                break
        new_dir = self.dir_path
        # Move what this run already wrote (its marker aside) into the new folder, then give the old name back.
        for name in os.listdir(old_dir):
            if name != MARKER_FILE:
                os.replace(os.path.join(old_dir, name), os.path.join(new_dir, name))
        self._release_local(old_dir)
        self._follow_name()
        old_prefix = f'{self.project_name}/{self.experiment_name}_{old_timestamp}'
        for other in others:
            other.release_prefix(old_prefix, self.run_id)
        logger.info('The S3 prefix %s belongs to another run; this run uses %s (local folder %s)',
                    uploader.storage.uri(old_prefix), uploader.storage.uri(self.key_prefix), new_dir)

    def _write_marker(self, exclusive):
        path = os.path.join(self.dir_path, MARKER_FILE)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
        try:
            fd = os.open(path, flags, 0o666)
        except FileExistsError:
            return False
        with os.fdopen(fd, 'w') as f:
            f.write(self.run_id)
        return True

    def _read_marker(self):
        try:
            with open(os.path.join(self.dir_path, MARKER_FILE)) as f:
                return f.read().strip()
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
        message (not while fit is already failing).
        """
        uploaders = list(self.uploaders.values())
        if not uploaders:
            return []
        limit = max(u.wait_timeout_s for u in uploaders)
        if after_exception:
            limit = min(limit, max(u.exception_wait_timeout_s for u in uploaders))
        deadline = time.monotonic() + limit
        failures = []
        for uploader in uploaders:
            pending = uploader.pending_count
            if pending:
                logger.info('Waiting for %d upload(s) to %s to finish (at most %.0f s)', pending,
                            uploader.storage.uri(self.key_prefix), max(deadline - time.monotonic(), 0.0))
            failures += uploader.uploader.wait(deadline - time.monotonic())
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
        message = (f'{len(unfinished)} file(s) of the experiment {self.dir_path} are not in S3 yet after waiting '
                   f'{limit:.0f} s (ExperimentUploader.wait_timeout_s):\n' + '\n'.join(lines))
        command = sync_command(self.dir_path)
        if unfinished:
            message += (f'\nThe local files are complete and kept, and {PENDING_UPLOADS} in the experiment folder '
                        f'lists them. Upload them later with:\n    {command}\n(a run resumed into this experiment '
                        f'uploads them too).')
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

    def save_hyperparams(self, hyperparams, uploader=None):
        """Write hyperparams_list.txt and hyperparams.json, copy the experiment script and zip the source
        folders, once per experiment folder (a resumed run keeps the original files). The loop's
        ``experiment_files`` are written too, whenever their text changed (see :meth:`save_experiment_files`)."""
        folder = self.claim()
        written = self.save_experiment_files(uploader)
        txt_path = os.path.join(folder, HYPERPARAMS_TXT)
        if os.path.exists(txt_path):
            return written
        hyperparams = hyperparams if hyperparams is not None else {}
        upload_from = len(written)
        json_path = os.path.join(folder, HYPERPARAMS_JSON)
        write_text_atomically(json_path, hyperparams_to_json(hyperparams))
        written.append(json_path)

        script = hyperparams.get('experiment_file_path') if isinstance(hyperparams, dict) else None
        if script:
            target = copy_experiment_script(folder, hyperparams)
            if target is not None:
                written.append(target)
        source_dirs = hyperparams.get('source_dirs_paths') if isinstance(hyperparams, dict) else None
        if source_dirs:
            zip_path = os.path.join(folder, SOURCE_ZIP)
            zip_source_dirs(source_dirs, zip_path)
            written.append(zip_path)
        # Written last: its presence means the set is complete.
        write_hyperparams_text(txt_path, hyperparams)
        written.append(txt_path)
        if uploader is not None:
            for path in written[upload_from:]:
                uploader.upload_experiment_file(path)
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
                write_text_atomically(path, text)
                written.append(path)
                if uploader is not None:
                    uploader.upload_experiment_file(path)
            self._files_written[name] = text
        return written


def zip_source_dirs(source_dirs, zip_path):
    """Zip the given folders (each under its own name), skipping caches and VCS folders."""
    if isinstance(source_dirs, (str, os.PathLike)):
        source_dirs = [source_dirs]

    def write(f):
        with zipfile.ZipFile(f, 'w', zipfile.ZIP_DEFLATED) as archive:
            for source in source_dirs:
                source = os.path.abspath(os.path.expanduser(os.fspath(source)))
                if not os.path.isdir(source):
                    logger.warning('source_dirs: %s is not a folder; not added to %s', source, SOURCE_ZIP)
                    continue
                parent = os.path.dirname(source)
                for dirpath, dirnames, filenames in os.walk(source):
                    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
                    for filename in sorted(filenames):
                        path = os.path.join(dirpath, filename)
                        archive.write(path, os.path.relpath(path, parent))

    write_atomically(zip_path, write, make_parents=False)
    return zip_path


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


# ---------------------------------------------------------------------------------------------- uploads


class ExperimentUploader:
    """Uploads files of the local experiment folder to the same relative keys in the cloud experiment folder,
    in a background thread (training does not wait). Set on the loop as ``loop.experiment_uploader``.

    At creation (the start of fit) it checks the bucket (HeadBucket), that it may write and delete under the
    experiment's prefix, and claims the prefix for this run (see :meth:`Experiment.add_cloud_claim`); an
    unreachable endpoint is a :class:`StorageUnreachableError`, a missing bucket or refused credentials a
    :class:`StorageError` / :class:`StorageAuthError`, before any training.

    Nothing is lost, nothing is silent: every upload is recorded in the experiment's ``pending_uploads.json``
    until the storage confirmed it; network errors are retried (backoff up to ``max_backoff_s``) for as long as
    the process lives; a file the run deletes (``rm_subopt_local_models``) is deleted only after its upload is
    confirmed (:meth:`remove_local_file`); what is still unconfirmed when fit ends is reported once, with the
    command that uploads it later (see :meth:`Experiment.wait_for_uploads`).

    Class attributes (set them on the class, before fit):
        storage_options: passed to S3Storage (tests shorten botocore's retries).
        uploader_options: passed to BackgroundUploader (``max_retries`` None by default: retry until confirmed).
        wait_timeout_s: how long the end of fit waits for the pending uploads, in all (10 min).
        exception_wait_timeout_s: the same when fit is failing with an exception (2 min).
        upload_failure: 'warn' (default): log the uploads not confirmed at the end of fit; 'raise': also raise
            UploadsIncompleteError from fit.
    """

    storage_options: Dict[str, Any] = {}
    uploader_options: Dict[str, Any] = {}
    wait_timeout_s = 600.0
    exception_wait_timeout_s = 120.0
    upload_failure = 'warn'

    def __init__(self, experiment, bucket_name, cloud_dir_prefix='', endpoint_url=None, storage=None):
        from ..storage import BackgroundUploader
        if self.upload_failure not in ('warn', 'raise'):
            raise ValueError(f"ExperimentUploader.upload_failure must be 'warn' or 'raise', got "
                             f'{self.upload_failure!r}')
        self.experiment = experiment
        if storage is None:
            from ..storage.s3 import S3Storage
            storage = S3Storage(bucket_name, cloud_dir_prefix or '', endpoint_url=endpoint_url,
                                **self.storage_options)
        self.storage = storage
        self.bucket_name = bucket_name
        self.cloud_dir_prefix = cloud_dir_prefix or ''
        self._check_access()
        options = {'max_retries': None, 'max_queue_size': None, **self.uploader_options}
        self.uploader = BackgroundUploader(storage, journal=experiment.journal, **options)
        try:
            self._checked(lambda: experiment.add_cloud_claim(self))
        except BaseException:
            self.uploader.close(timeout=0)
            raise
        if experiment.claimed and experiment.continued:
            self.resume_pending()

    def _endpoint(self):
        return getattr(self.storage, 'endpoint_url', None) or self.storage.uri('')

    def _checked(self, operation):
        """Run a start-of-fit storage operation; our errors get the hint about cloud_save_mode='local', network
        errors become a StorageUnreachableError naming the endpoint."""
        try:
            return operation()
        except StorageError as error:
            raise type(error)(f"{error} (cloud_save_mode='s3' uploads the experiment to S3; pass "
                              f"cloud_save_mode='local' to keep it only on this machine)") from None
        except Exception as error:
            if not is_retryable(error):
                raise
            raise StorageUnreachableError(
                f'Cannot reach the S3 endpoint {self._endpoint()} (bucket {self.bucket_name!r}): '
                f'{type(error).__name__}: {error}. Check endpoint_url (or AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL) and '
                f"that this machine can reach the server, or pass cloud_save_mode='local' to keep the experiment "
                f'only on this machine.') from None

    def _check_access(self):
        # Fail at the start of fit, not after the first epoch: a wrong key, a missing bucket or an unreachable
        # endpoint shows here. HeadBucket: the bucket itself (a HeadObject 404 cannot tell "no such key" from
        # "no such bucket"); then a put and a delete under the experiment's prefix: the permissions uploads need.
        check_bucket = getattr(self.storage, 'check_bucket', None)
        if check_bucket is not None:
            self._checked(check_bucket)
        probe = join_key(self.experiment.key_prefix, f'{ACCESS_CHECK_PREFIX}.{self.experiment.run_id}')
        self._checked(lambda: self.storage.write_text(probe, 'access check of aitoolbox_like; safe to delete'))
        self._checked(lambda: self.storage.delete(probe))

    # ---- the experiment's prefix in the bucket --------------------------------------------------------

    def claim_prefix(self, key_prefix, run_id, exclusive=True):
        """Make ``key_prefix`` (an experiment folder as a key) this run's in the bucket: create its marker object
        holding ``run_id`` only if absent (``exclusive``; then read back), or overwrite it (a continued run).
        True if the prefix is ours. A prefix holding objects but no marker (a run of an older version, or of
        AIToolbox) counts as taken."""
        marker = join_key(key_prefix, MARKER_FILE)
        if not exclusive:
            self.storage.write_text(marker, run_id)
            return True
        try:
            if self.storage.read_text(marker).strip() == run_id:
                return True
            return False
        except FileNotFoundError:
            pass
        if any(not key.rsplit('/', 1)[-1].startswith(ACCESS_CHECK_PREFIX)
               for key in self.storage.list(key_prefix + '/')):
            return False
        if not self.storage.create_exclusive(marker, run_id):
            try:
                return self.storage.read_text(marker).strip() == run_id
            except FileNotFoundError:
                return False
        # Read back: a server that ignores If-None-Match lets every writer "create" the marker; the last wins.
        return self.storage.read_text(marker).strip() == run_id

    def release_prefix(self, key_prefix, run_id):
        """Give ``key_prefix`` back (delete its marker) if this run holds it."""
        marker = join_key(key_prefix, MARKER_FILE)
        try:
            if self.storage.read_text(marker).strip() == run_id:
                self.storage.delete(marker)
        except FileNotFoundError:
            pass

    def resume_pending(self):
        """Queue again the uploads of this bucket / prefix / endpoint that the experiment's journal lists (a
        previous process queued them and never saw them confirmed). Returns how many were queued."""
        journal = self.experiment.journal
        location = self.storage.location()
        queued = set(job.id for job in self.uploader.unconfirmed())
        count = 0
        for entry in journal.entries():
            if entry['id'] in queued or any(entry.get(k) != v for k, v in location.items()):
                continue
            path = journal.local_path(entry)
            if not os.path.isfile(path):
                logger.warning('%s was listed for upload but no longer exists; dropped from %s', path, journal.path)
                journal.remove(entry['id'])
                continue
            self.uploader.submit(path, entry['key'], latest_pointer_key=entry.get('pointer_key'),
                                 delete_local_after=bool(entry.get('delete_local_after')),
                                 latest_pointer_text=entry.get('pointer_text'), job_id=entry['id'])
            count += 1
        if count:
            logger.info('Queued again %d upload(s) that a previous run of %s left unconfirmed', count,
                        self.experiment.dir_path)
        return count

    # ---- uploads ---------------------------------------------------------------------------------------

    def key_for(self, local_path):
        """The cloud key of a file inside the local experiment folder."""
        rel = os.path.relpath(os.path.abspath(local_path), self.experiment.dir_path)
        if rel.startswith('..') or os.path.isabs(rel):
            raise ValueError(f'{local_path} is not inside the experiment folder {self.experiment.dir_path}; only '
                             f'files of the experiment folder can be uploaded with upload_experiment_file()')
        return join_key(self.experiment.key_prefix, rel.replace(os.sep, '/'))

    def upload_experiment_file(self, local_path, latest_pointer_name=None):
        """Queue ``local_path`` (inside the local experiment folder) for upload to the same relative key.

        With ``latest_pointer_name``, the pointer object of that name at the root of the cloud experiment folder
        is set to the file (its path inside the experiment folder, as the local pointer) once the file is
        completely uploaded, so the cloud pointer never names a missing or partial object.
        """
        key = self.key_for(local_path)
        pointer = text = None
        if latest_pointer_name:
            pointer = join_key(self.experiment.key_prefix, latest_pointer_name)
            text = pointer_text(self.experiment.dir_path, local_path)
        self.uploader.submit(local_path, key, latest_pointer_key=pointer, latest_pointer_text=text)
        return key

    def remove_local_file(self, local_path):
        """Delete a local file of the experiment once every upload of it is confirmed (now, if none is pending).

        What ``rm_subopt_local_models`` uses: deleting a file whose upload is still queued (S3 down) would lose
        it. Returns True if the file was deleted now.
        """
        return self.uploader.delete_after_upload(local_path)

    @property
    def pending_count(self):
        return self.uploader.pending_count

    @property
    def failures(self):
        return self.uploader.failures

    def wait(self, timeout=None):
        """Wait for the pending uploads; log and return the ones that failed since the last wait."""
        timeout = self.wait_timeout_s if timeout is None else timeout
        pending = self.uploader.pending_count
        if pending:
            logger.info('Waiting for %d upload(s) to %s to finish', pending, self.storage.uri(self.experiment.key_prefix))
        failures = self.uploader.wait(timeout)
        if self.uploader.pending_count:
            logger.error('%d upload(s) to %s still unfinished after %.0f s; the local files in %s are complete; '
                         'upload them later with: %s', self.uploader.pending_count, self.bucket_name, timeout,
                         self.experiment.dir_path, sync_command(self.experiment.dir_path))
        for failure in failures:
            logger.error('Upload failed: %s -> %s (%s); the local copy is kept', failure.local_path,
                         self.storage.uri(failure.key), failure.error)
        return failures

    def close(self, timeout=None):
        """Stop the uploader after at most ``timeout`` seconds (None: once everything is uploaded); what is not
        uploaded by then stays in the journal for a later run or the sync command. Returns the failures."""
        return self.uploader.close(timeout)


def get_uploader(loop, experiment, cloud_save_mode, bucket_name, cloud_dir_prefix='', endpoint_url=None):
    """The loop's uploader for this bucket/prefix (created once), or None for local-only saving or on a
    rank other than 0 (only rank 0 writes)."""
    if not is_s3_mode(cloud_save_mode) or not loop.is_main_process():
        return None
    key = (bucket_name, (cloud_dir_prefix or '').strip('/'), endpoint_url)
    uploader = experiment.uploaders.get(key)
    if uploader is None:
        uploader = ExperimentUploader(experiment, bucket_name, cloud_dir_prefix, endpoint_url)
        experiment.uploaders[key] = uploader
        if loop.experiment_uploader is None:
            loop.experiment_uploader = uploader
    return uploader


def all_uploaders(loop):
    """Every uploader of the loop's experiment (one per bucket / prefix / endpoint)."""
    experiment = loop.experiment
    return list(experiment.uploaders.values()) if experiment is not None else []


def __getattr__(name):
    # AIToolbox's aitoolbox.experiment package exported a few result packages; code where aitoolbox was renamed
    # aitoolbox_like imports them from here (the names live in the compat alias table).
    from ..compat import extra_attribute
    value = extra_attribute(__name__, name)
    globals()[name] = value
    return value
