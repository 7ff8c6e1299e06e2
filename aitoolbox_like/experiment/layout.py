"""The experiment folder's layout: the names of its files and folders, where our bookkeeping folder lies, and the
names of checkpoints (what a name says of the checkpoint's place in its run).

The layout itself is described in :mod:`aitoolbox_like.experiment`.
"""
import math
import os
import re

from ..storage.journal import JOURNAL_NAME
from .uploads import BOOKKEEPING_DIR

# The journal of uploads not confirmed yet (storage.journal); the sync command uploads what it lists.
PENDING_UPLOADS = JOURNAL_NAME
HYPERPARAMS_TXT = 'hyperparams_list.txt'
HYPERPARAMS_JSON = 'hyperparams.json'
SOURCE_ZIP = 'source_code.zip'
CHECKPOINT_DIR = 'checkpoint_model'
MODEL_DIR = 'model'
RESULTS_DIR = 'results'
# Bookkeeping files naming a checkpoint by its path inside the experiment folder ('checkpoint_model/<file>').
LATEST_POINTER = 'latest_checkpoint.txt'
BEST_POINTER = 'best_checkpoint.txt'
# A checkpoint's name: model_<experiment>_<timestamp>_E<epoch>[_ITER<global batch idx>] + .pth / .pt / .dcp
_CHECKPOINT_NAME_RE = re.compile(r'_E(\d+)(?:_ITER(\d+))?\.(?:pth|pt|dcp)$')


def absolute_folder(path):
    """``path`` (str or path-like, ``~`` expanded) as an absolute path."""
    return os.path.abspath(os.path.expanduser(os.fspath(path)))


def model_file_name(experiment_name, experiment_timestamp, epoch=None, iteration_idx=None):
    """``model_<experiment>_<timestamp>[_E<epoch>[_ITER<idx>]].pth``: AIToolbox's saved model / checkpoint names."""
    name = f'model_{experiment_name}_{experiment_timestamp}'
    if epoch is not None:
        name += f'_E{epoch}'
        if iteration_idx is not None:
            name += f'_ITER{iteration_idx}'
    return name + '.pth'


def bookkeeping_dir(experiment_dir):
    """Our bookkeeping folder of the experiment folder ``experiment_dir`` (``<root>/<project>/<name>``):
    ``<root>/.aitoolbox_like/<project>/<name>`` (nothing is created)."""
    experiment_dir = os.path.abspath(os.fspath(experiment_dir))
    project_dir, name = os.path.split(experiment_dir)
    root, project = os.path.split(project_dir)
    return os.path.join(root, BOOKKEEPING_DIR, project, name)


def checkpoint_order(name):
    """Where a checkpoint named ``name`` comes in its run, from its name: ``(epoch, iteration)``, the end of an
    epoch after its mid-epoch checkpoints; None for names that are not a checkpoint's."""
    match = _CHECKPOINT_NAME_RE.search(name)
    if match is None:
        return None
    return int(match.group(1)), math.inf if match.group(2) is None else int(match.group(2))

