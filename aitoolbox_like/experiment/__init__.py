"""The experiment folder of a run: its id, the hyperparameter / source files, and the cloud uploader.

Local layout (the same keys in the cloud, under ``<cloud_dir_prefix>/``), as in AIToolbox::

    <local folder>/<project>/<experiment>_<timestamp>/
        checkpoint_model/   model/   results/          only the files AIToolbox writes there
        hyperparams_list.txt   <script>.py   source_code.zip
        hyperparams.json   latest_checkpoint.txt   best_checkpoint.txt   .aitoolbox_like_run     ours

Our own bookkeeping stays at the root, so a script that lists ``checkpoint_model/``, ``model/`` or
``results/`` and loads every file finds only saved models and results; temporary files of atomic writes
are created at the root too, so a crash mid-write leaves nothing partial inside those folders.

One :class:`Experiment` per TrainLoop (``loop.experiment``) so every callback writes to the same folder.
"""
import json
import logging
import os
import shutil
import uuid
import zipfile
from typing import Any, Dict

from ..storage.base import join_key, validate_key, validate_key_part
from ..storage.local import write_atomically, write_text_atomically

logger = logging.getLogger(__name__)

S3_SAVE_MODES = ('s3', 'aws_s3', 'aws')
GCS_SAVE_MODES = ('gcs', 'google_storage', 'google storage')
LOCAL_SAVE_MODES = ('local', None, False, '')
MARKER_FILE = '.aitoolbox_like_run'
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


class Experiment:
    """Where one run writes: ``<root>/<project>/<experiment>_<loop.experiment_timestamp>``.

    ``claim()`` makes the folder this run's own. Two runs started in the same second get the same
    timestamp; the second one to claim finds the folder marked by the other and moves to ``<ts>_1``
    (``_2``, ...), updating ``loop.experiment_timestamp`` so every callback follows.
    """

    def __init__(self, loop, project_name, experiment_name, local_model_result_folder_path):
        self.loop = loop
        self.project_name = validate_key_part(project_name, 'project_name')
        self.experiment_name = validate_key_part(experiment_name, 'experiment_name')
        self.root = _abs_folder(local_model_result_folder_path)
        self.run_id = uuid.uuid4().hex
        self.claimed = False
        self.uploaders = {}

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
        """Continue the experiment of a checkpoint: write to its folder again (resume)."""
        validate_key_part(f'{self.experiment_name}_{experiment_timestamp}', 'experiment_timestamp')
        self.loop.experiment_timestamp = experiment_timestamp
        self.claimed = True
        os.makedirs(self.dir_path, exist_ok=True)
        self._write_marker(exclusive=False)

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
        base = self.loop.experiment_timestamp
        suffix = 0
        while True:
            self.loop.experiment_timestamp = base if suffix == 0 else f'{base}_{suffix}'
            os.makedirs(self.dir_path, exist_ok=True)
            if self._write_marker(exclusive=True) or self._read_marker() == self.run_id:
                break
            suffix += 1
        if suffix:
            logger.info('Experiment folder %s_%s was taken by another run; using %s', self.experiment_name, base,
                        self.dir_path)

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
        """Wait for every uploader's pending uploads (at most ExperimentUploader.wait_timeout_s, or
        exception_wait_timeout_s when fit is failing) and return the uploads that failed. The loop calls this at
        the end of fit."""
        failures = []
        for uploader in self.uploaders.values():
            timeout = min(uploader.wait_timeout_s, uploader.exception_wait_timeout_s) if after_exception \
                else uploader.wait_timeout_s
            failures += uploader.wait(timeout)
        return failures

    # ---- files of the experiment --------------------------------------------------------------

    def subdir(self, name):
        path = os.path.join(self.claim(), name)
        os.makedirs(path, exist_ok=True)
        return path

    def save_hyperparams(self, hyperparams, uploader=None):
        """Write hyperparams_list.txt and hyperparams.json, copy the experiment script and zip the source
        folders, once per experiment folder (a resumed run keeps the original files)."""
        folder = self.claim()
        txt_path = os.path.join(folder, HYPERPARAMS_TXT)
        if os.path.exists(txt_path):
            return []
        hyperparams = hyperparams if hyperparams is not None else {}
        written = []
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
            for path in written:
                uploader.upload_experiment_file(path)
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
    in a background thread (training does not wait). Set on the loop as ``loop.experiment_uploader``."""

    # Passed to S3Storage / BackgroundUploader; tests shorten the retries.
    storage_options: Dict[str, Any] = {}
    uploader_options: Dict[str, Any] = {}
    # How long the end of fit waits for pending uploads; after an exception, at most exception_wait_timeout_s.
    wait_timeout_s = 1800.0
    exception_wait_timeout_s = 120.0

    def __init__(self, experiment, bucket_name, cloud_dir_prefix='', endpoint_url=None, storage=None):
        from ..storage import BackgroundUploader
        self.experiment = experiment
        if storage is None:
            from ..storage.s3 import S3Storage
            storage = S3Storage(bucket_name, cloud_dir_prefix or '', endpoint_url=endpoint_url,
                                **self.storage_options)
        self.storage = storage
        self.bucket_name = bucket_name
        self.cloud_dir_prefix = cloud_dir_prefix or ''
        self._check_access()
        self.uploader = BackgroundUploader(storage, **self.uploader_options)

    def _check_access(self):
        # Fail at the start of fit, not after the first epoch: a wrong key or a missing bucket shows here.
        from ..storage import StorageError
        try:
            self.storage.exists(join_key(self.experiment.project_name, '.aitoolbox_like_access_check'))
        except StorageError as error:
            raise type(error)(f"{error} (cloud_save_mode='s3' uploads the experiment to S3; pass "
                              f"cloud_save_mode='local' to keep it only on this machine)") from None

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
            logger.error('%d upload(s) to %s still unfinished after %.0f s; the local files in %s are complete',
                         self.uploader.pending_count, self.bucket_name, timeout, self.experiment.dir_path)
        for failure in failures:
            logger.error('Upload failed: %s -> %s (%s); the local copy is kept', failure.local_path,
                         self.storage.uri(failure.key), failure.error)
        return failures


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
