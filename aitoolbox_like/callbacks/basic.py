"""General-purpose callbacks: stopping rules, data subsets, timing, progress, function hooks, email reports and
log upload.

The stopping rules are defined here; the others live in modules of their own idea (``data_subset``,
``function_callback``, ``progress``, ``notifications``, ``log_upload``) and are importable from here, AIToolbox's
``callbacks.basic``, as well."""
import logging
import math
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import torch

from ..multi_loss_optim import MultiLoss
from ._common import check_int, lower_is_better, missing_monitor_message
from .abstract import AbstractCallback, StopTraining
# The other general-purpose callbacks, importable from here where AIToolbox has them.
from .data_subset import DataSubsetTestRun
from .function_callback import FunctionOnTrainLoop
from .log_upload import LogUpload
from .notifications import EmailNotification, SESSender
from .progress import ProgressBar, Timer

if TYPE_CHECKING:
    from ..engine.train_loop import TrainLoop

logger = logging.getLogger(__name__)


def _check_monitor_is_computed(loop: 'TrainLoop', monitor: str, who: str) -> None:
    if monitor == 'val_loss' and loop.validation_loader is None:
        raise ValueError(f"{who} monitors 'val_loss' but the TrainLoop has no validation_loader; pass one or "
                         f"monitor another history metric")
    if monitor in ('loss', 'val_loss') and not loop.end_auto_eval:
        raise ValueError(f'{who} monitors {monitor!r}, which the TrainLoop computes only with end_auto_eval=True '
                         f'(or an epoch interval); it is False')


class ListRegisteredCallbacks(AbstractCallback):
    """Print the registered callbacks (in execution order) when training starts."""

    def __init__(self) -> None:
        super().__init__('Print the list of registered callbacks')

    def on_train_begin(self) -> None:
        """Print the registered callbacks."""
        self.train_loop_obj.callbacks_handler.print_registered_callback_names()


class EarlyStopping(AbstractCallback):
    """Stop training when a history metric stops improving.

    Args:
        monitor (str): history key to follow.
        min_delta (float): an improvement must beat the best value by more than this.
        patience (int): evaluations without improvement tolerated before stopping (0 stops at the first one).
        mode (str): 'min', 'max' or 'auto' ('auto' minimises names containing 'loss' or 'error').
        restore_best_weights (bool): load the weights of the best evaluation back into the model when training
            ends (a CPU copy is kept).

    Epochs in which the metric got no new value (evaluation every k epochs) are ignored, so patience counts
    evaluations. The loop OR-reduces ``early_stop`` across ranks, so one rank's decision stops all of them.
    """

    def __init__(self, monitor: str = 'val_loss', min_delta: float = 0., patience: int = 0, mode: str = 'auto',
                 restore_best_weights: bool = False) -> None:
        super().__init__('EarlyStopping', execution_order=99)
        if mode not in ('auto', 'min', 'max'):
            raise ValueError(f"EarlyStopping: mode must be 'auto', 'min' or 'max', got {mode!r}")
        check_int('patience', patience, 0, who='EarlyStopping')
        if min_delta < 0:
            raise ValueError(f'EarlyStopping: min_delta must be >= 0, got {min_delta!r}')
        self.monitor = monitor
        self.min_delta = min_delta
        self.patience = patience
        self.mode = mode
        self.restore_best_weights = restore_best_weights
        self.minimize = lower_is_better(monitor) if mode == 'auto' else mode == 'min'
        self.patience_count = patience
        self.best_performance: Optional[float] = None
        self.best_epoch = 0
        self.best_weights: Optional[Dict[str, torch.Tensor]] = None
        self._weights_are_best = True
        self._warned_missing = False

    @property
    def state_key(self) -> str:
        """``EarlyStopping_<monitor>``."""
        return f'EarlyStopping_{self.monitor}'

    def on_train_begin(self) -> None:
        """Check that the TrainLoop computes the monitored metric."""
        _check_monitor_is_computed(self.train_loop_obj, self.monitor, 'EarlyStopping')

    def _improved(self, value: float) -> bool:
        best = self.best_performance
        if best is None or (math.isnan(best) and not math.isnan(value)):
            return True
        if self.minimize:
            return value < best - self.min_delta
        return value > best + self.min_delta

    def on_epoch_end(self) -> None:
        """Compare this epoch's value with the best one; set ``early_stop`` when patience is used up."""
        loop = self.train_loop_obj
        value = loop.train_history.value_in_epoch(self.monitor, loop.epoch)
        if value is None:
            if not loop.train_history.get(self.monitor) and not self._warned_missing:
                self._warned_missing = True
                logger.warning(missing_monitor_message('EarlyStopping', self.monitor, list(loop.train_history.keys()),
                                                       loop.epoch))
            return
        value = float(value)
        if self._improved(value):
            self.best_performance, self.best_epoch = value, loop.epoch
            self.patience_count = self.patience
            if self.restore_best_weights:
                self.best_weights = {k: v.detach().to('cpu', copy=True) for k, v in loop.model.state_dict().items()}
            self._weights_are_best = True
            return
        self._weights_are_best = False
        self.patience_count -= 1
        if self.patience_count < 0:
            loop.early_stop = True
            logger.info('Early stopping at epoch %d: %s did not improve for %d evaluation(s); best %.6g at epoch %d',
                        loop.epoch, self.monitor, self.patience + 1, self.best_performance, self.best_epoch)
            # Restore now so the end-of-training test loss is computed with the best weights.
            self._restore()
        elif self.restore_best_weights and loop.num_epochs is not None and loop.epoch + 1 >= loop.num_epochs:
            self._restore()

    def on_train_end(self) -> None:
        """Restore the best weights (restore_best_weights=True)."""
        self._restore()

    def _restore(self) -> None:
        if not self.restore_best_weights or self.best_weights is None or self._weights_are_best:
            return
        loop = self.train_loop_obj
        loop.model.load_state_dict(self.best_weights)
        loop.purge_prediction_cache()
        self._weights_are_best = True
        logger.info('EarlyStopping restored the weights of epoch %d (%s=%.6g)', self.best_epoch, self.monitor,
                    self.best_performance)

    def state_dict(self) -> Dict[str, Any]:
        """Best value and epoch, patience left (and the best weights, when kept)."""
        state: Dict[str, Any] = {'best_performance': self.best_performance, 'best_epoch': self.best_epoch,
                 'patience_count': self.patience_count, 'weights_are_best': self._weights_are_best}
        if self.best_weights is not None:
            state['best_weights'] = self.best_weights
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore what state_dict returned."""
        self.best_performance = state_dict['best_performance']
        self.best_epoch = state_dict['best_epoch']
        self.patience_count = state_dict['patience_count']
        self._weights_are_best = state_dict.get('weights_are_best', True)
        self.best_weights = state_dict.get('best_weights')


class ThresholdEarlyStopping(AbstractCallback):
    """Stop training when a metric is on the wrong side of ``threshold`` for more than ``patience`` evaluations
    in a row (above it for names containing 'loss' or 'error', below it otherwise). Epochs without a new value
    are ignored."""

    def __init__(self, monitor: str, threshold: float, patience: int = 0) -> None:
        super().__init__('Threshold early stopping', execution_order=99)
        check_int('patience', patience, 0, who='ThresholdEarlyStopping')
        self.monitor = monitor
        self.threshold = threshold
        self.patience = patience
        self.patience_count = patience
        self.minimize = lower_is_better(monitor)

    @property
    def state_key(self) -> str:
        """``ThresholdEarlyStopping_<monitor>``."""
        return f'ThresholdEarlyStopping_{self.monitor}'

    def on_train_begin(self) -> None:
        """Check that the TrainLoop computes the monitored metric."""
        _check_monitor_is_computed(self.train_loop_obj, self.monitor, 'ThresholdEarlyStopping')

    def on_epoch_end(self) -> None:
        """Count this epoch's miss (or reset the count); set ``early_stop`` when patience is used up."""
        loop = self.train_loop_obj
        value = loop.train_history.value_in_epoch(self.monitor, loop.epoch)
        if value is None:
            return
        value = float(value)
        missed = value > self.threshold if self.minimize else value < self.threshold
        if math.isnan(value):
            missed = True
        if not missed:
            self.patience_count = self.patience
            return
        self.patience_count -= 1
        if self.patience_count < 0:
            loop.early_stop = True
            logger.info('Threshold %s=%s not reached; early stopping at epoch %d', self.monitor, self.threshold,
                        loop.epoch)

    def state_dict(self) -> Dict[str, Any]:
        """The patience left."""
        return {'patience_count': self.patience_count}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore what state_dict returned."""
        self.patience_count = state_dict['patience_count']


def _loss_tensors(loss: Any) -> List[Any]:
    return list(loss.values()) if isinstance(loss, MultiLoss) else [loss]


class TerminateOnNaN(AbstractCallback):
    """Stop training when the loss becomes NaN or infinite.

    Args:
        monitor (str): history metric checked at the end of every epoch in which it got a value.
        check_every_batch (bool): also check every training batch's loss (every value of a MultiLoss). The
            check accumulates a flag on the device and reads it (one host sync) only every
            ``check_every_n_steps`` batches and at the end of the epoch; training stops within the epoch.
        check_every_n_steps (int): how often the device flag is read when check_every_batch is on.
    """

    def __init__(self, monitor: str = 'loss', check_every_batch: bool = False, check_every_n_steps: int = 50) -> None:
        super().__init__('TerminateOnNaN', execution_order=98)
        check_int('check_every_n_steps', check_every_n_steps, 1, who='TerminateOnNaN')
        self.monitor = monitor
        self.check_every_batch = check_every_batch
        self.check_every_n_steps = check_every_n_steps
        self._all_finite: Optional[torch.Tensor] = None
        self._unchecked_steps = 0

    def on_epoch_begin(self) -> None:
        """Reset the batch check."""
        self._all_finite = None
        self._unchecked_steps = 0

    def on_batch_end(self) -> None:
        """Fold this batch's finiteness into the device flag; read it every ``check_every_n_steps`` batches."""
        if not self.check_every_batch:
            return
        loss_accum = self.train_loop_obj.loss_batch_accum
        if not loss_accum:
            return
        for loss in _loss_tensors(loss_accum[-1]):
            finite = torch.isfinite(loss).all()
            self._all_finite = finite if self._all_finite is None else torch.logical_and(self._all_finite, finite)
        self._unchecked_steps += 1
        if self._unchecked_steps >= self.check_every_n_steps:
            self._check_batches()

    def _check_batches(self) -> None:
        self._unchecked_steps = 0
        if self._all_finite is None or bool(self._all_finite):
            return
        loop = self.train_loop_obj
        loop.early_stop = True
        logger.warning('Terminating: a training batch loss is NaN or infinite (epoch %d, batch %d)',
                       loop.epoch, loop.iteration)
        raise StopTraining(f'non-finite training loss in epoch {loop.epoch}')

    def on_epoch_end(self) -> None:
        """Check the epoch's remaining batches and the monitored history value."""
        if self.check_every_batch:
            self._check_batches()
        loop = self.train_loop_obj
        value = loop.train_history.value_in_epoch(self.monitor, loop.epoch)
        if value is None:
            return
        values = value.values() if isinstance(value, dict) else [value]
        if any(not math.isfinite(float(v)) for v in values):
            loop.early_stop = True
            logger.warning('Terminating on %s = %s at epoch %d', self.monitor, value, loop.epoch)


class AllPredictionsSame(AbstractCallback):
    """At the end of every epoch, warn (and optionally stop) when every validation prediction equals ``value``:
    the sign of a collapsed model."""

    def __init__(self, value: float = 0., stop_training: bool = False, verbose: bool = True) -> None:
        super().__init__('All predictions have the same value')
        self.value = value
        self.stop_training = stop_training
        self.verbose = verbose

    def on_train_loop_registration(self) -> None:
        """Check that the TrainLoop has a validation loader."""
        if self.train_loop_obj.validation_loader is None:
            raise ValueError('AllPredictionsSame checks the validation predictions, but the TrainLoop has no '
                             'validation_loader')

    def on_epoch_end(self) -> None:
        """Warn (and stop, with stop_training) when every validation prediction equals ``value``."""
        loop = self.train_loop_obj
        y_pred, _, _ = loop.predict_on_validation_set()
        if not bool((torch.as_tensor(y_pred) == self.value).all()):
            return
        if self.verbose:
            logger.warning('All validation predictions equal %s at epoch %d', self.value, loop.epoch)
        if self.stop_training:
            loop.early_stop = True
