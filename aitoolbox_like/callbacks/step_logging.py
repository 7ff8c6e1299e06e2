"""What the trackers that log every k-th training step share (MLflowTracking, WandBTracking): the per-step hooks."""
from typing import List, Optional

from ._common import BatchLossReader, StepLearningRates
from .abstract import AbstractExperimentCallback


class AbstractStepLoggingTracker(AbstractExperimentCallback):
    """A tracker that, with ``batch_log_frequency=k``, logs the loss and the learning rate of every k-th step: the
    learning rate each logged step's update uses is read when the step begins (a Python float), the losses are read
    from the device in one transfer every ``batch_sync_frequency`` steps by the subclass's ``log_mid_train_loss``
    (which takes the pending ones from ``batch_losses`` and ``learning_rates``), and at the epoch's end. Without
    ``batch_log_frequency`` its per-step hooks are not in use: the step costs nothing."""

    batch_log_frequency: Optional[int]
    batch_sync_frequency: int
    batch_losses: BatchLossReader
    learning_rates: StepLearningRates

    def hooks_in_use(self) -> List[str]:
        """Its hooks, the per-step ones only with ``batch_log_frequency``."""
        hooks = super().hooks_in_use()
        return hooks if self.batch_log_frequency is not None else \
            [name for name in hooks if name not in ('on_batch_begin', 'on_batch_end')]

    def on_batch_begin(self) -> None:
        """The learning rates this step's update uses, on a logged step."""
        if self.train_loop_obj.total_iteration_idx % (self.batch_log_frequency or 1) == 0:
            self.learning_rates.record(self.train_loop_obj)

    def on_batch_end(self) -> None:
        """Log the pending batch losses every ``batch_sync_frequency`` steps (with batch_log_frequency)."""
        if self.batch_log_frequency is not None and \
                (self.train_loop_obj.total_iteration_idx + 1) % self.batch_sync_frequency == 0:
            self.log_mid_train_loss()

    def log_mid_train_loss(self) -> None:
        """Log the batch losses (and learning rates) not logged yet."""
        raise NotImplementedError
