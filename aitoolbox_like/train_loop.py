"""TrainLoop: the training loop. Everything beyond fit / evaluate / predict is a callback.

The event order of one fit (see docs/event-order.md):

    register callbacks -> on_train_loop_registration
    [DDP worker] on_multiprocess_start
    on_train_begin
    for each epoch:
        on_epoch_begin
        for each batch:
            on_batch_begin
            loss = get_loss(batch) under autocast; backward(loss / grad_accumulation)
            on_after_backward
            if update step:
                unscale (fp16); for each optimizer idx:
                    on_after_gradient_update(idx); step; on_after_optimizer_step; zero_grad
            on_batch_end
        end-of-epoch evaluation -> history 'accumulated_loss', 'loss', 'val_loss'
        on_epoch_end
        stop if early_stop
    end-of-training evaluation -> history 'train_end_test_loss'
    on_train_end
    (on any exception: on_exception(exc), then re-raise)

TrainLoop is made of parts, one idea each (aitoolbox_like/loop/): training.py (a fit in this process: the epochs and
their batches), step.py (one training step and the optimizer update), evaluation.py (losses and predictions over a
loader, the end-of-epoch evaluation). This module holds TrainLoop's construction and run state, its devices, and
fit's entry (its arguments and the gpu_mode); and AIToolbox's tracking loops, a TrainLoop with savers registered.
"""
import contextlib
import datetime
import inspect
import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from . import distributed, loop_state
from .amp import AmpPolicy
from .console import default_console_output, in_notebook
from .devices import cuda_is_available
from .callbacks.abstract import AbstractCallback
from .callbacks.defaults import checkpoint_saver, end_saver     # the tracking loops' savers (no callback library here)
from .callbacks.handler import CallbacksHandler
from .experiment import normalize_cloud_save_mode
from .history import TrainingHistory
from .loop.checks import check_fit_inputs, check_fit_keywords
from .loop.checks import launcher_parameters  # noqa: F401  (kept importable from here)
from .loop.evaluation import EVAL_LOSS_WEIGHTINGS, EvaluationMixin
from .loop.step import StepMixin
from .loop.training import TrainingMixin
from .message_passing import MessageService
from .model import CompiledFeed, ModelWrap, resolve_model
from .multi_loss_optim import MultiOptimizer
from .parallel import TTDataParallel
from .predictions import append_predictions, torch_cat_transf
from .storage.base import validate_key_part

if TYPE_CHECKING:
    from .experiment import Experiment, ExperimentUploader

logger = logging.getLogger(__name__)

GPU_MODES = ('single', 'dp', 'ddp', 'fsdp')


class TrainLoop(EvaluationMixin, StepMixin, TrainingMixin):
    """Train a TTModel (or ModelWrap) with an optimizer and a criterion, extended by callbacks.

    Construction accepts ``None`` for the loaders, the optimizer and the criterion (a loop that only
    predicts, or whose optimizer a callback sets later); each method checks what it is about to use:
    ``fit`` checks the loaders and the optimizer before the first step, ``predict_on_*`` /
    ``evaluate_loss_on_*`` the loader they read.

    Args:
        model: TTModel, TTBasicModel or ModelWrap.
        train_loader: a DataLoader or any iterable of batches, or None.
        validation_loader: a DataLoader or any iterable of batches, or None.
        test_loader: a DataLoader or any iterable of batches, or None.
        optimizer: a torch optimizer, a MultiOptimizer, any object with step() and zero_grad(), or None.
        criterion: passed to the model's get_loss: any callable, or None if the model does not need one.
        collate_batch_pred_fn: how one batch's predictions are added to the collected list.
        pred_transform_fn: how the collected list becomes the final predictions (default torch.cat).
        end_auto_eval (bool or int): compute 'loss'/'val_loss' after every epoch (True), never (False)
            or every k epochs (int k); also controls the end-of-training test loss.
        lazy_experiment_save (bool): for tracking loops: create experiment folders only when first used.
        print_callbacks (bool): print the registered callbacks at the start of fit.
        gpu_mode: 'single', 'dp' (torch.nn.DataParallel over the visible GPUs in this process) or 'ddp'
            (DistributedDataParallel, one process per GPU; see docs/distributed.md) or 'fsdp' (torch's FSDP2:
            parameters, gradients and optimizer state sharded over the processes).
        cuda_device_idx (int or None): which GPU in 'single' mode (CPU when CUDA is unavailable).
        use_amp: False, True / 'fp16' (CUDA, with GradScaler), 'bf16' (CPU or CUDA), or a dict of
            GradScaler arguments.
        progress_bar (bool or None): tqdm progress bar; None shows it when stderr is a terminal and in a Jupyter
            notebook (tqdm's notebook bar, with the ``notebook`` extra's ipywidgets), not when output goes to a file.
        compile (bool or dict): ``torch.compile`` the model (True, or a dict of ``torch.compile`` arguments such
            as ``{'mode': 'max-autotune'}``). A model passed already compiled (``torch.compile(model)``) is used
            as it is. Either way ``model`` is the plain module (checkpoints have no ``_orig_mod.`` prefix) and
            the forward passes go through ``compiled_model``. The DDP and DataParallel modes run their
            wrapper's forward, which is not compiled.
        eval_loss_weighting: how an evaluated loss ('loss', 'val_loss', ``evaluate_loss_on_*``) averages the
            batches: ``'batch'`` (AIToolbox's: the mean of the per-batch mean losses) or ``'sample'`` (weighted by
            batch size, so a smaller last batch does not count as much as a full one: the mean over samples).
            Also settable as ``loop.eval_loss_weighting`` before an evaluation.
    """

    def __init__(self, model: Any, train_loader: Any, validation_loader: Any, test_loader: Any, optimizer: Any,
                 criterion: Any, collate_batch_pred_fn: Callable[[Any, List[Any]], List[Any]] = append_predictions,
                 pred_transform_fn: Callable[[List[Any]], Any] = torch_cat_transf,
                 end_auto_eval: Union[bool, int] = True, lazy_experiment_save: bool = False,
                 print_callbacks: bool = False, gpu_mode: str = 'single', cuda_device_idx: Optional[int] = None,
                 use_amp: Union[bool, str, Dict[str, Any]] = False, progress_bar: Optional[bool] = None,
                 compile: Union[bool, Dict[str, Any]] = False, eval_loss_weighting: str = 'batch') -> None:
        if isinstance(compile, dict):
            self.compile_options: Optional[Dict[str, Any]] = dict(compile)
        elif isinstance(compile, bool):
            self.compile_options = {} if compile else None
        else:
            raise TypeError(f'compile must be False, True or a dict of torch.compile arguments, got {compile!r}')
        self.model, self._feed = resolve_model(model, self.compile_options)
        # The torch.compile'd module the forward passes go through (None when not compiled); ``model`` is the
        # plain module, which is trained, saved and loaded (its state_dict keys have no '_orig_mod.' prefix).
        self.compiled_model: Optional[torch.nn.Module] = \
            self._feed.compiled_module if isinstance(self._feed, CompiledFeed) else None
        self.batch_model_feed_def = model.batch_model_feed_def if isinstance(model, ModelWrap) else None
        if gpu_mode not in GPU_MODES:
            raise ValueError(f'gpu_mode must be one of {GPU_MODES}, got {gpu_mode!r}')
        if eval_loss_weighting not in EVAL_LOSS_WEIGHTINGS:
            raise ValueError(f'eval_loss_weighting must be one of {EVAL_LOSS_WEIGHTINGS}, got {eval_loss_weighting!r}')
        self.eval_loss_weighting = eval_loss_weighting
        if isinstance(end_auto_eval, bool) or end_auto_eval is None:
            end_auto_eval = bool(end_auto_eval)
        elif not isinstance(end_auto_eval, int) or end_auto_eval < 1:
            raise ValueError(f'end_auto_eval must be True, False or an epoch interval >= 1, got {end_auto_eval!r}')

        self.train_loader = train_loader
        self.validation_loader = validation_loader
        self.test_loader = test_loader
        self.optimizer = optimizer
        self.criterion = criterion
        self.collate_batch_pred_fn = collate_batch_pred_fn
        self.pred_transform_fn = pred_transform_fn
        self.end_auto_eval = end_auto_eval
        self.lazy_experiment_save = lazy_experiment_save
        self.print_callbacks = print_callbacks
        self.gpu_mode = gpu_mode
        self.cuda_device_idx = cuda_device_idx
        self.progress_bar = (sys.stderr.isatty() or in_notebook()) if progress_bar is None else bool(progress_bar)

        self.device = self._select_device(cuda_device_idx)
        self._amp = AmpPolicy(use_amp, self.device)
        # The user's flag, as AIToolbox keeps it (True for True or a dict of GradScaler arguments), also where it
        # cannot be honoured (use_amp=True without CUDA trains in full precision): ``precision`` says what is used.
        self.use_amp: Union[bool, str] = True if isinstance(use_amp, dict) else (use_amp or False)
        self.amp_scaler_init: Dict[str, Any] = dict(use_amp) if isinstance(use_amp, dict) else {}
        self.amp_scaler = self._amp.scaler

        # ---- run state: everything a fit carries is declared here and documented in docs/loop-state.md.
        self.experiment_timestamp = datetime.datetime.now().strftime('%Y-%m-%d_%H-%M-%S')
        self.train_history = TrainingHistory(has_validation=validation_loader is not None)
        # position
        self._epochs_running = False    # True while fit trains epochs (see the epoch property)
        self.epochs_completed = 0       # the next fit starts at this epoch
        self.epoch = 0
        self.iteration = 0
        self.total_iteration_idx = -1
        self.num_epochs: Optional[int] = None
        self.num_iterations: Optional[int] = None
        self.grad_accumulation = 1
        # the step
        self.batch: Any = None          # the batch being trained (kept until the next one)
        self.loss: Any = None           # its loss, not detached: on_after_loss may replace it
        self.train_step_owner: Any = None   # the callback or model owning the step (train_step), or None
        self.optimizer_idx = 0
        self.update_applied: List[bool] = []    # per optimizer: did the last update step change its weights
        self.loss_batch_accum: List[Any] = []
        self.early_stop = False
        # Why the latest fit stopped before its end, leaving a checkpoint to continue from (e.g. 'received SIGINT'),
        # or None when it trained to its end (early stopping included). Code after fit reads it before treating the
        # model as trained; `aitoolbox-like train` exits with status 130 then.
        self.interrupted: Optional[str] = None
        self.grad_cb_used = False       # AIToolbox callbacks set it; dispatch does not need it
        # distributed run
        self.ddp_training_mode = False
        self.ddp_model: Optional[torch.nn.Module] = None   # the DDP wrapper while a DDP fit runs; model stays plain
        self.distributed_samplers: Optional[Tuple[Any, Any, Any]] = None   # (train, val, test) in a DDP fit
        self.running_rank_restricted_callback: Optional[AbstractCallback] = None
        # experiment and resume
        self.experiment: Optional[Experiment] = None   # the experiment folder, set by the first saving callback
        self.experiment_uploader: Optional[ExperimentUploader] = None
        self.upload_failures: List[Any] = []    # uploads that had failed when fit ended
        # More text files for the experiment folder's root, {file name: text}, written atomically next to the
        # hyperparameter files and uploaded with them (rewritten when the text changes: a resumed run's own);
        # the recipe command line puts the resolved recipe.yaml and command_line.txt here.
        self.experiment_files: Dict[str, str] = {}
        self.resume_plan: Optional[loop_state.ResumePlan] = None
        # With a checkpoint callback, a fit also gets PreemptionCheckpoint (SIGTERM / SIGINT save and stop cleanly;
        # callbacks/defaults.py); the tracking loops take it as an argument.
        self.preemption_safe = True
        # How a stopped run continues, in the messages that say so ({experiment_dir}: the experiment folder). None:
        # fit(resume_from='latest'); the command line sets 'aitoolbox-like resume {experiment_dir}'.
        self.resume_hint: Optional[str] = None
        self.epoch_start_rng: Optional[Dict[str, Any]] = None   # RNG state at this epoch's start (mid-epoch resume)
        # Samples of this epoch's data order (over every process) trained before its first batch index 0: not 0
        # only in an epoch resumed on another number of processes than its checkpoint's, whose batches then cover
        # what was left of the order (loop_state.samples_done_in_epoch).
        self.epoch_samples_offset = 0
        # callbacks
        self.callbacks: List[AbstractCallback] = []
        self.callbacks_handler = CallbacksHandler(self)
        self.message_service = MessageService()     # callbacks pass data to each other through it (AIToolbox's)

        self._is_last_batch = False
        self._eval_cache: Dict[Any, Any] = {}
        self._step_counters: Dict[int, Tuple[Any, Optional[List[int]]]] = {}   # id(optimizer) -> (it, steps)
        self._last_amp_scale: Optional[float] = None

    def _select_device(self, cuda_device_idx):
        if cuda_is_available():
            if cuda_device_idx is not None and not 0 <= cuda_device_idx < torch.cuda.device_count():
                raise ValueError(f'cuda_device_idx={cuda_device_idx} but only {torch.cuda.device_count()} GPUs '
                                 f'are visible')
            return torch.device('cuda' if cuda_device_idx is None else f'cuda:{cuda_device_idx}')
        if cuda_device_idx is not None:
            logger.warning('cuda_device_idx=%s ignored: CUDA is not available, training on CPU', cuda_device_idx)
        return torch.device('cpu')

    @property
    def global_rank(self) -> int:
        """This process's rank in a distributed run (0 otherwise)."""
        return distributed.get_rank()

    @property
    def world_size(self) -> int:
        """How many processes train together (1 outside a distributed run)."""
        return distributed.get_world_size()

    def is_main_process(self) -> bool:
        """True in the process of global rank 0 (always in a single-process run)."""
        return self.global_rank == 0

    def _collective_device(self):
        return self.device if dist.get_backend() == 'nccl' else torch.device('cpu')

    def move_to_device(self, device: torch.device) -> None:
        """Train on ``device`` from now on (a DDP process takes its own GPU, or the CPU). The mixed-precision
        choice is kept; the GradScaler is rebuilt when the device type changes."""
        device = torch.device(device)
        if device.type != self.device.type:
            self._amp = AmpPolicy(self.amp_scaler_init or self.use_amp, device)
            self.amp_scaler = self._amp.scaler
        self.device = device

    @contextlib.contextmanager
    def distributed_model(self, ddp_model: torch.nn.Module) -> Iterator[None]:
        """Within the block, forward passes go through ``ddp_model`` (the DistributedDataParallel wrapper of
        ``model``) and ``ddp_model`` is set; ``model`` stays the plain module. Used by each DDP process."""
        plain_feed = self._feed
        if self.compiled_model is not None:
            logger.warning('gpu_mode=%r: the training forward passes go through the DDP wrapper, which is not '
                           'torch.compile\'d; evaluation uses the compiled model', self.gpu_mode)
        self.ddp_model = ddp_model
        self._feed = distributed.DDPFeed(ddp_model, plain_feed, self.batch_model_feed_def)
        try:
            yield
        finally:
            self._feed = plain_feed
            self.ddp_model = None

    @property
    def epoch(self) -> int:
        """The epoch being trained (0-based); after a fit, the last epoch trained. Set before training starts
        (before ``fit``, or from on_train_loop_registration / on_train_begin), it says where training continues:
        ``loop.epoch = 5; loop.fit(num_epochs=6)`` trains epoch 5 only, as in AIToolbox."""
        return self._epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self._epoch = value
        if not self._epochs_running:
            # AIToolbox code continues training by setting the epoch (its loop runs range(loop.epoch, num_epochs)).
            self.epochs_completed = value

    @property
    def epochs_running(self) -> bool:
        """True while ``fit`` trains its epochs; False before (registration, on_train_begin), after (the
        end-of-training evaluation, on_train_end) and when AIToolbox code drives the hooks by hand."""
        return self._epochs_running

    @property
    def precision(self) -> str:
        """The precision the forward passes actually run in: ``'fp16'`` (float16 autocast with the GradScaler),
        ``'bf16'`` (bfloat16 autocast) or ``'fp32'`` (full precision: no ``use_amp``, or ``use_amp=True`` on a device
        without float16 AMP). ``use_amp`` keeps what was asked for."""
        return self._amp.mode or 'fp32'

    @property
    def num_optimizers(self) -> int:
        """How many optimizers the loop steps (AIToolbox's attribute)."""
        return len(self.optimizers)

    @property
    def ddp_rank(self) -> Optional[int]:
        """The global rank in a DDP fit, None otherwise (AIToolbox's attribute; see ``global_rank``)."""
        return self.global_rank if self.ddp_training_mode else None

    @property
    def optimizers(self) -> Sequence[Any]:
        """The optimizers the loop steps, in optimizer_idx order (one unless a MultiOptimizer is used).
        Derived from ``optimizer`` on every read, so a callback may swap ``loop.optimizer`` during training."""
        optimizer = self.optimizer
        return optimizer.optimizer_list if isinstance(optimizer, MultiOptimizer) else (optimizer,)

    def __call__(self, num_epochs=0, num_iterations=0, callbacks=None, grad_accumulation=1, **kwargs):
        return self.fit(num_epochs, num_iterations, callbacks, grad_accumulation, **kwargs)

    def fit(self, num_epochs: int = 0, num_iterations: int = 0, callbacks: Optional[Sequence[AbstractCallback]] = None,
            grad_accumulation: int = 1, resume_from: Any = None, **kwargs: Any) -> torch.nn.Module:
        """Train and return the model.

        Args:
            num_epochs (int): train until this many epochs are done in total (a second fit continues
                from the next epoch). Exactly one of num_epochs / num_iterations is given.
            num_iterations (int): train until this many batches are done in total; works with loaders
                that have no len() (IterableDataset).
            callbacks (list): AbstractCallback instances; a callback already registered is kept once.
            grad_accumulation (int): micro-batches per optimizer update; the last partial window of an
                epoch is applied too.
            resume_from: continue an interrupted run from a checkpoint: a file path, an experiment folder,
                's3://bucket/key' (or gs://, az://) or 'latest' (see docs/saving-and-resuming.md); 'auto': from the
                run's newest checkpoint when there is one (local, else its cloud copy, or a callback's such as Ray
                Train's), else start from scratch, for scripts that a launcher restarts (docs/distributed.md). 'auto'
                needs a callback that writes checkpoints.

        Returns:
            The model. When training stopped before its end with a checkpoint to continue from (Ctrl-C, a
            scheduler's SIGTERM, a time budget: see PreemptionCheckpoint), fit returns too, and ``loop.interrupted``
            says why (None after a run that trained to its end, early stopping included): read it before treating
            the model as trained.
        """
        check_fit_keywords(self, kwargs)
        for name, value in (('num_epochs', num_epochs), ('num_iterations', num_iterations),
                            ('grad_accumulation', grad_accumulation)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f'{name} must be a non-negative int, got {value!r}')
        if (num_epochs > 0) == (num_iterations > 0):
            raise ValueError(f'give exactly one of num_epochs and num_iterations (got num_epochs={num_epochs}, '
                             f'num_iterations={num_iterations})')
        if grad_accumulation < 1:
            raise ValueError('grad_accumulation must be >= 1')
        if resume_from is not None and not isinstance(resume_from, (str, os.PathLike, dict)):
            raise TypeError(f"resume_from must be a checkpoint path, an experiment folder, 's3://bucket/key' (gs://, "
                            f"az://), 'latest' or a loaded checkpoint dict, got {type(resume_from).__qualname__}")
        # What can be judged before any process starts; the rest once callbacks are registered (a callback
        # may build the loaders in each DDP process or set the optimizer).
        check_fit_inputs(self, self._amp.unavailable, final=False)
        if resume_from == loop_state.AUTO:
            loop_state.check_auto_resume(self, callbacks)
        # The plan travels with the loop into each DDP process, which loads the checkpoint itself.
        self.resume_plan = loop_state.ResumePlan(resume_from) if resume_from is not None else None
        with default_console_output():
            return self._fit(num_epochs, num_iterations, callbacks, grad_accumulation, **kwargs)

    def _fit(self, num_epochs, num_iterations, callbacks, grad_accumulation, **kwargs):
        try:
            if self.gpu_mode == 'ddp':
                from .ddp_launch import fit_ddp
                return fit_ddp(self, num_epochs, num_iterations, callbacks, grad_accumulation, **kwargs)
            if self.gpu_mode == 'fsdp':
                from .ddp_launch import fit_fsdp
                return fit_fsdp(self, num_epochs, num_iterations, callbacks, grad_accumulation, **kwargs)
            if self.gpu_mode == 'dp':
                return self._fit_data_parallel(num_epochs, num_iterations, callbacks, grad_accumulation, **kwargs)
            return self.train_in_this_process(num_epochs, num_iterations, callbacks, grad_accumulation)
        finally:
            self.resume_plan = None

    def _fit_data_parallel(self, num_epochs, num_iterations, callbacks, grad_accumulation, dp_model_args=None):
        # Any other keyword argument: fit() has refused it already (check_fit_keywords).
        if not isinstance(self.model, torch.nn.DataParallel):
            if self.compiled_model is not None:
                logger.warning("gpu_mode='dp': the DataParallel wrapper's forward is not torch.compile'd")
                self.compiled_model = None
            # As in AIToolbox, the loop's model becomes the wrapper (one process, so nothing else sees the plain
            # module); its state_dict keys then start with 'module.'.
            self.model.to(self.device)
            args = dict(dp_model_args or {})
            if self.batch_model_feed_def is None:
                self.model, self._feed = resolve_model(TTDataParallel(self.model, **args))
            else:
                self.model, self._feed = resolve_model(
                    ModelWrap(torch.nn.DataParallel(self.model, **args), self.batch_model_feed_def))
        return self.train_in_this_process(num_epochs, num_iterations, callbacks, grad_accumulation)

    def move_criterion_to_device(self) -> None:
        """Move the criterion to ``device`` when it can be moved: AIToolbox calls ``criterion.to(device)`` on
        whatever it is given (an nn.Module, a MultiLoss-style object, a user's class with ``to``)."""
        move = getattr(self.criterion, 'to', None)
        if callable(move):
            moved = move(self.device)
            if moved is not None:       # nn.Module.to returns the module; a duck-typed to() may return nothing
                self.criterion = moved

    def how_to_resume(self) -> str:
        """How to continue this run after it stopped, for messages: ``resume_hint`` with the experiment folder filled
        in (the command line's ``aitoolbox-like resume <folder>``), else ``fit(resume_from='latest')``."""
        if self.resume_hint and self.experiment is not None:
            return self.resume_hint.format(experiment_dir=self.experiment.dir_path)
        return "fit(resume_from='latest')"


# ---------------------------------------------------------------------------------------------- tracking loops
# AIToolbox's TrainLoopCheckpoint, TrainLoopEndSave and TrainLoopCheckpointEndSave (documented in tracking.py, their
# own module): defined here, beside TrainLoop, where AIToolbox's train_loop package and DESIGN.md offer them too;
# their saving callbacks come from callbacks/defaults.py, so this module names no callback library.


def _caller_file():
    """The file of the code that created the tracking loop: the first caller outside this module (so the
    subclasses' __init__ chains need no depth bookkeeping)."""
    frame = inspect.currentframe()
    try:
        while frame is not None and frame.f_globals.get('__name__') == __name__:
            frame = frame.f_back
        return os.path.abspath(frame.f_code.co_filename) if frame is not None else None
    finally:
        del frame


class _TrackingMixin(TrainLoop):
    """What the tracking loops add to a TrainLoop: the experiment's names and where it is saved."""

    def _set_tracking_attributes(self, project_name, experiment_name, local_model_result_folder_path, hyperparams,
                                 cloud_save_mode, bucket_name, cloud_dir_prefix, source_dirs, caller_file):
        validate_key_part(project_name, 'project_name')
        validate_key_part(experiment_name, 'experiment_name')
        normalize_cloud_save_mode(cloud_save_mode)
        if hyperparams is None:
            hyperparams = {}
        if not isinstance(hyperparams, dict):
            raise TypeError(f'hyperparams must be a dict, got {type(hyperparams).__qualname__}')
        self.project_name = project_name
        self.experiment_name = experiment_name
        self.local_model_result_folder_path = os.path.expanduser(os.fspath(local_model_result_folder_path))
        # As in AIToolbox, the dict is completed in place so the caller sees what is saved.
        if 'experiment_file_path' not in hyperparams and caller_file:
            hyperparams['experiment_file_path'] = caller_file
        if 'source_dirs_paths' not in hyperparams:
            # As given (AIToolbox's default is the tuple ()): the saved hyperparameters show what the caller passed.
            hyperparams['source_dirs_paths'] = source_dirs
        self.hyperparams = hyperparams
        self.cloud_save_mode = cloud_save_mode
        self.bucket_name = bucket_name
        self.cloud_dir_prefix = cloud_dir_prefix
        self.source_dirs = source_dirs

    def _register_checkpoint_callback(self, rm_subopt_local_models, num_best_checkpoints_kept, iteration_save_freq):
        if isinstance(iteration_save_freq, bool) or not isinstance(iteration_save_freq, int) or iteration_save_freq < 0:
            raise ValueError(f'iteration_save_freq must be an int >= 0 (0: checkpoint after every epoch), got '
                             f'{iteration_save_freq!r}')
        self.rm_subopt_local_models = rm_subopt_local_models
        self.iteration_save_freq = iteration_save_freq
        args = (self.project_name, self.experiment_name, self.local_model_result_folder_path, self.hyperparams)
        kwargs = dict(cloud_save_mode=self.cloud_save_mode, bucket_name=self.bucket_name,
                      cloud_dir_prefix=self.cloud_dir_prefix, rm_subopt_local_models=rm_subopt_local_models,
                      num_best_checkpoints_kept=num_best_checkpoints_kept)
        callback = checkpoint_saver(iteration_save_freq, *args, **kwargs)
        self.callbacks_handler.register_callbacks([callback], cache_callbacks=True)


class TrainLoopCheckpoint(_TrackingMixin, TrainLoop):
    """TrainLoop that checkpoints the full training state after every epoch (ModelCheckpoint) or every
    ``iteration_save_freq`` batches (ModelIterationCheckpoint). Arguments as in AIToolbox; see
    ModelCheckpoint for rm_subopt_local_models / num_best_checkpoints_kept."""

    def __init__(self, model, train_loader, validation_loader, test_loader, optimizer, criterion, project_name,
                 experiment_name, local_model_result_folder_path, hyperparams, cloud_save_mode='s3',
                 bucket_name='model-result', cloud_dir_prefix='', source_dirs=(), rm_subopt_local_models=False,
                 num_best_checkpoints_kept=2, iteration_save_freq=0, collate_batch_pred_fn=append_predictions,
                 pred_transform_fn=torch_cat_transf, end_auto_eval=True, lazy_experiment_save=False,
                 print_callbacks=False, gpu_mode='single', cuda_device_idx=None, use_amp=False, progress_bar=None,
                 preemption_safe=True):
        TrainLoop.__init__(self, model, train_loader, validation_loader, test_loader, optimizer, criterion,
                           collate_batch_pred_fn, pred_transform_fn, end_auto_eval, lazy_experiment_save,
                           print_callbacks, gpu_mode, cuda_device_idx, use_amp, progress_bar)
        # Read by callbacks/defaults.py: False leaves out the default PreemptionCheckpoint.
        self.preemption_safe = bool(preemption_safe)
        self._set_tracking_attributes(project_name, experiment_name, local_model_result_folder_path, hyperparams,
                                      cloud_save_mode, bucket_name, cloud_dir_prefix, source_dirs, _caller_file())
        self._register_checkpoint_callback(rm_subopt_local_models, num_best_checkpoints_kept, iteration_save_freq)


class TrainLoopEndSave(_TrackingMixin, TrainLoop):
    """TrainLoop that saves the final model and evaluates the result packages at the end of training
    (ModelTrainEndSave). Arguments as in AIToolbox."""

    def __init__(self, model, train_loader, validation_loader, test_loader, optimizer, criterion, project_name,
                 experiment_name, local_model_result_folder_path, hyperparams, val_result_package=None,
                 test_result_package=None, cloud_save_mode='s3', bucket_name='model-result', cloud_dir_prefix='',
                 source_dirs=(), collate_batch_pred_fn=append_predictions, pred_transform_fn=torch_cat_transf,
                 end_auto_eval=True, lazy_experiment_save=False, print_callbacks=False, gpu_mode='single',
                 cuda_device_idx=None, use_amp=False, progress_bar=None, preemption_safe=True):
        TrainLoop.__init__(self, model, train_loader, validation_loader, test_loader, optimizer, criterion,
                           collate_batch_pred_fn, pred_transform_fn, end_auto_eval, lazy_experiment_save,
                           print_callbacks, gpu_mode, cuda_device_idx, use_amp, progress_bar)
        self.preemption_safe = bool(preemption_safe)     # read by callbacks/defaults.py
        self._set_tracking_attributes(project_name, experiment_name, local_model_result_folder_path, hyperparams,
                                      cloud_save_mode, bucket_name, cloud_dir_prefix, source_dirs, _caller_file())
        self.val_result_package = val_result_package
        self.test_result_package = test_result_package
        self.check_if_result_packages_possible()
        self.callbacks_handler.register_callbacks([end_saver(
            self.project_name, self.experiment_name, self.local_model_result_folder_path, self.hyperparams,
            val_result_package, test_result_package, cloud_save_mode=cloud_save_mode, bucket_name=bucket_name,
            cloud_dir_prefix=cloud_dir_prefix)], cache_callbacks=True)

    def check_if_result_packages_possible(self):
        if self.val_result_package is None and self.test_result_package is None:
            raise ValueError('give val_result_package and/or test_result_package (both are None)')
        if self.val_result_package is not None and self.validation_loader is None:
            raise ValueError('val_result_package was given but validation_loader is None')
        if self.test_result_package is not None and self.test_loader is None:
            raise ValueError('test_result_package was given but test_loader is None')
        for package in (self.val_result_package, self.test_result_package):
            if package is not None and not callable(getattr(package, 'prepare_result_package', None)):
                raise TypeError(f'result packages must be AbstractResultPackage instances, got '
                                f'{type(package).__qualname__}')


class TrainLoopCheckpointEndSave(TrainLoopEndSave):
    """TrainLoopEndSave plus a checkpoint after every epoch (or every ``iteration_save_freq`` batches)."""

    def __init__(self, model, train_loader, validation_loader, test_loader, optimizer, criterion, project_name,
                 experiment_name, local_model_result_folder_path, hyperparams, val_result_package=None,
                 test_result_package=None, cloud_save_mode='s3', bucket_name='model-result', cloud_dir_prefix='',
                 source_dirs=(), rm_subopt_local_models=False, num_best_checkpoints_kept=2, iteration_save_freq=0,
                 collate_batch_pred_fn=append_predictions, pred_transform_fn=torch_cat_transf, end_auto_eval=True,
                 lazy_experiment_save=False, print_callbacks=False, gpu_mode='single', cuda_device_idx=None,
                 use_amp=False, progress_bar=None, preemption_safe=True):
        TrainLoopEndSave.__init__(self, model, train_loader, validation_loader, test_loader, optimizer, criterion,
                                  project_name, experiment_name, local_model_result_folder_path, hyperparams,
                                  val_result_package, test_result_package, cloud_save_mode, bucket_name,
                                  cloud_dir_prefix, source_dirs, collate_batch_pred_fn, pred_transform_fn,
                                  end_auto_eval, lazy_experiment_save, print_callbacks, gpu_mode, cuda_device_idx,
                                  use_amp, progress_bar, preemption_safe)
        self._register_checkpoint_callback(rm_subopt_local_models, num_best_checkpoints_kept, iteration_save_freq)
