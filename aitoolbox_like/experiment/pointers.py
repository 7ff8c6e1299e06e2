"""The pointers of an experiment folder: small files of its bookkeeping folder that name a checkpoint (the latest,
the best) by its path inside the experiment folder, rewritten atomically once the checkpoint is complete."""
import os

from ..storage.base import validate_key
from ..storage.local import write_text_atomically
from .layout import LATEST_POINTER, bookkeeping_dir


def pointer_text(experiment_dir, target_path):
    """How a pointer names ``target_path``: its '/'-separated path inside the experiment folder."""
    rel = os.path.relpath(os.path.abspath(target_path), os.path.abspath(experiment_dir)).replace(os.sep, '/')
    validate_key(rel, 'pointer target')      # refuses a target outside the experiment folder ('..')
    return rel


def write_pointer(experiment_dir, pointer_name, target_path):
    """Atomically (re)write the pointer ``pointer_name`` of the experiment folder (in its bookkeeping folder) to name
    ``target_path``; returns the pointer's path.

    Call it only once the target file is complete: a reader following a pointer must find a whole file.
    """
    folder = bookkeeping_dir(experiment_dir)
    path = os.path.join(folder, pointer_name)
    write_text_atomically(path, pointer_text(experiment_dir, target_path), temp_dir=folder)
    return path


def _read_pointer_file(experiment_dir, path):
    try:
        with open(path, encoding='utf-8') as f:
            text = f.read().strip()
        validate_key(text, 'pointer target')
    except (OSError, ValueError):
        return None
    target = os.path.join(experiment_dir, *text.split('/'))
    return target if os.path.isfile(target) else None


def read_pointer(experiment_dir, pointer_name=LATEST_POINTER):
    """The existing file the pointer ``pointer_name`` of an experiment folder names, or None."""
    experiment_dir = os.path.abspath(os.fspath(experiment_dir))
    return _read_pointer_file(experiment_dir, os.path.join(bookkeeping_dir(experiment_dir), pointer_name))

