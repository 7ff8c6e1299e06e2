"""AIToolbox's CallbacksHandler, as its module path serves it: aitoolbox_like's handler with AIToolbox's names for
firing each hook (``execute_*``), which AIToolbox's own loop and tests call. aitoolbox_like fires hooks through
``handler.dispatch`` (or ``fire(name)``); AIToolbox's loops (compat/loops.py) are given this handler."""
from typing import Any, Dict, Optional

from ..engine import handler


class CallbacksHandler(handler.CallbacksHandler):
    """AIToolbox 1.8.0's CallbacksHandler: :class:`aitoolbox_like.engine.handler.CallbacksHandler` with its
    ``execute_*`` methods, each firing one hook."""

    def execute_multiprocess_start(self) -> None:
        """``on_multiprocess_start``."""
        self.dispatch.on_multiprocess_start()

    def execute_train_begin(self) -> None:
        """``on_train_begin``."""
        self.dispatch.on_train_begin()

    def execute_epoch_begin(self) -> None:
        """``on_epoch_begin``."""
        self.dispatch.on_epoch_begin()

    def execute_batch_begin(self) -> None:
        """``on_batch_begin``."""
        self.dispatch.on_batch_begin()

    def execute_after_backward(self) -> None:
        """``on_after_backward``."""
        self.dispatch.on_after_backward()

    def execute_gradient_update(self, optimizer_idx: int = 0) -> None:
        """``on_after_gradient_update(optimizer_idx)``."""
        self.dispatch.on_after_gradient_update(optimizer_idx)

    def execute_optimizer_step(self) -> None:
        """``on_after_optimizer_step``."""
        self.dispatch.on_after_optimizer_step()

    def execute_batch_end(self) -> None:
        """``on_batch_end``."""
        self.dispatch.on_batch_end()

    def execute_epoch_end(self) -> None:
        """``on_epoch_end``."""
        self.dispatch.on_epoch_end()

    def execute_train_end(self) -> None:
        """``on_train_end``."""
        self.dispatch.on_train_end()

    def execute_after_batch_prediction(self, y_pred_batch: Any, y_test_batch: Any, metadata_batch: Any,
                                       dataset_info: Optional[Dict[str, Any]]) -> None:
        """``on_after_batch_prediction(y_pred_batch, y_test_batch, metadata_batch, dataset_info)``."""
        self.dispatch.on_after_batch_prediction(y_pred_batch, y_test_batch, metadata_batch, dataset_info)
