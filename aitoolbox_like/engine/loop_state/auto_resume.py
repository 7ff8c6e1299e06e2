"""``fit(resume_from='auto')``: continue from the run's newest checkpoint when there is one (a callback's, the
experiment's newest local one, else its cloud copy), else start from scratch; rank 0 decides for every rank."""
import logging
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import torch

from ... import distributed
from .locate import find_latest_in_cloud, find_latest_local, load_resume_checkpoint

if TYPE_CHECKING:
    from ...experiment import Experiment
    from ..train_loop import TrainLoop

logger = logging.getLogger(__name__)

AUTO = 'auto'

def _all_callbacks(loop, callbacks):
    given = list(callbacks) if isinstance(callbacks, (list, tuple)) else []
    found: List[Any] = []
    for cb in list(loop.callbacks) + list(loop.callbacks_handler.cached_callbacks) + given:
        if not any(cb is other for other in found):
            found.append(cb)
    return found

def check_auto_resume(loop: 'TrainLoop', callbacks: Any) -> None:
    """``fit(resume_from='auto')`` before anything starts: some callback must write the checkpoints a restarted run
    resumes from (it sets ``writes_checkpoints``: ModelCheckpoint, ModelIterationCheckpoint, the tracking loops'
    savers, RayTrainReport); without one every restart would silently train from zero again."""
    if not any(getattr(cb, 'writes_checkpoints', False) for cb in _all_callbacks(loop, callbacks)):
        raise ValueError("fit(resume_from='auto') continues from the run's newest checkpoint, but no registered "
                         'callback writes checkpoints, so every restart would train from scratch: add a '
                         'ModelCheckpoint or ModelIterationCheckpoint (or use TrainLoopCheckpoint; under Ray, '
                         'aitoolbox_like.adapters.ray.RayTrainReport), or leave resume_from out')

def _find_here(loop, experiment, callbacks):
    """What rank 0 would resume from: ('path', path, None), ('loaded', source name, checkpoint) or None."""
    for cb in _all_callbacks(loop, callbacks):
        finder = getattr(cb, 'find_resume_checkpoint', None)
        if not callable(finder):
            continue
        found = finder(loop)
        if isinstance(found, dict):
            return 'loaded', f'the checkpoint of {type(cb).__name__}', found
        if found is not None:
            return 'path', os.fspath(found), None
    if experiment is None:
        return None
    path = find_latest_local(experiment)
    if path is not None:
        return 'path', path, None
    remote = find_latest_in_cloud(loop, experiment, callbacks)
    if remote is not None:
        checkpoint, uri = remote
        return 'loaded', uri, checkpoint
    return None

def find_auto_checkpoint(loop: 'TrainLoop', experiment: Optional['Experiment'],
                         callbacks: Any = None) -> Optional[Tuple[Dict[str, Any], str]]:
    """``resume_from='auto'``: the checkpoint to continue from, as ``(checkpoint, source name)``, or None to start
    from scratch (logged). Looked for in this order: a callback's ``find_resume_checkpoint(loop)`` (e.g. Ray Train's
    checkpoint), the experiment's newest complete local checkpoint, its newest copy in the cloud (a new machine). In a
    distributed run rank 0 decides and every rank resumes from the same checkpoint: each reads the file itself
    when it sees it, else rank 0 sends its copy (a collective)."""
    check_auto_resume(loop, callbacks)
    distributed_run = distributed.is_distributed() and distributed.get_world_size() > 1
    found = _find_here(loop, experiment, callbacks) if distributed.get_rank() == 0 else None
    if distributed_run:
        choice: List[Any] = [found[:2] if found is not None else None]
        torch.distributed.broadcast_object_list(choice, src=0)
        if choice[0] is not None and found is None:
            found = (choice[0][0], choice[0][1], None)
        elif choice[0] is None:
            found = None
    if found is None:
        where = f'{experiment.project_name}/{experiment.experiment_name} in {experiment.root}' if experiment else \
            'this run (no experiment folder)'
        if loop.is_main_process():
            logger.info("fit(resume_from='auto'): no checkpoint of %s yet: training from scratch", where)
        return None
    kind, source, checkpoint = found
    if kind == 'path' and checkpoint is None and (not distributed_run or _visible_everywhere(source)):
        checkpoint, source = load_resume_checkpoint(loop, source, experiment, callbacks)
    elif distributed_run:
        if kind == 'path' and loop.is_main_process():
            checkpoint, _ = load_resume_checkpoint(loop, source, experiment, callbacks)
        shipped: List[Any] = [checkpoint]
        torch.distributed.broadcast_object_list(shipped, src=0)
        checkpoint = shipped[0]
    if loop.is_main_process():
        logger.info("fit(resume_from='auto'): resuming from %s", source)
    return checkpoint, source

def _visible_everywhere(path):
    """Every rank sees the file ``path`` (a shared file system, or one machine): a collective."""
    visible: List[Any] = [None] * distributed.get_world_size()
    torch.distributed.all_gather_object(visible, os.path.exists(path))
    return all(visible)
