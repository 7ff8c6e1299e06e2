"""The resume plan: how a fit continues a saved run (load before callbacks register, apply once they are, reopen
the epoch the checkpoint was taken in), and the start of a fit that sets it going (the experiment folder the run
continues in)."""
import logging
from typing import TYPE_CHECKING, Any, Dict, Iterator, Optional, Tuple

import torch

from ... import distributed
from ...checkpoint import sharded as sharded_checkpoint
from ...checkpoint.files import CheckpointError
from ...experiment import get_experiment
from .auto_resume import AUTO, find_auto_checkpoint
from .build import rebuild_losses
from .locate import experiment_callbacks, load_resume_checkpoint
from .restore import apply_checkpoint, load_weights_optimizer_scaler, validate_checkpoint
from .rng import capture_rng_state, restore_rng_state

if TYPE_CHECKING:
    from ...experiment import Experiment
    from ..train_loop import TrainLoop

logger = logging.getLogger(__name__)

class ResumePlan:
    """How the current fit continues a saved run; the loop owns it as ``loop.resume_plan``.

    Made by ``fit(resume_from=...)`` (from where to resume) or by ModelLoadContinueTraining (an already loaded
    checkpoint). Its steps, each done once even when a DDP process calls them again:

    1. :meth:`load` before callbacks register: read the checkpoint, so the run continues in its experiment folder;
    2. :meth:`apply` once callbacks are registered and the model is on its device: weights, optimizer, history,
       counters, callback state, RNG;
    3. :meth:`reopen_epoch` at the start of the epoch the checkpoint was taken in, when it was taken mid-epoch.

    Args:
        source: what to resume from: a file path, an experiment folder, ``'s3://bucket/key'`` (or ``gs://``,
            ``az://``), ``'latest'``, or
            ``'auto'`` (the newest checkpoint if there is one, else a fresh start: :func:`find_auto_checkpoint`).
        checkpoint: an already loaded checkpoint dict (then ``source`` only names it in messages).
    """

    def __init__(self, source: Any, checkpoint: Optional[Dict[str, Any]] = None) -> None:
        self.source = source
        self.checkpoint = checkpoint
        self.source_name = source if checkpoint is None else str(source)
        self.applied = False
        self.found = True       # False: resume_from='auto' found nothing to resume
        self.position: Optional[Dict[str, Any]] = None      # where inside an epoch to continue, once applied

    def load(self, loop: 'TrainLoop', experiment: Optional['Experiment'], callbacks: Any = None) -> None:
        """Read the checkpoint (once) and move the run into its experiment folder. With ``resume_from='auto'`` and
        nothing to resume, the plan stays empty (:attr:`found` is False) and the run starts from scratch."""
        if self.checkpoint is None and self.source == AUTO:
            found = find_auto_checkpoint(loop, experiment, callbacks)
            if found is None:
                self.found = False
                return
            self.checkpoint, self.source_name = found
        elif self.checkpoint is None:
            self.checkpoint, self.source_name = load_resume_checkpoint(loop, self.source, experiment, callbacks)
        # Before the run moves into the checkpoint's folder: a checkpoint that does not fit changes nothing.
        validate_checkpoint(loop, self.checkpoint, self.source_name, check_optimizer_groups=False)
        adopt_experiment(loop, self.checkpoint, experiment)

    def load_weights_now(self, loop: 'TrainLoop') -> bool:
        """Put the checkpoint's weights, optimizer state and grad-scaler state into the loop now, before ``apply``
        (which puts them in again with the rest): what AIToolbox's ModelLoadContinueTraining loads at
        registration, so that the loop predicts with the loaded model without a fit, and schedulers registered
        after it are built on the saved optimizer state. Returns False (nothing changed) when that cannot be done
        before every callback is registered: a sharded checkpoint or model, or an optimizer whose parameter groups
        a callback has yet to rebuild."""
        checkpoint = self.checkpoint
        assert checkpoint is not None, 'load() runs first'
        if checkpoint.get(sharded_checkpoint.FOLDER_KEY) or distributed.is_fsdp_model(loop.model):
            return False
        try:
            validate_checkpoint(loop, checkpoint, self.source_name)
        except CheckpointError:
            return False        # apply() loads it, or names what does not fit, once every callback is registered
        if not callable(getattr(loop.optimizer, 'load_state_dict', None)):
            # No optimizer yet (AIToolbox code may set it later): the weights now, the rest when fit starts.
            checkpoint = dict(checkpoint, optimizer_state_dict=None)
        load_weights_optimizer_scaler(loop, checkpoint, self.source_name)
        loop.purge_prediction_cache()
        return True

    def apply(self, loop: 'TrainLoop') -> None:
        """Put the checkpoint's state into the loop (once)."""
        if not self.applied and self.found:
            self.position = apply_checkpoint(loop, self.checkpoint, self.source_name)
            self.applied = True

    def resumes_inside(self, epoch: int) -> bool:
        """True when the run continues inside ``epoch`` (the checkpoint was taken after one of its batches)."""
        return self.position is not None and self.position['epoch'] == epoch

    def reopen_epoch(self, loop: 'TrainLoop') -> Tuple[Iterator[Any], int, Any]:
        """The train loader's iterator for the epoch being resumed, positioned after the samples the checkpoint
        already trained, the index of the next batch, and the loader the iterator comes from (its len() is the
        epoch's number of batches).

        The data order of an epoch comes from the RNG state at the epoch's start, which the checkpoint kept: the
        same permutation is rebuilt, the trained batches are skipped, then the checkpoint's own RNG state, history,
        callback state, running losses and accumulated gradients are put back (on_epoch_begin just ran again for
        this epoch; its effects were already in the checkpoint). When the number of processes changed since the
        checkpoint, the samples it trained are known by their position in the epoch's order: the rest of that
        order is split between the processes of this run (:func:`remaining_epoch_loader`)."""
        resume = self.position
        assert resume is not None, 'reopen_epoch() is called only when resumes_inside(epoch)'
        self.position = None
        if resume['epoch_start_rng'] is not None:
            restore_rng_state(loop, resume['epoch_start_rng'])
            loop.epoch_start_rng = resume['epoch_start_rng']
        else:
            logger.warning('The checkpoint was taken outside fit, without the RNG state of its epoch start: the '
                           'resumed epoch skips %d batches of a new data order, so with a shuffling loader some '
                           'samples of this epoch are trained twice and some not at all', resume['batches_done'])
            loop.epoch_start_rng = capture_rng_state(loop)
        loader, start = loop.train_loader, resume['batches_done']
        loop.epoch_samples_offset = 0
        if resume['world_size'] != loop.world_size or resume['sample_offset']:
            remaining = remaining_epoch_loader(loop, resume['samples_done'])
            if remaining is not None:
                loader, start = remaining, 0
                loop.epoch_samples_offset = resume['samples_done']
                if loop.is_main_process():
                    logger.info('Resuming epoch %d on %d process(es) (the checkpoint was saved by %d): %d samples of '
                                'its order were trained, the other %d are split between the processes',
                                loop.epoch, loop.world_size, resume['world_size'], resume['samples_done'],
                                len(remaining.sampler.order) - resume['samples_done'])
            elif loop.is_main_process():
                logger.warning('The checkpoint was saved by %d process(es), this run has %d, and the train loader\'s '
                               'data order cannot be rebuilt (only a DataLoader whose sampler the distributed fit '
                               'set up can): the resumed epoch skips %d batches per process, so some samples of it '
                               'are trained twice or not at all', resume['world_size'], loop.world_size,
                               resume['batches_done'])
        iterator = iter(loader)
        if loader is loop.train_loader:
            for done in range(start):
                try:
                    next(iterator)
                except StopIteration:
                    raise CheckpointError(f'the checkpoint was taken after {start} batches of epoch {loop.epoch}, '
                                          f'but the train loader now has only {done}; resume with the same data and '
                                          f'batch size') from None
        if resume['batches_done'] > 0:
            restore_rng_state(loop, resume['rng'])
        # else: a checkpoint from before the epoch's first batch (a stop abandoned its fetch or its step): the
        # loader draws its data order when the first batch is fetched, from the state iter() left, as it did then.
        loop.train_history.load_state_dict(resume['history'])
        loop.callbacks_handler.load_callbacks_state_dict(resume['callbacks'])
        loop.loss_batch_accum = [loss.to(loop.device) if isinstance(loss, torch.Tensor) else loss
                                 for loss in rebuild_losses(resume['loss_batch_accum'])]
        if resume['grads'] is not None:
            for param, grad in zip(loop.model.parameters(), resume['grads']):
                param.grad = None if grad is None else grad.to(param.device)
        return iterator, start, loader

def remaining_epoch_loader(loop: 'TrainLoop', samples_done: Optional[int]) -> Any:
    """A loader over the samples of the current epoch's order after the first ``samples_done``, split between the
    processes of this run as the DistributedSampler splits a whole epoch (padded by repeating its first samples when
    they do not divide evenly, so every process runs the same number of batches), keeping every other DataLoader
    argument. None when the order cannot be rebuilt: ``samples_done`` unknown, or a train loader whose sampler the
    distributed fit did not set up."""
    samplers = loop.distributed_samplers
    sampler = samplers[0] if samplers else None
    if samples_done is None or sampler is None:
        return None
    order = distributed.epoch_order(sampler)
    if order is None:
        return None
    return distributed.loader_with_sampler(
        loop.train_loader, distributed.RemainingOrderSampler(order, samples_done, loop.world_size, loop.global_rank))

def _experiment_for(loop, callbacks):
    experiment = get_experiment(loop)
    if experiment is not None:
        return experiment
    for cb in experiment_callbacks(loop, callbacks):
        names = (cb.project_name, cb.experiment_name, cb.local_model_result_folder_path)
        if None not in names:
            return get_experiment(loop, *names)
    return None

def prepare_fit(loop, callbacks):
    """Start of a fit, before callbacks register: load the checkpoint to resume from (so the run continues in
    the checkpoint's experiment folder) and claim the experiment folder of a tracking loop. Safe to call again in
    the same fit (a DDP process prepares before its own registration, then trains)."""
    experiment = _experiment_for(loop, callbacks)
    if loop.resume_plan is not None:
        loop.resume_plan.load(loop, experiment, callbacks)
        if not loop.resume_plan.found:
            loop.resume_plan = None         # resume_from='auto' with nothing to resume: a fresh start
    continuing = any(getattr(cb, 'continues_experiment', False) for cb in experiment_callbacks(loop, callbacks))
    # A ModelLoadContinueTraining continues an existing folder: claiming a new one first would leave it empty.
    if experiment is not None and not experiment.claimed and not loop.lazy_experiment_save and not continuing:
        experiment.claim()

def adopt_experiment(loop, checkpoint, experiment):
    """A resumed run keeps writing to the experiment folder of its checkpoint."""
    saved: Any = checkpoint.get('experiment') if isinstance(checkpoint, dict) else None
    timestamp = saved.get('experiment_timestamp') if isinstance(saved, dict) else None
    if not isinstance(timestamp, str):
        return
    if experiment is None:
        loop.experiment_timestamp = timestamp
        return
    if (saved.get('project_name'), saved.get('experiment_name')) != (experiment.project_name,
                                                                     experiment.experiment_name):
        logger.info('Resuming a checkpoint of experiment %s/%s under %s/%s: a new experiment folder is used',
                    saved.get('project_name'), saved.get('experiment_name'), experiment.project_name,
                    experiment.experiment_name)
        return
    if loop.is_main_process():
        experiment.adopt(timestamp)
    else:
        loop.experiment_timestamp = timestamp
        experiment.claimed = True
