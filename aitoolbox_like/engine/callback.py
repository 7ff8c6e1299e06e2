"""The callback base: every hook a TrainLoop calls, each a documented no-op, in the order of a fit; StopTraining;
and the scheduler base the loop finds schedulers by. Users import these from ``aitoolbox_like.callbacks.abstract``
(or ``aitoolbox_like``); the loop (train_loop.py) and the handler build on this module."""
import inspect
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from .message_passing import MessageService
    from .train_loop import TrainLoop


class StopTraining(Exception):
    """Raise from any hook to end training cleanly: on_train_end still runs and fit returns."""


class TrainingInterrupted(StopTraining):
    """Training stopped before its end with a checkpoint to continue from (a signal such as Ctrl-C or a scheduler's
    SIGTERM, a time budget): what :class:`~aitoolbox_like.callbacks.preemption.PreemptionCheckpoint` raises. The
    loop records the reason in ``loop.interrupted`` and skips the end-of-training evaluation; ``on_train_end`` runs
    (to close and flush), and callbacks that report the end of training skip their reports, which belong to the
    run's real end.

    Raised in the middle of one of the loop's interruptible phases (``loop.interruptible_phase``: waiting for the
    next training batch, the end-of-epoch or end-of-training evaluation, the compile warm-up of a compiled model's
    first step), it abandons what was going on there: with ``phase`` naming that phase, the loop puts its position
    back to the end of the last trained batch (the evaluation's records leave the history) before
    ``on_train_stopped``, where the checkpoint to continue from is then written, and the resumed run redoes what was
    abandoned.

    Args:
        reason (str): why, in a few words (``'received SIGINT'``); it becomes ``loop.interrupted``.
        message (str or None): the whole message (default: ``reason``).
        phase (str or None): the interruptible phase it was raised in (``loop.interruptible_phase`` at the time), or
            None when raised between two steps.
    """

    def __init__(self, reason: str, message: Optional[str] = None, phase: Optional[str] = None) -> None:
        super().__init__(message or reason)
        self.reason = reason
        self.phase = phase


def overrides_hook(callback_class: type, hook_name: str) -> bool:
    """True when ``callback_class`` defines its own ``hook_name`` (not AbstractCallback's no-op)."""
    hook = getattr(callback_class, hook_name, None)
    return hook is not None and hook is not getattr(AbstractCallback, hook_name)


class AbstractCallback:
    """Base class of every callback.

    A callback sees the loop as ``self.train_loop_obj`` (set at registration) with full read/write access to
    its public attributes (docs/loop-state.md), and overrides the hooks it needs (docs/event-order.md).

    Args:
        callback_name (str): a readable name, shown by print_callbacks and in error messages.
        execution_order (int): callbacks run in ascending order (stable for ties).
        device_idx_execution (int or None): None runs the callback in every process; an int k
            runs it only in the process of global rank k of a distributed run. In a single-process
            run every callback runs.
    """

    # The loop, set at registration; hooks only run on registered callbacks, so they may use it unchecked.
    train_loop_obj: 'TrainLoop'

    #: The names this callback adds to the training history each epoch (fnmatch patterns allowed, e.g.
    #: ``('val_worst_class', 'grad_norm_*')``); ``()``: none. None (the default): not declared, so a hyper-parameter
    #: search (``aitoolbox-like tune``) can only check its ``--monitor`` against this callback at the end of the first
    #: epoch instead of before the first trial.
    history_names: Optional[Tuple[str, ...]] = None

    #: True when this callback may call ``train_loop_obj.skip_update()`` / ``train_loop_obj.end_epoch()``. In a
    #: distributed fit the ranks then agree on every update / batch whether one of them asked (one small CPU
    #: collective each), so that all act alike; a fit without such a callback pays nothing, and calling them there
    #: is refused with this fix. A single-process fit needs no declaration.
    may_skip_updates: bool = False
    may_end_epochs: bool = False

    def __init__(self, callback_name: str, execution_order: float = 0,
                 device_idx_execution: Optional[int] = None) -> None:
        self.callback_name = callback_name
        self.execution_order = execution_order
        self.device_idx_execution = device_idx_execution
        self.train_loop_obj = None  # type: ignore[assignment]  # None only until registration

    def register_train_loop_object(self, train_loop_obj: 'TrainLoop') -> 'AbstractCallback':
        """Attach the callback to a loop and call on_train_loop_registration. Called by the handler."""
        self.train_loop_obj = train_loop_obj
        self.on_train_loop_registration()
        return self

    def hooks_in_use(self) -> List[str]:
        """The hooks the loop calls on this callback: by default every hook its class overrides. A callback that
        decides per instance which hooks it needs (FunctionOnTrainLoop) overrides this; it is read when the
        callback is registered, and hooks not listed cost nothing."""
        return [name for name in HOOK_NAMES if overrides_hook(type(self), name)]

    @property
    def message_service(self) -> Optional['MessageService']:
        """The loop's :class:`~aitoolbox_like.engine.message_passing.MessageService`, through which callbacks pass
        data to each other; None before registration.

        Read from the loop on every access rather than copied at registration, so subclasses that override
        register_train_loop_object without calling super() get it too. Assigning it (as AIToolbox callbacks
        do in their own register_train_loop_object) pins that service for this callback.
        """
        pinned = self.__dict__.get('_message_service')
        if pinned is not None:
            return pinned
        return getattr(self.__dict__.get('train_loop_obj'), 'message_service', None)

    @message_service.setter
    def message_service(self, service: 'MessageService') -> None:
        self.__dict__['_message_service'] = service

    @property
    def state_key(self) -> str:
        """Name of this callback's state inside a checkpoint; subclasses add their distinguishing
        arguments so that two instances of one class keep separate state."""
        return type(self).__name__

    def state_dict(self) -> Optional[Dict[str, Any]]:
        """State to keep in checkpoints (only tensors, numbers, strings, lists and dicts), or None."""
        return None

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore what state_dict returned; called when a fit resumes, after registration."""

    # ---- hooks, in the order of a fit -------------------------------------------------------------------

    def on_train_loop_registration(self) -> None:
        """Once, when the callback is registered on the loop (at the start of fit, or by register_callbacks).
        ``train_loop_obj`` is set; validate arguments against the loop here, and register further callbacks if
        needed. In a DDP fit this runs inside each process, after the process group exists."""

    def on_multiprocess_start(self) -> None:
        """DDP only: in each process, after its process group is up and before the loaders are sharded (build
        the data here, see InMultiProcessDataLoad)."""

    def on_train_begin(self) -> None:
        """Once per fit, after a resumed checkpoint was applied and before the first epoch: the model is on its
        device and in train mode; the optimizer may still be set here."""

    def on_epoch_begin(self) -> None:
        """At the start of every epoch; ``epoch`` is the new epoch's index."""

    def on_batch_begin(self) -> None:
        """Before each training batch; ``iteration`` and ``total_iteration_idx`` index it. Runs every step:
        keep it cheap and never read a device value on the host here."""

    def train_step(self, batch: Any) -> Any:
        """Own the whole training step of a batch (GANs, SAM, manual optimisation): at most one registered callback
        (or the model, with a ``train_step(batch, loop)`` method) may override it. Compute the loss, call
        ``train_loop_obj.backward(loss)`` and ``train_loop_obj.step_optimizers(...)`` (which keep AMP, gradient
        hooks, schedulers and update bookkeeping working) and return the loss (a tensor or MultiLoss) for the
        history, or None. The loop still calls on_batch_begin / on_batch_end, wraps the step in DDP's no_sync on
        accumulation micro-batches, records the returned loss and saves checkpoints as usual."""
        raise NotImplementedError

    def on_after_loss(self) -> None:
        """In the standard step, after ``get_loss`` and before backward: ``train_loop_obj.loss`` is the batch's loss
        (not detached) and ``train_loop_obj.batch`` the batch. Replace ``train_loop_obj.loss`` to change what is
        backpropagated and recorded (add a regulariser, scale it), or call ``train_loop_obj.skip_update()`` to leave
        this step's optimizer update out. Runs every step."""

    def on_after_backward(self) -> None:
        """After every micro-batch's backward(): gradients hold this micro-batch's contribution (scaled under
        fp16). Runs every step."""

    def on_after_gradient_update(self, optimizer_idx: int) -> None:
        """On optimizer-update steps only, for each optimizer before it steps: gradients are final and unscaled,
        so clip or inspect them here. ``optimizer_idx`` (also ``train_loop_obj.optimizer_idx``) names the
        optimizer about to step. ``train_loop_obj.skip_update()`` from here (that of the first optimizer to step)
        leaves the update out."""

    def on_after_optimizer_step(self) -> None:
        """On optimizer-update steps, after each optimizer's step() and before its zero_grad().
        ``train_loop_obj.optimizer_update_applied()`` tells whether the update was applied (fp16 may skip)."""

    def on_batch_end(self) -> None:
        """After each training batch (and its update, if any). Runs every step."""

    def on_train_epoch_end(self) -> None:
        """After the epoch's last training batch, before its end-of-epoch evaluation."""

    def on_eval_begin(self, dataset_info: Dict[str, Any]) -> None:
        """Before an evaluation pass over a loader: the end-of-epoch losses, ``predict_on_*``,
        ``evaluate_loss_on_*``, the end-of-training test pass. ``dataset_info['type']`` is 'train', 'validation',
        'test' (or None for a loader given directly) and ``dataset_info['kind']`` is 'loss' or 'predictions'.
        The model is in eval mode, under no_grad. A cached result makes no pass, so no eval hooks run."""

    def on_eval_batch_begin(self, batch: Any, dataset_info: Dict[str, Any]) -> None:
        """Before each batch of an evaluation pass."""

    def on_eval_batch_end(self, batch: Any, outputs: Any, dataset_info: Dict[str, Any]) -> None:
        """After each batch of an evaluation pass: ``outputs`` is the batch's loss (kind 'loss') or its
        ``(y_pred, y_true, metadata)`` (kind 'predictions'). Streaming metrics update here."""

    def on_eval_end(self, dataset_info: Dict[str, Any]) -> None:
        """After an evaluation pass. For a loss pass (``dataset_info['kind'] == 'loss'``) that completed,
        ``dataset_info['loss']`` is its result as ``evaluate_model_loss`` returns it (before the history records
        it); also called, without it, when the pass stops early."""

    def on_epoch_end(self) -> None:
        """After every epoch's end-of-epoch evaluation: this epoch's 'accumulated_loss' and 'val_loss' (and 'loss'
        with ``eval_train_set``) are in ``train_history``. Set ``train_loop_obj.early_stop = True`` to stop after this epoch."""

    def on_train_stopped(self, reason: BaseException) -> None:
        """Training was ended early by ``StopTraining`` (``reason``), raised from any hook, an evaluation hook or a
        custom step; the end-of-training evaluation and on_train_end follow."""

    def on_train_end(self) -> None:
        """Once at the end of fit, after the end-of-training evaluation; also after StopTraining."""

    def on_exception(self, exception: BaseException) -> None:
        """When fit fails with ``exception`` (which is re-raised afterwards): release resources, report."""

    def on_after_batch_prediction(self, y_pred_batch: Any, y_test_batch: Any, metadata_batch: Any,
                                  dataset_info: Optional[Dict[str, Any]]) -> None:
        """After each batch of a prediction pass run with ``execute_callbacks=True`` (predict_on_*_set)."""

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self.callback_name!r}, execution_order={self.execution_order}, ' \
               f'device_idx_execution={self.device_idx_execution})'


# The hooks are AbstractCallback's methods named on_* (and train_step), in the order the class defines them, which is
# the order of a fit; those that take arguments beyond self are checked against an override's signature at
# registration. The handler dispatches a hook only to the callbacks that use it (hooks_in_use), so adding one costs
# nothing per step.
HOOK_NAMES: Tuple[str, ...] = tuple(name for name in vars(AbstractCallback)
                                    if name.startswith('on_') or name == 'train_step')
#: Each hook's number of arguments (beyond self), from AbstractCallback's signatures.
HOOK_ARITY: Dict[str, int] = {name: len(inspect.signature(getattr(AbstractCallback, name)).parameters) - 1
                              for name in HOOK_NAMES}
HOOKS_WITH_ARGUMENTS: Tuple[str, ...] = tuple(name for name in HOOK_NAMES if HOOK_ARITY[name])


class AbstractScheduler:
    """Base of the learning-rate scheduler callbacks (callbacks/train_schedule.py): ``TrainLoop.get_schedulers()``
    finds them by this class, and checkpoints save / restore the wrapped ``self.scheduler``."""

    def __init__(self) -> None:
        self.scheduler: Any = None
        self._pending_state: Optional[Dict[str, Any]] = None

    def state_dict(self) -> Optional[Dict[str, Any]]:
        return self.scheduler.state_dict() if self.scheduler is not None else None

    def load_state_dict(self, state_dict: Optional[Dict[str, Any]]) -> None:
        if state_dict is None:
            return
        if self.scheduler is None:
            # The scheduler is created when the callback is registered; keep the state until then.
            self._pending_state = state_dict
        else:
            self._load_scheduler_state(state_dict)

    def _load_scheduler_state(self, state_dict: Dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)
        # torch restores only the scheduler's counters; put its last learning rates back into the optimizer too,
        # so a resume that does not also load the optimizer state still continues the same curve.
        get_last_lr = getattr(self.scheduler, 'get_last_lr', None)
        last_lr = get_last_lr() if callable(get_last_lr) else None
        optimizer = getattr(self.scheduler, 'optimizer', None)
        if last_lr is not None and optimizer is not None and len(last_lr) == len(optimizer.param_groups):
            for group, lr in zip(optimizer.param_groups, last_lr):
                group['lr'] = lr
