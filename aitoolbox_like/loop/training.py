"""A fit in this process, as TrainLoop runs it once fit's arguments are checked (and each process of a distributed
fit once it is set up): register the callbacks (and the defaults), apply the resume plan, on_train_begin, the
epochs and their batches (each batch a step: step.py), the end-of-epoch evaluation and early stopping,
on_train_end, and the wait for background saves and uploads; on any exception on_exception, then re-raise."""
import logging
import math
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, cast

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset

from .. import loop_state
from ..callbacks.abstract import AbstractCallback, StopTraining, TrainingInterrupted
from ..callbacks.defaults import add_default_callbacks       # the one place default callbacks come from
from ..callbacks.handler import CallbacksHandler
from ..console import default_console_output
from .checks import check_fit_inputs

if TYPE_CHECKING:
    from ..amp import AmpPolicy
    from ..experiment import Experiment
    from ..history import TrainingHistory
    from ..message_passing import MessageService
    from ..train_loop import TrainLoop

# The loop's messages keep the logger of train_loop.py, where users configure them.
logger = logging.getLogger('aitoolbox_like.train_loop')


class TrainingMixin:
    """A fit in this process (a part of TrainLoop; the run state it uses is declared in TrainLoop.__init__)."""

    if TYPE_CHECKING:   # what this part uses of TrainLoop: run state (declared in its __init__), other parts
        model: torch.nn.Module
        device: torch.device
        train_loader: Any
        print_callbacks: bool
        epochs_completed: int
        epoch: int
        iteration: int
        total_iteration_idx: int
        num_epochs: Optional[int]
        num_iterations: Optional[int]
        grad_accumulation: int
        batch: Any
        train_step_owner: Any
        loss_batch_accum: List[Any]
        early_stop: bool
        interrupted: Optional[str]
        train_history: 'TrainingHistory'
        experiment: Optional['Experiment']
        upload_failures: List[Any]
        resume_plan: Optional[loop_state.ResumePlan]
        epoch_start_rng: Optional[Dict[str, Any]]
        epoch_samples_offset: int
        callbacks: List[AbstractCallback]
        callbacks_handler: CallbacksHandler
        message_service: 'MessageService'
        _amp: 'AmpPolicy'
        _epochs_running: bool
        _is_last_batch: bool
        _eval_cache: Dict[Any, Any]

        @property
        def world_size(self) -> int: ...

        def is_main_process(self) -> bool: ...

        def move_criterion_to_device(self) -> None: ...

        def _collective_device(self) -> torch.device: ...

        def _train_step(self, batch_data: Any) -> None: ...

        def _run_custom_step(self, batch_data: Any) -> None: ...

        def auto_execute_end_of_epoch(self) -> None: ...

        def auto_execute_end_of_training(self) -> None: ...

    def register_fit_callbacks(self, callbacks: Optional[Sequence[AbstractCallback]]) -> None:
        """The start of a fit, before any training: load the checkpoint being resumed from (so the run continues
        in its experiment folder), then register ``callbacks`` and the cached ones (a tracking loop's savers).
        A DDP process calls it once its rank is known; calling it again in the same fit does no harm."""
        loop_state.prepare_fit(self, callbacks)
        self.callbacks_handler.register_callbacks(callbacks)      # also registers cached callbacks

    def train_in_this_process(self, num_epochs: int, num_iterations: int,
                              callbacks: Optional[Sequence[AbstractCallback]] = None,
                              grad_accumulation: int = 1) -> torch.nn.Module:
        """Train in this process: what ``fit`` does once its arguments are checked (and, in a DDP fit, what
        each process does once its process group, loaders and model wrapper are set up). Returns the model."""
        steps_before = self.total_iteration_idx
        claimed_before = self.experiment is not None and self.experiment.claimed
        try:
            with default_console_output():
                return self._train_in_this_process(num_epochs, num_iterations, callbacks, grad_accumulation)
        except BaseException:
            experiment = self.experiment
            if self.total_iteration_idx == steps_before and experiment is not None and not claimed_before:
                experiment.discard_untrained()      # a run that never trained leaves no folder behind
            raise

    def _train_in_this_process(self, num_epochs, num_iterations, callbacks, grad_accumulation):
        self.num_iterations = num_iterations
        self.grad_accumulation = grad_accumulation
        self.num_epochs = num_epochs or self._epochs_for_iterations(num_iterations)
        self.early_stop = False
        self.interrupted = None
        self._eval_cache.clear()
        loop = cast('TrainLoop', self)      # this part of the loop, handed on as the TrainLoop it is

        self.register_fit_callbacks(callbacks)
        add_default_callbacks(loop)
        self.train_step_owner = self._find_train_step_owner()
        if self.print_callbacks:
            self.callbacks_handler.print_registered_callback_names()
        check_fit_inputs(loop, self._amp.unavailable, final=False, need_train_loader=True)

        self.model.to(self.device)
        self.move_criterion_to_device()
        self.model.train()
        if self.resume_plan is not None:
            self.resume_plan.apply(loop)
        experiment = self.experiment
        if experiment is not None and experiment.claimed and self.is_main_process():
            logger.info('Experiment folder: %s (checkpoints in %s/)', experiment.dir_path, loop_state.CHECKPOINT_DIR)

        try:
            try:
                self.callbacks_handler.execute_train_begin()
                check_fit_inputs(loop, self._amp.unavailable, final=True, need_train_loader=True)
                self._train_epochs()
            except StopTraining as stop:
                if isinstance(stop, TrainingInterrupted):
                    self.interrupted = stop.reason
                else:
                    logger.info('Training stopped by a callback: %s', stop or 'StopTraining')
                for fn in self.callbacks_handler.hook_lists['on_train_stopped']:
                    fn(stop)
            try:
                if self.interrupted is None:    # the end-of-training evaluation belongs to the run's real end
                    self.auto_execute_end_of_training()
                self.callbacks_handler.execute_train_end()
            except StopTraining:
                pass
            self.message_service.end_of_training_trigger()
            self.wait_for_pending_saves()
            self.wait_for_uploads()
        except BaseException as exc:
            self.callbacks_handler.execute_exception(exc)
            try:
                self.wait_for_pending_saves()
            except Exception:
                logger.exception('A background checkpoint write failed while fit was failing with %r', exc)
            self.wait_for_uploads(after_exception=True)
            raise
        return self.model

    def wait_for_pending_saves(self) -> None:
        """Wait until the checkpoints the saving callbacks write in the background are complete (the end of fit
        does this); a failed background write is raised here."""
        # Saving callbacks write checkpoints in the background and wait in their own on_train_end; this also covers
        # a fit whose on_train_end was cut short (StopTraining raised there by an earlier callback).
        for callback in self.callbacks:
            wait = getattr(callback, 'wait_for_pending_save', None)
            if callable(wait):
                wait()

    def wait_for_uploads(self, after_exception: bool = False) -> List[Any]:
        """Wait for the experiment's pending cloud uploads (the end of fit does this) and return the ones that
        failed; they are also added to ``upload_failures``. The local files are complete either way."""
        if self.experiment is None:
            return []
        failures = self.experiment.wait_for_uploads(after_exception)
        self.upload_failures += failures
        return failures

    def _find_train_step_owner(self):
        owners: List[Any] = [cb for cb in self.callbacks if 'train_step' in cb.hooks_in_use()]
        model_step = getattr(self.model, 'train_step', None)
        if callable(model_step):
            owners.append(self.model)
        if len(owners) > 1:
            raise ValueError(f'only one callback (or the model) may own the training step, but train_step is defined '
                             f'by {[type(o).__name__ for o in owners]}: keep one of them')
        return owners[0] if owners else None

    def _epochs_for_iterations(self, num_iterations):
        try:
            return math.ceil(num_iterations / max(len(self.train_loader), 1))
        except TypeError:
            return None       # a loader without len(): epochs last until the data runs out

    def _train_epochs(self):
        epoch = self.epochs_completed
        num_epochs = self.num_epochs or 0      # None only with num_iterations (a loader without len())
        if not self.num_iterations and epoch >= num_epochs:
            logger.warning('Nothing to train: %d epochs are already done and num_epochs=%d is the total; pass a '
                           'larger num_epochs to continue', epoch, self.num_epochs)
        # With num_iterations the batch count decides (num_epochs is only an estimate then: a previous
        # fit may have ended mid-epoch).
        self._epochs_running = True
        try:
            self._train_epochs_from(epoch, num_epochs)
        finally:
            self._epochs_running = False

    def _train_epochs_from(self, epoch, num_epochs):
        handler = self.callbacks_handler
        while not self._iterations_done() if self.num_iterations else epoch < num_epochs:
            iteration_before = self.total_iteration_idx
            self.epoch = self.train_history.current_epoch = epoch
            self.loss_batch_accum = []
            handler.execute_epoch_begin()
            hooks = handler.hook_lists
            custom_step = self.train_step_owner is not None
            for self.iteration, batch_data, self._is_last_batch in self._batches():
                self.total_iteration_idx += 1
                self.batch = batch_data
                for fn in hooks['on_batch_begin']:
                    fn()
                if custom_step:
                    self._run_custom_step(batch_data)
                else:
                    self._train_step(batch_data)
                for fn in hooks['on_batch_end']:
                    fn()
                if self._is_last_batch:
                    break
            for fn in hooks['on_train_epoch_end']:
                fn()
            if self.total_iteration_idx == iteration_before and self.num_iterations:
                raise ValueError(f'train_loader yielded no batches in epoch {epoch}; fit(num_iterations='
                                 f'{self.num_iterations}) cannot make progress')
            self.epochs_completed = epoch + 1
            self.auto_execute_end_of_epoch()
            handler.execute_epoch_end()
            self.message_service.end_of_epoch_trigger()
            if self._agree_on_early_stop():
                logger.info('Early stopping after epoch %d', epoch)
                break
            epoch += 1

    def _iterations_done(self):
        num_iterations = self.num_iterations
        return bool(num_iterations) and self.total_iteration_idx + 1 >= (num_iterations or 0)

    def _batches(self):
        """Yield (index, batch, is_last). is_last marks the end of the epoch (or of num_iterations) so the
        last partial gradient-accumulation window is applied. Sized loaders use len() so that batches
        are fetched exactly when a hand-written loop would fetch them; others look one batch ahead."""
        remaining = self.num_iterations - (self.total_iteration_idx + 1) if self.num_iterations else None
        iterator, start, loader = self._open_epoch()
        sized = not isinstance(getattr(loader, 'dataset', None), IterableDataset)
        try:
            length = len(loader) if sized else None
        except TypeError:
            length = None
        if length is not None:
            last = length - 1 if remaining is None else min(length, start + remaining) - 1
            for i, batch in enumerate(iterator, start):
                yield i, batch, i == last
            return
        try:
            batch = next(iterator)
        except StopIteration:
            return
        i = start
        while True:
            try:
                upcoming = next(iterator)
            except StopIteration:
                yield i, batch, True
                return
            yield i, batch, remaining is not None and i - start == remaining - 1
            batch, i = upcoming, i + 1

    def _open_epoch(self):
        """The train loader's iterator for the epoch now starting, the index of its first batch (after the
        batches a mid-epoch checkpoint already trained, when the run resumes inside this epoch) and the loader it
        comes from (the epoch's number of batches is its len())."""
        plan, self.resume_plan = self.resume_plan, None
        if plan is not None and plan.resumes_inside(self.epoch):
            return plan.reopen_epoch(cast('TrainLoop', self))
        self.epoch_start_rng = loop_state.capture_rng_state(self)
        self.epoch_samples_offset = 0
        return iter(self.train_loader), 0, self.train_loader

    def _agree_on_early_stop(self):
        if self.world_size == 1:
            return self.early_stop
        flag = torch.tensor([1.0 if self.early_stop else 0.0], device=self._collective_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.early_stop = bool(flag.item())
        return self.early_stop
