"""FunctionOnTrainLoop: call a function of the train loop on the hooks its flags switch on (re-exported by
:mod:`.basic`, AIToolbox's home of it)."""
from typing import TYPE_CHECKING, Any, Callable, List, Optional

from .abstract import AbstractCallback

if TYPE_CHECKING:
    from ..engine.train_loop import TrainLoop


_FUNCTION_HOOK_FLAGS = (
    ('epoch_begin', 'on_epoch_begin'), ('epoch_end', 'on_epoch_end'), ('train_begin', 'on_train_begin'),
    ('train_end', 'on_train_end'), ('batch_begin', 'on_batch_begin'), ('batch_end', 'on_batch_end'),
    ('after_gradient_update', 'on_after_gradient_update'), ('after_optimizer_step', 'on_after_optimizer_step'),
)


class FunctionOnTrainLoop(AbstractCallback):
    """Call ``fn_to_execute(train_loop)`` on the hooks switched on by the flags (and once at registration with
    tl_registration=True). Only the switched-on hooks are dispatched."""

    # The hook flags, set from the arguments of the same names.
    epoch_begin: bool
    epoch_end: bool
    train_begin: bool
    train_end: bool
    batch_begin: bool
    batch_end: bool
    after_gradient_update: bool
    after_optimizer_step: bool

    def __init__(self, fn_to_execute: Callable[['TrainLoop'], Any], tl_registration: bool = False,
                 epoch_begin: bool = False, epoch_end: bool = False, train_begin: bool = False,
                 train_end: bool = False, batch_begin: bool = False, batch_end: bool = False,
                 after_gradient_update: bool = False, after_optimizer_step: bool = False,
                 execution_order: float = 0, device_idx_execution: Optional[int] = None) -> None:
        super().__init__('Execute given function as a callback', execution_order, device_idx_execution)
        if not callable(fn_to_execute):
            raise TypeError(f'FunctionOnTrainLoop: fn_to_execute must be a function of the train loop, got '
                            f'{type(fn_to_execute).__qualname__}')
        flags = dict(epoch_begin=epoch_begin, epoch_end=epoch_end, train_begin=train_begin, train_end=train_end,
                     batch_begin=batch_begin, batch_end=batch_end, after_gradient_update=after_gradient_update,
                     after_optimizer_step=after_optimizer_step)
        self.fn_to_execute = fn_to_execute
        self.tl_registration = tl_registration
        for flag, value in flags.items():
            setattr(self, flag, value)
        self._enabled_hooks = [hook for flag, hook in _FUNCTION_HOOK_FLAGS if flags[flag]]

    def hooks_in_use(self) -> List[str]:
        """Registration and the switched-on hooks."""
        # Only the switched-on hooks are dispatched, so the others cost nothing per step.
        return ['on_train_loop_registration'] + self._enabled_hooks

    def _run(self, *args: Any, **kwargs: Any) -> None:
        self.execute_callback()

    on_epoch_begin = on_epoch_end = on_train_begin = on_train_end = on_batch_begin = on_batch_end = _run
    on_after_gradient_update = on_after_optimizer_step = _run

    def on_train_loop_registration(self) -> None:
        """Mark gradient hooks as used on the loop; run the function with tl_registration=True."""
        if self.after_gradient_update or self.after_optimizer_step:
            self.train_loop_obj.grad_cb_used = True
        if self.tl_registration:
            self.execute_callback()

    def execute_callback(self) -> None:
        """Call ``fn_to_execute(train_loop)``."""
        self.fn_to_execute(self.train_loop_obj)
