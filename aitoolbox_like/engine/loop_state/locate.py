"""Finding the checkpoint to resume from and loading it: in an experiment folder (its pointer, else its newest
file), the experiment's newest run, a file, or the cloud (a file, a pointer, an experiment folder, a sharded
checkpoint's folder, downloaded into the local experiment folder)."""
import os
import shutil
import tempfile

from ...checkpoint import sharded as sharded_checkpoint
from ...checkpoint.files import CheckpointError, load_checkpoint
from ...experiment import CHECKPOINT_DIR, LATEST_POINTER
from ...experiment import bookkeeping_dir, find_cloud_checkpoint, find_latest_cloud_checkpoint, is_cloud_mode
from ...experiment import read_pointer, run_owner_alive
from ...storage.base import validate_key
from ...storage.local import remove_stray_temp_files
from ...storage.urls import is_cloud_url, open_storage, split_url, storage_for_mode

def experiment_callbacks(loop, callbacks):
    """Callbacks that say which experiment the run writes to (saving callbacks, ModelLoadContinueTraining): they
    set ``defines_experiment``. Found by that attribute so this core module needs no callback module."""
    found = []
    # Not validated yet (the handler does that, with a clear error): look only inside a list.
    callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else []
    for cb in list(loop.callbacks) + list(loop.callbacks_handler.cached_callbacks) + callbacks:
        if getattr(cb, 'defines_experiment', False) and cb not in found:
            found.append(cb)
    return found

def find_checkpoint_in_dir(path):
    """The newest complete checkpoint of an experiment folder, given the folder itself or its checkpoint_model
    folder: the one its ``latest_checkpoint.txt`` names, else (a run that died before writing any pointer, or a
    folder of checkpoints from elsewhere) the newest checkpoint file."""
    path = os.path.normpath(path)
    experiment_dir = os.path.dirname(path) if os.path.basename(path) == CHECKPOINT_DIR else path
    found = read_pointer(experiment_dir, LATEST_POINTER)
    if found:
        return found
    for folder in dict.fromkeys((os.path.join(experiment_dir, CHECKPOINT_DIR), path)):
        if os.path.isdir(folder):
            files = [os.path.join(folder, f) for f in os.listdir(folder)
                     if f.endswith(('.pth', '.pt')) and not f.startswith('.')]
            # Sharded (FSDP) checkpoints: complete folders only, named by their marker file as pointers do.
            files += [os.path.join(folder, f, sharded_checkpoint.MARKER) for f in os.listdir(folder)
                      if f.endswith(sharded_checkpoint.SUFFIX) and sharded_checkpoint.is_sharded_checkpoint(
                          os.path.join(folder, f))]
            if files:
                return max(files, key=os.path.getmtime)
    return None

def find_latest_local(experiment):
    project_dir = os.path.join(experiment.root, experiment.project_name)
    prefix = f'{experiment.experiment_name}_'
    try:
        names = sorted((n for n in os.listdir(project_dir) if n.startswith(prefix)), reverse=True)
    except OSError:
        return None
    for name in names:
        # Falls back to the newest file when a run died between a checkpoint and its pointer.
        found = find_checkpoint_in_dir(os.path.join(project_dir, name))
        if found:
            return found
    return None

def remove_unfinished_writes_of_dead_runs(experiment):
    """The temporary files of writes that runs of this experiment's name left when they were killed before their
    first checkpoint (no checkpoint in their folder): removed where the run is known to be dead (its process, on this
    machine, is gone); a run still alive, or on another machine, keeps its folder untouched. Returns the removed
    paths."""
    project_dir = os.path.join(experiment.root, experiment.project_name)
    prefix = f'{experiment.experiment_name}_'
    try:
        names = [n for n in os.listdir(project_dir) if n.startswith(prefix)]
    except OSError:
        return []
    removed = []
    for name in names:
        folder = os.path.join(project_dir, name)
        if find_checkpoint_in_dir(folder) is None and run_owner_alive(folder) is False:
            removed += remove_stray_temp_files(folder) + remove_stray_temp_files(bookkeeping_dir(folder))
    return removed

def load_resume_checkpoint(loop, resume_from, experiment=None, callbacks=None, map_location='cpu',
                           allow_unsafe_pickle=False, endpoint_url=None):
    """Load the checkpoint ``resume_from`` names: a file, an experiment folder, a cloud URL (``s3://bucket/key``,
    ``gs://bucket/key``, ``az://container/key``) or 'latest'. ``endpoint_url`` is the cloud's endpoint (None: the
    client's own resolution, e.g. AWS_ENDPOINT_URL_S3 or STORAGE_EMULATOR_HOST). Returns ``(checkpoint, source)``."""
    if isinstance(resume_from, dict):
        return resume_from, 'the given checkpoint dict'
    resume_from = os.fspath(resume_from)
    if is_cloud_url(resume_from):
        return _load_from_cloud(resume_from, map_location, allow_unsafe_pickle, endpoint_url, experiment)
    if resume_from == 'latest':
        if experiment is None:
            raise ValueError("fit(resume_from='latest') needs to know the experiment: use a TrainLoopCheckpoint (or "
                             'pass a ModelCheckpoint callback), or give the checkpoint path instead')
        path = find_latest_local(experiment)
        if path is None:
            remote = find_latest_in_cloud(loop, experiment, callbacks)
            if remote is not None:
                return remote
            cleaned = remove_unfinished_writes_of_dead_runs(experiment)
            note = (f' (removed {len(cleaned)} unfinished write(s) left by runs killed before their first '
                    f'checkpoint: {", ".join(cleaned)})' if cleaned else '')
            raise FileNotFoundError(f"fit(resume_from='latest'): no checkpoint of experiment "
                                    f'{experiment.project_name}/{experiment.experiment_name} in {experiment.root}'
                                    f'{note}; start the run without resume_from (or with resume_from=\'auto\', '
                                    f'which starts from scratch when there is no checkpoint)')
    else:
        path = os.path.abspath(os.path.expanduser(resume_from))
        if os.path.isdir(path) and not sharded_checkpoint.is_sharded_checkpoint(path):
            found = find_checkpoint_in_dir(path)
            if found is None:
                raise FileNotFoundError(f'resume_from={resume_from!r}: no checkpoint in this folder')
            path = found
    if sharded_checkpoint.is_sharded_checkpoint(path):
        return sharded_checkpoint.load_train_state(path, map_location), path
    return load_checkpoint(path, map_location=map_location, allow_unsafe_pickle=allow_unsafe_pickle), path

def _download_and_load(storage, key, map_location, allow_unsafe_pickle):
    tmp_dir = tempfile.mkdtemp(prefix='aitoolbox_like_resume_')
    try:
        local = os.path.join(tmp_dir, key.rsplit('/', 1)[-1])
        storage.load_file(key, local)
        uri = storage.uri(key)
        # Errors name the cloud address, not the temporary copy (deleted by the time the user reads them).
        return load_checkpoint(local, map_location=map_location, allow_unsafe_pickle=allow_unsafe_pickle,
                               source_name=uri), uri
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)

def _sharded_folder_key(key):
    """The folder key when ``key`` names a sharded checkpoint (its ``.dcp`` folder, its marker or another of its files:
    ``train_state.pt`` or a shard, none of which is a checkpoint on its own), else None."""
    key = key.rstrip('/')
    folder = key.rpartition('/')[0]
    if folder.endswith(sharded_checkpoint.SUFFIX):
        key = folder
    return key if key.endswith(sharded_checkpoint.SUFFIX) else None

def _download_sharded(storage, folder_key, experiment, map_location):
    """A sharded checkpoint in the cloud: its folder is downloaded into the same place of the local experiments root (the
    train state is read now, the shards once the model is sharded: sharded_checkpoint.load_model_and_optimizer)."""
    uri = storage.uri(folder_key)
    if experiment is None:
        raise ValueError(f'resume_from={uri!r}: a sharded (FSDP) checkpoint is downloaded into the local '
                         f'experiment folder before it is loaded, and this TrainLoop has none; use a '
                         f'TrainLoopCheckpoint (or pass a ModelCheckpoint, whose local_model_result_folder_path is the '
                         f'root), or download the folder and give its path')
    parts = folder_key.split('/')
    if len(parts) < 4 or parts[-2] != CHECKPOINT_DIR:
        raise CheckpointError(f'resume_from={uri!r}: expected a sharded checkpoint of an experiment folder, '
                              f'.../<project>/<experiment>_<timestamp>/{CHECKPOINT_DIR}/<name>'
                              f'{sharded_checkpoint.SUFFIX}')
    place = validate_key('/'.join(parts[-4:]), 'sharded checkpoint folder')
    local = sharded_checkpoint.download(storage, folder_key, os.path.join(experiment.root, *place.split('/')))
    return sharded_checkpoint.load_train_state(local, map_location), uri

def _download_target(storage, key, experiment, map_location, allow_unsafe_pickle):
    folder_key = _sharded_folder_key(key)
    if folder_key is not None:
        return _download_sharded(storage, folder_key, experiment, map_location)
    return _download_and_load(storage, key, map_location, allow_unsafe_pickle)

def _load_from_cloud(uri, map_location, allow_unsafe_pickle, endpoint_url=None, experiment=None):
    scheme, bucket, key = split_url(uri)
    if not bucket or not key:
        raise ValueError(f'resume_from={uri!r}: expected {scheme}://bucket/key/of/checkpoint.pth or '
                         f'{scheme}://bucket/<experiment folder>')
    storage = open_storage(f'{scheme}://{bucket}', endpoint_url=endpoint_url)
    if _sharded_folder_key(key) is not None:
        return _download_sharded(storage, _sharded_folder_key(key), experiment, map_location)
    if key.endswith(('.pth', '.pt')) or storage.exists(key):
        return _download_and_load(storage, key, map_location, allow_unsafe_pickle)
    experiment_key = key[:-len(CHECKPOINT_DIR) - 1] if key.endswith(f'/{CHECKPOINT_DIR}') else key
    # The bucket holds only AIToolbox's files: the newest checkpoint is found by its name.
    found = find_cloud_checkpoint(storage, experiment_key)
    if found is not None:
        return _download_target(storage, found, experiment, map_location, allow_unsafe_pickle)
    raise FileNotFoundError(f'resume_from={uri!r}: no checkpoint there (neither a file nor an experiment folder '
                            f'with checkpoints in {CHECKPOINT_DIR}/)')

def find_latest_in_cloud(loop, experiment, callbacks):
    details = None
    for cb in experiment_callbacks(loop, callbacks):
        if is_cloud_mode(getattr(cb, 'cloud_save_mode', None)) and getattr(cb, 'bucket_name', None):
            details = (cb.cloud_save_mode, cb.bucket_name, cb.cloud_dir_prefix or '', getattr(cb, 'endpoint_url', None))
            break
    if details is None:
        return None
    storage = storage_for_mode(details[0], details[1], details[2], endpoint_url=details[3])
    found = find_latest_cloud_checkpoint(storage, experiment.project_name, experiment.experiment_name)
    if found is None:
        return None
    return _download_target(storage, found, experiment, 'cpu', False)
