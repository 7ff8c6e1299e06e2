"""The adapter: SuperGradients' ``Callback`` and ``PhaseCallback`` as callbacks of the TrainLoop.

Every SG-style callback is an :class:`AbstractCallback` whose loop hooks call its SG methods, and whose
``hooks_in_use()`` lists only the hooks behind the SG methods it overrides (phases.SG_METHOD_HOOKS), so the others
cost nothing. The methods receive the loop's one :class:`PhaseContext` (context.py).
"""
import logging
import math
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, List, Optional, Union

import torch

from ...callbacks.abstract import AbstractCallback
from ..foreign_state import Encoder, ForeignState, loop_references, unsaveable
from .context import EVAL_PREFIXES, PhaseContext, context_for, epoch_metrics
from .params import name_param_groups
from .phases import (EVAL_BATCH_METHODS, EVAL_METHODS, NEVER_CALLED, PHASE_METHODS, SG_METHOD_HOOKS,
                     TRAIN_BATCH_METHODS, Phase)

if TYPE_CHECKING:
    from ...engine.train_loop import TrainLoop

logger = logging.getLogger(__name__)


# The adapter's own attributes of an SG callback (and AbstractCallback's), never saved as the callback's state.
ADAPTER_ATTRIBUTES = ('callback_name', '_callback_name', 'execution_order', 'device_idx_execution', 'train_loop_obj',
                      '_message_service', '_sg_methods', '_sg_context', '_sg_best', '_sg_preds_handle',
                      '_sg_training_ended', '_sg_eval_batch_idx', '_sg_preds', '_sg_eval_preds', '_sg_state',
                      '_sg_pending', 'context')


def loss_entries(name: str, loss: Any) -> Dict[str, float]:
    """``loss`` under the history names the loop gives it: one float, or for a MultiLoss (any mapping) one per
    part (``<name>_<part>``) plus their sum under ``name``."""
    if hasattr(loss, 'items'):
        parts = {f'{name}_{part}': float(value.item()) for part, value in loss.items()}
        return {**parts, name: float(sum(parts.values()))}
    return {name: float(loss.item()) if isinstance(loss, torch.Tensor) else float(loss)}


def name_loop_param_groups(loop: 'TrainLoop') -> None:
    """Name the unnamed parameter groups of the loop's optimizers as SG's trainer names its own (SG's learning-rate
    callbacks look their rate up by the group's ``'name'``)."""
    if loop.optimizer is None:
        return
    for optimizer in loop.optimizers:
        name_param_groups(optimizer)


def batch_mean(losses: List[Any]) -> Any:
    """The float64 mean of batch losses in this process (tensors or numbers; MultiLosses part by part): the
    loop's mean of batch losses without its all-reduce."""
    if hasattr(losses[0], 'items'):
        return {part: batch_mean([loss[part] for loss in losses]) for part in losses[0]}
    return torch.stack([torch.as_tensor(loss, dtype=torch.float64).reshape(()) for loss in losses]).mean()


class Callback(AbstractCallback):
    """SuperGradients' ``Callback``: override the SG methods you need; each receives the :class:`PhaseContext`.

    Subclasses need not call ``super().__init__()`` (SG's subclasses do not); the callback is named after its
    class and runs in every process, in list order. Class attributes a subclass or instance may set:

    Attributes:
        metric_to_watch (str): the history metric that defines the best epoch for
            ``on_validation_end_best_epoch`` ('val_loss' by default; any metric a callback records, e.g.
            'val_Accuracy', when that callback runs before this one at the end of the epoch). In a fit with a
            :class:`TrainingParamsCallback`, its ``metric_to_watch`` (an SG name) decides instead, unless this
            callback's class or instance sets its own.
        greater_metric_to_watch_is_better (bool): False: lower is better.
        capture_train_preds (bool): when the callback uses a method after the training forward pass (or a batch
            method of validation or test), keep the model's output (a forward hook on ``loop.model``) as
            ``context.preds``; False saves the hook call and keeps ``preds`` None in training batches and loss
            passes.
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
    _sg_preds: Any = None            # the model's output in the current training batch
    _sg_eval_preds: Any = None       # ... in the current evaluation batch
    _sg_state: Optional[ForeignState] = None         # its attributes in the loop's checkpoints
    _sg_pending: Optional[Dict[str, Any]] = None     # restored once on_training_start has run

    def __init__(self) -> None:
        # the class's execution_order / device_idx_execution (SG-style class attributes) stay in force
        cls = type(self)
        super().__init__(cls.__name__, cls.execution_order, cls.device_idx_execution)

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
        this epoch's training values (``accumulated_loss``, the mean of its batch losses) and SG's names."""

    def on_validation_loader_start(self, context: PhaseContext) -> None:
        """Before a pass over the validation set (on_eval_begin, type 'validation')."""

    def on_validation_batch_start(self, context: PhaseContext) -> None:
        """Before each validation batch's forward pass: batch_idx, inputs, target."""

    def on_validation_batch_end(self, context: PhaseContext) -> None:
        """After each validation batch: preds (the model's output), and the batch loss in a loss pass."""

    def on_validation_loader_end(self, context: PhaseContext) -> None:
        """After a pass over the validation set (on_eval_end). ``metrics_dict``: this epoch's validation values,
        with the pass's own mean loss as ``val_loss`` when it is a loss pass, and SG's names."""

    def on_validation_end_best_epoch(self, context: PhaseContext) -> None:
        """At the end of an epoch whose ``metric_to_watch`` is the best so far (on_epoch_end). ``metrics_dict``:
        the epoch's validation values (and the watched one)."""

    def on_test_loader_start(self, context: PhaseContext) -> None:
        """Before a pass over the test set (on_eval_begin, type 'test'), e.g. the end-of-training test loss."""

    def on_test_batch_start(self, context: PhaseContext) -> None:
        """Before each test batch's forward pass."""

    def on_test_batch_end(self, context: PhaseContext) -> None:
        """After each test batch: preds, and the batch loss in a loss pass."""

    def on_test_loader_end(self, context: PhaseContext) -> None:
        """After a pass over the test set (on_eval_end). ``metrics_dict``: ``test_loss`` of a loss pass (the loop
        records the end-of-training one as ``train_end_test_loss``), this epoch's ``test_*`` values, SG's names."""

    def on_average_best_models_validation_start(self, context: PhaseContext) -> None:
        """SG's validation of the average of the best checkpoints: never called (the loop does not average best
        models; a callback using it is warned once)."""

    def on_average_best_models_validation_end(self, context: PhaseContext) -> None:
        """Never called, as ``on_average_best_models_validation_start``."""

    def on_training_end(self, context: PhaseContext) -> None:
        """Once when training ends (on_train_end), or when fit fails (on_exception), as in SG. ``metrics_dict``:
        every value the history holds for the last epoch, and SG's names of the last loader end."""

    # ---- which SG methods are used, and the loop hooks they need ---------------------------------------------

    def sg_methods_in_use(self) -> List[str]:
        """The SG methods this callback's class overrides (those the adapter calls)."""
        return [name for name in SG_METHOD_HOOKS if getattr(type(self), name) is not getattr(Callback, name)]

    def _keeps_preds(self, methods: FrozenSet[str]) -> bool:
        return bool(self.capture_train_preds and methods & (TRAIN_BATCH_METHODS | EVAL_BATCH_METHODS))

    def hooks_in_use(self) -> List[str]:
        """The loop hooks behind the SG methods in use (plus any loop hook the subclass overrides itself)."""
        methods = frozenset(self.sg_methods_in_use())
        hooks = {hook for method in methods for hook in SG_METHOD_HOOKS[method]}
        if self._keeps_preds(methods):
            hooks |= {'on_train_begin', 'on_train_end', 'on_exception'}
        own = {name for name in AbstractCallback.hooks_in_use(self)
               if getattr(type(self), name) is not getattr(Callback, name)}
        return [name for name in super().hooks_in_use() if name in hooks or name in own]

    # ---- the adapter: our hooks call the SG methods ---------------------------------------------------------

    def register_train_loop_object(self, train_loop_obj: 'TrainLoop') -> AbstractCallback:
        """Attach to the loop and take its one context."""
        methods = frozenset(self.sg_methods_in_use())
        self._sg_methods = methods
        self._sg_context = context_for(train_loop_obj, self.metric_to_watch)
        self._remove_preds_hook()
        self._sg_training_ended = False
        self._sg_eval_batch_idx = -1
        name_loop_param_groups(train_loop_obj)
        if self._sg_state is None:
            self._sg_state = ForeignState(type(self).__name__, ADAPTER_ATTRIBUTES)
        never = sorted(methods & NEVER_CALLED)
        if never:
            logger.warning('%s: %s never run here: the loop does not average the best models', type(self).__name__,
                           ' and '.join(never))
        registered = super().register_train_loop_object(train_loop_obj)
        encoder = self._sg_encoder()
        self._sg_state.record_initial(self, encoder)
        self._sg_state.name_unsaveable(unsaveable(self, encoder, ADAPTER_ATTRIBUTES))     # said when the fit starts
        return registered

    @property
    def context(self) -> PhaseContext:
        """The :class:`PhaseContext` passed to this callback's methods: the loop's one context. An SG callback may
        assign ``self.context`` for its own use (SG's PhaseContextTestCallback does); that does not change what
        its methods receive."""
        if 'context' in self.__dict__:
            return self.__dict__['context']
        return self._adapter_context()

    @context.setter
    def context(self, value: Any) -> None:
        self.__dict__['context'] = value

    def _adapter_context(self) -> PhaseContext:
        if self._sg_context is None:
            raise RuntimeError(f'{type(self).__name__} is not registered on a TrainLoop yet')
        return self._sg_context

    def _uses(self, method: str) -> bool:
        return method in self._sg_methods

    def _training(self) -> PhaseContext:
        context = self._adapter_context()
        context.enter_training_epoch()
        return context

    def on_train_begin(self) -> None:
        self._sg_training_ended = False
        if self._keeps_preds(self._sg_methods):
            self._remove_preds_hook()
            self._sg_preds_handle = self.train_loop_obj.model.register_forward_hook(self._keep_preds)
        if self._uses('on_training_start'):
            context = self._adapter_context()
            context.set_batch(None, None)
            self.on_training_start(context)
        if self._sg_pending is not None:
            # SG's callbacks set themselves up for a run in on_training_start; a resumed fit then continues the
            # state they had when the checkpoint was taken
            pending, self._sg_pending = self._sg_pending, None
            self._sg_restore(pending)

    def _keep_preds(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if module.training:
            self._sg_preds = output
        else:
            self._sg_eval_preds = output

    def _remove_preds_hook(self) -> None:
        handle = self._sg_preds_handle
        if handle is not None:
            handle.remove()
            self._sg_preds_handle = None
        self._sg_preds = self._sg_eval_preds = None

    def on_epoch_begin(self) -> None:
        if self._uses('on_train_loader_start'):
            context = self._training()
            context.set_batch(None, None)
            self.on_train_loader_start(context)

    def on_batch_begin(self) -> None:
        loop = self.train_loop_obj
        context = self._training()
        context.set_batch(loop.batch, loop.iteration)
        self._sg_preds = None
        self.on_train_batch_start(context)

    def _train_batch_context(self) -> PhaseContext:
        loop = self.train_loop_obj
        context = self._training()
        if context.batch is not loop.batch or context.batch_idx != loop.iteration:
            context.set_batch(loop.batch, loop.iteration)
        if context.loss is not loop.loss:
            context.set_loss(loop.loss)
        context.preds = self._sg_preds
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
        context = self._training()
        context.set_batch(None, None)
        ours = self._train_epoch_values()
        context.metrics_dict = {**ours, **context.sg_metrics('train', ours)}
        self.on_train_loader_end(context)

    def _only_this_process(self) -> bool:
        # In a DDP fit the loop records means over all processes; a callback restricted to one rank cannot join
        # that all-reduce (the other ranks never call it), so it gets its own process's mean.
        return self.train_loop_obj.world_size > 1 and self.device_idx_execution is not None

    def _train_epoch_values(self) -> Dict[str, Any]:
        """SG's training metrics of the epoch: the running mean of the batch losses, which the loop records as
        'accumulated_loss' only after on_train_epoch_end, so it is computed here the way the loop computes it."""
        loop = self.train_loop_obj
        values = epoch_metrics(loop, 'train_')
        losses = [loss for loss in loop.loss_batch_accum if loss is not None]
        if losses:
            mean = batch_mean(losses) if self._only_this_process() else loop.parse_loss(losses)
            values.update(loss_entries('accumulated_loss', mean))
        return values

    def _pass(self, dataset_info: Dict[str, Any]) -> Optional[tuple]:
        """The SG methods of an evaluation pass (None for a pass of another type), its context entered."""
        methods = EVAL_METHODS.get(dataset_info.get('type') or '')
        if methods is not None:
            self._adapter_context().enter_pass(dataset_info)
        return methods

    def on_eval_begin(self, dataset_info: Dict[str, Any]) -> None:
        methods = self._pass(dataset_info)
        if methods is not None and self._uses(methods[0]):
            context = self._adapter_context()
            context.set_batch(None, None)
            getattr(self, methods[0])(context)
        self._sg_eval_batch_idx = -1

    def on_eval_batch_begin(self, batch: Any, dataset_info: Dict[str, Any]) -> None:
        batch_idx = self._sg_eval_batch_idx = self._sg_eval_batch_idx + 1
        self._sg_eval_preds = None
        methods = self._pass(dataset_info)
        if methods is not None and self._uses(methods[1]):
            context = self._adapter_context()
            context.set_batch(batch, batch_idx)
            getattr(self, methods[1])(context)

    def on_eval_batch_end(self, batch: Any, outputs: Any, dataset_info: Dict[str, Any]) -> None:
        methods = self._pass(dataset_info)
        if methods is None or not self._uses(methods[2]):
            return
        context = self._adapter_context()
        context.set_batch(batch, self._sg_eval_batch_idx)
        if dataset_info.get('kind') == 'predictions':
            y_pred, y_true, _ = outputs
            context.preds = y_pred
            if context.target is None:
                context.target = y_true
        else:
            context.set_loss(outputs)
            context.preds = self._sg_eval_preds     # the model's output in this loss pass (the forward hook)
        getattr(self, methods[2])(context)

    def _eval_values(self, prefix: str, dataset_info: Dict[str, Any]) -> Dict[str, Any]:
        """The metrics of an evaluation pass: a loss pass's mean loss, which the loop hands to on_eval_end
        (``dataset_info['loss']``: its eval_loss_weighting, the mean over the processes of a DDP fit) and writes
        into the history ('val_loss') only after it, plus the epoch's values recorded so far. Metrics that
        callbacks compute from a predictions pass (ModelPerformanceEvaluation) are recorded later still, in their
        on_epoch_end: they are here only when recorded before this pass (on_validation_end_best_epoch has them)."""
        values = epoch_metrics(self.train_loop_obj, prefix)
        if dataset_info.get('kind') == 'loss' and dataset_info.get('loss') is not None:
            values.update(loss_entries(f'{prefix}loss', dataset_info['loss']))
        return values

    def on_eval_end(self, dataset_info: Dict[str, Any]) -> None:
        split = dataset_info.get('type') or ''
        methods = self._pass(dataset_info)
        if methods is not None and self._uses(methods[3]):
            context = self._adapter_context()
            context.set_batch(None, None)
            ours = self._eval_values(EVAL_PREFIXES[split], dataset_info)
            context.metrics_dict = {**ours, **context.sg_metrics(split, ours)}
            getattr(self, methods[3])(context)

    def watches_own_metric(self) -> bool:
        """Whether this callback's class (below :class:`Callback`) or the instance sets ``metric_to_watch`` or
        ``greater_metric_to_watch_is_better``: then its best epoch follows them, else the
        :class:`TrainingParamsCallback`'s of the fit when there is one."""
        names = ('metric_to_watch', 'greater_metric_to_watch_is_better')
        if any(name in self.__dict__ for name in names):
            return True
        for cls in type(self).__mro__:
            if cls is Callback:
                return False
            if any(name in vars(cls) for name in names):
                return True
        return False

    def on_epoch_end(self) -> None:
        loop = self.train_loop_obj
        context = self._adapter_context()
        run = context.state.get('run')
        results: Optional[Dict[str, Any]] = None
        if run is not None and not self.watches_own_metric():
            watched = run.watched_value(loop.epoch)
            if watched is None:
                return
            value, results = watched
            greater = bool(run.training_params.greater_metric_to_watch_is_better)
        else:
            value = loop.train_history.value_in_epoch(self.metric_to_watch, loop.epoch)
            greater = self.greater_metric_to_watch_is_better
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return
        best = self._sg_best
        if best is None or (value > best if greater else value < best):
            self._sg_best = value
            context.set_batch(None, None)
            if results is not None:     # SG's validation results of the epoch (TrainingParamsCallback)
                context.metrics_dict = dict(results)
            else:
                # SG hands the validation metrics of the epoch; the watched value is added as it may be another
                # split's ('loss'), which SG's validation-only metric_to_watch never is
                ours = {**epoch_metrics(loop, 'val_'), self.metric_to_watch: value}
                context.metrics_dict = {**ours, **context.best_epoch_sg_metrics(ours)}
            self.on_validation_end_best_epoch(context)

    def on_train_end(self) -> None:
        self._end_training()

    def on_exception(self, exception: BaseException) -> None:
        self._end_training()

    def _end_training(self) -> None:
        self._remove_preds_hook()
        if self._uses('on_training_end') and not self._sg_training_ended:
            self._sg_training_ended = True
            context = self._adapter_context()
            context.set_batch(None, None)
            # SG's context still holds the dict of its last loader end; the loop's counterpart is all that the
            # last epoch recorded, the end-of-training values ('train_end_test_loss') included, with SG's names
            # of that last loader end beside
            ours = epoch_metrics(self.train_loop_obj)
            context.metrics_dict = {**ours, **context.final_sg_metrics(ours)}
            self.on_training_end(context)

    # ---- checkpoints: the callback's state survives a resume ----------------------------------------------------

    def _sg_encoder(self) -> Encoder:
        context = self._sg_context
        references: List[Any] = loop_references(self.train_loop_obj) + [context]
        return Encoder(references, lambda value: isinstance(value, AbstractCallback))

    def state_dict(self) -> Optional[Dict[str, Any]]:
        """The callback's state for the loop's checkpoints: its attributes as SG keeps them (counters, best values,
        a torch scheduler's state, ...; see ``aitoolbox_like.adapters.foreign_state``) and the best value of
        ``metric_to_watch``. None before registration."""
        if self._sg_state is None or self.train_loop_obj is None:
            return None
        state = self._sg_state.state(self, self._sg_encoder())
        state['best_metric'] = self._sg_best
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` gave: the best value of ``metric_to_watch``, and the attributes (for a
        callback that uses ``on_training_start``, once the resumed fit has run it; at once inside a fit: a mid-epoch
        resume)."""
        self._sg_best = state_dict.get('best_metric')
        if 'attributes' not in state_dict:
            return
        running = self.train_loop_obj is not None and self.train_loop_obj.epochs_running
        if self._uses('on_training_start') and not running:
            self._sg_pending = state_dict       # on_training_start sets the callback up for the run: restored after
        else:
            self._sg_restore(state_dict)

    def _sg_restore(self, state: Dict[str, Any]) -> None:
        if self._sg_state is not None:
            self._sg_state.apply(self, state)

    def __repr__(self) -> str:
        return type(self).__name__


class PhaseCallback(Callback):
    """SuperGradients' ``PhaseCallback``: ``__call__(context)`` runs at ``phase``. Only the hook behind that phase
    is used (plus any SG method the subclass overrides itself).

    Args:
        phase (Phase or str): when to run: a :class:`Phase`, or its name (``'TRAIN_EPOCH_END'``, as SG's YAML
            recipes write it).
    """

    def __init__(self, phase: Union[Phase, str]) -> None:
        super().__init__()
        if isinstance(phase, str):
            phase = Phase.from_string(phase)
        elif not isinstance(phase, Phase):
            raise TypeError(f'phase must be a Phase member (e.g. Phase.TRAIN_EPOCH_END) or its name, got {phase!r}')
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

    def on_average_best_models_validation_start(self, context: PhaseContext) -> None:
        self._run_at(Phase.AVERAGE_BEST_MODELS_VALIDATION_START, context)

    def on_average_best_models_validation_end(self, context: PhaseContext) -> None:
        self._run_at(Phase.AVERAGE_BEST_MODELS_VALIDATION_END, context)

    def on_training_end(self, context: PhaseContext) -> None:
        self._run_at(Phase.POST_TRAINING, context)
