"""The files of a sharded checkpoint folder: its names and markers, whether it is complete, the order its files are
uploaded in, its download from a storage, and its training state (``train_state.pt``)."""
from __future__ import annotations

import logging
import os
import shutil
from typing import Any

from ..files import CheckpointError, fsync_directory, load_checkpoint
from ...storage.base import Storage, join_key, validate_key
from ...storage.local import exclusive_lock, mark_temp_live, remove_folder, temp_name_for

logger = logging.getLogger(__name__)


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
