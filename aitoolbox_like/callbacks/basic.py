"""General-purpose callbacks (AIToolbox's ``callbacks.basic`` and ours): stopping rules, a data subset for a quick
test run, a function of the loop on chosen hooks, timing and the progress bar, email reports through AWS SES, and a
log file uploaded with the experiment."""
import html
import itertools
import logging
import math
import os
import shutil
import time
from email.mime.application import MIMEApplication
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from email.utils import formataddr
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple,
                    Union)

import torch

from ..experiment import get_experiment, is_cloud_mode
from ..runtime.host_copy import HostCopy, host_copy
from ..model.multi_loss_optim import MultiLoss
from ..storage.local import write_atomically
from ._common import check_int, lower_is_better, missing_monitor_message
from .abstract import AbstractCallback, AbstractExperimentCallback, StopTraining
from .performance_eval import ModelTrainHistoryFileWriter, ModelTrainHistoryPlot
from .preemption import PreemptionCheckpoint, find_preemption_callback

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
    if monitor == 'loss' and not loop.eval_train_set:
        raise ValueError(f"{who} monitors 'loss', the loss over the whole training set, which the TrainLoop computes "
                         f"only with eval_train_set=True (a pass over the training set after each epoch); monitor "
                         f"'accumulated_loss' (the epoch's training loss, at no cost) or pass eval_train_set=True")


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

    #: Whether the callback stops training when patience is used up (RestoreBestWeights only restores).
    stops_training = True

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
        if not self.stops_training:
            if self.restore_best_weights and loop.num_epochs is not None and loop.epoch + 1 >= loop.num_epochs:
                self._restore()
            return
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
        logger.info('%s restored the weights of epoch %d (%s=%.6g)', type(self).__name__, self.best_epoch,
                    self.monitor, self.best_performance)

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


class RestoreBestWeights(EarlyStopping):
    """Keep the weights of the best evaluation of ``monitor`` and load them back when training ends, without ever
    stopping it: transformers' ``load_best_model_at_end=True`` with ``metric_for_best_model=monitor``.

    It is EarlyStopping with ``restore_best_weights=True`` and no patience: a CPU copy of the model's ``state_dict``
    is kept at every improvement (strictly better than the best by more than ``min_delta``) and loaded back after the
    last planned epoch, before the end-of-training evaluation and the saves of the end of training (and at
    ``on_train_end`` when the fit ends otherwise), so ``train_end_*`` results and ``ModelTrainEndSave``'s model
    are the best one's. A checkpoint keeps the best weights, so a resumed run restores the same ones.

    Args:
        monitor (str): history key to follow (``'val_loss'``, or a metric of ModelPerformanceEvaluation such as
            ``'val_Accuracy'``).
        mode (str): 'min', 'max' or 'auto' ('auto' minimises names containing 'loss' or 'error'):
            transformers' ``greater_is_better``.
        min_delta (float): an improvement must beat the best value by more than this.
    """

    stops_training = False

    def __init__(self, monitor: str = 'val_loss', mode: str = 'auto', min_delta: float = 0.) -> None:
        super().__init__(monitor, min_delta=min_delta, patience=0, mode=mode, restore_best_weights=True)
        self.callback_name = 'RestoreBestWeights'

    @property
    def state_key(self) -> str:
        """``RestoreBestWeights_<monitor>``."""
        return f'RestoreBestWeights_{self.monitor}'

    def on_train_begin(self) -> None:
        """Check that the TrainLoop computes the monitored metric."""
        _check_monitor_is_computed(self.train_loop_obj, self.monitor, 'RestoreBestWeights')


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
        monitor (str or None): history metric checked at the end of every epoch in which it got a value; None: the
            loop's training loss (``train_loss_name``: 'accumulated_loss', or 'loss' with ``eval_train_set``).
        check_every_batch (bool): also check every training batch's loss (every value of a MultiLoss). The
            check accumulates a flag on the device and reads it (one host sync) only every
            ``check_every_n_steps`` batches and at the end of the epoch; training stops within the epoch.
        check_every_n_steps (int): how often the device flag is read when check_every_batch is on.
    """

    def __init__(self, monitor: Optional[str] = None, check_every_batch: bool = False,
                 check_every_n_steps: int = 50) -> None:
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
        monitor = self.monitor or loop.train_loss_name
        value = loop.train_history.value_in_epoch(monitor, loop.epoch)
        if value is None:
            return
        values = value.values() if isinstance(value, dict) else [value]
        if any(not math.isfinite(float(v)) for v in values):
            loop.early_stop = True
            logger.warning('Terminating on %s = %s at epoch %d', monitor, value, loop.epoch)


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


# -------------------------------------------------------------------------------------------------- data subsets


class _FirstBatches:
    """An iterable over the first ``num_batches`` batches of a loader; ``len()`` is the subset's length and
    other attributes (dataset, batch_size, sampler) come from the wrapped loader."""

    def __init__(self, loader: Any, num_batches: int) -> None:
        self.loader = loader
        self.num_batches = num_batches

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.loader), self.num_batches)

    def __len__(self) -> int:
        return min(len(self.loader), self.num_batches)

    def __getattr__(self, name: str) -> Any:
        if name == 'loader':
            raise AttributeError(name)
        return getattr(self.loader, name)


class DataSubsetTestRun(AbstractCallback):
    """Train and evaluate on the first few batches only: a quick end-to-end check of a training script.

    At ``on_train_begin`` each loader is replaced by a ``list`` of its first batches, read once and reused in
    every epoch (AIToolbox's record). From registration until then the loop already holds a view of those
    batches, so ``len()`` of the loaders (e.g. ``get_num_optimizer_updates()`` in a scheduler's registration) is
    that of the subset.

    Args:
        num_train_batches (int): training batches per epoch.
        num_val_batches (int): validation batches (0 keeps the whole validation set).
        num_test_batches (int): test batches (0 keeps the whole test set).
    """

    def __init__(self, num_train_batches: int = 1, num_val_batches: int = 0, num_test_batches: int = 0) -> None:
        super().__init__('Run model on a small subset of the training dataset', execution_order=-100)
        check_int('num_train_batches', num_train_batches, 1, who='DataSubsetTestRun')
        check_int('num_val_batches', num_val_batches, 0, who='DataSubsetTestRun')
        check_int('num_test_batches', num_test_batches, 0, who='DataSubsetTestRun')
        self.num_train_batches = num_train_batches
        self.num_val_batches = num_val_batches
        self.num_test_batches = num_test_batches

    def on_train_loop_registration(self) -> None:
        """Check that the loaders to subset exist, and put views of their first batches in the loop."""
        loop = self.train_loop_obj
        for num, attr in ((self.num_val_batches, 'validation_loader'), (self.num_test_batches, 'test_loader')):
            if num > 0 and getattr(loop, attr) is None:
                raise ValueError(f'DataSubsetTestRun: {attr.replace("_", " ")} subset of {num} batches asked for, '
                                 f'but the TrainLoop has no {attr}')
        for attr, num in self._subsets():
            setattr(loop, attr, _FirstBatches(_unwrapped(getattr(loop, attr)), num))

    def on_train_begin(self) -> None:
        """Replace the loaders by lists of their first batches."""
        # Also after registration: loaders may have been replaced since (e.g. built inside each DDP process).
        loop = self.train_loop_obj
        for attr, num in self._subsets():
            setattr(loop, attr, self.subset_data_loader(getattr(loop, attr), num))

    def _subsets(self) -> List[Tuple[str, int]]:
        loop = self.train_loop_obj
        return [(attr, num) for attr, num in (('train_loader', self.num_train_batches),
                                              ('validation_loader', self.num_val_batches),
                                              ('test_loader', self.num_test_batches))
                if num > 0 and getattr(loop, attr) is not None]

    @staticmethod
    def subset_data_loader(data_loader: Iterable[Any], num_batches: int) -> List[Any]:
        """The first ``num_batches`` batches of ``data_loader``, as a list."""
        return list(itertools.islice(iter(_unwrapped(data_loader)), num_batches))


def _unwrapped(loader: Any) -> Any:
    # A view is never nested: a subset of a subset reads the original loader.
    return loader.loader if isinstance(loader, _FirstBatches) else loader


# ------------------------------------------------------------------------ a function of the loop on chosen hooks


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


# ---------------------------------------------------------------------- how long and how far: Timer, ProgressBar


class Timer(AbstractCallback):
    """Wall time and training throughput per epoch, into the train history.

    History keys: ``'epoch_time'`` (seconds from on_epoch_begin to this callback's on_epoch_end, including the
    end-of-epoch evaluation), ``'train_time'`` (seconds from the first batch to the end of the last one),
    ``'batches_per_sec'`` and, when the loader has a batch_size, ``'samples_per_sec'`` (training samples of this
    process per train_time second). Times are host clock readings and never sync the device, so on a GPU the
    last few queued steps may be counted in the evaluation instead of train_time.

    Args:
        max_duration_s (float or None): a wall-time budget for the fit, counted from its ``on_train_begin`` (a
            resumed fit gets a new budget). Once it is spent, training stops at the end of the current step the way
            a preemption signal stops it: a full mid-epoch checkpoint through the loop's checkpoint callback (when
            there is one), a bounded wait for its upload, then ``StopTraining`` (see
            :class:`~aitoolbox_like.callbacks.preemption.PreemptionCheckpoint`, whose registered instance is used;
            in DDP the ranks agree on the step). ``fit(resume_from='latest')`` then continues.
    """

    def __init__(self, max_duration_s: Optional[float] = None) -> None:
        super().__init__('Epoch timer')
        if max_duration_s is not None and (isinstance(max_duration_s, bool) or not max_duration_s > 0):
            raise ValueError(f'max_duration_s must be a number of seconds > 0 or None, got {max_duration_s!r}')
        self.max_duration_s = max_duration_s
        self._epoch_start: Optional[float] = None
        self._train_start: Optional[float] = None
        self._train_end: Optional[float] = None
        self._deadline: Optional[float] = None
        self._stopper: Optional[PreemptionCheckpoint] = None      # a PreemptionCheckpoint not registered itself

    def hooks_in_use(self) -> List[str]:
        hooks = super().hooks_in_use()
        budget_hooks = ('on_train_begin', 'on_train_end')
        return hooks if self.max_duration_s is not None else [h for h in hooks if h not in budget_hooks]

    def on_train_begin(self) -> None:
        """(Only with max_duration_s.) Start the fit's wall-time budget."""
        loop = self.train_loop_obj
        self._stopper = None
        if find_preemption_callback(loop) is None:
            # No registered one (preemption_safe=False, or no checkpoint callback): use one without signals, not
            # registered, that this timer drives itself.
            stopper = PreemptionCheckpoint(signals=())
            stopper.train_loop_obj = loop
            stopper.on_train_begin()
            self._stopper = stopper
        assert self.max_duration_s is not None
        self._deadline = time.monotonic() + self.max_duration_s

    def on_epoch_begin(self) -> None:
        """Start the epoch clock."""
        self._epoch_start = time.perf_counter()
        self._train_start = None

    def on_batch_begin(self) -> None:
        """Start the training clock at the epoch's first batch."""
        if self._train_start is None:
            self._train_start = time.perf_counter()

    def on_batch_end(self) -> None:
        """Note the end of the latest batch; past the time budget, checkpoint and stop."""
        self._train_end = time.perf_counter()
        deadline = self._deadline
        if deadline is not None and time.monotonic() >= deadline:
            self._deadline = None
            reason = f'the time budget of {self.max_duration_s} s (Timer(max_duration_s)) is spent'
            registered = self._stopper or find_preemption_callback(self.train_loop_obj)
            assert registered is not None, 'found or made at on_train_begin'
            # A registered PreemptionCheckpoint checkpoints and stops in its own on_batch_end, after this one.
            registered.request_stop(reason)
        if self._stopper is not None:
            self._stopper.on_batch_end()       # in DDP every step, so that the ranks agree on the stop

    def on_train_end(self) -> None:
        """(Only with max_duration_s.) Close the budget."""
        self._deadline = None
        if self._stopper is not None:
            self._stopper.on_train_end()
            self._stopper = None

    def on_epoch_end(self) -> None:
        """Write the epoch's times and throughput into the train history."""
        loop = self.train_loop_obj
        now = time.perf_counter()
        epoch_start = self._epoch_start
        assert epoch_start is not None, 'on_epoch_begin runs before on_epoch_end'
        loop.insert_metric_result_into_history('epoch_time', now - epoch_start)
        num_batches = len(loop.loss_batch_accum)
        if self._train_start is None or num_batches == 0:
            return
        train_end = self._train_end
        assert train_end is not None, 'on_batch_end ran after the on_batch_begin that started the clock'
        train_time = max(train_end - self._train_start, 1e-9)
        loop.insert_metric_result_into_history('train_time', train_time)
        loop.insert_metric_result_into_history('batches_per_sec', num_batches / train_time)
        samples = self._num_samples(loop.train_loader, num_batches)
        if samples is not None:
            loop.insert_metric_result_into_history('samples_per_sec', samples / train_time)

    @staticmethod
    def _num_samples(loader: Any, num_batches: int) -> Optional[int]:
        batch_size = getattr(loader, 'batch_size', None)
        if not isinstance(batch_size, int):
            return None
        samples = num_batches * batch_size
        try:
            full_epoch = num_batches == len(loader)
            sampler_len = len(loader.sampler)
        except (TypeError, AttributeError):
            return samples
        # A full epoch without drop_last ends with a smaller batch: the sampler knows the exact count.
        if full_epoch and not getattr(loader, 'drop_last', False) and samples - batch_size < sampler_len <= samples:
            return sampler_len
        return samples


class ProgressBar(AbstractCallback):
    """A tqdm bar per epoch, with the epoch's metrics in the postfix at the end of the epoch.

    The TrainLoop adds one on the main process when its ``progress_bar`` is on (default: when stderr is
    a terminal). The running loss is shown every ``loss_refresh_steps`` steps (0: never); on a GPU its copy
    to the host is started then and shown once it has arrived, a step or so later, so the bar never makes
    the host wait for the device.
    """

    def __init__(self, loss_refresh_steps: int = 50, leave: bool = True) -> None:
        super().__init__('Progress bar', execution_order=97, device_idx_execution=0)
        self.loss_refresh_steps = loss_refresh_steps
        self.leave = leave
        self._bar: Any = None     # the epoch's tqdm bar
        self._loss_copy: Optional[HostCopy] = None     # the running loss on its way to the host

    def on_epoch_begin(self) -> None:
        """Open the epoch's bar."""
        from tqdm.auto import tqdm
        loop = self.train_loop_obj
        try:
            total = len(loop.train_loader)
        except TypeError:
            total = None
        total_epochs = f'/{loop.num_epochs}' if loop.num_epochs else ''
        self._bar = tqdm(total=total, desc=f'Epoch {loop.epoch + 1}{total_epochs}', leave=self.leave,
                         dynamic_ncols=True)

    def on_batch_end(self) -> None:
        """Advance the bar (and show the running loss every ``loss_refresh_steps`` steps)."""
        if self._bar is None:
            return
        self._bar.update(1)
        n = self.loss_refresh_steps
        if n and self._bar.n % n == 0 and self.train_loop_obj.loss_batch_accum:
            last = self.train_loop_obj.loss_batch_accum[-1]
            last = last.total() if hasattr(last, 'total') else last
            if isinstance(last, torch.Tensor):
                self._loss_copy = host_copy(last.detach())
            else:
                self._bar.set_postfix(loss=f'{float(last):.4g}', refresh=False)
        if self._loss_copy is not None and self._loss_copy.ready():
            self._bar.set_postfix(loss=f'{self._loss_copy.wait().item():.4g}', refresh=False)
            self._loss_copy = None

    def on_epoch_end(self) -> None:
        """Show the epoch's metrics and close the bar."""
        if self._bar is None:
            return
        history = self.train_loop_obj.train_history
        epoch = self.train_loop_obj.epoch
        postfix = {name: f'{value:.4g}' for name in history
                   if isinstance(value := history.value_in_epoch(name, epoch), float)}
        self._bar.set_postfix(postfix)
        self._close()

    def on_train_end(self) -> None:
        """Close a bar left open."""
        # A StopTraining inside an epoch skips on_epoch_end; do not leave the bar open.
        self._close()

    def on_exception(self, exception: BaseException) -> None:
        """Close a bar left open."""
        self._close()

    def _close(self) -> None:
        self._loss_copy = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None


# --------------------------------------------------------------------------------- email reports through AWS SES


def _import_boto3(who: str) -> Tuple[Any, Any]:
    try:
        import boto3
        import botocore.config
    except ImportError as exc:
        raise ImportError(f'{who} needs boto3: pip install aitoolbox_like[s3]') from exc
    return boto3, botocore.config


class SESSender:
    """Sends HTML emails with attachments through AWS Simple Email Service (``send_raw_email``).

    Credentials, and optionally an endpoint (``AWS_ENDPOINT_URL_SES``) and retries (``AWS_MAX_ATTEMPTS``,
    ``AWS_RETRY_MODE``), come from the usual boto3 configuration. The boto3 client is created at the first
    send, so the sender can be pickled before training (DDP launch).

    Args:
        sender_name (str): name shown as the sender.
        sender_email (str): sender address (verified in SES).
        recipient_email (str or list of str): recipient address(es).
        aws_region (str): SES region.
    """

    CHARSET = 'UTF-8'
    # Seconds; botocore's defaults (60 s) would hold training up for minutes on an unreachable endpoint.
    connect_timeout_s = 10
    read_timeout_s = 30

    def __init__(self, sender_name: str, sender_email: str, recipient_email: Union[str, Sequence[str]],
                 aws_region: str = 'eu-west-1') -> None:
        _import_boto3('SESSender')
        self.sender_name = sender_name
        self.sender_email = sender_email
        self.recipient_email = recipient_email
        self.aws_region = aws_region
        self._client: Any = None

    @property
    def sender(self) -> str:
        """``Name <address>`` of the sender."""
        return formataddr((self.sender_name, self.sender_email))

    @property
    def recipients(self) -> List[str]:
        """The recipient addresses as a list."""
        return [self.recipient_email] if isinstance(self.recipient_email, str) else list(self.recipient_email)

    @property
    def client(self) -> Any:
        """The boto3 SES client, created at first use."""
        if self._client is None:
            boto3, config = _import_boto3('SESSender')
            self._client = boto3.client('ses', region_name=self.aws_region, config=config.Config(
                connect_timeout=self.connect_timeout_s, read_timeout=self.read_timeout_s))
        return self._client

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state['_client'] = None
        return state

    def build_message(self, subject: str, body: str,
                      attachment_file_paths: Optional[Iterable[str]] = None) -> MIMEMultipart:
        """The MIME message: an HTML part (``body`` inside <html><body>) and one attachment per existing file
        (a missing file is skipped with a warning)."""
        message = MIMEMultipart('mixed')
        message['Subject'] = subject
        message['From'] = self.sender
        message['To'] = ', '.join(self.recipients)
        alternative = MIMEMultipart('alternative')
        html_text = f'<html>\n<head></head>\n<body>\n{body}\n</body>\n</html>\n'
        alternative.attach(MIMEText(html_text, 'html', self.CHARSET))
        message.attach(alternative)
        for path in attachment_file_paths or []:
            try:
                with open(path, 'rb') as f:
                    part = MIMEApplication(f.read())
            except OSError as error:
                logger.warning('Email attachment %s skipped: %s', path, error)
                continue
            part.add_header('Content-Disposition', 'attachment', filename=os.path.basename(path))
            message.attach(part)
        return message

    def send_email(self, subject: str, body: str, attachment_file_paths: Optional[Iterable[str]] = None) -> str:
        """Send the email; returns SES's MessageId. Errors (botocore's) are raised to the caller."""
        message = self.build_message(subject, body, attachment_file_paths)
        response = self.client.send_raw_email(Source=self.sender, Destinations=self.recipients,
                                              RawMessage={'Data': message.as_bytes()})
        return response.get('MessageId', '')


class EmailNotification(AbstractCallback):
    """Email a report after every epoch and at the end of training, through AWS SES (needs boto3:
    ``pip install aitoolbox_like[s3]``).

    The epoch email lists the latest value of every history metric; the end-of-training email also lists the
    hyperparameters of a tracking TrainLoop. Files written by ModelTrainHistoryPlot and
    ModelTrainHistoryFileWriter in the same epoch are attached. A failed send never stops training: the first
    failure is logged as an error with its reason, and the end of training reports how many failed.

    Args:
        sender_name (str): name shown as the sender.
        sender_email (str): sender address (verified in SES).
        recipient_email (str): where the emails go.
        project_name (str or None): for the subject (None: the tracking TrainLoop's, else 'default_project').
        experiment_name (str or None): for the subject (None: the tracking TrainLoop's, else 'experiment').
        aws_region (str): SES region.
    """

    def __init__(self, sender_name: str, sender_email: str, recipient_email: Union[str, Sequence[str]],
                 project_name: Optional[str] = None, experiment_name: Optional[str] = None,
                 aws_region: str = 'eu-west-1') -> None:
        super().__init__('Send email to notify about the state of training', execution_order=98,
                         device_idx_execution=0)
        _import_boto3('EmailNotification')       # a missing extra fails here, not after the first epoch
        self.project_name = project_name
        self.experiment_name = experiment_name
        self.ses_sender: Optional[SESSender] = None     # created at registration
        self.sender_name = sender_name
        self.sender_email = sender_email
        self.recipient_email = recipient_email
        self.aws_region = aws_region
        self.sent_count = 0
        self.failed_count = 0

    def on_train_loop_registration(self) -> None:
        """Take the names from the TrainLoop (or the defaults) and create the SES sender."""
        loop = self.train_loop_obj
        # A plain TrainLoop has no names; AIToolbox raised an error, the subject uses the defaults instead.
        if self.project_name is None:
            self.project_name = getattr(loop, 'project_name', None) or AbstractExperimentCallback.DEFAULT_PROJECT_NAME
        if self.experiment_name is None:
            self.experiment_name = getattr(loop, 'experiment_name', None) or AbstractExperimentCallback.DEFAULT_EXPERIMENT_NAME
        self.ses_sender = SESSender(self.sender_name, self.sender_email, self.recipient_email, self.aws_region)

    def on_epoch_end(self) -> None:
        """Send the end-of-epoch report."""
        epoch = self.train_loop_obj.epoch
        subject = f'End of epoch {epoch} report: {self.project_name}: {self.experiment_name}'
        body = f'<h2>End of epoch {epoch}</h2>\n{self.get_metric_list_html()}'
        self._send(subject, body)

    def on_train_end(self) -> None:
        """Send the end-of-training report (or, after an interruption, say so)."""
        interrupted = self.train_loop_obj.interrupted
        what = f'Training interrupted ({interrupted})' if interrupted else 'End of training'
        subject = f'{what}: {self.project_name}: {self.experiment_name}'
        body = (f'<h2>{html.escape(what)} at epoch {self.train_loop_obj.epoch}</h2>\n{self.get_metric_list_html()}\n'
                f'<h3>Used hyper parameters:</h3>\n{self.get_hyperparams_html()}')
        self._send(subject, body)
        if self.failed_count > 1:
            logger.warning('EmailNotification: %d of %d emails could not be sent (the first failure was logged)',
                           self.failed_count, self.failed_count + self.sent_count)

    def get_metric_list_html(self) -> str:
        """HTML list of the latest value of every history metric."""
        items = [f'<li><p>{html.escape(str(name))}: {html.escape(str(values[-1]))}</p></li>'
                 for name, values in self.train_loop_obj.train_history.items() if len(values) > 0]
        return '<ul>' + '\n'.join(items) + '</ul>'

    def get_hyperparams_html(self) -> str:
        """HTML list of the tracking TrainLoop's hyperparameters, or 'Not given'."""
        hyperparams = getattr(self.train_loop_obj, 'hyperparams', None)
        if not isinstance(hyperparams, dict):
            return 'Not given'
        items = [f'<li><p>{html.escape(str(name))}: {html.escape(str(value))}</p></li>'
                 for name, value in hyperparams.items()]
        return '<ul>' + '\n'.join(items) + '</ul>'

    def get_attachment_paths(self) -> List[str]:
        """Files the history plot / file writer callbacks of this loop wrote at their last call."""
        paths: List[str] = []
        for callback in self.train_loop_obj.callbacks:
            if isinstance(callback, (ModelTrainHistoryPlot, ModelTrainHistoryFileWriter)):
                paths += [p for p in callback.last_written_files if os.path.isfile(p) and p not in paths]
        return paths

    def _send(self, subject: str, body: str) -> bool:
        try:
            # Inside the try: a sender missing (never registered) counts as a failed send, as it always did.
            ses_sender = self.ses_sender
            assert ses_sender is not None, 'the SES sender is created at registration'
            message_id = ses_sender.send_email(subject, body, self.get_attachment_paths())
        except Exception as error:      # an email is a report: training goes on whatever went wrong
            self.failed_count += 1
            if self.failed_count == 1:
                logger.error('EmailNotification could not send %r to %s via SES in %s (%s: %s); training goes '
                             'on, later failures are only counted', subject, self.recipient_email, self.aws_region,
                             type(error).__name__, error)
            else:
                logger.debug('EmailNotification failure %d: %s: %s', self.failed_count, type(error).__name__, error)
            return False
        self.sent_count += 1
        logger.info('EmailNotification sent %r (SES MessageId %s)', subject, message_id)
        return True


# ----------------------------------------------------------------- a log file into the experiment's cloud folder


class LogUpload(AbstractExperimentCallback):
    """Upload a log file into the experiment's cloud folder after every epoch, at the end of training and when
    training fails: ``<cloud_dir_prefix>/<project>/<experiment>_<timestamp>/<log file name>``.

    The file is copied into the local experiment folder under its name (a consistent snapshot even while the
    logger keeps writing) and the copy goes through the loop's shared background uploader, so training
    does not wait for the network.

    Args:
        log_file_path (str): the log file (e.g. the file a logging.FileHandler writes, or a tmux/tee log).
        fail_if_cloud_missing (bool): raise ValueError at registration when there is no cloud cloud_save_mode
            (False: log a warning and only keep the log where it is).
        project_name: the experiment (None: from the tracking TrainLoop; see AbstractExperimentCallback), as are
            the following five.
        experiment_name: see project_name.
        local_model_result_folder_path: see project_name.
        cloud_save_mode: see project_name.
        bucket_name: see project_name.
        cloud_dir_prefix: see project_name.
    """

    def __init__(self, log_file_path: str = '~/project/training.log', fail_if_cloud_missing: bool = True,
                 project_name: Optional[str] = None, experiment_name: Optional[str] = None,
                 local_model_result_folder_path: Optional[str] = None, cloud_save_mode: Optional[str] = None,
                 bucket_name: Optional[str] = None, cloud_dir_prefix: Optional[str] = None) -> None:
        super().__init__('Upload logging file to cloud', project_name, experiment_name,
                         local_model_result_folder_path, cloud_save_mode, bucket_name, cloud_dir_prefix,
                         execution_order=1500, device_idx_execution=0)
        self.log_file_path = os.path.abspath(os.path.expanduser(log_file_path))
        self.log_filename = os.path.basename(self.log_file_path)
        self.fail_if_cloud_missing = fail_if_cloud_missing
        self.uploads_on = False
        self._warned_missing = False

    def on_train_loop_registration(self) -> None:
        """Infer the experiment; check that uploads are possible (raise, or warn with
        fail_if_cloud_missing=False)."""
        self.try_infer_experiment_details(infer_cloud_details=True)
        self.uploads_on = is_cloud_mode(self.cloud_save_mode)     # raises for an unknown mode
        if self.uploads_on:
            return
        message = (f'LogUpload: cloud_save_mode={self.cloud_save_mode!r} uploads nothing, so {self.log_file_path} '
                   f"is not uploaded; use cloud_save_mode='s3' (or 'gcs', 'azure') with a bucket_name")
        if self.fail_if_cloud_missing:
            raise ValueError(f'{message} (or fail_if_cloud_missing=False to train without the upload)')
        logger.warning('%s; the log could be lost with this machine', message)

    def on_epoch_end(self) -> None:
        """Upload the log."""
        self.upload_log_file()

    def on_train_end(self) -> None:
        """Upload the log."""
        self.upload_log_file()

    def on_exception(self, exception: BaseException) -> None:
        """Upload the log of the failed run (an upload error is only logged)."""
        # The log of a failed run is the one most worth keeping.
        try:
            self.upload_log_file()
        except Exception as error:
            logger.error('LogUpload could not upload %s after %s: %s', self.log_file_path,
                         type(exception).__name__, error)

    def upload_log_file(self) -> Optional[str]:
        """Snapshot the log file into the experiment folder and queue its upload; returns the snapshot's path
        (None when uploads are off or the log file does not exist yet, which is warned about once)."""
        if not self.uploads_on:
            return None
        if not os.path.isfile(self.log_file_path):
            if not self._warned_missing:
                self._warned_missing = True
                logger.warning('LogUpload: log file %s does not exist (yet); nothing uploaded', self.log_file_path)
            return None
        experiment = get_experiment(self.train_loop_obj, self.project_name, self.experiment_name,
                                    self.local_model_result_folder_path)
        snapshot = os.path.join(experiment.claim(), self.log_filename)
        if os.path.abspath(snapshot) != self.log_file_path:
            # Replaced atomically: an upload still reading the previous snapshot keeps reading a whole file.
            with open(self.log_file_path, 'rb') as source:
                write_atomically(snapshot, lambda target: shutil.copyfileobj(source, target, 1024 * 1024))
        self.upload_experiment_files([snapshot])
        return snapshot
