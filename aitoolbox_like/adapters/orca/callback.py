"""BigDL Orca's PyTorch callbacks on the TrainLoop: Orca's ``Callback`` and ``MainCallback`` and the ``runner`` their
methods receive (the package's other modules: Orca's built-in callbacks, its metrics, its Estimator).

This is an adapter, not a second dispatch system: every Orca callback is an :class:`AbstractCallback` whose loop
hooks call its Orca methods, with the loop's one :class:`Runner` (Orca's ``TorchRunner`` as its callbacks see it).
Which Orca method runs on which loop hook (docs/callbacks/orca.md has the full table):

    [2.2: set_model, set_trainer, on_train_begin()] before_run        on_train_begin
    [2.2: on_epoch_begin(epoch)] before_train_epoch                   on_epoch_begin
    [2.2: on_batch_begin(batch_idx)] before_train_iter                on_batch_begin
    on_train_forward, on_iter_backward (MainCallback)                 train_step (the MainCallback owns the step)
    after_train_iter [2.2: on_batch_end(batch_idx, logs)]             on_batch_end (global_step counts the batch)
    on_lr_adjust                                                      on_train_epoch_end (before the evaluation)
    before_val_epoch ... after_val_epoch, on_val_forward              the validation loss pass (on_val_forward is
                                                                      its forward, when a MainCallback is registered)
    after_train_epoch [2.2: on_epoch_end(epoch, logs)]                on_epoch_end (after the validation)
    [2.2: on_train_end(logs)] after_run                               on_train_end
    before_pred_epoch ... after_pred_epoch                            the evaluation hooks of prediction passes outside fit

Orca's generic hooks chain as in Orca's base class: ``before_train_epoch``, ``before_val_epoch`` and
``before_pred_epoch`` call ``before_epoch``; the ``after_*_epoch`` ones ``after_epoch``; the ``*_iter`` ones
``before_iter`` / ``after_iter``. The names of Orca's callback tutorial (``on_run_begin``, ``on_iter_begin``, ...),
which Orca 2.4.0 never calls, are not called here either (a warning names them).
"""
import contextlib
import functools
import inspect
import logging
import math
import os
import shutil
import tempfile
import types
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ...callbacks.abstract import AbstractCallback
from ...engine.steering import StepRequestError
from ...model.feeds import PlainModuleFeed
from ..foreign_state import Encoder, ForeignState, decode, loop_references, unsaveable
from .metrics import metric_accumulators

if TYPE_CHECKING:
    from ...engine.train_loop import TrainLoop

logger = logging.getLogger(__name__)


#: Every Orca 2.4.0 method the adapter calls, and the loop hook it runs on (Orca 2.2's Keras-style ones: KERAS_HOOKS).
ORCA_HOOKS: Dict[str, str] = {
    'before_run': 'on_train_begin',
    'before_train_epoch': 'on_epoch_begin',
    'before_train_iter': 'on_batch_begin',
    'on_train_forward': 'train_step',
    'on_iter_forward': 'train_step',
    'on_iter_backward': 'train_step',
    'after_train_iter': 'on_batch_end',
    'on_lr_adjust': 'on_train_epoch_end',
    'before_val_epoch': 'on_eval_begin',
    'before_val_iter': 'on_eval_batch_begin',
    'on_val_forward': 'on_eval_batch_end',
    'after_val_iter': 'on_eval_batch_end',
    'after_val_epoch': 'on_eval_end',
    'after_train_epoch': 'on_epoch_end',
    'after_run': 'on_train_end',
    'before_pred_epoch': 'on_eval_begin',
    'before_pred_iter': 'on_eval_batch_begin',
    'after_pred_iter': 'on_eval_batch_end',
    'after_pred_epoch': 'on_eval_end',
}

#: The name Orca's callback tutorial gives a point -> Orca 2.4.0's name of it. Orca 2.4.0 never calls the tutorial's
#: names, and neither does the adapter: a callback defining one is warned at registration, with the 2.4.0 name.
TUTORIAL_HOOKS: Dict[str, str] = {
    'on_run_begin': 'before_run',
    'on_epoch_begin': 'before_train_epoch',
    'on_iter_begin': 'before_train_iter',
    'on_iter_end': 'after_train_iter',
    'on_epoch_end': 'after_train_epoch',
    'on_run_end': 'after_run',
}

#: The hooks only the MainCallback has: the step's forward and backward, and the validation forward.
MAIN_CALLBACK_HOOKS = ('on_train_forward', 'on_iter_forward', 'on_iter_backward', 'on_val_forward',
                       'on_pred_forward')

# The attributes Orca sets for one iteration and deletes after it, per kind of iteration (torch_runner.py).
_ITERATION_ATTRIBUTES = {
    'train': ('batch', 'output', 'loss', 'batch_idx', 'metrics_stats'),
    'val': ('output', 'target', 'batch', 'loss', 'batch_idx'),
    'pred': ('batch', 'batch_idx', 'output'),
}
_WHEN_SET = {
    'batch': 'during an iteration (training, validation or prediction), from before_*_iter to after_*_iter',
    'batch_idx': 'during an iteration, and in on_lr_adjust (the last training batch\'s index)',
    'output': "by the MainCallback's forward (on_iter_forward / on_val_forward) until the iteration ends; "
              'without a MainCallback the loop\'s own step keeps no output',
    'loss': 'by the forward until the iteration ends (the standard step\'s loss from after_train_iter on)',
    'target': "by the MainCallback's forward",
    'metrics_stats': 'in after_train_iter: {"train_loss": ..., "num_samples": ...}',
    'epoch_stats': 'from after_train_epoch until the next before_train_epoch',
}
NUM_SAMPLES = 'num_samples'
# The runner's own attributes (not what callbacks store on it) and the per-iteration ones.
_RUNNER_OWN = frozenset({'epochs', 'global_step', 'stop', 'schedulers', 'config', 'sync_stats', 'epoch_stats', 'logger',
                         'metrics', 'validation_results'})
_ITERATION_NAMES = frozenset(name for names in _ITERATION_ATTRIBUTES.values() for name in names) | {'target'}


def _batch_size(data: Any) -> int:
    """Orca's count of samples in a batch or an output: the first dimension of its first tensor."""
    while isinstance(data, (list, tuple, dict)):
        if not data:
            return 0
        data = next(iter(data.values())) if isinstance(data, dict) else data[0]
    shape = getattr(data, 'shape', None)
    return int(shape[0]) if shape else 1


def _to_device(data: Any, device: torch.device) -> Any:
    if isinstance(data, torch.Tensor):
        return data.to(device)
    if isinstance(data, (list, tuple)):
        moved = [_to_device(item, device) for item in data]
        return type(data)(moved) if not hasattr(data, '_fields') else type(data)(*moved)
    if isinstance(data, dict):
        return type(data)((key, _to_device(value, device)) for key, value in data.items())
    return data


def _autocast(loop: 'TrainLoop') -> ContextManager[Any]:
    """The autocast context of the loop's precision, for the MainCallback's training forward."""
    dtype = {'fp16': torch.float16, 'bf16': torch.bfloat16}.get(loop.precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=loop.device.type, dtype=dtype)


class _Meter:
    """Orca's AverageMeterCollection: per metric the running mean weighted by samples and the last value."""

    def __init__(self) -> None:
        self.batch_count = 0
        self.samples = 0
        self.sums: Dict[str, float] = {}
        self.counts: Dict[str, int] = {}
        self.last: Dict[str, float] = {}

    def update(self, metrics: Dict[str, float], n: int) -> None:
        self.batch_count += 1
        self.samples += n
        for name, value in metrics.items():
            self.sums[name] = self.sums.get(name, 0) + value * n
            self.counts[name] = self.counts.get(name, 0) + n
            self.last[name] = value

    def summary(self) -> Dict[str, Any]:
        stats: Dict[str, Any] = {'batch_count': self.batch_count, NUM_SAMPLES: self.samples}
        for name in self.sums:
            stats[name] = self.sums[name] / self.counts[name]
            stats['last_' + name] = self.last[name]
        return stats


class _RunnerState:
    """The adapter's bookkeeping of one runner (kept apart from the runner's own attributes)."""

    def __init__(self) -> None:
        self.last_key: Any = None
        self.in_fit = False
        self.mode = 'val'                   # Orca's _mode: 'train' during the training batches
        self.iteration: Optional[str] = None    # 'train' / 'val' / 'pred' while an iteration's attributes are set
        self.metrics_window = False         # metrics_stats can be built (after_train_iter)
        self.batch_samples = 0
        # per training batch of the epoch: (samples, its metrics_stats when a callback read it, else None, its loss)
        self.train_records: List[Tuple[int, Optional[Dict[str, Any]], Any]] = []
        self.val_records: List[Tuple[int, Any]] = []
        self.val_stats: Dict[str, Any] = {}
        self.eval_kind: Optional[str] = None
        self.eval_batch_idx = -1
        self.last_train_batch_idx: Optional[int] = None
        # a training iteration's attributes and metrics window, kept aside during a validation pass inside it
        self.suspended: Optional[Tuple[Dict[str, Any], bool]] = None
        self.pass_metrics: Dict[str, Any] = {}  # this validation pass's metric accumulators, by Orca's name
        self.forwarded = False                  # the MainCallback's on_val_forward ran for this validation batch


class Runner:
    """Orca's ``TorchRunner`` as Orca's callbacks see it, over a TrainLoop: one per loop (:func:`runner_for`),
    passed to every Orca method.

    Read from the loop when accessed: ``model`` (the DDP wrapper during the training batches of a DDP fit, as Orca's
    training model, else ``loop.model``), ``models``, ``optimizer`` (the first of ``loop.optimizers``), ``optimizers``,
    ``criterion``, ``train_loader``, ``val_loader``, ``num_epochs``, ``rank``, ``size`` / ``world_size``, ``device``.

    Counters as Orca keeps them: ``epochs`` is the number of completed epochs (0 during the first epoch, 1 from the
    first ``after_train_epoch`` on); ``global_step`` the number of trained batches (incremented just before
    ``after_train_iter``).

    Set for an iteration and deleted after it, as Orca does: ``batch`` (on the loop's device), ``batch_idx``,
    ``output`` (``outputs``, the tutorial's name) / ``loss`` / ``target`` (the MainCallback's forward sets them;
    without a MainCallback ``loss`` is the standard step's from ``after_train_iter`` on), ``metrics_stats``
    (``after_train_iter``: ``train_loss``, ``num_samples``). ``epoch_stats`` (from ``after_train_epoch`` until the
    next epoch): the epoch's training means (``train_loss``, ``last_train_loss``, ``batch_count``, ``num_samples``),
    ``val_loss`` / ``val_num_samples`` when the epoch was validated, and ``epoch``.

    Any other attribute a callback assigns is kept (Orca's TqdmCallback keeps its progress bar on the runner), and
    ``put`` / ``update`` / ``get`` / ``remove`` keep named values apart from them, as Orca's runner does.

    Attributes:
        epochs (int): completed epochs.
        global_step (int): trained batches.
        stop (bool): set True to end training: set during a training batch, the epoch ends after it
            (``loop.end_epoch()``: its remaining batches are skipped), is still validated and ends with
            ``after_train_epoch``; then training stops (``loop.early_stop``). In a fit of several processes the callback
            setting it during a batch declares ``may_end_epochs = True`` (every rank then ends the epoch there;
            ``MaxstepsCallback`` does).
        schedulers (list): the learning-rate schedulers the runner owns, which MainCallback's default
            ``on_lr_adjust`` steps once per epoch and checkpoints save (empty by default; the scheduler callbacks of
            ``callbacks.train_schedule`` step themselves and are not in it).
        config (dict): Orca's ``config`` (read by WandbLoggerCallback with ``log_config=True``); empty by default.
        sync_stats (bool): average ``epoch_stats``' training means over the processes of a DDP fit (TorchRunner's
            default; Orca's ``Estimator.from_torch`` sets False: each process's own, which :class:`Estimator` does).
        epoch_stats (dict or None): see above.
        metrics (list): Orca's metrics (``aitoolbox_like.adapters.orca.Accuracy``, ...), computed on the validation
            pass from ``runner.output`` and ``runner.target`` as Orca's runner does: in ``epoch_stats`` and the loop's
            history as ``val_<name, lower case>`` (``val_accuracy``), in ``validation_results`` under their names.
        validation_results (dict or None): Orca's ``validate`` result of the last validation pass: each metric under
            its name, ``val_loss`` (the batch losses weighted by samples) and ``num_samples``.
        logger (logging.Logger): where the runner logs.
    """

    # Set for one iteration and deleted after it (declared for the type checker; not class attributes).
    _progress_bar: Any      # Orca's TqdmCallback keeps its bar here
    batch: Any
    batch_idx: int
    output: Any
    loss: Any
    target: Any
    metrics_stats: Dict[str, Any]

    def __init__(self, loop: 'TrainLoop') -> None:
        self._adapter = _RunnerState()
        self._adapter_loop = weakref.ref(loop)
        self._adapter_pocket: Dict[str, Any] = {}
        self.epochs = 0
        self.global_step = 0
        self._adapter_stop = False
        self.schedulers: List[Any] = []
        self.config: Dict[str, Any] = {}
        self.sync_stats = True
        self.epoch_stats: Optional[Dict[str, Any]] = None
        self.logger = logger
        self.metrics: List[Any] = []
        self.validation_results: Optional[Dict[str, Any]] = None

    # ---- read from the loop --------------------------------------------------------------------------------

    @property
    def loop(self) -> 'TrainLoop':
        """The TrainLoop this runner belongs to."""
        loop = self._adapter_loop()
        if loop is None:
            raise RuntimeError('the TrainLoop of this runner no longer exists')
        return loop

    @property
    def model(self) -> torch.nn.Module:
        """The model to call: the DDP wrapper during a DDP fit's training batches, else ``loop.model``."""
        loop = self.loop
        if self._adapter.mode == 'train' and loop.ddp_model is not None:
            return loop.ddp_model
        return loop.model

    @property
    def models(self) -> List[torch.nn.Module]:
        """``[loop.model]`` (Orca's list of the models created)."""
        return [self.loop.model]

    @property
    def optimizer(self) -> Any:
        """The first optimizer of ``loop.optimizers`` (None without an optimizer)."""
        optimizers = self.optimizers
        return optimizers[0] if optimizers else None

    @property
    def optimizers(self) -> List[Any]:
        """The loop's optimizers (``loop.optimizers``), empty without an optimizer."""
        loop = self.loop
        return [] if loop.optimizer is None else list(loop.optimizers)

    @property
    def criterion(self) -> Any:
        """``loop.criterion`` (assigning it sets the loop's)."""
        return self.loop.criterion

    @criterion.setter
    def criterion(self, value: Any) -> None:
        self.loop.criterion = value

    @property
    def scheduler(self) -> Any:
        """The first of ``schedulers``, or None (assigning it sets ``schedulers`` to ``[value]``)."""
        return self.schedulers[0] if self.schedulers else None

    @scheduler.setter
    def scheduler(self, value: Any) -> None:
        self.schedulers = [] if value is None else [value]

    @property
    def lr_scheduler(self) -> Any:
        """The tutorial's name of ``scheduler``."""
        return self.scheduler

    @lr_scheduler.setter
    def lr_scheduler(self, value: Any) -> None:
        self.scheduler = value

    @property
    def train_loader(self) -> Any:
        """``loop.train_loader`` (assigning it sets the loop's; used from the next epoch)."""
        return self.loop.train_loader

    @train_loader.setter
    def train_loader(self, value: Any) -> None:
        self.loop.train_loader = value

    @property
    def val_loader(self) -> Any:
        """``loop.validation_loader`` (assigning it sets the loop's)."""
        return self.loop.validation_loader

    @val_loader.setter
    def val_loader(self, value: Any) -> None:
        self.loop.validation_loader = value

    validation_loader = val_loader

    @property
    def stop(self) -> bool:
        """Orca's flag that ends training (see the class's attributes)."""
        return self._adapter_stop

    @stop.setter
    def stop(self, value: bool) -> None:
        self._adapter_stop = bool(value)
        state = self._adapter
        if value and state.iteration == 'train' and state.suspended is None:
            # Orca breaks out of the epoch right after the batch that set it: the loop's end_epoch()
            loop = self.loop
            try:
                loop.end_epoch()
            except StepRequestError as error:
                raise StepRequestError(f'runner.stop = True during a training batch of a fit of {loop.world_size} '
                                       f'processes ends the epoch on every rank, which they agree on only when a '
                                       f'callback declares it: set the class attribute may_end_epochs = True on the '
                                       f'Orca callback that sets runner.stop (aitoolbox_like.adapters.orca\'s '
                                       f'MaxstepsCallback has it)') from error

    @property
    def num_epochs(self) -> Optional[int]:
        """``loop.num_epochs``: the epochs the fit trains up to (a total over fits). Assigned in ``before_run`` (as
        Orca's MaxstepsCallback does), it sets how many epochs this fit trains; with ``fit(num_iterations=...)`` the
        batch count decides instead."""
        return self.loop.num_epochs

    @num_epochs.setter
    def num_epochs(self, value: int) -> None:
        self.loop.num_epochs = value

    @property
    def outputs(self) -> Any:
        """The tutorial's name of ``output`` (reading, assigning and deleting it is ``output``'s)."""
        return self.output

    @outputs.setter
    def outputs(self, value: Any) -> None:
        self.output = value

    @outputs.deleter
    def outputs(self) -> None:
        del self.output

    @property
    def rank(self) -> int:
        """This process's global rank (0 outside a distributed fit)."""
        return self.loop.global_rank

    @property
    def size(self) -> int:
        """The number of processes training together (Orca's name; 1 outside a distributed fit)."""
        return self.loop.world_size

    @property
    def world_size(self) -> int:
        """The number of processes training together."""
        return self.loop.world_size

    @property
    def device(self) -> torch.device:
        """The loop's device (``runner.batch`` is moved there)."""
        return self.loop.device

    def __getattr__(self, name: str) -> Any:
        # Called only for attributes not set: metrics_stats is built when first read in after_train_iter (one host
        # sync for the loss, only when a callback reads it); Orca's per-iteration attributes say when they exist.
        if name.startswith('_adapter'):
            raise AttributeError(name)
        if name == 'metrics_stats' and self._adapter.metrics_window:
            loss = self.__dict__.get('loss')
            stats: Dict[str, Any] = {}
            if loss is not None:
                stats['train_loss'] = float(loss.item()) if isinstance(loss, torch.Tensor) else float(loss)
            stats[NUM_SAMPLES] = self._adapter.batch_samples
            self.__dict__['metrics_stats'] = stats
            return stats
        if name in _WHEN_SET:
            raise AttributeError(f'runner.{name} is not set now: it is set {_WHEN_SET[name]}')
        raise AttributeError(f"'Runner' object has no attribute {name!r}")

    # ---- Orca's named storage --------------------------------------------------------------------------------

    def put(self, k: str, v: Any) -> None:
        """Store ``v`` under ``k`` (a warning when ``k`` is stored already: use ``update``)."""
        if k in self._adapter_pocket:
            logger.warning('Key %s is already stored on the runner; use runner.update instead', k)
        self._adapter_pocket[k] = v

    def update(self, k: str, v: Any) -> None:
        """Replace the value under ``k`` (a warning when nothing is stored under it: use ``put``)."""
        if k not in self._adapter_pocket:
            logger.warning('Key %s is not stored on the runner; use runner.put instead', k)
        self._adapter_pocket[k] = v

    def get(self, k: str) -> Any:
        """The value stored under ``k`` (RuntimeError when there is none, as Orca's invalidInputError)."""
        if k not in self._adapter_pocket:
            raise RuntimeError(f'KeyError, key {k} is not stored on the runner; store it with runner.put')
        return self._adapter_pocket[k]

    def remove(self, k: str) -> None:
        """Forget the value stored under ``k`` (RuntimeError when there is none)."""
        if k not in self._adapter_pocket:
            raise RuntimeError(f'KeyError, key {k} is not stored on the runner')
        del self._adapter_pocket[k]

    # ---- checkpoints, in Orca's format -----------------------------------------------------------------------

    def get_state_dict(self) -> Dict[str, Any]:
        """Orca's checkpoint content: ``{'epoch': epochs, 'models': [...], 'optimizers': [...], 'schedulers':
        [...]}`` (the last two only when there are optimizers / schedulers)."""
        state: Dict[str, Any] = {'epoch': self.epochs, 'models': [model.state_dict() for model in self.models]}
        if self.optimizers:
            state['optimizers'] = [optimizer.state_dict() for optimizer in self.optimizers]
        if self.schedulers:
            state['schedulers'] = [scheduler.state_dict() for scheduler in self.schedulers]
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Load what ``get_state_dict`` returned (or a model's bare state dict, or a list of them) into the
        models, optimizers and schedulers; ``epochs`` becomes the saved epoch, and outside a fit the loop continues
        from it (``loop.epoch``: the next fit's epochs count on, as Orca's do after loading a checkpoint)."""
        if isinstance(state, OrderedDict):
            self.models[0].load_state_dict(state)
            return
        model_states = state['models'] if 'models' in state else state
        for model, model_state in zip(self.models, model_states):
            model.load_state_dict(model_state)
        for optimizer, optimizer_state in zip(self.optimizers, state.get('optimizers', [])):
            optimizer.load_state_dict(optimizer_state)
        for scheduler, scheduler_state in zip(self.schedulers, state.get('schedulers', [])):
            scheduler.load_state_dict(scheduler_state)
        if 'epoch' in state:
            self.epochs = state['epoch']
            loop = self.loop
            if not loop.epochs_running:
                # Outside a fit the loop continues from the loaded epoch, as Orca's runner counts on from it
                loop.epoch = self.epochs

    def save_checkpoint(self, filepath: str, save_weights_only: bool = False) -> str:
        """Write Orca's checkpoint to ``filepath`` in the main process (a local path; written to a temporary file
        first, then renamed); ``save_weights_only``: the epoch and the models only. Returns ``filepath``."""
        if self.rank == 0:
            if save_weights_only:
                state = {'epoch': self.epochs, 'models': [model.state_dict() for model in self.models]}
            else:
                state = self.get_state_dict()
            folder = os.path.dirname(os.path.abspath(filepath))
            os.makedirs(folder, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=folder, prefix='.orca-checkpoint-')
            os.close(handle)
            try:
                with open(temporary, 'wb') as file:
                    torch.save(state, file)
                os.replace(temporary, filepath)
            except BaseException:
                if os.path.exists(temporary):
                    os.remove(temporary)
                raise
            logger.debug('Saved checkpoint: %s', filepath)
        return filepath

    def remove_checkpoint(self, filepath: str) -> None:
        """Delete a checkpoint written by ``save_checkpoint`` (in the main process)."""
        if self.rank == 0 and os.path.exists(filepath):
            if os.path.isdir(filepath):
                shutil.rmtree(filepath)
            else:
                os.remove(filepath)
            logger.debug('Removed checkpoint: %s', filepath)

    def load_checkpoint(self, filepath: str) -> None:
        """Load a checkpoint file written by ``save_checkpoint`` (``load_state_dict``)."""
        self.load_state_dict(torch.load(filepath, map_location=self.device, weights_only=True))

    # ---- the runner's state in the loop's checkpoints ------------------------------------------------------------

    def _adapter_state_dict(self) -> Dict[str, Any]:
        """What callbacks stored on the runner (``put`` and free attributes), its schedulers' states and the epoch's
        training statistics so far (a mid-epoch checkpoint)."""
        encoder = Encoder(loop_references(self.loop), lambda value: isinstance(value, AbstractCallback))
        free = {name: value for name, value in self.__dict__.items()
                if not name.startswith('_adapter') and name not in _RUNNER_OWN}
        state = self._adapter
        records = [[n, encoder.encode(metrics, 0, set()), loss.detach().to('cpu', copy=True)
                    if isinstance(loss, torch.Tensor) else loss] for n, metrics, loss in state.train_records]
        return {'pocket': encoder.encode(self._adapter_pocket, 0, set()),
                'free': encoder.encode(free, 0, set()),
                'schedulers': [scheduler.state_dict() for scheduler in self.schedulers],
                'train_records': records if self.loop.epochs_running else []}

    def _adapter_load_state(self, saved: Dict[str, Any]) -> None:
        decode(saved['pocket'], self._adapter_pocket)
        free = decode(saved['free'], {})
        self.__dict__.update({name: value for name, value in free.items() if name not in _ITERATION_NAMES})
        for scheduler, scheduler_state in zip(self.schedulers, saved.get('schedulers', [])):
            scheduler.load_state_dict(scheduler_state)
        if self.loop.epochs_running:
            device = self.device
            self._adapter.train_records = [
                (n, decode(metrics, None), loss.to(device) if isinstance(loss, torch.Tensor) else loss)
                for n, metrics, loss in saved.get('train_records', [])]

    # ---- the adapter's bookkeeping: what Orca's runner sets between its hooks ------------------------------------

    def _adapter_sync(self, hook: str, info: Optional[Dict[str, Any]] = None, batch: Any = None,
                      outputs: Any = None) -> bool:
        """Bring the runner to the point of the loop hook ``hook``, once per hook call whichever Orca callback
        asks first. False when the runner is there already, or for an evaluation pass that is none of Orca's."""
        loop = self.loop
        if info is not None:
            if _pass_kind(self, info) is None:
                return False
            key: Any = (hook, id(info))
        else:
            key = (hook, loop.epoch, loop.total_iteration_idx)
        state = self._adapter
        if key == state.last_key:
            return False
        state.last_key = key
        if hook == 'on_eval_batch_end':
            self._adapter_eval_batch_end(batch, outputs)
            return True
        if hook == 'on_eval_begin' and state.iteration == 'train':
            self._adapter_suspend_iteration()     # a validation pass inside a training batch (another callback's)
        elif hook != 'on_batch_end':      # the end of a training batch continues its iteration
            self._adapter_close_iteration()
        getattr(self, '_adapter_at_' + hook)(loop, info, batch)
        return True

    def _adapter_at_on_train_begin(self, loop: 'TrainLoop', info: Any, batch: Any) -> None:
        state = self._adapter
        state.in_fit = True
        state.mode = 'val'
        self._adapter_stop = False
        self.epochs = loop.epochs_completed
        self.global_step = loop.total_iteration_idx + 1
        self.epoch_stats = None
        main = _main_callback(loop)
        if main is not None:
            main._orca_check_step(loop)

    def _adapter_at_on_epoch_begin(self, loop: 'TrainLoop', info: Any, batch: Any) -> None:
        state = self._adapter
        self.__dict__.pop('epoch_stats', None)
        self.epochs = loop.epoch
        state.mode = 'train'
        state.train_records = []
        state.val_stats = {}
        state.last_train_batch_idx = None

    def _adapter_at_on_batch_begin(self, loop: 'TrainLoop', info: Any, batch: Any) -> None:
        state = self._adapter
        state.mode = 'train'
        state.iteration = 'train'
        self.batch_idx = loop.iteration
        state.last_train_batch_idx = loop.iteration
        self.batch = self._adapter_on_device(loop.batch)
        self.global_step = loop.total_iteration_idx

    def _adapter_at_on_batch_end(self, loop: 'TrainLoop', info: Any, batch: Any) -> None:
        state = self._adapter
        state.iteration = 'train'
        if 'loss' not in self.__dict__ and loop.loss is not None:
            self.loss = loop.loss
        state.batch_samples = _batch_size(loop.batch)
        self.global_step = loop.total_iteration_idx + 1
        state.metrics_window = True

    def _adapter_at_on_train_epoch_end(self, loop: 'TrainLoop', info: Any, batch: Any) -> None:
        state = self._adapter
        state.mode = 'val'
        if state.last_train_batch_idx is not None:
            # Orca deletes batch_idx before on_lr_adjust; the tutorial's on_lr_adjust example reads it, so it is the
            # last training batch's index here.
            self.batch_idx = state.last_train_batch_idx

    def _adapter_at_on_eval_begin(self, loop: 'TrainLoop', info: Any, batch: Any) -> None:
        state = self._adapter
        self.__dict__.pop('batch_idx', None)
        state.eval_batch_idx = -1
        state.eval_kind = _pass_kind(self, info)
        state.val_records = []
        # Orca's _validate converts its metrics anew for each pass (Metric.convert_metrics_dict): fresh accumulators
        state.pass_metrics = metric_accumulators(self.metrics) if state.eval_kind == 'val' else {}
        state.mode = 'val' if state.eval_kind == 'val' else 'predict'

    def _adapter_at_on_eval_batch_begin(self, loop: 'TrainLoop', info: Any, batch: Any) -> None:
        state = self._adapter
        state.eval_batch_idx += 1
        state.iteration = state.eval_kind
        self.batch_idx = state.eval_batch_idx
        self.batch = self._adapter_on_device(batch)

    def _adapter_eval_batch_end(self, batch: Any, outputs: Any) -> None:
        state = self._adapter
        if state.eval_kind == 'pred':
            self.output = outputs[0] if isinstance(outputs, tuple) else outputs
            return
        if state.eval_kind != 'val':
            return
        forwarded, state.forwarded = state.forwarded, False
        if not forwarded:
            # No MainCallback gave the pass its forward (its on_val_forward is the evaluation's forward when one
            # is registered): the loop's own batch loss.
            self.loss = outputs
        output = self.__dict__.get('output')
        if state.pass_metrics:
            if output is None or 'target' not in self.__dict__:
                raise RuntimeError(f'Orca metrics {sorted(state.pass_metrics)} are computed from runner.output and '
                                   f'runner.target of each validation batch, which the MainCallback\'s forward sets '
                                   f'(on_val_forward / on_iter_forward): set both there')
            for metric in state.pass_metrics.values():
                metric(output, self.__dict__['target'])
        state.val_records.append((_batch_size(output if output is not None else self.__dict__.get('batch')),
                                  self.__dict__.get('loss')))

    def _adapter_at_on_eval_end(self, loop: 'TrainLoop', info: Any, batch: Any) -> None:
        state = self._adapter
        if state.eval_kind == 'val' and state.val_records:
            total = sum(n for n, _ in state.val_records)
            weighted = sum(_as_float(loss) * n for n, loss in state.val_records if loss is not None)
            val_loss = weighted / total if total else math.nan
            results = {name: _as_number(metric.compute()) for name, metric in state.pass_metrics.items()}
            self.validation_results = {**results, 'val_loss': val_loss, 'num_samples': total}
            # Orca's fit prefixes them as its train_epoch does: 'val_' + the name in lower case
            state.val_stats = {**{'val_' + name.lower(): value for name, value in results.items()},
                               'val_loss': val_loss, 'val_num_samples': total}
            if loop.epochs_running:
                for name, value in results.items():
                    if isinstance(value, float):
                        loop.insert_metric_result_into_history('val_' + name.lower(), value)
        state.mode = 'val'
        if state.suspended is not None:
            attributes, state.metrics_window = state.suspended
            state.suspended = None
            self.__dict__.update(attributes)
            state.iteration, state.mode = 'train', 'train'

    def _adapter_at_on_epoch_end(self, loop: 'TrainLoop', info: Any, batch: Any) -> None:
        state = self._adapter
        self.__dict__.pop('batch_idx', None)
        self.epochs = loop.epoch + 1
        stats: Dict[str, Any] = {'epoch': self.epochs}
        stats.update(self._adapter_train_summary(loop))
        stats.update(state.val_stats)
        self.epoch_stats = stats

    def _adapter_at_on_train_end(self, loop: 'TrainLoop', info: Any, batch: Any) -> None:
        state = self._adapter
        self.__dict__.pop('batch_idx', None)
        self.epochs = loop.epochs_completed
        state.mode = 'val'
        state.in_fit = False

    def _adapter_at_on_exception(self, loop: 'TrainLoop', info: Any, batch: Any) -> None:
        self._adapter_at_on_train_end(loop, info, batch)

    def _adapter_close_iteration(self) -> None:
        """The end of an iteration: its statistics recorded, its attributes deleted (as Orca deletes them)."""
        state = self._adapter
        kind = state.iteration
        if kind is None:
            return
        if kind == 'train':
            stats = self.__dict__.pop('metrics_stats', None)
            if stats is not None:       # what a callback read (and may have changed), as Orca averages it
                stats = dict(stats)
                state.train_records.append((stats.pop(NUM_SAMPLES, 1), stats, None))
            else:                       # nobody read it: the loss is read once, at the end of the epoch
                loss = self.__dict__.get('loss')
                state.train_records.append(
                    (state.batch_samples, None, loss.detach() if isinstance(loss, torch.Tensor) else loss))
            state.metrics_window = False
        for name in _ITERATION_ATTRIBUTES[kind]:
            self.__dict__.pop(name, None)
        state.iteration = None

    def _adapter_suspend_iteration(self) -> None:
        """Keep the training iteration's attributes aside while a validation pass runs inside it."""
        state = self._adapter
        names = _ITERATION_ATTRIBUTES['train'] + ('target',)
        state.suspended = ({name: self.__dict__.pop(name) for name in names if name in self.__dict__},
                           state.metrics_window)
        state.iteration, state.metrics_window = None, False

    def _adapter_train_summary(self, loop: 'TrainLoop') -> Dict[str, Any]:
        """Orca's training statistics of the epoch (metric_meters.summary), averaged over processes when asked."""
        meter = _Meter()
        for n, metrics, loss in self._adapter.train_records:
            if metrics is None:
                metrics = {} if loss is None else {'train_loss': _as_float(loss)}
            meter.update(metrics, n)
        stats = meter.summary()
        if self.sync_stats and loop.world_size > 1 and dist.is_available() and dist.is_initialized() \
                and loop.running_rank_restricted_callback is None:
            names = [name for name in stats if name not in ('batch_count', NUM_SAMPLES)]
            if names:
                device = loop.device if dist.get_backend() == 'nccl' else torch.device('cpu')
                values = torch.tensor([float(stats[name]) for name in names], dtype=torch.float64, device=device)
                dist.all_reduce(values)
                for name, value in zip(names, (values / loop.world_size).tolist()):
                    stats[name] = value
        return stats

    def _adapter_on_device(self, data: Any) -> Any:
        device = self.loop.device
        return data if device.type == 'cpu' else _to_device(data, device)


def _pass_kind(runner: Runner, info: Dict[str, Any]) -> Optional[str]:
    """Which of Orca's passes an evaluation pass of the loop is: 'val' (the validation loss pass), 'pred' (a
    predictions pass outside fit: Orca's predict), or None (no Orca hooks: the training-set and test losses, and the
    predictions other callbacks make during fit)."""
    kind = info.get('kind')
    if kind == 'loss' and info.get('type') == 'validation':
        return 'val'
    if kind == 'predictions' and not runner._adapter.in_fit:
        return 'pred'
    return None


def _as_float(value: Any) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


def _as_number(value: Any) -> Any:
    """A metric's result: a one-element tensor as a float (Orca's estimator averages them as numbers), anything else
    as it is."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.item())
    return value


_RUNNERS: 'weakref.WeakKeyDictionary[TrainLoop, Runner]' = weakref.WeakKeyDictionary()


def runner_for(loop: 'TrainLoop') -> Runner:
    """The loop's one :class:`Runner` (created when first asked for), shared by all its Orca callbacks: what one
    callback stores on it the others see. Set ``runner_for(loop).scheduler`` for MainCallback's ``on_lr_adjust`` to
    step (Orca's scheduler_creator)."""
    runner = _RUNNERS.get(loop)
    if runner is None:
        runner = _RUNNERS[loop] = Runner(loop)
    return runner


def _main_callback(loop: 'TrainLoop') -> Optional['Callback']:
    """The loop's Orca callback owning the training step (its MainCallback), or None."""
    owner = loop.train_step_owner
    if isinstance(owner, Callback) and owner.orca_is_main():
        return owner
    for callback in loop.callbacks:
        if isinstance(callback, Callback) and callback.orca_is_main():
            return callback
    return None


class MainCallbackFeed:
    """The loop's evaluation feed while a MainCallback is registered (``loop.evaluation.feed``): its
    ``on_val_forward`` is the forward of every evaluation pass, as Orca's runner validates with it, so a validation
    batch is run through the model once and the history's ``val_loss`` comes from the same ``runner.loss`` as Orca's
    ``epoch_stats['val_loss']``. A plain ``nn.Module``'s predictions are ``runner.output`` (with ``runner.target``)
    from the same forward; a TTModel's are its own ``get_predictions``.

    Args:
        loop: the TrainLoop.
        main: the MainCallback.
        inner: the loop's own feed (a TTModel's methods, or the plain module's, which only say what is missing).
    """

    def __init__(self, loop: 'TrainLoop', main: 'Callback', inner: Any) -> None:
        self.loop = loop
        self.main = main
        self.inner = inner
        self.plain = isinstance(getattr(inner, 'plain_feed', inner), PlainModuleFeed)

    def forward(self, batch: Any) -> Tuple[Any, Any, Any]:
        """``(loss, output, target)`` of ``on_val_forward`` on ``batch``: inside Orca's validation iteration on the
        runner as it is (its attributes live until the iteration ends); in any other pass (the training set's or the
        test set's loss) on the batch alone, the runner's attributes put back afterwards."""
        runner = runner_for(self.loop)
        state = runner._adapter
        forward = getattr(self.main, 'on_val_forward')
        if state.iteration == 'val':
            forward(runner)
            state.forwarded = True
            values = runner.__dict__
        else:
            names = ('batch', 'output', 'loss', 'target')
            kept = {name: runner.__dict__.pop(name) for name in names if name in runner.__dict__}
            runner.batch = runner._adapter_on_device(batch)
            try:
                forward(runner)
                values = {name: runner.__dict__.get(name) for name in names}
            finally:
                for name in names:
                    runner.__dict__.pop(name, None)
                runner.__dict__.update(kept)
        if values.get('loss') is None:
            raise RuntimeError(f'{type(self.main).__name__}: on_val_forward (by default on_iter_forward) must set '
                               f'runner.loss (and runner.output), as Orca\'s MainCallback requires')
        return values['loss'], values.get('output'), values.get('target')

    def get_loss(self, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """The training loss of a step the MainCallback does not own (a custom step's ``forward_loss``): the
        loop's own feed."""
        return self.inner.get_loss(batch_data, criterion, device)

    def get_loss_eval(self, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """``runner.loss`` of ``on_val_forward``."""
        return self.forward(batch_data)[0]

    def get_predictions(self, batch_data: Any, device: torch.device) -> Tuple[Any, Any, Any]:
        """A plain module's ``(runner.output, runner.target, None)`` of ``on_val_forward``; a TTModel's own."""
        if not self.plain:
            return self.inner.get_predictions(batch_data, device)
        _, output, target = self.forward(batch_data)
        return (output.detach() if isinstance(output, torch.Tensor) else output), target, None

    def one_pass_evaluation(self) -> Optional[Callable[..., Any]]:
        """For a plain module the loss and the predictions come from one ``on_val_forward``; a TTModel's
        predictions are its own, so it gets none."""
        return self.loss_and_predictions if self.plain else None

    def loss_and_predictions(self, batch_data: Any, criterion: Any, device: torch.device) -> Tuple[Any, Any, Any, Any]:
        """``(loss, output, target, None)`` of one ``on_val_forward``."""
        loss, output, target = self.forward(batch_data)
        return loss, (output.detach() if isinstance(output, torch.Tensor) else output), target, None


def install_main_feed(loop: 'TrainLoop', main: 'Callback') -> None:
    """Make ``main``'s ``on_val_forward`` the forward of the loop's evaluation passes."""
    current = loop.evaluation.feed
    inner = current.inner if isinstance(current, MainCallbackFeed) else loop.batch_feed
    loop.evaluation.feed = MainCallbackFeed(loop, main, inner)


#: Orca 2.2's Keras-style callback methods (its runner called them beside the 2.4 names, which 2.2 had too), each
#: with the arguments Orca 2.2 passed: on_train_begin(), on_epoch_begin(epoch=), on_batch_begin(batch_idx),
#: on_batch_end(batch_idx, logs=), on_epoch_end(epoch=, logs=), on_train_end(logs=). Their names are also the loop's
#: hooks: on an Orca Callback they are Orca's (the loop's hooks of an Orca callback are the adapter's).
KERAS_HOOKS = ('on_train_begin', 'on_epoch_begin', 'on_batch_begin', 'on_batch_end', 'on_epoch_end', 'on_train_end')
#: The execution_order of a MainCallback: first, as Orca's estimator puts it (make_only_mainCallback).
MAIN_CALLBACK_ORDER = -1


def _first_parameter(function: Callable[..., Any]) -> Optional[str]:
    """The name of the parameter after ``self``, or None."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return None
    return parameters[1].name if len(parameters) > 1 else None


def _keras_hook(name: str, function: Callable[..., Any], tutorial: bool = False) -> Callable[..., Any]:
    """A subclass's Orca 2.2 method ``name`` kept under the name, which is also the loop hook's: called with
    arguments (Orca's call, the adapter's, or the user's own code) it is the subclass's method; called by the loop
    (no arguments) it runs the adapter's dispatch of that hook, which calls the subclass's method at Orca 2.2's point
    with Orca 2.2's arguments. (``on_train_begin()`` takes none: the dispatch marks its own call.)"""
    dispatch = getattr(Callback, name)

    @functools.wraps(function)
    def hook(self: 'Callback', *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or self.__dict__.get('_orca_keras_call') == name:
            return function(self, *args, **kwargs)
        return dispatch(self)

    setattr(hook, '_orca_keras', function)
    setattr(hook, '_orca_tutorial', tutorial)     # the tutorial's on_epoch_begin(runner): never called by the adapter
    return hook


class Callback(AbstractCallback):
    """Orca's ``Callback``: override the Orca methods you need; each receives the loop's :class:`Runner`.

    Subclasses need not call ``super().__init__()`` (Orca's base has no arguments); the callback is named after its
    class and runs in every process, in list order (``execution_order`` 0; a MainCallback first, -1). The generic
    hooks chain as in Orca's base class (``before_train_epoch`` calls ``before_epoch``, and so on). A subclass with
    ``on_iter_backward`` and a forward (``on_train_forward`` / ``on_iter_forward``) is a MainCallback: it owns the
    training step (see :class:`MainCallback`); at most one may be registered.

    Orca 2.2's Keras-style methods (``on_train_begin()``, ``on_epoch_begin(epoch)``, ``on_batch_begin(batch)``,
    ``on_batch_end(batch, logs=None)``, ``on_epoch_end(epoch, logs=None)``, ``on_train_end(logs=None)``, with
    ``set_model`` / ``set_param`` and a subclass's ``set_trainer``) are called where Orca 2.2 called them, with its
    arguments. The names of Orca's tutorial that Orca 2.4.0 never calls (``on_run_begin``, ``on_run_end``,
    ``on_iter_begin``, ``on_iter_end``, and ``on_epoch_begin(runner)`` / ``on_epoch_end(runner)``) are not called
    here either: registering a callback that defines one logs a warning naming Orca 2.4.0's method for that point.

    Whatever such a callback holds in its attributes (``ModelCheckpoint``'s last file, a counter, ...) is in the
    loop's checkpoints, restored after ``before_run`` of the resumed fit (``aitoolbox_like.adapters.foreign_state``).
    """

    execution_order: float = 0
    device_idx_execution: Optional[int] = None
    #: Set True on a MainCallback whose own ``on_iter_backward`` goes through the loop (it calls
    #: ``super().on_iter_backward(runner)``, or ``loop.backward`` / ``loop.step_optimizers``): it is then treated as
    #: the default backward, allowed with fp16 and gradient accumulation.
    backward_through_loop: bool = False
    # Orca 2.2's base attributes (set_model / set_param / set_trainer set them)
    model: Any = None
    params: Any = None
    trainer: Any = None
    # the adapter's state of the callback
    _orca_state: Optional[ForeignState] = None
    _orca_pending: Optional[Dict[str, Any]] = None

    def __init__(self) -> None:
        super().__init__(type(self).__name__, type(self).execution_order)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in KERAS_HOOKS:
            function = cls.__dict__.get(name)
            if not isinstance(function, types.FunctionType) or hasattr(function, '_orca_keras'):
                continue
            if name in ('on_epoch_begin', 'on_epoch_end') and _first_parameter(function) == 'runner':
                # the tutorial's on_epoch_begin(runner): never called by Orca 2.4.0, so not here (warned at
                # registration); kept callable by its own code
                setattr(cls, f'_orca_tutorial_{name}', function)
                setattr(cls, name, _keras_hook(name, function, tutorial=True))
                continue
            setattr(cls, name, _keras_hook(name, function))
        if 'execution_order' not in cls.__dict__ and cls.orca_is_main_class():
            cls.execution_order = MAIN_CALLBACK_ORDER

    @property
    def callback_name(self) -> str:
        """The class name unless set (Orca callbacks need not call super().__init__)."""
        return self.__dict__.get('_callback_name') or type(self).__name__

    @callback_name.setter
    def callback_name(self, name: str) -> None:
        self.__dict__['_callback_name'] = name

    # ---- Orca's hooks (no-ops), chained as in Orca's base class ----------------------------------------------

    def before_run(self, runner: Runner) -> None:
        """Once before the first epoch (our on_train_begin)."""

    def after_run(self, runner: Runner) -> None:
        """Once when training ends (our on_train_end), also after StopTraining; not after an exception."""

    def before_epoch(self, runner: Runner) -> None:
        """Called by the default ``before_train_epoch``, ``before_val_epoch`` and ``before_pred_epoch``."""

    def after_epoch(self, runner: Runner) -> None:
        """Called by the default ``after_train_epoch``, ``after_val_epoch`` and ``after_pred_epoch``."""

    def before_iter(self, runner: Runner) -> None:
        """Called by the default ``before_train_iter``, ``before_val_iter`` and ``before_pred_iter``."""

    def after_iter(self, runner: Runner) -> None:
        """Called by the default ``after_train_iter``, ``after_val_iter`` and ``after_pred_iter``."""

    def before_train_epoch(self, runner: Runner) -> None:
        """At the start of each epoch (our on_epoch_begin): ``runner.epochs`` is the epochs completed."""
        self.before_epoch(runner)

    def before_val_epoch(self, runner: Runner) -> None:
        """Before the pass over the validation set (our on_eval_begin of the validation loss pass)."""
        self.before_epoch(runner)

    def before_pred_epoch(self, runner: Runner) -> None:
        """Before a prediction pass outside fit (our on_eval_begin of a predictions pass)."""
        self.before_epoch(runner)

    def after_train_epoch(self, runner: Runner) -> None:
        """At the end of each epoch, after its validation (our on_epoch_end): ``runner.epochs`` counts this epoch,
        ``runner.epoch_stats`` holds its statistics."""
        self.after_epoch(runner)

    def after_val_epoch(self, runner: Runner) -> None:
        """After the pass over the validation set (our on_eval_end)."""
        self.after_epoch(runner)

    def after_pred_epoch(self, runner: Runner) -> None:
        """After a prediction pass outside fit."""
        self.after_epoch(runner)

    def before_train_iter(self, runner: Runner) -> None:
        """Before each training batch (our on_batch_begin): ``runner.batch``, ``runner.batch_idx``."""
        self.before_iter(runner)

    def before_val_iter(self, runner: Runner) -> None:
        """Before each validation batch (our on_eval_batch_begin)."""
        self.before_iter(runner)

    def before_pred_iter(self, runner: Runner) -> None:
        """Before each batch of a prediction pass."""
        self.before_iter(runner)

    def after_train_iter(self, runner: Runner) -> None:
        """After each training batch and its update (our on_batch_end): ``runner.global_step`` counts the batch,
        ``runner.loss`` and ``runner.metrics_stats`` are set."""
        self.after_iter(runner)

    def after_val_iter(self, runner: Runner) -> None:
        """After each validation batch: ``runner.loss`` (and ``output`` / ``target`` from a MainCallback)."""
        self.after_iter(runner)

    def after_pred_iter(self, runner: Runner) -> None:
        """After each batch of a prediction pass: ``runner.output`` is the batch's predictions."""
        self.after_iter(runner)

    def every_n_iter(self, runner: Runner, n: int) -> bool:
        """Orca's test in ``after_train_iter``: ``(runner.global_step + 1) % n == 0`` (False for n <= 0)."""
        return (runner.global_step + 1) % n == 0 if n > 0 else False

    def every_n_epoch(self, runner: Runner, n: int) -> bool:
        """Orca's test in ``after_train_epoch``: ``runner.epochs % n == 0`` (False for n <= 0)."""
        return runner.epochs % n == 0 if n > 0 else False

    # ---- Orca 2.2's base methods ------------------------------------------------------------------------------

    def set_model(self, model: Any) -> None:
        """Orca 2.2's: keep the runner's models (called before ``on_train_begin``)."""
        self.model = model

    def set_param(self, param: Any) -> None:
        """Orca 2.2's: keep ``param``."""
        self.params = param

    # ---- the MainCallback ----------------------------------------------------------------------------------

    @classmethod
    def orca_is_main_class(cls) -> bool:
        """Whether the class is a MainCallback: it has ``on_iter_backward`` and a forward (``on_train_forward`` or
        ``on_iter_forward``), as Orca's MainCallback (or a class of the same shape)."""
        return callable(getattr(cls, 'on_iter_backward', None)) and (
            callable(getattr(cls, 'on_train_forward', None)) or callable(getattr(cls, 'on_iter_forward', None)))

    def orca_is_main(self) -> bool:
        """Whether this callback is a MainCallback (:meth:`orca_is_main_class`)."""
        return type(self).orca_is_main_class()

    def orca_owns_backward(self) -> bool:
        """Whether this MainCallback's ``on_iter_backward`` is its own (it calls backward and the optimizer itself)
        rather than :class:`MainCallback`'s, which goes through ``loop.backward`` / ``loop.step_optimizers`` (False
        also when ``backward_through_loop`` says the override goes through the loop)."""
        if self.backward_through_loop:
            return False
        return getattr(type(self), 'on_iter_backward', None) is not getattr(MainCallback, 'on_iter_backward')

    def hooks_in_use(self) -> List[str]:
        """Every loop hook the adapter needs, and ``train_step`` for a MainCallback only."""
        return [name for name in super().hooks_in_use() if name != 'train_step' or self.orca_is_main()]

    def train_step(self, batch: Any) -> Any:
        """A MainCallback's training step: ``on_train_forward`` (or ``on_iter_forward``) under the loop's autocast,
        then ``on_iter_backward``; returns ``runner.loss``."""
        loop = self.train_loop_obj
        runner = runner_for(loop)
        forward = getattr(self, 'on_train_forward', None)
        if not callable(forward):
            forward = getattr(self, 'on_iter_forward')
        with _autocast(loop):
            forward(runner)
        if 'loss' not in runner.__dict__:
            raise RuntimeError(f'{type(self).__name__}: the forward (on_train_forward / on_iter_forward) must set '
                               f'runner.loss (and runner.output), as Orca\'s MainCallback requires')
        getattr(self, 'on_iter_backward')(runner)
        if self.orca_owns_backward():
            # Its own backward stepped the optimizers: the loop's schedulers read optimizer_update_applied().
            loop.update_applied = [True] * len(runner.optimizers)
        return runner.__dict__.get('loss')

    def _orca_check_step(self, loop: 'TrainLoop') -> None:
        """Before the first step: a MainCallback with its own backward cannot honour fp16 or accumulation."""
        if not self.orca_owns_backward():
            return
        name = type(self).__name__
        problems = []
        if loop.precision == 'fp16':
            problems.append("use_amp='fp16' (its backward would bypass the GradScaler: float16 gradients unscaled, "
                            'overflows unchecked)')
        if loop.grad_accumulation > 1:
            problems.append(f'grad_accumulation={loop.grad_accumulation} (it would step the optimizer on every '
                            f'micro-batch)')
        if problems:
            raise ValueError(f'{name} overrides on_iter_backward, which calls backward and the optimizer itself, so '
                             f'it cannot train with {" and ".join(problems)}. Fix: remove the on_iter_backward '
                             f'override (aitoolbox_like.adapters.orca.MainCallback\'s own backward honours fp16 and '
                             f'gradient accumulation through loop.backward / loop.step_optimizers); an override that '
                             f'goes through the loop (super().on_iter_backward(runner)) sets the class attribute '
                             f'backward_through_loop = True; or fit without fp16 and with grad_accumulation=1.')
        hooks = [hook for hook in ('on_after_backward', 'on_after_gradient_update', 'on_after_optimizer_step')
                 if loop.callbacks_handler.has_hook(hook)]
        if hooks:
            logger.warning('%s overrides on_iter_backward (its own backward and optimizer step): the %s hooks of the '
                           'other callbacks do not run (MainCallback\'s own backward runs them)', name,
                           ', '.join(hooks))

    # ---- registration ----------------------------------------------------------------------------------------

    def register_train_loop_object(self, train_loop_obj: 'TrainLoop') -> AbstractCallback:
        """Attach to the loop and its one runner; a MainCallback's validation forward becomes the evaluation's."""
        runner_for(train_loop_obj)
        name = type(self).__name__
        if not self.orca_is_main():
            ignored = [hook for hook in MAIN_CALLBACK_HOOKS if callable(getattr(type(self), hook, None))]
            if ignored:
                logger.warning('%s defines %s but is not a MainCallback (it needs on_iter_backward and a forward): '
                               'only the MainCallback\'s are called', name, ', '.join(ignored))
        tutorial = [hook for hook in TUTORIAL_HOOKS if _defined_below(type(self), hook)]
        if tutorial:
            logger.warning('%s defines %s: names of Orca\'s callback tutorial that Orca 2.4.0 never calls, and '
                           'neither does this adapter; Orca 2.4.0 calls %s at those points', name,
                           ', '.join(tutorial), ', '.join(TUTORIAL_HOOKS[hook] for hook in tutorial))
        if self.orca_is_main():
            install_main_feed(train_loop_obj, self)
        if self._orca_state is None:
            self._orca_state = ForeignState(name, ADAPTER_ATTRIBUTES)
        registered = super().register_train_loop_object(train_loop_obj)
        self._orca_state.record_initial(self, _encoder(train_loop_obj))
        return registered

    # ---- the adapter: our hooks call the Orca methods -------------------------------------------------------

    def _orca_runner(self, hook: str, info: Optional[Dict[str, Any]] = None, batch: Any = None,
                     outputs: Any = None) -> Runner:
        runner = runner_for(self.train_loop_obj)
        runner._adapter_sync(hook, info, batch, outputs)
        return runner

    def _orca_call(self, runner: Runner, *names: str) -> None:
        # As Orca's runner calls a hook: on every callback that has it.
        for name in names:
            method = getattr(self, name, None)
            if callable(method):
                method(runner)

    def _orca_keras(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Orca 2.2's method ``name`` with its arguments, when the subclass defines one."""
        hook = getattr(type(self), name, None)
        function = getattr(hook, '_orca_keras', None)
        if function is None or getattr(hook, '_orca_tutorial', False):
            return
        self.__dict__['_orca_keras_call'] = name
        try:
            function(self, *args, **kwargs)
        finally:
            self.__dict__.pop('_orca_keras_call', None)

    def _orca_uses_keras(self) -> bool:
        return any(getattr(getattr(type(self), name, None), '_orca_keras', None) is not None
                   and not getattr(getattr(type(self), name), '_orca_tutorial', False) for name in KERAS_HOOKS)

    def on_train_begin(self, *keras_args: Any, **keras_kwargs: Any) -> None:
        """The loop hook of Orca 2.2's ``set_model`` / ``set_trainer`` / ``on_train_begin()`` and of
        ``before_run``; then a resumed fit's state of the callback."""
        if keras_args or keras_kwargs or self.__dict__.get('_orca_keras_call') == 'on_train_begin':
            return      # Orca 2.2's base method (a no-op), called by a subclass's own
        runner = self._orca_runner('on_train_begin')
        if self._orca_uses_keras() or callable(getattr(self, 'set_trainer', None)):
            self.set_model(runner.models)
            set_trainer = getattr(self, 'set_trainer', None)
            if callable(set_trainer):
                set_trainer(runner)
            self._orca_keras('on_train_begin')
        self._orca_call(runner, 'before_run')
        pending, self._orca_pending = self._orca_pending, None
        if pending is not None:
            self._orca_restore(pending)
        if self._orca_state is not None:       # what a checkpoint of this fit could not hold, said as it starts
            self._orca_state.name_unsaveable(unsaveable(self, _encoder(self.train_loop_obj), ADAPTER_ATTRIBUTES))

    def on_epoch_begin(self, *keras_args: Any, **keras_kwargs: Any) -> None:
        """The loop hook of Orca 2.2's ``on_epoch_begin(epoch=)`` and of ``before_train_epoch``."""
        if keras_args or keras_kwargs or self.__dict__.get('_orca_keras_call') == 'on_epoch_begin':
            return      # Orca 2.2's base method (a no-op), called by a subclass's own
        runner = self._orca_runner('on_epoch_begin')
        self._orca_keras('on_epoch_begin', epoch=runner.epochs)
        self.before_train_epoch(runner)

    def on_batch_begin(self, *keras_args: Any, **keras_kwargs: Any) -> None:
        """The loop hook of Orca 2.2's ``on_batch_begin(batch_idx)`` and of ``before_train_iter``."""
        if keras_args or keras_kwargs or self.__dict__.get('_orca_keras_call') == 'on_batch_begin':
            return      # Orca 2.2's base method (a no-op), called by a subclass's own
        runner = self._orca_runner('on_batch_begin')
        self._orca_keras('on_batch_begin', runner.batch_idx)
        self._orca_call(runner, 'before_train_iter')

    def on_batch_end(self, *keras_args: Any, **keras_kwargs: Any) -> None:
        """The loop hook of ``after_train_iter`` and of Orca 2.2's ``on_batch_end(batch_idx, logs=)`` (the
        batch's ``metrics_stats`` without ``num_samples``, as Orca 2.2 passed them)."""
        if keras_args or keras_kwargs or self.__dict__.get('_orca_keras_call') == 'on_batch_end':
            return      # Orca 2.2's base method (a no-op), called by a subclass's own
        runner = self._orca_runner('on_batch_end')
        self._orca_call(runner, 'after_train_iter')
        if self._orca_uses_keras() and getattr(getattr(type(self), 'on_batch_end'), '_orca_keras', None):
            logs = {name: value for name, value in runner.metrics_stats.items() if name != NUM_SAMPLES}
            self._orca_keras('on_batch_end', runner.batch_idx, logs=logs)

    def on_train_epoch_end(self) -> None:
        """The loop hook of ``on_lr_adjust`` (called on every Orca callback that has it, as Orca does)."""
        self._orca_call(self._orca_runner('on_train_epoch_end'), 'on_lr_adjust')

    def on_eval_begin(self, dataset_info: Dict[str, Any]) -> None:
        """The loop hook of ``before_val_epoch`` / ``before_pred_epoch``."""
        runner = self._orca_runner('on_eval_begin', dataset_info)
        kind = _pass_kind(runner, dataset_info)
        if kind is not None:
            self._orca_call(runner, f'before_{kind}_epoch')

    def on_eval_batch_begin(self, batch: Any, dataset_info: Dict[str, Any]) -> None:
        """The loop hook of ``before_val_iter`` / ``before_pred_iter``."""
        runner = self._orca_runner('on_eval_batch_begin', dataset_info, batch)
        kind = _pass_kind(runner, dataset_info)
        if kind is not None:
            self._orca_call(runner, f'before_{kind}_iter')

    def on_eval_batch_end(self, batch: Any, outputs: Any, dataset_info: Dict[str, Any]) -> None:
        """The loop hook of ``after_val_iter`` / ``after_pred_iter`` (after the MainCallback's ``on_val_forward``)."""
        runner = self._orca_runner('on_eval_batch_end', dataset_info, batch, outputs)
        kind = _pass_kind(runner, dataset_info)
        if kind is not None:
            self._orca_call(runner, f'after_{kind}_iter')

    def on_eval_end(self, dataset_info: Dict[str, Any]) -> None:
        """The loop hook of ``after_val_epoch`` / ``after_pred_epoch``."""
        runner = self._orca_runner('on_eval_end', dataset_info)
        kind = _pass_kind(runner, dataset_info)
        if kind is not None:
            self._orca_call(runner, f'after_{kind}_epoch')

    def on_epoch_end(self, *keras_args: Any, **keras_kwargs: Any) -> None:
        """The loop hook of ``after_train_epoch`` and of Orca 2.2's ``on_epoch_end(epoch=, logs=)``."""
        if keras_args or keras_kwargs or self.__dict__.get('_orca_keras_call') == 'on_epoch_end':
            return      # Orca 2.2's base method (a no-op), called by a subclass's own
        runner = self._orca_runner('on_epoch_end')
        self.after_train_epoch(runner)
        self._orca_keras('on_epoch_end', epoch=runner.epochs, logs=runner.epoch_stats)
        if runner.stop:
            self.train_loop_obj.early_stop = True

    def on_train_end(self, *keras_args: Any, **keras_kwargs: Any) -> None:
        """The loop hook of Orca 2.2's ``on_train_end(logs=)`` and of ``after_run``."""
        if keras_args or keras_kwargs or self.__dict__.get('_orca_keras_call') == 'on_train_end':
            return      # Orca 2.2's base method (a no-op), called by a subclass's own
        runner = self._orca_runner('on_train_end')
        self._orca_keras('on_train_end', logs=runner.epoch_stats)
        self._orca_call(runner, 'after_run')

    def on_exception(self, exception: BaseException) -> None:
        """A failed fit: the runner's state and the train loader are put back; no Orca hook runs (Orca has none)."""
        self._orca_runner('on_exception')

    # ---- checkpoints: the callback's attributes (and the runner's state) survive a resume ----------------------

    def state_dict(self) -> Optional[Dict[str, Any]]:
        """The callback's state for the loop's checkpoints: its attributes (see
        ``aitoolbox_like.adapters.foreign_state``), and for the loop's first Orca callback the runner's (what
        callbacks stored on it, its schedulers, the epoch's statistics so far). None before registration."""
        loop = self.train_loop_obj
        if self._orca_state is None or loop is None:
            return None
        state = self._orca_state.state(self, _encoder(loop))
        if _first_orca_callback(loop) is self:
            state['runner'] = runner_for(loop)._adapter_state_dict()
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` gave: after ``before_run`` of the resumed fit (where Orca callbacks set
        themselves up for a run), or at once inside a fit (a mid-epoch resume)."""
        loop = self.train_loop_obj
        if loop is not None and loop.epochs_running:
            self._orca_restore(state_dict)
        else:
            self._orca_pending = state_dict

    def _orca_restore(self, state: Dict[str, Any]) -> None:
        if self._orca_state is not None:
            self._orca_state.apply(self, state)
        if 'runner' in state:
            runner_for(self.train_loop_obj)._adapter_load_state(state['runner'])

    def __repr__(self) -> str:
        return type(self).__name__


# The adapter's own attributes of an Orca callback (and AbstractCallback's), never saved as its state.
ADAPTER_ATTRIBUTES = ('callback_name', '_callback_name', 'execution_order', 'device_idx_execution', 'train_loop_obj',
                      '_message_service', '_orca_state', '_orca_pending', '_orca_keras_call', 'model', 'trainer')


def _encoder(loop: 'TrainLoop') -> Encoder:
    """What is never saved from an Orca callback: the loop's objects, the runner, other callbacks."""
    return Encoder(loop_references(loop) + [runner_for(loop)], lambda value: isinstance(value, AbstractCallback))


def _first_orca_callback(loop: 'TrainLoop') -> Optional['Callback']:
    return next((callback for callback in loop.callbacks if isinstance(callback, Callback)), None)


def _defined_below(cls: type, name: str) -> bool:
    """Whether a class below :class:`Callback` defines ``name`` (the tutorial's on_epoch_* only when taking a runner)."""
    for klass in cls.__mro__:
        if klass is Callback:
            return False
        if name in ('on_epoch_begin', 'on_epoch_end'):
            if f'_orca_tutorial_{name}' in vars(klass):
                return True
        elif name in vars(klass):
            return True
    return False


class MainCallback(Callback):
    """Orca's ``MainCallback``: the one callback that owns the training step (our ``train_step``), the validation
    forward and the learning-rate adjustment. Override its methods as in Orca:

    * ``on_iter_forward(runner)``: the forward of training and validation; it must set ``runner.output`` and
      ``runner.loss`` (Orca's rule). Default: the batch is ``(*features, target)``, ``output = model(*features)``,
      ``loss = criterion(output, target)`` (lists of outputs / targets unpacked into the criterion), and
      ``runner.target`` is set.
    * ``on_train_forward(runner)`` / ``on_val_forward(runner)``: the training / validation forward (default:
      ``on_iter_forward``). The training forward runs under the loop's autocast (``use_amp``); the validation one
      inside the loop's validation loss pass, for each batch, after the loop's own evaluation forward (whose loss is
      the history's ``val_loss``), so ``after_val_iter`` sees Orca's ``output`` / ``loss`` / ``target``.
    * ``on_iter_backward(runner)``: Orca's zero_grad / backward / step. The default does it through the loop:
      ``loop.backward(runner.loss)`` and, on update steps, ``loop.step_optimizers()``, so fp16 (the GradScaler),
      gradient accumulation and the other callbacks' gradient hooks work. An override that calls backward and the
      optimizer itself is refused with ``use_amp='fp16'`` or ``grad_accumulation > 1`` (a ValueError before the
      first step, naming the fix); one that goes through the loop (``super().on_iter_backward(runner)``) sets
      ``backward_through_loop = True``.
    * ``on_lr_adjust(runner)``: once per epoch after the training batches (our on_train_epoch_end), before the
      validation. Default: steps ``runner.scheduler`` when set.
    * ``on_pred_forward(runner)``: Orca's prediction forward (``model(*batch)``, trailing size-1 dimensions
      squeezed, a NumPy array). The loop predicts with the model's ``get_predictions``, so the adapter does not call
      it; it is kept for code that calls it.
    """

    execution_order: float = MAIN_CALLBACK_ORDER

    def on_iter_forward(self, runner: Runner) -> None:
        """Default forward: ``(*features, target) = runner.batch``; ``runner.output = runner.model(*features)``;
        ``runner.loss = runner.criterion(*outputs, *targets)`` (a list or tuple of outputs / targets unpacked, a
        single one passed as is); ``runner.target = target``."""
        *features, target = runner.batch
        runner.output = runner.model(*features)
        outputs = runner.output if isinstance(runner.output, (list, tuple)) else [runner.output]
        targets = target if isinstance(target, (list, tuple)) else [target]
        runner.loss = runner.criterion(*outputs, *targets)
        runner.target = target

    def on_train_forward(self, runner: Runner) -> None:
        """The training forward: ``on_iter_forward``."""
        self.on_iter_forward(runner)

    def on_val_forward(self, runner: Runner) -> None:
        """The validation forward: ``on_iter_forward``."""
        self.on_iter_forward(runner)

    def on_iter_backward(self, runner: Runner) -> None:
        """Backward and the optimizer update, through the loop: ``loop.backward(runner.loss)`` (divided by
        ``grad_accumulation``, scaled under fp16, ``on_after_backward``), then on update steps
        ``loop.step_optimizers()`` (unscale, gradient hooks, step, zero_grad)."""
        loop = runner.loop
        loop.backward(runner.loss)
        if loop.should_execute_optimizer_update():
            loop.step_optimizers()

    def on_lr_adjust(self, runner: Runner) -> None:
        """Step ``runner.scheduler`` when there is one (once per epoch)."""
        if runner.scheduler:
            runner.scheduler.step()

    def on_pred_forward(self, runner: Runner) -> None:
        """Orca's prediction forward: ``runner.output = model(*runner.batch)`` with trailing dimensions of size 1
        squeezed, as a NumPy array."""
        output = runner.model(*runner.batch)
        for dim in reversed(range(1, output.dim())):
            output = torch.squeeze(output, dim)
        runner.output = output.detach().cpu().numpy()


#: The tutorial's spelling of :class:`MainCallback`.
MainCallBack = MainCallback


def adopt_bigdl_callbacks(loop: 'TrainLoop', callbacks: List[Any]) -> List[Any]:
    """BigDL's own Orca callbacks given to ``fit`` (kept ``bigdl...`` imports, or a class derived from BigDL's
    ``Callback`` / ``MainCallback``): refused, naming the import to change. Their base classes are BigDL's, which calls
    them from its own runner; here Orca callbacks derive from this adapter's classes."""
    for i, callback in enumerate(callbacks):
        cls = callback if isinstance(callback, type) else type(callback)
        if not any(klass.__module__.partition('.')[0] == 'bigdl' for klass in cls.__mro__):
            continue
        own = cls.__module__.partition('.')[0] == 'bigdl'
        fix = (f'change the import to `from aitoolbox_like.adapters.orca import {cls.__name__}`' if own else
               f'derive {cls.__name__} from aitoolbox_like.adapters.orca\'s Callback / MainCallback instead of '
               f'BigDL\'s (change `from bigdl.orca.learn.pytorch.callbacks import ...` to '
               f'`from aitoolbox_like.adapters.orca import ...`)')
        raise TypeError(f'callbacks[{i}] is a BigDL Orca callback ({cls.__module__}.{cls.__qualname__}), whose base '
                        f'classes are BigDL\'s own; the TrainLoop runs Orca callbacks through '
                        f'aitoolbox_like.adapters.orca: {fix} (docs/callbacks/orca.md)')
    return callbacks
