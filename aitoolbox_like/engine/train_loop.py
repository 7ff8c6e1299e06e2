"""TrainLoop: the training loop. Everything beyond fit / evaluate / predict is a callback.

The event order of one fit is docs/event-order.md's (its table of hooks is made from AbstractCallback's methods,
callback.py, which define the hooks and their order).

The class reads top to bottom as a fit runs: construction and run state, fit's entry, a fit in this process, the
epochs, the training step, evaluation. What it is built on lives beside it: the callback base (callback.py), the
handler that fires hooks (handler.py), what fit checks and how a failed step is explained (checks.py), the loop's
state as a checkpoint and resuming from it (loop_state), the evaluation passes, their cache and the end-of-epoch
evaluation (evaluation.py). Mixed precision and the GradScaler's steps are amp.py's.
"""
import contextlib
import datetime
import logging
import math
import os
import sys
from typing import (TYPE_CHECKING, Any, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence, Tuple, Type,
                    Union)

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset

from .. import distributed
from ..runtime.amp import AmpPolicy
from ..runtime.console import default_console_output, in_notebook
from ..runtime.devices import cuda_is_available
from ..experiment.layout import CHECKPOINT_DIR
from .history import TrainingHistory
from .message_passing import MessageService
from ..model.feeds import BatchFeed, CompiledFeed, ModelWrap, resolve_model
from ..model.multi_loss_optim import MultiLoss, MultiOptimizer
from ..model.predictions import append_predictions, torch_cat_transf
from ..runtime.prefetch import DevicePrefetcher, prefetch_applies
from . import loop_state
from .callback import AbstractCallback, AbstractScheduler, StopTraining, TrainingInterrupted
from .checks import (ForeignMethod, check_fit_inputs, check_fit_keywords, explain_step_failure,
                     loss_to_record, names_foreign_keywords)
from .evaluation import EVAL_LOSS_WEIGHTINGS, Evaluation
from .handler import CallbacksHandler, import_object
from .steering import RunSteering, StepRequestError, close_window_across_ranks

if TYPE_CHECKING:
    from ..experiment import Experiment, ExperimentUploader

#: The context of a step outside a DDP fit (no gradient synchronisation to skip): one object, entered each step.
_NOTHING = contextlib.nullcontext()

# Users configure the loop's messages under this name (the module's public path).
logger = logging.getLogger('aitoolbox_like.train_loop')

GPU_MODES = ('single', 'dp', 'ddp', 'fsdp')
#: The loop's interruptible phases (``loop.interruptible_phase``), which a stop may abandon (see TrainingInterrupted):
#: waiting for the next training batch, the end-of-epoch / end-of-training evaluation, and the forward and backward
#: of a compiled model's first training step in a single-process fit (torch.compile's warm-up).
FETCH, EVALUATION, COMPILE = 'fetch', 'evaluation', 'compile'
INTERRUPTIBLE_PHASES = (FETCH, EVALUATION, COMPILE)
#: What no update step leaves in ``update_applied``: the loop sets it before every batch, so a batch whose step
#: updates nothing (a custom train_step that skips its update) leaves every consumer of it where it was.
_NO_UPDATE: Sequence[bool] = ()

#: The callbacks a fit gets without asking (progress bar, LR monitor, the DDP samplers' epoch, the preemption
#: checkpoint) are the callback library's choice: fit imports this function by its path when it starts, so that
#: importing TrainLoop loads no callback library (docs/architecture.md).
DEFAULT_CALLBACKS = 'aitoolbox_like.callbacks.defaults:add_default_callbacks'


class TrainLoop:
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
        criterion: passed to the model's get_loss and get_loss_eval (the loop itself never calls it): any
            callable, or None for a model that computes its own loss (a Hugging Face model in ``HFModelWrap``, a
            get_loss returning ``model(**batch).loss``). A TTBasicModel, whose get_loss calls it, needs one.
        collate_batch_pred_fn: how one batch's predictions are added to the collected list.
        pred_transform_fn: how the collected list becomes the final predictions (default torch.cat).
        end_auto_eval (bool or int): the end-of-epoch evaluation, 'val_loss' (one pass over the validation set),
            after every epoch (True), never (False) or every k epochs (int k); also controls the end-of-training test
            loss. The training loss of each epoch is always in the history, as 'accumulated_loss' (the mean of its
            batches' losses, at no extra cost).
        eval_train_set (bool or None): also evaluate the loss over the whole training set in each end-of-epoch
            evaluation, recorded as 'loss' (AIToolbox's end-of-epoch evaluation: one more pass over the training set
            per epoch). None: the class's default, ``EVAL_TRAIN_SET_DEFAULT``: False here, True for AIToolbox's
            TrainLoop and tracking loops (their AIToolbox module paths, served by ``aitoolbox_like.compat``).
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
        prefetch_to_device (bool or None): on a CUDA device, copy the next training batch to the GPU while the
            current step runs (pinned memory, a side stream; ``aitoolbox_like.runtime.prefetch``), so the step does not wait
            for its copy. None (default): when the train loader has worker processes (``num_workers > 0``), where
            taking the next batch early cannot change what the run computes; True: also with ``num_workers=0``
            (a dataset drawing random numbers in the training process then draws them in another order); False:
            never. No effect on the CPU.
    """

    #: ``eval_train_set``'s value when it is not given: no pass over the training set at the end of an epoch (its
    #: training loss is 'accumulated_loss'). AIToolbox's loops, on its module paths, set True (aitoolbox_like.compat).
    EVAL_TRAIN_SET_DEFAULT = False
    #: The class of ``callbacks_handler`` (AIToolbox's loops give theirs AIToolbox's ``execute_*`` names).
    callbacks_handler_class: Type[CallbacksHandler] = CallbacksHandler

    # Other libraries' trainers take keywords a TrainLoop does not (pytorch-accelerated's callbacks=): each is named
    # with where it belongs here, and the signature stays this one (the decorator keeps it).
    @names_foreign_keywords
    def __init__(self, model: Any, train_loader: Any, validation_loader: Any, test_loader: Any, optimizer: Any,
                 criterion: Any, collate_batch_pred_fn: Callable[[Any, List[Any]], List[Any]] = append_predictions,
                 pred_transform_fn: Callable[[List[Any]], Any] = torch_cat_transf,
                 end_auto_eval: Union[bool, int] = True, lazy_experiment_save: bool = False,
                 print_callbacks: bool = False, gpu_mode: str = 'single', cuda_device_idx: Optional[int] = None,
                 use_amp: Union[bool, str, Dict[str, Any]] = False, progress_bar: Optional[bool] = None,
                 compile: Union[bool, Dict[str, Any]] = False, eval_loss_weighting: str = 'batch',
                 prefetch_to_device: Optional[bool] = None, eval_train_set: Optional[bool] = None) -> None:
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
        if eval_train_set not in (None, True, False):
            raise TypeError(f'eval_train_set must be True, False or None (the default of {type(self).__name__}), got '
                            f'{eval_train_set!r}')

        self.train_loader = train_loader
        self.validation_loader = validation_loader
        self.test_loader = test_loader
        self.optimizer = optimizer
        self.criterion = criterion
        self.collate_batch_pred_fn = collate_batch_pred_fn
        self.pred_transform_fn = pred_transform_fn
        self.end_auto_eval = end_auto_eval
        self.eval_train_set: bool = self.EVAL_TRAIN_SET_DEFAULT if eval_train_set is None else eval_train_set
        self.lazy_experiment_save = lazy_experiment_save
        self.print_callbacks = print_callbacks
        self.gpu_mode = gpu_mode
        self.cuda_device_idx = cuda_device_idx
        self.progress_bar = (sys.stderr.isatty() or in_notebook()) if progress_bar is None else bool(progress_bar)
        if prefetch_to_device not in (None, True, False):
            raise TypeError(f'prefetch_to_device must be None, True or False, got {prefetch_to_device!r}')
        self.prefetch_to_device = prefetch_to_device

        self.device = self._select_device(cuda_device_idx)
        # Mixed precision, and the GradScaler's steps with whether each changed the weights.
        self._amp = AmpPolicy(use_amp, self.device)
        # The user's flag, as AIToolbox keeps it (True for True or a dict of GradScaler arguments), also where it
        # cannot be honoured (use_amp=True without CUDA trains in full precision): ``precision`` says what is used.
        self.use_amp: Union[bool, str] = True if isinstance(use_amp, dict) else (use_amp or False)
        self.amp_scaler_init: Dict[str, Any] = dict(use_amp) if isinstance(use_amp, dict) else {}

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
        self._is_last_batch = False
        # the step
        self.batch: Any = None          # the batch being trained (kept until the next one)
        self.loss: Any = None           # its loss, not detached: on_after_loss may replace it
        self.train_step_owner: Any = None   # the callback or model owning the step (train_step), or None
        self.optimizer_idx = 0
        # per optimizer: did this batch's update step change its weights (empty on a batch without one)
        self.update_applied: Sequence[bool] = _NO_UPDATE
        self.loss_batch_accum: List[Any] = []
        self.early_stop = False
        # what callbacks ask of the run beyond their own state: skip_update(), end_epoch(), agreed by every rank
        self.steering = RunSteering(self)
        # The phase a stop may abandon now (one of INTERRUPTIBLE_PHASES), or None: between two steps, or inside one.
        self.interruptible_phase: Optional[str] = None
        self._history_marks: Dict[str, int] = {}       # the history's lengths before the epoch-end phase
        self._compile_warm = False                     # a compiled model's first training step has run
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
        self.experiment: Optional['Experiment'] = None   # the experiment folder, set by the first saving callback
        self.experiment_uploader: Optional['ExperimentUploader'] = None
        self.upload_failures: List[Any] = []    # uploads that had failed when fit ended
        # More text files for the experiment folder's root, {file name: text}, written atomically next to the
        # hyperparameter files and uploaded with them (rewritten when the text changes: a resumed run's own);
        # the recipe command line puts the resolved recipe.yaml and command_line.txt here.
        self.experiment_files: Dict[str, str] = {}
        self.resume_plan: Optional[loop_state.ResumePlan] = None
        # With a checkpoint callback, a fit also gets PreemptionCheckpoint (SIGTERM / SIGINT save and stop cleanly;
        # the default callbacks); the tracking loops take it as an argument.
        self.preemption_safe = True
        # How a stopped run continues, in the messages that say so ({experiment_dir}: the experiment folder). None:
        # fit(resume_from='latest'); the command line sets 'aitoolbox-like resume {experiment_dir}'.
        self.resume_hint: Optional[str] = None
        self.epoch_start_rng: Optional[Dict[str, Any]] = None   # RNG state at this epoch's start (mid-epoch resume)
        # Samples of this epoch's data order (over every process) trained before its first batch index 0: not 0
        # only in an epoch resumed on another number of processes than its checkpoint's, whose batches then cover
        # what was left of the order (loop_state.samples_done_in_epoch).
        self.epoch_samples_offset = 0
        # the evaluation passes, their results per training position (every callback asking at one point gets the
        # same values) and the end-of-epoch evaluation
        self.evaluation = Evaluation(self)
        # callbacks
        self.callbacks: List[AbstractCallback] = []
        self.callbacks_handler = self.callbacks_handler_class(self)
        self.message_service = MessageService()     # callbacks pass data to each other through it (AIToolbox's)

    # Another library's trainer methods (pytorch-accelerated's train, evaluate), named with what they are here.
    train = ForeignMethod()
    evaluate = ForeignMethod()

    # ---------------------------------------------------------------------------------------- devices and ranks

    def _select_device(self, cuda_device_idx: Optional[int]) -> torch.device:
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

    @property
    def ddp_rank(self) -> Optional[int]:
        """The global rank in a DDP fit, None otherwise (AIToolbox's attribute; see ``global_rank``)."""
        return self.global_rank if self.ddp_training_mode else None

    def move_to_device(self, device: torch.device) -> None:
        """Train on ``device`` from now on (a DDP process takes its own GPU, or the CPU). The mixed-precision
        choice is kept; the GradScaler is rebuilt when the device type changes."""
        device = torch.device(device)
        if device.type != self.device.type:
            self._amp = AmpPolicy(self.amp_scaler_init or self.use_amp, device)
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

    def move_criterion_to_device(self) -> None:
        """Move the criterion to ``device`` when it can be moved: AIToolbox calls ``criterion.to(device)`` on
        whatever it is given (an nn.Module, a MultiLoss-style object, a user's class with ``to``)."""
        move = getattr(self.criterion, 'to', None)
        if callable(move):
            moved = move(self.device)
            if moved is not None:       # nn.Module.to returns the module; a duck-typed to() may return nothing
                self.criterion = moved

    # ---------------------------------------------------------------------------------------- run state read

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
    def is_last_batch(self) -> bool:
        """True during the last batch of the epoch (or of num_iterations)."""
        return self._is_last_batch

    @property
    def precision(self) -> str:
        """The precision the forward passes actually run in: ``'fp16'`` (float16 autocast with the GradScaler),
        ``'bf16'`` (bfloat16 autocast) or ``'fp32'`` (full precision: no ``use_amp``, or ``use_amp=True`` on a device
        without float16 AMP). ``use_amp`` keeps what was asked for."""
        return self._amp.mode or 'fp32'

    @property
    def batch_feed(self) -> BatchFeed:
        """What turns a batch into a loss or predictions: the model itself (a TTModel), a ModelWrap's feed definition
        bound to its model, or during a DDP fit the DDP wrapper's feed (its training loss goes through the wrapper)."""
        return self._feed

    def autocast(self) -> ContextManager[Any]:
        """The context the loop's forward passes run in: ``torch.autocast`` for the precision used (``precision``),
        nothing in full precision. For code that runs the model as the loop does (a custom evaluation)."""
        return self._amp.autocast()

    @property
    def train_loss_name(self) -> str:
        """The history name of the training loss recorded at each end-of-epoch evaluation: 'loss' (the loss over
        the training set) with ``eval_train_set``, else 'accumulated_loss' (the mean of the epoch's batch losses)."""
        return 'loss' if self.eval_train_set and self.end_auto_eval else 'accumulated_loss'

    @property
    def amp_scaler(self) -> torch.amp.GradScaler:
        """The GradScaler of fp16 training (AIToolbox's attribute); a disabled one otherwise, so callbacks can rely on
        it existing."""
        return self._amp.scaler

    @amp_scaler.setter
    def amp_scaler(self, scaler: torch.amp.GradScaler) -> None:
        self._amp.scaler = scaler

    @property
    def optimizers(self) -> Sequence[Any]:
        """The optimizers the loop steps, in optimizer_idx order (one unless a MultiOptimizer is used).
        Derived from ``optimizer`` on every read, so a callback may swap ``loop.optimizer`` during training."""
        optimizer = self.optimizer
        return optimizer.optimizer_list if isinstance(optimizer, MultiOptimizer) else (optimizer,)

    @property
    def num_optimizers(self) -> int:
        """How many optimizers the loop steps (AIToolbox's attribute)."""
        return len(self.optimizers)

    def get_schedulers(self) -> List[AbstractCallback]:
        """The registered learning-rate scheduler callbacks (checkpoints save their state)."""
        return [cb for cb in self.callbacks if isinstance(cb, AbstractScheduler)]

    def how_to_resume(self) -> str:
        """How to continue this run after it stopped, for messages: ``resume_hint`` with the experiment folder filled
        in (the command line's ``aitoolbox-like resume <folder>``), else ``fit(resume_from='latest')``."""
        if self.resume_hint and self.experiment is not None:
            return self.resume_hint.format(experiment_dir=self.experiment.dir_path)
        return "fit(resume_from='latest')"

    # ---------------------------------------------------------------------------------------- fit

    def __call__(self, num_epochs: int = 0, num_iterations: int = 0,
                 callbacks: Optional[Sequence[AbstractCallback]] = None, grad_accumulation: int = 1,
                 **kwargs: Any) -> torch.nn.Module:
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
        callbacks = self.callbacks_handler.adopt_foreign(callbacks)
        if resume_from == loop_state.AUTO:
            loop_state.check_auto_resume(self, callbacks)
        # The plan travels with the loop into each DDP process, which loads the checkpoint itself.
        self.resume_plan = loop_state.ResumePlan(resume_from) if resume_from is not None else None
        try:
            with default_console_output():
                if self.gpu_mode in ('ddp', 'fsdp'):
                    from .launch import fit_ddp, fit_fsdp     # torch.multiprocessing: these modes only
                    launch = fit_ddp if self.gpu_mode == 'ddp' else fit_fsdp
                    return launch(self, num_epochs, num_iterations, callbacks, grad_accumulation, **kwargs)
                if self.gpu_mode == 'dp':
                    self._wrap_in_data_parallel(**kwargs)
                return self.train_in_this_process(num_epochs, num_iterations, callbacks, grad_accumulation)
        finally:
            self.resume_plan = None

    def _wrap_in_data_parallel(self, dp_model_args: Optional[Dict[str, Any]] = None) -> None:
        # Any other keyword argument: fit() has refused it already (check_fit_keywords).
        if isinstance(self.model, torch.nn.DataParallel):
            return
        if self.compiled_model is not None:
            logger.warning("gpu_mode='dp': the DataParallel wrapper's forward is not torch.compile'd")
            self.compiled_model = None
        # As in AIToolbox, the loop's model becomes the wrapper (one process, so nothing else sees the plain
        # module); its state_dict keys then start with 'module.'.
        self.model.to(self.device)
        args = dict(dp_model_args or {})
        if self.batch_model_feed_def is None:
            self.model, self._feed = resolve_model(distributed.TTDataParallel(self.model, **args))
        else:
            self.model, self._feed = resolve_model(
                ModelWrap(torch.nn.DataParallel(self.model, **args), self.batch_model_feed_def))

    # ---------------------------------------------------------------------------------------- a fit in this process

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

    def _train_in_this_process(self, num_epochs: int, num_iterations: int,
                               callbacks: Optional[Sequence[AbstractCallback]],
                               grad_accumulation: int) -> torch.nn.Module:
        self.num_iterations = num_iterations
        self.grad_accumulation = grad_accumulation
        self.num_epochs = num_epochs or self._epochs_for_iterations(num_iterations)
        self.early_stop = False
        self.interrupted = None
        self.evaluation.purge()
        handler = self.callbacks_handler

        self.register_fit_callbacks(callbacks)
        import_object(DEFAULT_CALLBACKS)(self)
        self.train_step_owner = self._find_train_step_owner()
        self.steering.start()
        if self.print_callbacks:
            handler.print_registered_callback_names()
        check_fit_inputs(self, self._amp.unavailable, final=False, need_train_loader=True)

        self.model.to(self.device)
        self.move_criterion_to_device()
        self.model.train()
        if self.resume_plan is not None:
            self.resume_plan.apply(self)
        experiment = self.experiment
        if experiment is not None and experiment.claimed and self.is_main_process():
            logger.info('Experiment folder: %s (checkpoints in %s/)', experiment.dir_path, CHECKPOINT_DIR)

        try:
            try:
                handler.dispatch.on_train_begin()
                check_fit_inputs(self, self._amp.unavailable, final=True, need_train_loader=True)
                self._train_epochs()
            except StopTraining as stop:
                if isinstance(stop, TrainingInterrupted):
                    self.interrupted = stop.reason
                else:
                    logger.info('Training stopped by a callback: %s', stop or 'StopTraining')
                handler.dispatch.on_train_stopped(stop)
            try:
                if self.interrupted is None:    # the end-of-training evaluation belongs to the run's real end
                    try:
                        self.interruptible_phase = EVALUATION
                        self.auto_execute_end_of_training()
                    except TrainingInterrupted as stop:     # abandoned: the resumed run evaluates again
                        self.interrupted = stop.reason
                        handler.dispatch.on_train_stopped(stop)
                    finally:
                        self.interruptible_phase = None
                handler.dispatch.on_train_end()
            except StopTraining:
                pass
            self.message_service.end_of_training_trigger()
            self.wait_for_pending_saves()
            self.wait_for_uploads()
        except BaseException as exc:
            handler.dispatch.on_exception(exc)
            try:
                self.wait_for_pending_saves()
            except Exception:
                logger.exception('A background checkpoint write failed while fit was failing with %r', exc)
            self.wait_for_uploads(after_exception=True)
            raise
        finally:
            self.steering.finish()
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

    def _find_train_step_owner(self) -> Any:
        owners: List[Any] = [cb for cb in self.callbacks if 'train_step' in cb.hooks_in_use()]
        model_step = getattr(self.model, 'train_step', None)
        if callable(model_step):
            owners.append(self.model)
        if len(owners) > 1:
            raise ValueError(f'only one callback (or the model) may own the training step, but train_step is defined '
                             f'by {[type(o).__name__ for o in owners]}: keep one of them')
        return owners[0] if owners else None

    def _epochs_for_iterations(self, num_iterations: int) -> Optional[int]:
        try:
            return math.ceil(num_iterations / max(len(self.train_loader), 1))
        except TypeError:
            return None       # a loader without len(): epochs last until the data runs out

    # ---------------------------------------------------------------------------------------- the epochs

    def _train_epochs(self) -> None:
        epoch = self.epochs_completed
        num_epochs = self.num_epochs or 0      # None only with num_iterations (a loader without len())
        if not self.num_iterations and epoch >= num_epochs:
            logger.warning('Nothing to train: %d epochs are already done and num_epochs=%d is the total; pass a '
                           'larger num_epochs to continue', epoch, self.num_epochs)
        handler = self.callbacks_handler
        dispatch = handler.dispatch
        steering = self.steering
        self._epochs_running = True
        try:
            # With num_iterations the batch count decides (num_epochs is only an estimate then: a previous fit may
            # have ended mid-epoch).
            while not self._iterations_done() if self.num_iterations else epoch < num_epochs:
                iteration_before = self.total_iteration_idx
                self.epoch = self.train_history.current_epoch = epoch
                self.loss_batch_accum = []
                dispatch.on_epoch_begin()
                step = self._train_step if self.train_step_owner is None else self._custom_step
                # torch.compile's warm-up runs in the first step of a compiled model: a stop may abandon it.
                warm_up = self.compiled_model is not None and not self._compile_warm and step == self._train_step \
                    and self.world_size == 1
                for self.iteration, self.batch, self._is_last_batch in self._batches():
                    self.total_iteration_idx += 1
                    self.update_applied = _NO_UPDATE
                    dispatch.on_batch_begin()
                    if warm_up:
                        warm_up = False
                        # Abandoned only where the accumulated gradients are empty (the step opens its window).
                        self._train_step(self.batch, self.iteration % self.grad_accumulation == 0)
                    else:
                        step(self.batch)
                    if steering.end_epoch_requested or steering.agree_epoch_ends:
                        self._end_epoch_after_batch(before_batch_end=True)
                    dispatch.on_batch_end()
                    if self._is_last_batch or ((steering.end_epoch_requested or steering.agree_epoch_ends)
                                               and self._end_epoch_after_batch(before_batch_end=False)):
                        break
                steering.end_epoch_requested = False        # the epoch ended: a request in its last batch is met
                if steering.restart_epoch is not None:      # restart_from(): reopen that epoch at its position
                    epoch, steering.restart_epoch = steering.restart_epoch, None
                    continue
                self._history_marks = self.train_history.lengths()
                dispatch.on_train_epoch_end()
                if self.total_iteration_idx == iteration_before and self.num_iterations:
                    raise ValueError(f'train_loader yielded no batches in epoch {epoch}; fit(num_iterations='
                                     f'{self.num_iterations}) cannot make progress')
                self.epochs_completed = epoch + 1
                try:
                    self.interruptible_phase = EVALUATION
                    self.auto_execute_end_of_epoch()
                except TrainingInterrupted as stop:
                    if stop.phase == EVALUATION:
                        self._rewind_epoch_end(epoch)
                    raise
                finally:
                    self.interruptible_phase = None
                dispatch.on_epoch_end()
                self.message_service.end_of_epoch_trigger()
                if self._agree_on_early_stop():
                    logger.info('Early stopping after epoch %d', epoch)
                    break
                epoch += 1
        finally:
            self._epochs_running = False

    def _end_epoch_after_batch(self, before_batch_end: bool) -> bool:
        """end_epoch() was called (on some rank): when the ranks agree, this batch becomes the epoch's last, and a
        gradient-accumulation window it leaves open is applied as the last batch of an epoch applies it. Returns
        whether the epoch ends."""
        steering = self.steering
        if not steering.decide_end_epoch():
            return False
        if steering.restart_epoch is not None:
            # restart_from() (from on_batch_end): the epoch reopens at its position after this batch, without an end.
            if before_batch_end:
                return False
            steering.end_epoch_requested = False
            return True
        steering.end_epoch_requested = False
        window_open = self.update_applied is _NO_UPDATE and not self._is_update_step()
        self._is_last_batch = True
        if window_open:
            if not before_batch_end and self.is_main_process():
                logger.warning('end_epoch() was called in on_batch_end of batch %d, inside a gradient-accumulation '
                               'window: its update is applied after the batch\'s on_batch_end, where callbacks that '
                               'count updates (step-wise schedulers, EMA) do not see it; call end_epoch() before '
                               'on_batch_end (from on_batch_begin to on_after_gradient_update)', self.total_iteration_idx)
            close_window_across_ranks(self, self.ddp_model)
            self._update_optimizers()
        if self.is_main_process():
            logger.info('Epoch %d ends after batch %d (end_epoch())', self.epoch, self.iteration)
        return True

    def _rewind_epoch_end(self, epoch: int) -> None:
        """A stop abandoned the end-of-epoch evaluation of ``epoch``: the loop is put back to the end of the epoch's
        last batch (what the evaluation recorded leaves the history), where the checkpoint to continue from is written,
        and the resumed run evaluates again."""
        self.train_history.drop_after(self._history_marks)
        self.epochs_completed = epoch
        self.evaluation.purge()

    def _rewind_step(self, rng: Dict[str, Any], losses: int) -> None:
        """A stop abandoned the forward / backward of this batch (torch.compile's warm-up): the loop is put back to the
        end of the previous batch (random-number states, running losses, the position; the gradients this step began
        to accumulate are dropped, as it opened its window)."""
        loop_state.restore_rng_state(self, rng)
        del self.loss_batch_accum[losses:]
        for param in self.model.parameters():
            param.grad = None
        self.total_iteration_idx -= 1
        self.iteration -= 1
        self._is_last_batch = False
        self.update_applied = _NO_UPDATE

    def _iterations_done(self) -> bool:
        num_iterations = self.num_iterations
        return bool(num_iterations) and self.total_iteration_idx + 1 >= (num_iterations or 0)

    def _batches(self) -> Iterator[Tuple[int, Any, bool]]:
        """Yield (index, batch, is_last). is_last marks the end of the epoch (or of num_iterations) so the
        last partial gradient-accumulation window is applied. Sized loaders use len() so that batches
        are fetched exactly when a hand-written loop would fetch them; others look one batch ahead."""
        remaining = self.num_iterations - (self.total_iteration_idx + 1) if self.num_iterations else None
        iterator, start, loader = self._open_epoch()
        if prefetch_applies(self.device, loader, self.prefetch_to_device):
            iterator = DevicePrefetcher(iterator, self.device)
        sized = not isinstance(getattr(loader, 'dataset', None), IterableDataset)
        try:
            length = len(loader) if sized else None
        except TypeError:
            length = None
        # Nothing of this epoch is trained yet: a stop while the first batch is fetched saves this position.
        self.iteration = start - 1
        # Each wait for a batch is an interruptible phase (a stop abandons it: the batch is fetched again on resume).
        if length is not None:
            last = length - 1 if remaining is None else min(length, start + remaining) - 1
            i = start
            while True:
                self.interruptible_phase = FETCH
                try:
                    batch = next(iterator)
                except StopIteration:
                    return
                finally:
                    self.interruptible_phase = None
                yield i, batch, i == last
                i += 1
        self.interruptible_phase = FETCH
        try:
            batch = next(iterator)
        except StopIteration:
            return
        finally:
            self.interruptible_phase = None
        i = start
        while True:
            self.interruptible_phase = FETCH
            try:
                upcoming = next(iterator)
            except StopIteration:
                yield i, batch, True
                return
            finally:
                self.interruptible_phase = None
            yield i, batch, remaining is not None and i - start == remaining - 1
            batch, i = upcoming, i + 1

    def _open_epoch(self) -> Tuple[Iterator[Any], int, Any]:
        """The train loader's iterator for the epoch now starting, the index of its first batch (after the
        batches a mid-epoch checkpoint already trained, when the run resumes inside this epoch) and the loader it
        comes from (the epoch's number of batches is its len())."""
        plan, self.resume_plan = self.resume_plan, None
        if plan is not None and plan.resumes_inside(self.epoch):
            return plan.reopen_epoch(self)
        self.epoch_start_rng = loop_state.capture_rng_state(self)
        self.epoch_samples_offset = 0
        return iter(self.train_loader), 0, self.train_loader

    def _agree_on_early_stop(self) -> bool:
        if self.world_size == 1:
            return self.early_stop
        flag = torch.tensor([1.0 if self.early_stop else 0.0], device=distributed.collective_device(self.device))
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.early_stop = bool(flag.item())
        return self.early_stop

    # ---------------------------------------------------------------------------------------- the training step

    def _train_step(self, batch: Any, interruptible: bool = False) -> None:
        """One training step as the algorithm reads: the forward pass under autocast, on_after_loss (which may
        replace ``loss``), the loss kept for the epoch's mean (detached: no host sync), backward (which fires
        on_after_backward) and, on update steps, the optimizer update. ``interruptible``: the forward and backward
        are the COMPILE phase (a compiled model's first step), which a stop may abandon."""
        update = self._is_update_step()
        if interruptible:
            rewind = (loop_state.capture_rng_state(self), len(self.loss_batch_accum))
            self.interruptible_phase = COMPILE
        try:
            # DDP: micro-batches that do not update skip the gradient all-reduce (no_sync covers the forward too).
            with _NOTHING if self.ddp_model is None else distributed.skip_grad_sync(self.ddp_model, not update):
                with self._amp.autocast():
                    self.loss = self._feed.get_loss(batch, self.criterion, self.device)
                self.callbacks_handler.dispatch.on_after_loss()
                loss = self.loss
                self.loss_batch_accum.append(loss.detach() if isinstance(loss, torch.Tensor)
                                             else loss_to_record(loss, self))
                self.backward(loss)
        except TrainingInterrupted as stop:
            if interruptible and stop.phase == COMPILE:
                self._rewind_step(*rewind)
            raise
        except Exception as failure:    # costs nothing unless a step fails: then the common mistakes are named
            wrapped = _interruption_inside(failure) if interruptible else None
            if wrapped is not None and wrapped.phase == COMPILE:
                # torch.compile wraps what its backend raised (BackendCompilerFailed): the stop is the cause.
                self._rewind_step(*rewind)
                raise wrapped from None
            explained = explain_step_failure(failure, self)
            if explained is None:
                raise
            raise explained
        finally:
            if interruptible:
                self.interruptible_phase = None
                self._compile_warm = True
        if update:
            self._update_optimizers()

    def _custom_step(self, batch: Any) -> None:
        """The step of a ``train_step`` owner (a callback or the model): it computes the loss and calls
        ``backward`` / ``step_optimizers`` itself; the loop keeps the loss it returns."""
        owner = self.train_step_owner
        args = (batch, self) if owner is self.model else (batch,)     # a model's train_step also gets the loop
        with distributed.skip_grad_sync(self.ddp_model, not self._is_update_step()):
            loss = owner.train_step(*args)
        self.loss = loss
        if loss is not None:
            self.loss_batch_accum.append(loss.detach() if isinstance(loss, torch.Tensor)
                                         else loss_to_record(loss, self, from_custom_step=True))

    def _is_update_step(self) -> bool:
        """The one definition of an update step: every grad_accumulation-th batch of the epoch, and its last."""
        return (self.iteration + 1) % self.grad_accumulation == 0 or self._is_last_batch

    def forward_loss(self, batch_data: Any) -> Any:
        """The model's training loss for ``batch_data`` (``get_loss`` under the loop's autocast, through the DDP
        wrapper in a DDP fit): the forward pass a custom ``train_step`` starts from."""
        with self._amp.autocast():
            return self._feed.get_loss(batch_data, self.criterion, self.device)

    def backward(self, loss: Any) -> None:
        """Backpropagate ``loss`` as the standard step does: divided by grad_accumulation, scaled by the fp16
        GradScaler; then the on_after_backward hooks. For custom ``train_step`` code."""
        # A tensor divided by 1 is the same tensor bit for bit, so that kernel is skipped; any other loss object
        # (MultiLoss, a user's class) is divided as AIToolbox always did, since its division may do more.
        if self.grad_accumulation > 1 or not isinstance(loss, torch.Tensor):
            loss = loss / self.grad_accumulation
        if self._amp.uses_scaler:
            loss = self._amp.scale(loss)
        loss.backward()
        self.callbacks_handler.dispatch.on_after_backward()

    def skip_update(self) -> None:
        """Leave out the optimizer update of this step, on every rank of a distributed fit (the ranks agree, so they
        never diverge). Call it from ``on_after_loss``, ``on_after_backward`` or ``on_after_gradient_update`` (of the
        first optimizer to step), or from a custom ``train_step`` before ``step_optimizers()``; inside a
        gradient-accumulation window it leaves out the window's update. The update is left out as the fp16
        GradScaler leaves out one with non-finite gradients: the hooks of the update run
        (``on_after_gradient_update``, ``on_after_optimizer_step``), no optimizer steps, the gradients are zeroed, the
        scaler's update runs (on the gradients' own inf check) and ``optimizer_update_applied()`` is False, so
        schedulers, EMA / SWA and the counters of updates do not move; ``update_skipped`` is True.

        In a distributed fit the callback that calls it declares ``may_skip_updates = True`` (see AbstractCallback).
        Called too late (after an optimizer stepped in this batch) or outside fit it raises ``StepRequestError``."""
        self.steering.request_skip()

    @property
    def update_skipped(self) -> bool:
        """True once this batch's optimizer update was left out by :meth:`skip_update` (read it from
        on_after_optimizer_step or on_batch_end)."""
        return self.steering.skipped_in == self.total_iteration_idx

    def end_epoch(self) -> None:
        """End the current epoch after this batch, on every rank of a distributed fit: the batch becomes the epoch's
        last (``is_last_batch``), a gradient-accumulation window it leaves open is applied as the last batch of an
        epoch applies it, and the epoch ends as any epoch does (``on_train_epoch_end``, its evaluation,
        ``on_epoch_end``); training goes on with the next epoch. Call it from any hook of a training batch (before
        ``on_batch_end`` when gradients accumulate, so the closing update is counted where updates are counted).

        In a distributed fit the callback that calls it declares ``may_end_epochs = True`` (see AbstractCallback)."""
        self.steering.request_end_epoch()

    def restart_from(self, checkpoint: Dict[str, Any], skip_batches: int = 0, source: str = 'a snapshot') -> None:
        """Go back (or forward) to ``checkpoint``, a mid-epoch training checkpoint of this run taken between two
        optimizer updates (``loop_state.build_snapshot``, as LossSpikeGuard keeps them in memory, or one that
        ``build_checkpoint`` made): its weights, optimizer, GradScaler, schedulers and callbacks' state, history,
        counters and random-number states are put back now, and after this batch the epoch loop continues from its
        position, ``skip_batches`` batches of data further: those batches are never trained (never past the end of
        the checkpoint's epoch; the next epoch then starts). The checkpoint dict is not changed (what the loop takes
        is a copy). Call it from ``on_batch_end``; every rank of a distributed fit calls it at the same batch."""
        if not self.epochs_running:
            raise StepRequestError('restart_from() changes the course of a fit: call it from on_batch_end')
        if isinstance(skip_batches, bool) or not isinstance(skip_batches, int) or skip_batches < 0:
            raise ValueError(f'skip_batches must be an int >= 0, got {skip_batches!r}')
        if checkpoint.get('data_position', {}).get('batches_done') is None:
            raise ValueError(f'{source} was taken at the end of an epoch; restart_from() takes a mid-epoch checkpoint')
        taken = loop_state.copy_tree(checkpoint, torch.Tensor.clone)
        for param in self.model.parameters():
            param.grad = None
        position = loop_state.apply_checkpoint(self, taken, source)
        assert position is not None
        try:
            epoch_length: Optional[int] = len(self.train_loader)
        except TypeError:
            epoch_length = None
        done = position['batches_done'] + skip_batches
        position['batches_done'] = done if epoch_length is None else min(done, epoch_length)
        plan = loop_state.ResumePlan(source, taken)
        plan.applied, plan.position = True, position
        self.resume_plan = plan
        self.steering.restart_epoch = position['epoch']
        self.steering.end_epoch_requested = True     # leave this epoch's batches after this one (no epoch end)

    def step_optimizers(self, optimizer_indices: Optional[Sequence[int]] = None) -> None:
        """Apply an update with the given optimizers (all by default) as the standard step does: unscale once under
        fp16, on_after_gradient_update, step (GradScaler.step under fp16), on_after_optimizer_step, zero_grad, then
        the scaler update; ``update_applied`` records what was applied (schedulers read it). For custom
        ``train_step`` code; call it on update steps (``should_execute_optimizer_update()``) when accumulating."""
        self._update_optimizers(optimizer_indices)

    def _update_optimizers(self, indices: Optional[Sequence[int]] = None) -> None:
        """The optimizer update: the gradients unscaled once under fp16 (so callbacks see and clip the real ones),
        then per optimizer on_after_gradient_update, its step, on_after_optimizer_step and zero_grad, and the
        GradScaler's update. ``update_applied`` says which optimizers changed the weights."""
        optimizers, amp, handler = self.optimizers, self._amp, self.callbacks_handler
        dispatch, scaled = handler.dispatch, amp.uses_scaler
        if indices is None:
            indices, chosen = range(len(optimizers)), optimizers
            applied = self.update_applied = [True] * len(optimizers)
        else:
            chosen = [optimizers[i] for i in indices]
            applied = self.update_applied = [i in indices for i in range(len(optimizers))]
        if scaled:
            amp.unscale(chosen)
        steering = self.steering
        decide, skip = True, False
        for idx in indices:
            self.optimizer_idx = idx
            dispatch.on_after_gradient_update(idx)
            if decide:      # the update point: a skip is decided (agreed by the ranks) before any optimizer steps
                decide = False
                steering.in_update = True
                steering.decided_in = self.total_iteration_idx
                skip = (steering.skip_requested or steering.agree_skips) and steering.decide_skip()
            if skip:
                applied[idx] = False
            elif scaled:
                applied[idx] = amp.step(optimizers[idx])
            else:
                optimizers[idx].step()
            dispatch.on_after_optimizer_step()
            optimizers[idx].zero_grad()
        if scaled:
            amp.update(optimizers, applied)
        steering.in_update = False
        self.optimizer_idx = 0

    def should_execute_optimizer_update(self) -> bool:
        """True on the batches where the optimizer steps: every grad_accumulation-th batch of the epoch and
        the last batch of the epoch (or of num_iterations)."""
        if self._is_update_step():
            return True
        if self._epochs_running:
            return False        # the loop marks the last batch itself (also for loaders without len())
        # Outside fit, AIToolbox code sets loop.iteration itself and asks: the last batch of the epoch updates too.
        try:
            return self.iteration == len(self.train_loader) - 1
        except TypeError:
            return False

    def optimizer_update_applied(self, optimizer_idx: int = 0) -> bool:
        """True when this batch was an optimizer-update step and optimizer ``optimizer_idx`` really changed the
        weights: False on gradient-accumulation micro-batches and when the fp16 GradScaler skipped the update
        (inf/NaN gradients). Reliable from on_batch_end of the batch (for non-fused optimizers already in
        on_after_optimizer_step). Schedulers step on it."""
        return self.should_execute_optimizer_update() and optimizer_idx < len(self.update_applied) \
            and self.update_applied[optimizer_idx]

    def get_num_training_steps(self) -> int:
        """AIToolbox's count of training steps: ``num_iterations // grad_accumulation``, or
        ``len(train_loader) // grad_accumulation * num_epochs``. It leaves out the update that ends an epoch
        whose batches are not a multiple of ``grad_accumulation``; :meth:`get_num_optimizer_updates` counts
        them (the schedulers of this library use that one)."""
        if self.num_epochs is None and not self.num_iterations:
            raise RuntimeError('get_num_training_steps() is known only once fit() has started')
        if self.num_iterations:
            return self.num_iterations // self.grad_accumulation
        try:
            per_epoch = len(self.train_loader)
        except TypeError:
            raise RuntimeError('get_num_training_steps() needs a train_loader with len() or fit(num_iterations=...)')
        return int(per_epoch // self.grad_accumulation * (self.num_epochs or 0))

    def get_num_optimizer_updates(self) -> int:
        """Number of optimizer updates of the whole run up to num_epochs / num_iterations, counting the
        updates of earlier fits (both are totals), so a resumed schedule keeps its length. The last partial
        accumulation window of each epoch counts as an update."""
        if self.num_epochs is None and not self.num_iterations:
            raise RuntimeError('get_num_optimizer_updates() is known only once fit() has started')
        try:
            per_epoch = len(self.train_loader)
        except TypeError:
            if self.num_iterations:
                return math.ceil(self.num_iterations / self.grad_accumulation)
            raise RuntimeError('get_num_optimizer_updates() needs a train_loader with len() or '
                               'fit(num_iterations=...)')
        total_batches = self.num_iterations or per_epoch * (self.num_epochs or 0)
        full_epochs, rest = divmod(total_batches, per_epoch)
        return full_epochs * math.ceil(per_epoch / self.grad_accumulation) + math.ceil(rest / self.grad_accumulation)

    # ---------------------------------------------------------------------------------------- evaluation
    # Evaluation is engine/evaluation.py's (``self.evaluation``); these are AIToolbox's names for it.

    def auto_execute_end_of_epoch(self) -> None:
        """The end-of-epoch evaluation: 'accumulated_loss', and 'val_loss' (and with ``eval_train_set``, 'loss')
        when end_auto_eval is due (:meth:`Evaluation.end_of_epoch <aitoolbox_like.engine.evaluation.Evaluation.end_of_epoch>`)."""
        self.evaluation.end_of_epoch()

    def auto_execute_end_of_training(self) -> None:
        """The end-of-training evaluation: 'train_end_test_loss' when there is a test loader."""
        self.evaluation.end_of_training()

    def insert_metric_result_into_history(self, metric_name: str, metric_result: Any) -> None:
        """Record ``metric_result`` under ``metric_name`` for the current epoch."""
        self.train_history.insert_single_result_into_history(metric_name, metric_result)

    def parse_loss(self, loss_record: Sequence[Any]) -> Any:
        """Mean of a list of per-batch losses (tensors or MultiLoss), as a float64 tensor (or MultiLoss);
        averaged across processes in a distributed run."""
        return self.evaluation.mean_loss(loss_record)

    def evaluate_loss_on_train_set(self, force_prediction: bool = False, float_dict_format: bool = False) -> Any:
        """Mean loss over the train set (cached per training position; see evaluate_model_loss)."""
        return self.evaluation.loss('train', force_prediction, float_dict_format)

    def evaluate_loss_on_validation_set(self, force_prediction: bool = False, float_dict_format: bool = False) -> Any:
        """Mean loss over the validation set (cached per training position)."""
        return self.evaluation.loss('validation', force_prediction, float_dict_format)

    def evaluate_loss_on_test_set(self, force_prediction: bool = False, float_dict_format: bool = False) -> Any:
        """Mean loss over the test set (cached per training position)."""
        return self.evaluation.loss('test', force_prediction, float_dict_format)

    @staticmethod
    def convert_loss_to_float_dict_format(loss: Any) -> Any:
        """A loss tensor as a float, a MultiLoss as a dict of floats."""
        return loss.item() if isinstance(loss, (torch.Tensor, MultiLoss)) else loss

    def evaluate_model_loss(self, data_loader: Any, move_to_cpu: bool = False,
                            dataset_info: Optional[Dict[str, Any]] = None) -> Any:
        """Loss of the model over a loader, in eval mode without gradients: the mean of the per-batch losses
        (as AIToolbox), or with ``eval_loss_weighting='sample'`` their mean weighted by batch size."""
        return self.evaluation.model_loss(data_loader, move_to_cpu, dataset_info)

    def predict_on_train_set(self, force_prediction: bool = False,
                             execute_callbacks: bool = False) -> Tuple[Any, Any, Any]:
        """``(y_pred, y_true, metadata)`` over the train set (cached per training position)."""
        return self.evaluation.predictions('train', force_prediction, execute_callbacks)

    def predict_on_validation_set(self, force_prediction: bool = False,
                                  execute_callbacks: bool = False) -> Tuple[Any, Any, Any]:
        """``(y_pred, y_true, metadata)`` over the validation set (cached per training position)."""
        return self.evaluation.predictions('validation', force_prediction, execute_callbacks)

    def predict_on_test_set(self, force_prediction: bool = False,
                            execute_callbacks: bool = False) -> Tuple[Any, Any, Any]:
        """``(y_pred, y_true, metadata)`` over the test set (cached per training position)."""
        return self.evaluation.predictions('test', force_prediction, execute_callbacks)

    def predict_with_model(self, data_loader: Any, execute_callbacks: bool = False, move_to_cpu: bool = False,
                           dataset_info: Optional[Dict[str, Any]] = None) -> Tuple[Any, Any, Any]:
        """Run the model over a loader in eval mode: returns ``(y_pred, y_true, metadata)``."""
        return self.evaluation.model_predictions(data_loader, execute_callbacks, move_to_cpu, dataset_info)

    def purge_prediction_cache(self) -> None:
        """Forget cached losses and predictions (e.g. after loading other weights into the model)."""
        self.evaluation.purge()


def _interruption_inside(failure: BaseException) -> Optional[TrainingInterrupted]:
    """The TrainingInterrupted among the causes of ``failure`` (a library that wraps the exceptions raised inside it,
    as torch.compile does, keeps them as the cause or context), or None."""
    seen = set()
    cause: Optional[BaseException] = failure
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, TrainingInterrupted):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None
