"""SuperGradients-style callbacks on the TrainLoop: ``Callback`` (SG's method names, each taking a
``PhaseContext``), ``PhaseCallback(phase)`` with the ``Phase`` enum, and the ``multi_process_safe`` decorator.

This is an adapter, not a second dispatch system: every SG-style callback is an :class:`AbstractCallback` whose
loop hooks call its SG methods, and whose ``hooks_in_use()`` lists only the hooks behind the SG methods it
overrides, so the others cost nothing. Register them in the same ``callbacks=[...]`` list as any other callback.

Which SG method runs on which hook (docs/callbacks/supergradients.md has the full table):

    on_training_start                  on_train_begin
    on_train_loader_start              on_epoch_begin
    on_train_batch_start               on_batch_begin
    on_train_batch_loss_end            on_after_loss (a custom train_step: on_batch_end, before on_train_batch_end)
    on_train_batch_backward_end        on_after_backward
    on_train_batch_gradient_step_start on_after_gradient_update (per optimizer)
    on_train_batch_gradient_step_end   on_after_optimizer_step (per optimizer)
    on_train_batch_end                 on_batch_end
    on_train_loader_end                on_train_epoch_end
    on_validation_loader_start / _batch_start / _batch_end / _loader_end
                                       on_eval_begin / _batch_begin / _batch_end / _end of passes of type 'validation'
    on_validation_end_best_epoch       on_epoch_end, when ``metric_to_watch`` improved in this epoch
    on_test_loader_start / ... / on_test_loader_end     the same eval hooks, passes of type 'test'
    on_training_end                    on_train_end (or on_exception when fit fails), once
"""
import enum
import functools
import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, List, Optional, Tuple, TypeVar, cast

import torch

from .. import distributed
from .abstract import AbstractCallback

if TYPE_CHECKING:
    from ..train_loop import TrainLoop

__all__ = ['Phase', 'PhaseContext', 'Callback', 'PhaseCallback', 'multi_process_safe', 'save_image',
           'SG_METHOD_HOOKS']

F = TypeVar('F', bound=Callable[..., Any])


def multi_process_safe(func: F) -> F:
    """Run the decorated function only in the main process (global rank 0; always in a single process); in the
    other processes of a DDP fit it returns None without running. SuperGradients checks the *local* rank (one
    process per node); here it is the global rank, the process that logs and saves (``loop.is_main_process()``)."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not distributed.is_main_process():
            return None
        return func(*args, **kwargs)
    return cast(F, wrapper)


class Phase(enum.Enum):
    """SuperGradients' phases; a :class:`PhaseCallback` runs at one of them. Each is the SG method noted."""
    PRE_TRAINING = 'PRE_TRAINING'                              #: on_training_start
    TRAIN_EPOCH_START = 'TRAIN_EPOCH_START'                    #: on_train_loader_start
    TRAIN_BATCH_END = 'TRAIN_BATCH_END'                        #: on_train_batch_loss_end (as SG's PhaseCallback)
    TRAIN_BATCH_STEP = 'TRAIN_BATCH_STEP'                      #: on_train_batch_gradient_step_end
    TRAIN_EPOCH_END = 'TRAIN_EPOCH_END'                        #: on_train_loader_end
    VALIDATION_BATCH_END = 'VALIDATION_BATCH_END'              #: on_validation_batch_end
    VALIDATION_EPOCH_END = 'VALIDATION_EPOCH_END'              #: on_validation_loader_end
    VALIDATION_END_BEST_EPOCH = 'VALIDATION_END_BEST_EPOCH'    #: on_validation_end_best_epoch
    TEST_BATCH_END = 'TEST_BATCH_END'                          #: on_test_batch_end
    TEST_END = 'TEST_END'                                      #: on_test_loader_end
    POST_TRAINING = 'POST_TRAINING'                            #: on_training_end


# The SG method each phase runs on (SG's PhaseCallback).
PHASE_METHODS: Dict[Phase, str] = {
    Phase.PRE_TRAINING: 'on_training_start',
    Phase.TRAIN_EPOCH_START: 'on_train_loader_start',
    Phase.TRAIN_BATCH_END: 'on_train_batch_loss_end',
    Phase.TRAIN_BATCH_STEP: 'on_train_batch_gradient_step_end',
    Phase.TRAIN_EPOCH_END: 'on_train_loader_end',
    Phase.VALIDATION_BATCH_END: 'on_validation_batch_end',
    Phase.VALIDATION_EPOCH_END: 'on_validation_loader_end',
    Phase.VALIDATION_END_BEST_EPOCH: 'on_validation_end_best_epoch',
    Phase.TEST_BATCH_END: 'on_test_batch_end',
    Phase.TEST_END: 'on_test_loader_end',
    Phase.POST_TRAINING: 'on_training_end',
}

# Every SG method, in SG's order, and the loop hooks the adapter needs for it.
SG_METHOD_HOOKS: Dict[str, Tuple[str, ...]] = {
    'on_training_start': ('on_train_begin',),
    'on_train_loader_start': ('on_epoch_begin',),
    'on_train_batch_start': ('on_batch_begin',),
    'on_train_batch_loss_end': ('on_after_loss', 'on_batch_end'),    # on_batch_end: under a custom train_step
    'on_train_batch_backward_end': ('on_after_backward',),
    'on_train_batch_gradient_step_start': ('on_after_gradient_update',),
    'on_train_batch_gradient_step_end': ('on_after_optimizer_step',),
    'on_train_batch_end': ('on_batch_end',),
    'on_train_loader_end': ('on_train_epoch_end',),
    'on_validation_loader_start': ('on_eval_begin',),
    'on_validation_batch_start': ('on_eval_begin', 'on_eval_batch_begin'),     # on_eval_begin, on_eval_batch_begin:
    'on_validation_batch_end': ('on_eval_begin', 'on_eval_batch_begin', 'on_eval_batch_end'),    # batch_idx
    'on_validation_loader_end': ('on_eval_end',),
    'on_validation_end_best_epoch': ('on_epoch_end',),
    'on_test_loader_start': ('on_eval_begin',),
    'on_test_batch_start': ('on_eval_begin', 'on_eval_batch_begin'),
    'on_test_batch_end': ('on_eval_begin', 'on_eval_batch_begin', 'on_eval_batch_end'),
    'on_test_loader_end': ('on_eval_end',),
    'on_training_end': ('on_train_end', 'on_exception'),
}
_TRAIN_BATCH_METHODS = frozenset({'on_train_batch_loss_end', 'on_train_batch_backward_end',
                                  'on_train_batch_gradient_step_start', 'on_train_batch_gradient_step_end',
                                  'on_train_batch_end'})
# dataset_info['type'] of an evaluation pass -> (loader start, batch start, batch end, loader end)
_EVAL_METHODS = {
    'validation': ('on_validation_loader_start', 'on_validation_batch_start', 'on_validation_batch_end',
                   'on_validation_loader_end'),
    'test': ('on_test_loader_start', 'on_test_batch_start', 'on_test_batch_end', 'on_test_loader_end'),
}
# dataset_info['type'] of an evaluation pass -> the history prefix of its values ('val_loss', 'val_Accuracy')
_EVAL_PREFIXES = {'validation': 'val_', 'test': 'test_'}


class _FromLoop:
    """A PhaseContext field read from the loop when it is accessed (a non-data descriptor: a value assigned to
    the context, e.g. by ``update_context``, replaces it for that context)."""

    def __init__(self, read: Callable[['TrainLoop'], Any], doc: str) -> None:
        self.read = read
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, context: Optional['PhaseContext'], owner: type) -> Any:
        if context is None:
            return self
        return self.read(context.loop)


def _ckpt_dir(loop: 'TrainLoop') -> Optional[str]:
    experiment = loop.experiment
    return None if experiment is None else os.path.join(experiment.dir_path, 'checkpoint_model')


def _epoch_metrics(loop: 'TrainLoop', prefix: str = '') -> Dict[str, Any]:
    """The history values recorded in the current epoch whose names start with ``prefix``."""
    history = loop.train_history
    # 'train_end_val_Accuracy' is an end-of-training value, not a training-set one
    skip = 'train_end_' if prefix == 'train_' else None
    return {name: value for name in history.keys()
            if name.startswith(prefix) and not (skip and name.startswith(skip))
            and (value := history.value_in_epoch(name, loop.epoch)) is not None}


def _loss_entries(name: str, loss: Any) -> Dict[str, float]:
    """``loss`` under the history names the loop gives it (TrainLoop._insert_loss): one float, or for a
    MultiLoss (any mapping) one per part (``<name>_<part>``) plus their sum under ``name``."""
    if isinstance(loss, Mapping):
        parts = {f'{name}_{part}': float(value.item()) for part, value in loss.items()}
        return {**parts, name: float(sum(parts.values()))}
    return {name: float(loss.item()) if isinstance(loss, torch.Tensor) else float(loss)}


def _batch_mean(losses: List[Any]) -> Any:
    """The float64 mean of batch losses in this process (tensors or numbers; MultiLosses part by part): the
    loop's mean of batch losses without its all-reduce."""
    if isinstance(losses[0], Mapping):
        return {part: _batch_mean([loss[part] for loss in losses]) for part in losses[0]}
    return torch.stack([torch.as_tensor(loss, dtype=torch.float64).reshape(()) for loss in losses]).mean()


class PhaseContext:
    """What a SuperGradients callback method receives: SG's field names over the loop's public attributes.

    Fields read from the loop when accessed (assigning one, or ``update_context(**values)``, replaces it in
    this context): ``epoch``, ``optimizer``, ``criterion``, ``device``, ``net``, ``train_loader``,
    ``valid_loader``, ``valid_loaders_dict``, ``test_loader``, ``ckpt_dir`` / ``checkpoints_dir_path``,
    ``experiment_name``, ``training_params``, ``ddp_silent_mode``, ``architecture``.

    Fields of the current batch, set by the adapter before each method: ``batch_idx``, ``inputs``, ``target``,
    ``additional_batch_items``, ``preds``, ``loss``, ``loss_log_items``, ``loss_logging_items_names`` and
    ``batch`` (the whole batch as the loader gave it).

    ``metrics_dict``, set where SG sets it and None elsewhere, under the loop's history names: at
    ``on_train_loader_end`` this epoch's training values (``accumulated_loss``, ``train_*``), at
    ``on_validation_loader_end`` / ``on_validation_end_best_epoch`` its validation values (``val_loss``,
    ``val_*``), at ``on_test_loader_end`` the test values (``test_loss``, ``test_*``), at ``on_training_end``
    everything the history holds for the last epoch. docs/hooks-from-other-libraries.md has the table by phase.

    Set ``stop_training = True`` to end training after the current epoch (``loop.early_stop``).

    SG fields with no counterpart here are None: ``metrics_compute_fn``, ``loss_avg_meter``, ``lr_warmup_epochs``,
    ``sg_logger``, ``checkpoint_params``, ``arch_params``, ``metric_idx_in_results_tuple``, ``valid_metrics``,
    ``context_methods``, ``ema_model`` (see docs/hooks-from-other-libraries.md for why).
    """

    epoch = _FromLoop(lambda loop: loop.epoch, 'the current epoch (0-based), loop.epoch')
    optimizer = _FromLoop(lambda loop: loop.optimizer, 'loop.optimizer')
    criterion = _FromLoop(lambda loop: loop.criterion, 'loop.criterion')
    device = _FromLoop(lambda loop: loop.device, 'loop.device (a torch.device)')
    net = _FromLoop(lambda loop: loop.ddp_model if loop.ddp_model is not None else loop.model,
                    'the model being trained: the DDP wrapper in a DDP fit (as SG), else loop.model')
    train_loader = _FromLoop(lambda loop: loop.train_loader, 'loop.train_loader')
    valid_loader = _FromLoop(lambda loop: loop.validation_loader, 'loop.validation_loader')
    valid_loaders_dict = _FromLoop(
        lambda loop: None if loop.validation_loader is None else {'': loop.validation_loader},
        "{'': loop.validation_loader} (SG's newer name), or None")
    test_loader = _FromLoop(lambda loop: loop.test_loader, 'loop.test_loader')
    ckpt_dir = _FromLoop(_ckpt_dir, "<experiment folder>/checkpoint_model when the loop has an experiment, else None")
    checkpoints_dir_path = _FromLoop(_ckpt_dir, 'the same as ckpt_dir (SG\'s newer name)')
    experiment_name = _FromLoop(lambda loop: None if loop.experiment is None else loop.experiment.experiment_name,
                                "the experiment's name when the loop has an experiment, else None")
    training_params = _FromLoop(
        lambda loop: {'max_epochs': loop.num_epochs, 'max_train_batches': loop.num_iterations,
                      'batch_accumulate': loop.grad_accumulation, 'mixed_precision': bool(loop.use_amp)},
        "the fit's settings under SG's names: max_epochs, max_train_batches, batch_accumulate, mixed_precision")
    ddp_silent_mode = _FromLoop(lambda loop: not loop.is_main_process(), 'True outside the main process')
    architecture = _FromLoop(lambda loop: type(loop.model).__name__, "the model's class name")

    def __init__(self, loop: 'TrainLoop', metric_to_watch: Optional[str] = None) -> None:
        self.loop = loop
        self.metric_to_watch = metric_to_watch
        self.batch_idx: Optional[int] = None
        self.metrics_dict: Optional[Dict[str, Any]] = None
        self.batch: Any = None
        self.inputs: Any = None
        self.target: Any = None
        self.additional_batch_items: Any = None
        self.preds: Any = None
        self.loss: Any = None
        self.loss_log_items: Any = None
        self.loss_logging_items_names: Optional[List[str]] = None
        self.metrics_compute_fn: Any = None
        self.loss_avg_meter: Any = None
        self.lr_warmup_epochs: Optional[int] = None
        self.sg_logger: Any = None
        self.checkpoint_params: Any = None
        self.arch_params: Any = None
        self.metric_idx_in_results_tuple: Optional[int] = None
        self.valid_metrics: Any = None
        self.context_methods: Any = None
        self.ema_model: Any = None

    @property
    def stop_training(self) -> bool:
        """SG's flag to stop: reads and sets ``loop.early_stop`` (training ends after the current epoch)."""
        return bool(self.loop.early_stop)

    @stop_training.setter
    def stop_training(self, value: bool) -> None:
        self.loop.early_stop = bool(value)

    def update_context(self, **kwargs: Any) -> None:
        """Set fields (SG's method); a loop-derived field set here keeps the given value in this context."""
        for name, value in kwargs.items():
            setattr(self, name, value)

    def set_batch(self, batch: Any, batch_idx: Optional[int]) -> None:
        """The adapter's: the batch the next method sees. ``inputs`` / ``target`` / ``additional_batch_items`` are
        its parts when it is a tuple or list ``(inputs, target, *rest)``, else the batch and None. Clears what
        belongs to one phase (``preds``, ``loss``, ``loss_log_items``, ``metrics_dict``)."""
        self.batch, self.batch_idx = batch, batch_idx
        self.metrics_dict = None
        if isinstance(batch, (tuple, list)) and len(batch) >= 2:
            self.inputs, self.target = batch[0], batch[1]
            self.additional_batch_items = tuple(batch[2:]) or None
        else:
            self.inputs, self.target, self.additional_batch_items = batch, None, None
        self.preds = self.loss = self.loss_log_items = None

    def set_loss(self, loss: Any) -> None:
        """The adapter's: the batch loss, and SG's logging view of it (detached items and their names)."""
        self.loss = loss
        if loss is None:
            self.loss_log_items = self.loss_logging_items_names = None
        elif isinstance(loss, torch.Tensor):
            self.loss_log_items = loss.detach().reshape(1)
            self.loss_logging_items_names = ['loss']
        elif hasattr(loss, 'items'):        # MultiLoss: one item per named loss
            names = list(loss.keys())
            self.loss_log_items = torch.stack([torch.as_tensor(loss[n]).detach().reshape(()) for n in names])
            self.loss_logging_items_names = names
        else:
            self.loss_log_items, self.loss_logging_items_names = loss, ['loss']

    def __repr__(self) -> str:
        return f'PhaseContext(epoch={self.loop.epoch}, batch_idx={self.batch_idx})'


class Callback(AbstractCallback):
    """SuperGradients' ``Callback``: override the SG methods you need; each receives a :class:`PhaseContext`.

    Subclasses need not call ``super().__init__()`` (SG's subclasses do not); the callback is named after its
    class and runs in every process, in list order. Class attributes a subclass or instance may set:

    Attributes:
        metric_to_watch (str): the history metric that defines the best epoch for
            ``on_validation_end_best_epoch`` ('val_loss' by default; any metric a callback records, e.g.
            'val_Accuracy', when that callback runs before this one at the end of the epoch).
        greater_metric_to_watch_is_better (bool): False: lower is better.
        capture_train_preds (bool): when the callback uses a method after the training forward pass, keep the
            model's output (a forward hook on ``loop.model`` during training) as ``context.preds``; False saves
            the hook call and keeps ``preds`` None in training batches.
    """

    metric_to_watch: str = 'val_loss'
    greater_metric_to_watch_is_better: bool = False
    capture_train_preds: bool = True
    execution_order: float = 0
    device_idx_execution: Optional[int] = None
    # the adapter's state (class defaults, since SG subclasses need not call __init__)
    _sg_methods: FrozenSet[str] = frozenset()
    _sg_context: Optional[PhaseContext] = None
    _sg_best: Optional[float] = None
    _sg_preds_handle: Any = None
    _sg_training_ended: bool = False
    _sg_eval_batch_idx: int = -1     # index of the current evaluation batch
    _sg_train_preds: Any = None

    def __init__(self) -> None:
        super().__init__(type(self).__name__)

    @property
    def callback_name(self) -> str:
        """The class name unless set (SG callbacks do not call super().__init__)."""
        return self.__dict__.get('_callback_name') or type(self).__name__

    @callback_name.setter
    def callback_name(self, name: str) -> None:
        self.__dict__['_callback_name'] = name

    # ---- SuperGradients' methods (no-ops), in SG's order ----------------------------------------------------

    def on_training_start(self, context: PhaseContext) -> None:
        """Once before the first epoch (our on_train_begin): model, optimizer, loaders, ckpt_dir are set."""

    def on_train_loader_start(self, context: PhaseContext) -> None:
        """At the start of each epoch's training batches (on_epoch_begin); ``context.epoch`` is the epoch."""

    def on_train_batch_start(self, context: PhaseContext) -> None:
        """Before each training batch's forward pass (on_batch_begin): batch_idx, inputs, target."""

    def on_train_batch_loss_end(self, context: PhaseContext) -> None:
        """After the loss is computed, before backward (on_after_loss): preds, loss, loss_log_items."""

    def on_train_batch_backward_end(self, context: PhaseContext) -> None:
        """After each micro-batch's backward (on_after_backward)."""

    def on_train_batch_gradient_step_start(self, context: PhaseContext) -> None:
        """Before an optimizer steps, gradients final and unscaled (on_after_gradient_update): clip here."""

    def on_train_batch_gradient_step_end(self, context: PhaseContext) -> None:
        """After an optimizer stepped (on_after_optimizer_step): step-based LR updates."""

    def on_train_batch_end(self, context: PhaseContext) -> None:
        """After the batch and its update (on_batch_end)."""

    def on_train_loader_end(self, context: PhaseContext) -> None:
        """After the epoch's last training batch, before its validation (on_train_epoch_end). ``metrics_dict``:
        this epoch's training values (``accumulated_loss``, the mean of its batch losses)."""

    def on_validation_loader_start(self, context: PhaseContext) -> None:
        """Before a pass over the validation set (on_eval_begin, type 'validation')."""

    def on_validation_batch_start(self, context: PhaseContext) -> None:
        """Before each validation batch's forward pass: batch_idx, inputs, target."""

    def on_validation_batch_end(self, context: PhaseContext) -> None:
        """After each validation batch: preds (predictions passes) or loss (loss passes)."""

    def on_validation_loader_end(self, context: PhaseContext) -> None:
        """After a pass over the validation set (on_eval_end). ``metrics_dict``: this epoch's validation values,
        with the pass's own mean loss as ``val_loss`` when it is a loss pass."""

    def on_validation_end_best_epoch(self, context: PhaseContext) -> None:
        """At the end of an epoch whose ``metric_to_watch`` is the best so far (on_epoch_end). ``metrics_dict``:
        the epoch's validation values (and the watched one)."""

    def on_test_loader_start(self, context: PhaseContext) -> None:
        """Before a pass over the test set (on_eval_begin, type 'test'), e.g. the end-of-training test loss."""

    def on_test_batch_start(self, context: PhaseContext) -> None:
        """Before each test batch's forward pass."""

    def on_test_batch_end(self, context: PhaseContext) -> None:
        """After each test batch: preds or loss."""

    def on_test_loader_end(self, context: PhaseContext) -> None:
        """After a pass over the test set (on_eval_end). ``metrics_dict``: ``test_loss`` of a loss pass (the loop
        records the end-of-training one as ``train_end_test_loss``) and this epoch's ``test_*`` values."""

    def on_training_end(self, context: PhaseContext) -> None:
        """Once when training ends (on_train_end), or when fit fails (on_exception), as in SG. ``metrics_dict``:
        every value the history holds for the last epoch."""

    # ---- which SG methods are used, and the loop hooks they need ---------------------------------------------

    def sg_methods_in_use(self) -> List[str]:
        """The SG methods this callback's class overrides (those the adapter calls)."""
        return [name for name in SG_METHOD_HOOKS if getattr(type(self), name) is not getattr(Callback, name)]

    def hooks_in_use(self) -> List[str]:
        """The loop hooks behind the SG methods in use (plus any loop hook the subclass overrides itself)."""
        methods = set(self.sg_methods_in_use())
        hooks = {hook for method in methods for hook in SG_METHOD_HOOKS[method]}
        if methods & _TRAIN_BATCH_METHODS and self.capture_train_preds:
            hooks |= {'on_train_begin', 'on_train_end', 'on_exception'}
        own = {name for name in AbstractCallback.hooks_in_use(self)
               if getattr(type(self), name) is not getattr(Callback, name)}
        return [name for name in super().hooks_in_use() if name in hooks or name in own]

    # ---- the adapter: our hooks call the SG methods ---------------------------------------------------------

    def register_train_loop_object(self, train_loop_obj: 'TrainLoop') -> AbstractCallback:
        """Attach to the loop and build the context this callback's methods receive."""
        methods = frozenset(self.sg_methods_in_use())
        self._sg_methods = methods
        self._sg_context = PhaseContext(train_loop_obj, self.metric_to_watch)
        self._remove_preds_hook()
        self._sg_training_ended = False
        self._sg_eval_batch_idx = -1
        return super().register_train_loop_object(train_loop_obj)

    @property
    def context(self) -> PhaseContext:
        """The :class:`PhaseContext` passed to this callback's methods (one per callback, as SG's trainer keeps
        one context for the run)."""
        if self._sg_context is None:
            raise RuntimeError(f'{type(self).__name__} is not registered on a TrainLoop yet')
        return self._sg_context

    def _uses(self, method: str) -> bool:
        return method in self._sg_methods

    def on_train_begin(self) -> None:
        self._sg_training_ended = False
        if self.capture_train_preds and self._sg_methods & _TRAIN_BATCH_METHODS:
            self._remove_preds_hook()
            self._sg_preds_handle = self.train_loop_obj.model.register_forward_hook(self._keep_preds)
        if self._uses('on_training_start'):
            self.context.set_batch(None, None)
            self.on_training_start(self.context)

    def _keep_preds(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if module.training:
            self._sg_train_preds = output

    def _remove_preds_hook(self) -> None:
        handle = self._sg_preds_handle
        if handle is not None:
            handle.remove()
            self._sg_preds_handle = None
        self._sg_train_preds = None

    def on_epoch_begin(self) -> None:
        if self._uses('on_train_loader_start'):
            self.context.set_batch(None, None)
            self.on_train_loader_start(self.context)

    def on_batch_begin(self) -> None:
        loop = self.train_loop_obj
        context = self.context
        context.set_batch(loop.batch, loop.iteration)
        self._sg_train_preds = None
        self.on_train_batch_start(context)

    def _train_batch_context(self) -> PhaseContext:
        loop = self.train_loop_obj
        context = self.context
        if context.batch is not loop.batch or context.batch_idx != loop.iteration:
            context.set_batch(loop.batch, loop.iteration)
        if context.loss is not loop.loss:
            context.set_loss(loop.loss)
        context.preds = self._sg_train_preds
        return context

    def on_after_loss(self) -> None:
        self.on_train_batch_loss_end(self._train_batch_context())

    def on_after_backward(self) -> None:
        self.on_train_batch_backward_end(self._train_batch_context())

    def on_after_gradient_update(self, optimizer_idx: int) -> None:
        self.on_train_batch_gradient_step_start(self._train_batch_context())

    def on_after_optimizer_step(self) -> None:
        self.on_train_batch_gradient_step_end(self._train_batch_context())

    def on_batch_end(self) -> None:
        context = self._train_batch_context()
        if self.train_loop_obj.train_step_owner is not None and self._uses('on_train_batch_loss_end'):
            self.on_train_batch_loss_end(context)     # a custom step computed its loss inside train_step
        if self._uses('on_train_batch_end'):
            self.on_train_batch_end(context)

    def on_train_epoch_end(self) -> None:
        context = self.context
        context.set_batch(None, None)
        context.metrics_dict = self._train_epoch_values()
        self.on_train_loader_end(context)

    def _only_this_process(self) -> bool:
        # In a DDP fit the loop records means over all processes; a callback restricted to one rank cannot join
        # that all-reduce (the other ranks never call it), so it gets its own process's mean.
        return self.train_loop_obj.world_size > 1 and self.device_idx_execution is not None

    def _train_epoch_values(self) -> Dict[str, Any]:
        """SG's training metrics of the epoch: the running mean of the batch losses, which the loop records as
        'accumulated_loss' only after on_train_epoch_end, so it is computed here the way the loop computes it."""
        loop = self.train_loop_obj
        values = _epoch_metrics(loop, 'train_')
        losses = [loss for loss in loop.loss_batch_accum if loss is not None]
        if losses:
            mean = _batch_mean(losses) if self._only_this_process() else loop.parse_loss(losses)
            values.update(_loss_entries('accumulated_loss', mean))
        return values

    def on_eval_begin(self, dataset_info: Dict[str, Any]) -> None:
        methods = _EVAL_METHODS.get(dataset_info.get('type') or '')
        if methods is not None and self._uses(methods[0]):
            self.context.set_batch(None, None)
            getattr(self, methods[0])(self.context)
        self._sg_eval_batch_idx = -1

    def on_eval_batch_begin(self, batch: Any, dataset_info: Dict[str, Any]) -> None:
        batch_idx = self._sg_eval_batch_idx = self._sg_eval_batch_idx + 1
        methods = _EVAL_METHODS.get(dataset_info.get('type') or '')
        if methods is not None and self._uses(methods[1]):
            self.context.set_batch(batch, batch_idx)
            getattr(self, methods[1])(self.context)

    def on_eval_batch_end(self, batch: Any, outputs: Any, dataset_info: Dict[str, Any]) -> None:
        methods = _EVAL_METHODS.get(dataset_info.get('type') or '')
        if methods is None or not self._uses(methods[2]):
            return
        context = self.context
        context.set_batch(batch, self._sg_eval_batch_idx)
        if dataset_info.get('kind') == 'predictions':
            y_pred, y_true, _ = outputs
            context.preds = y_pred
            if context.target is None:
                context.target = y_true
        else:
            context.set_loss(outputs)
        getattr(self, methods[2])(context)

    def _eval_values(self, prefix: str, dataset_info: Dict[str, Any]) -> Dict[str, Any]:
        """SG's metrics of an evaluation pass: a loss pass's mean loss, which the loop hands to on_eval_end
        (``dataset_info['loss']``: its eval_loss_weighting, the mean over the processes of a DDP fit) and writes
        into the history ('val_loss') only after it, plus the epoch's values recorded so far. Metrics that
        callbacks compute from a predictions pass (ModelPerformanceEvaluation) are recorded later still, in their
        on_epoch_end: they are here only when recorded before this pass (on_validation_end_best_epoch has them)."""
        values = _epoch_metrics(self.train_loop_obj, prefix)
        if dataset_info.get('kind') == 'loss' and dataset_info.get('loss') is not None:
            values.update(_loss_entries(f'{prefix}loss', dataset_info['loss']))
        return values

    def on_eval_end(self, dataset_info: Dict[str, Any]) -> None:
        split = dataset_info.get('type') or ''
        methods = _EVAL_METHODS.get(split)
        if methods is not None and self._uses(methods[3]):
            context = self.context
            context.set_batch(None, None)
            context.metrics_dict = self._eval_values(_EVAL_PREFIXES[split], dataset_info)
            getattr(self, methods[3])(context)

    def on_epoch_end(self) -> None:
        loop = self.train_loop_obj
        value = loop.train_history.value_in_epoch(self.metric_to_watch, loop.epoch)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return
        best = self._sg_best
        better = best is None or (value > best if self.greater_metric_to_watch_is_better else value < best)
        if better:
            self._sg_best = value
            context = self.context
            context.set_batch(None, None)
            # SG hands the validation metrics of the epoch; the watched value is added as it may be another
            # split's ('loss'), which SG's validation-only metric_to_watch never is
            context.metrics_dict = {**_epoch_metrics(loop, 'val_'), self.metric_to_watch: value}
            self.on_validation_end_best_epoch(context)

    def on_train_end(self) -> None:
        self._end_training()

    def on_exception(self, exception: BaseException) -> None:
        self._end_training()

    def _end_training(self) -> None:
        self._remove_preds_hook()
        if self._uses('on_training_end') and not self._sg_training_ended:
            self._sg_training_ended = True
            context = self.context
            context.set_batch(None, None)
            # SG's context still holds the dict of its last epoch phase; the loop's counterpart is all that the
            # last epoch recorded, the end-of-training values ('train_end_test_loss') included
            context.metrics_dict = _epoch_metrics(self.train_loop_obj)
            self.on_training_end(context)

    # ---- checkpoints: the best value of metric_to_watch survives a resume -----------------------------------

    def state_dict(self) -> Optional[Dict[str, Any]]:
        """``{'best_metric': value}`` when on_validation_end_best_epoch is used, else None."""
        if 'on_validation_end_best_epoch' not in self.sg_methods_in_use():
            return None
        return {'best_metric': self._sg_best}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore the best value of ``metric_to_watch``."""
        self._sg_best = state_dict.get('best_metric')

    def __repr__(self) -> str:
        return type(self).__name__


class PhaseCallback(Callback):
    """SuperGradients' ``PhaseCallback``: ``__call__(context)`` runs at ``phase`` (a :class:`Phase`). Only the hook
    behind that phase is used (plus any SG method the subclass overrides itself).

    Args:
        phase (Phase): when to run.
    """

    def __init__(self, phase: Phase) -> None:
        super().__init__()
        if not isinstance(phase, Phase):
            raise TypeError(f'phase must be a Phase member (e.g. Phase.TRAIN_EPOCH_END), got {phase!r}')
        self.phase = phase

    def __call__(self, context: PhaseContext) -> None:
        """What runs at the phase; subclasses implement it."""
        raise NotImplementedError(f'{type(self).__name__} must implement __call__(self, context)')

    def sg_methods_in_use(self) -> List[str]:
        """The SG method of ``phase`` and the SG methods the subclass overrides itself."""
        own = {name for name in SG_METHOD_HOOKS
               if getattr(type(self), name) is not getattr(PhaseCallback, name)
               and getattr(type(self), name) is not getattr(Callback, name)}
        phase = getattr(self, 'phase', None)
        if phase is not None:
            own.add(PHASE_METHODS[phase])
        return [name for name in SG_METHOD_HOOKS if name in own]

    def _run_at(self, phase: Phase, context: PhaseContext) -> None:
        if self.phase == phase:
            self(context)

    def on_training_start(self, context: PhaseContext) -> None:
        self._run_at(Phase.PRE_TRAINING, context)

    def on_train_loader_start(self, context: PhaseContext) -> None:
        self._run_at(Phase.TRAIN_EPOCH_START, context)

    def on_train_batch_loss_end(self, context: PhaseContext) -> None:
        self._run_at(Phase.TRAIN_BATCH_END, context)

    def on_train_batch_gradient_step_end(self, context: PhaseContext) -> None:
        self._run_at(Phase.TRAIN_BATCH_STEP, context)

    def on_train_loader_end(self, context: PhaseContext) -> None:
        self._run_at(Phase.TRAIN_EPOCH_END, context)

    def on_validation_batch_end(self, context: PhaseContext) -> None:
        self._run_at(Phase.VALIDATION_BATCH_END, context)

    def on_validation_loader_end(self, context: PhaseContext) -> None:
        self._run_at(Phase.VALIDATION_EPOCH_END, context)

    def on_validation_end_best_epoch(self, context: PhaseContext) -> None:
        self._run_at(Phase.VALIDATION_END_BEST_EPOCH, context)

    def on_test_batch_end(self, context: PhaseContext) -> None:
        self._run_at(Phase.TEST_BATCH_END, context)

    def on_test_loader_end(self, context: PhaseContext) -> None:
        self._run_at(Phase.TEST_END, context)

    def on_training_end(self, context: PhaseContext) -> None:
        self._run_at(Phase.POST_TRAINING, context)


def save_image(tensor: Any, fp: Any, nrow: int = 8, padding: int = 2, normalize: bool = False) -> None:
    """``torchvision.utils.save_image`` when torchvision can be imported; otherwise the same grid (images of a
    ``(B, C, H, W)`` or ``(C, H, W)`` tensor, values in [0, 1], or min-max scaled with ``normalize``) written with
    Pillow. For SG example code that saves batches (``from torchvision.utils import save_image``)."""
    try:
        from torchvision.utils import save_image as tv_save_image
    except Exception:       # not installed, or a build that does not match torch
        tv_save_image = None
    if tv_save_image is not None:
        tv_save_image(tensor, fp, nrow=nrow, padding=padding, normalize=normalize)
        return
    from PIL import Image
    images = torch.as_tensor(tensor).detach().float().cpu()
    if images.dim() == 2:
        images = images.unsqueeze(0)
    if images.dim() == 3:
        images = images.unsqueeze(0)
    if images.size(1) == 1:
        images = images.expand(-1, 3, -1, -1)
    if normalize:
        low, high = images.min(), images.max()
        images = (images - low) / (high - low).clamp_min(1e-5)
    count, channels, height, width = images.shape
    columns = min(nrow, count)
    rows = math.ceil(count / columns)
    grid = torch.zeros(channels, rows * (height + padding) + padding, columns * (width + padding) + padding)
    for i in range(count):
        top, left = (i // columns) * (height + padding) + padding, (i % columns) * (width + padding) + padding
        grid[:, top:top + height, left:left + width] = images[i]
    array = grid.mul(255).add(0.5).clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
    Image.fromarray(array).save(fp)
