"""Finding the newest checkpoint of an experiment in a cloud storage, by the checkpoints' names (the bucket holds
only AIToolbox's files: no pointer of ours is kept there)."""
from typing import Optional, Tuple

from ..storage.base import join_key
from .layout import CHECKPOINT_DIR, checkpoint_order


def find_cloud_checkpoint(storage, experiment_key):
    """The key of the newest complete checkpoint of the experiment folder ``experiment_key`` in ``storage`` (a cloud
    prefix), or None.

    The bucket holds only AIToolbox's files, so the newest checkpoint is found by its name (epoch, then iteration,
    see :func:`checkpoint_order`): an object exists only once completely uploaded, and a sharded checkpoint counts
    once its marker (uploaded last) is there; its key is then the marker's, as ``resume_from`` accepts it.
    """
    from ..checkpoint.sharded import MARKER, SUFFIX
    folder = join_key(experiment_key.rstrip('/'), CHECKPOINT_DIR) + '/'
    best: Optional[Tuple[Tuple[int, float], str]] = None
    for key in storage.list(folder):
        parts = key[len(folder):].split('/')
        if len(parts) == 1:
            order = checkpoint_order(parts[0]) if not parts[0].endswith(SUFFIX) else None
        elif len(parts) == 2 and parts[0].endswith(SUFFIX) and parts[1] == MARKER:
            order = checkpoint_order(parts[0])
        else:
            continue
        if order is not None and (best is None or order > best[0]):
            best = (order, key)
    return best[1] if best is not None else None


def find_latest_cloud_checkpoint(storage, project_name, experiment_name):
    """The key of the newest complete checkpoint of the newest experiment folder (by timestamp) of
    ``<project_name>/<experiment_name>_*`` in ``storage`` that has one, or None."""
    prefix = f'{project_name}/{experiment_name}_'
    folders = sorted({'/'.join(key.split('/')[:2]) for key in storage.list(prefix)
                      if key.split('/')[2:3] == [CHECKPOINT_DIR]}, reverse=True)
    for folder in folders:
        found = find_cloud_checkpoint(storage, folder)
        if found is not None:
            return found
    return None

