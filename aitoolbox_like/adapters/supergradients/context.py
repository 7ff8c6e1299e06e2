"""The ``PhaseContext`` SG callbacks receive: SuperGradients' fields over the loop's public attributes.

One context per loop, shared by its SG callbacks, as SG's trainer keeps one context for the run: what one
callback assigns (``context.update_context(...)``), the others see. It holds SG's per-run objects: the training
params, the loss meter and the metric collection of the current training epoch or evaluation pass, and SG's names
for the metrics (``metrics_dict`` has them beside the history names).
"""
import os
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import torch

from .params import AverageMeter, EpochLossMeter, SGMetricCollection, TrainingParams
from .sg_logger import SGLogger, UnavailableFieldError, experiment_folder

if TYPE_CHECKING:
    from ...engine.train_loop import TrainLoop

# dataset_info['type'] of an evaluation pass -> the history prefix of its values ('val_loss', 'val_Accuracy')
EVAL_PREFIXES = {'validation': 'val_', 'test': 'test_'}
# The fields the adapter sets on every context (an item of SG's batch dict is not set over one of them).
CONTEXT_FIELDS = frozenset({'loop', 'metric_to_watch', 'batch_idx', 'metrics_dict', 'batch', 'inputs', 'target',
                            'additional_batch_items', 'preds', 'loss', 'loss_log_items', 'loss_logging_items_names',
                            'metrics_compute_fn', 'loss_avg_meter', 'ema_model', 'state'})
# the training-params list of each split's metrics (SG's trainer: train_metrics_list, valid_metrics_list)
METRICS_LISTS = {'train': 'train_metrics_list', 'validation': 'valid_metrics_list', 'test': 'valid_metrics_list'}


class _FromLoop:
    """A PhaseContext field read from the loop when it is accessed (a non-data descriptor: a value assigned to
    the context, e.g. by ``update_context``, replaces it)."""

    def __init__(self, read: Callable[['PhaseContext'], Any], doc: str) -> None:
        self.read = read
        self.__doc__ = doc

    def __get__(self, context: Optional['PhaseContext'], owner: type) -> Any:
        if context is None:
            return self
        return self.read(context)


class _Unavailable:
    """A PhaseContext field SG's trainer fills and nothing here can: reading it raises
    :class:`UnavailableFieldError` naming the field (assigning one gives it a value)."""

    def __init__(self, why: str) -> None:
        self.why = why
        self.__doc__ = f'Not available: {why}.'

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, context: Optional['PhaseContext'], owner: type) -> Any:
        if context is None:
            return self
        raise UnavailableFieldError(f'PhaseContext.{self.name} is not available in aitoolbox_like: {self.why} '
                                    f'(docs/callbacks/supergradients.md lists the SG fields)')


def _ckpt_dir(context: 'PhaseContext') -> str:
    # As SG's run folder: the folder exists when a callback first reads its name (SG's trainer makes it before
    # training), so code that writes into it, os.path.join(context.ckpt_dir, 'my_best.pth'), works from the first
    # hook on.
    folder = os.path.join(experiment_folder(context.loop, 'PhaseContext.ckpt_dir'), 'checkpoint_model')
    if context.loop.is_main_process():
        os.makedirs(folder, exist_ok=True)
    return folder


def _held_training_params(loop: 'TrainLoop') -> Optional[TrainingParams]:
    """The TrainingParams an SG callback of the fit holds (SG's trainer builds its LR callbacks from the run's)."""
    for callback in loop.callbacks:
        params = callback.__dict__.get('training_params')
        if isinstance(params, TrainingParams):
            return params
    return None


def epoch_metrics(loop: 'TrainLoop', prefix: str = '') -> Dict[str, Any]:
    """The history values recorded in the current epoch whose names start with ``prefix``."""
    history = loop.train_history
    # 'train_end_val_Accuracy' is an end-of-training value, not a training-set one
    skip = 'train_end_' if prefix == 'train_' else None
    return {name: value for name in history.keys()
            if name.startswith(prefix) and not (skip and name.startswith(skip))
            and (value := history.value_in_epoch(name, loop.epoch)) is not None}


def loss_names(loop: 'TrainLoop', loss: Any = None) -> List[str]:
    """SG's names of the loss items (``loss_logging_items_names``): the criterion's class name for one loss
    (SG's), the part names of a MultiLoss; 'loss' without a criterion."""
    if loss is None:
        loss = next((batch for batch in loop.loss_batch_accum if batch is not None), None)
    if isinstance(loss, Mapping):
        return list(loss.keys())
    return [type(loop.criterion).__name__] if loop.criterion is not None else ['loss']


def sg_names(values: Dict[str, Any], prefix: str, names: List[str]) -> Dict[str, Any]:
    """SG's names for the history values of one split: the loss under the loss item names, a metric without the
    split's prefix (and without the '_PTLMetrics' suffix of a TorchMetricsPackage result)."""
    loss = 'accumulated_loss' if prefix == 'train_' else f'{prefix}loss'
    renamed: Dict[str, Any] = {}
    if len(names) == 1 and loss in values:
        renamed[names[0]] = values[loss]
    for name, value in values.items():
        if name == loss:
            continue
        if name.startswith(loss + '_') and name[len(loss) + 1:] in names:
            renamed[name[len(loss) + 1:]] = value
        elif name.startswith(prefix):
            short = name[len(prefix):]
            renamed[short[:-len('_PTLMetrics')] if short.endswith('_PTLMetrics') else short] = value
    return renamed


class PhaseContext:
    """What a SuperGradients callback method receives: SG's field names over the loop's public attributes, one
    context per loop, shared by its SG callbacks (as SG's one context for the run).

    Fields read from the loop when accessed (assigning one, or ``update_context(**values)``, replaces it):
    ``epoch``, ``optimizer``, ``criterion``, ``device``, ``net``, ``train_loader``, ``valid_loader``,
    ``valid_loaders_dict``, ``test_loader``, ``ckpt_dir`` / ``checkpoints_dir_path`` (the experiment folder's
    ``checkpoint_model``; :class:`NoExperimentFolderError`, naming the fix, when the loop has none),
    ``experiment_name``, ``ddp_silent_mode``, ``architecture``; ``training_params`` (a :class:`TrainingParams`: the
    :class:`TrainingParamsCallback`'s, else the one SG callbacks of the fit were built with, else SG's defaults with
    the fit's settings), ``lr_warmup_epochs`` (its ``lr_warmup_epochs``), ``valid_metrics`` (the collection of its
    ``valid_metrics_list``), ``sg_logger`` (the run's :class:`SGLogger`: SG's logger methods over the loop's
    TensorBoard callback, history and experiment folder).

    Fields of the current batch, set by the adapter before each method: ``batch_idx``, ``inputs``, ``target``,
    ``additional_batch_items``, ``preds``, ``loss``, ``loss_log_items``, ``loss_logging_items_names`` and
    ``batch`` (the whole batch as the loader gave it).

    Of the current training epoch or evaluation pass, as SG's trainer sets them: ``loss_avg_meter`` (SG's
    ``AverageMeter``; in training over the epoch's batch losses) and ``metrics_compute_fn`` (an
    :class:`SGMetricCollection` of the training params' metrics list of the split), None before the first epoch.

    ``metrics_dict``, set where SG sets it and None elsewhere: the history values of the phase's split and, beside
    them, SG's names (docs/hooks-from-other-libraries.md has the table by phase).

    Set ``stop_training = True`` to end training after the current epoch (``loop.early_stop``). ``ema_model`` is
    None (no EMA model in the loop: SG's value without EMA). ``metric_to_watch``: the
    :class:`TrainingParamsCallback`'s (SG's name of the watched value), else the first SG callback's.
    ``checkpoint_params``, ``arch_params``, ``context_methods``, ``metric_idx_in_results_tuple`` have no
    counterpart: reading one raises :class:`UnavailableFieldError` naming it.
    """

    loop: 'TrainLoop'
    epoch = _FromLoop(lambda c: c.loop.epoch, 'the current epoch (0-based), loop.epoch')
    optimizer = _FromLoop(lambda c: c.loop.optimizer, 'loop.optimizer')
    criterion = _FromLoop(lambda c: c.loop.criterion, 'loop.criterion')
    device = _FromLoop(lambda c: c.loop.device, 'loop.device (a torch.device)')
    net = _FromLoop(lambda c: c.loop.ddp_model if c.loop.ddp_model is not None else c.loop.model,
                    'the model being trained: the DDP wrapper in a DDP fit (as SG), else loop.model')
    train_loader = _FromLoop(lambda c: c.loop.train_loader, 'loop.train_loader')
    valid_loader = _FromLoop(lambda c: c.loop.validation_loader, 'loop.validation_loader')
    valid_loaders_dict = _FromLoop(
        lambda c: None if c.loop.validation_loader is None else {'': c.loop.validation_loader},
        "{'': loop.validation_loader} (SG's newer name), or None")
    test_loader = _FromLoop(lambda c: c.loop.test_loader, 'loop.test_loader')
    ckpt_dir = _FromLoop(_ckpt_dir, "<experiment folder>/checkpoint_model; NoExperimentFolderError (naming the fix) "
                                    "when the loop has no experiment folder")
    checkpoints_dir_path = _FromLoop(_ckpt_dir, 'the same as ckpt_dir (SG\'s newer name)')
    experiment_name = _FromLoop(lambda c: None if c.loop.experiment is None else c.loop.experiment.experiment_name,
                                "the experiment's name when the loop has an experiment, else None")
    training_params = _FromLoop(
        lambda c: c.fit_training_params(),
        "a TrainingParams: the one the fit's SG callbacks hold (SG's LR callbacks are built from it), else SG's "
        "defaults with the fit's max_epochs, max_train_batches, batch_accumulate, mixed_precision")
    lr_warmup_epochs = _FromLoop(lambda c: c.training_params.get('lr_warmup_epochs', 0),
                                 "training_params.lr_warmup_epochs (0 without warm-up, as SG)")
    valid_metrics = _FromLoop(lambda c: c.metric_collection('validation'),
                              "the SGMetricCollection of training_params.valid_metrics_list")
    ddp_silent_mode = _FromLoop(lambda c: not c.loop.is_main_process(), 'True outside the main process')
    architecture = _FromLoop(lambda c: type(c.loop.model).__name__, "the model's class name")
    sg_logger = _FromLoop(lambda c: c.logger(), "the run's SGLogger: SG's logger methods over the loop's "
                          "TensorBoard callback, history and experiment folder (sg_logger.py)")
    checkpoint_params = _Unavailable("SG's checkpoint settings; checkpoints are callbacks' arguments here")
    arch_params = _Unavailable("SG's model-zoo architecture settings; the model is any torch module here")
    context_methods = _Unavailable("SG trainer methods exposed to callbacks; use the loop (callback.train_loop_obj)")
    metric_idx_in_results_tuple = _Unavailable("an index into SG trainer's results tuple; read metrics_dict by name")

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
        self.metrics_compute_fn: Optional[SGMetricCollection] = None
        self.loss_avg_meter: Optional[AverageMeter] = None
        self.ema_model: Any = None
        # the adapter's bookkeeping: the training epoch and evaluation pass entered last (SG's trainer sets the
        # meter and the metrics at their start), the latest of them, the built params, collections, results
        self.state: Dict[str, Any] = {'epoch': None, 'train_meter': None, 'pass': None, 'pass_split': None,
                                      'pass_key': (None, 0), 'pass_meter': None, 'last': None, 'built_params': None,
                                      'collections': {}, 'computed': {}, 'sg': None}

    @property
    def stop_training(self) -> bool:
        """SG's flag to stop: reads and sets ``loop.early_stop`` (training ends after the current epoch)."""
        return bool(self.loop.early_stop)

    @stop_training.setter
    def stop_training(self, value: bool) -> None:
        self.loop.early_stop = bool(value)

    def update_context(self, **kwargs: Any) -> None:
        """Set fields (SG's method); a loop-derived field set here keeps the given value."""
        for name, value in kwargs.items():
            setattr(self, name, value)

    # ---- the adapter's: the batch, the loss, the epoch or pass the next method is about --------------------------

    def set_batch(self, batch: Any, batch_idx: Optional[int]) -> None:
        """The batch the next method sees. ``inputs`` / ``target`` / ``additional_batch_items`` are its parts when
        it is a tuple or list ``(inputs, target, *rest)``, else the batch and None. SG's own batch format,
        ``(inputs, target, {name: item})``, gives that dict as ``additional_batch_items`` and each item as a field
        of its name (``context.gt_samples``), as SG's trainer does. Clears what belongs to one phase (``preds``,
        ``loss``, ``loss_log_items``, ``metrics_dict``)."""
        self.batch, self.batch_idx = batch, batch_idx
        self.metrics_dict = None
        if isinstance(batch, (tuple, list)) and len(batch) >= 2:
            self.inputs, self.target = batch[0], batch[1]
            if len(batch) == 3 and isinstance(batch[2], Mapping):
                self.additional_batch_items = batch[2]
                for name, item in batch[2].items():
                    # an item named like one of the context's own fields would hide it for the rest of the run
                    if isinstance(name, str) and name.isidentifier() and not hasattr(PhaseContext, name) \
                            and name not in CONTEXT_FIELDS:
                        setattr(self, name, item)
            else:
                self.additional_batch_items = tuple(batch[2:]) or None
        else:
            self.inputs, self.target, self.additional_batch_items = batch, None, None
        self.preds = self.loss = self.loss_log_items = None

    def set_loss(self, loss: Any) -> None:
        """The batch loss, and SG's logging view of it: detached items and their names (:func:`loss_names`)."""
        self.loss = loss
        if loss is None:
            self.loss_log_items = self.loss_logging_items_names = None
            return
        self.loss_logging_items_names = loss_names(self.loop, loss)
        if isinstance(loss, torch.Tensor):
            self.loss_log_items = loss.detach().reshape(1)
        elif isinstance(loss, Mapping):        # MultiLoss: one item per named loss
            self.loss_log_items = torch.stack([torch.as_tensor(loss[n]).detach().reshape(())
                                               for n in self.loss_logging_items_names])
        else:
            self.loss_log_items = loss

    def enter_training_epoch(self) -> None:
        """SG's trainer at each training epoch's start: a new loss meter and the reset training metrics (and back to
        them after an evaluation pass made in the middle of the epoch)."""
        epoch = self.loop.epoch
        if self.state['epoch'] != epoch:
            self.state['epoch'] = epoch
            self.state['train_meter'] = EpochLossMeter(self.loop)
            self.state['last'] = None
            self.reset_collection('train')
        if self.state['last'] != 'train':
            self.state['last'] = 'train'
            self.loss_avg_meter = self.state['train_meter']
            self.metrics_compute_fn = self.metric_collection('train')

    def enter_pass(self, dataset_info: Dict[str, Any]) -> None:
        """SG's trainer at each evaluation pass's start (``dataset_info`` is the pass's own dict): a new meter and
        the split's reset metrics."""
        if self.state['pass'] is not dataset_info:
            self.state['pass'] = dataset_info
            self.state['last'] = self.state['pass_split'] = dataset_info.get('type') or ''
            self.state['pass_key'] = (self.loop.epoch, self.state['pass_key'][1] + 1)
            self.loss_avg_meter = self.state['pass_meter'] = AverageMeter()
            self.metrics_compute_fn = self.reset_collection(self.state['pass_split'])

    # ---- SG's per-run objects -------------------------------------------------------------------------------

    def fit_training_params(self) -> TrainingParams:
        """The run's training params: the TrainingParamsCallback's, else the ones the fit's SG callbacks were built
        with, else SG's defaults with the fit's settings."""
        run = self.state.get('run')
        if run is not None:
            return run.training_params
        held = _held_training_params(self.loop)
        if held is not None:
            return held
        params = self.state['built_params']
        if params is None:
            params = self.state['built_params'] = TrainingParams(average_best_models=False)
        loop = self.loop
        params.update(max_epochs=loop.num_epochs, max_train_batches=loop.num_iterations,
                      batch_accumulate=loop.grad_accumulation, mixed_precision=loop.precision != 'fp32')
        return params

    def logger(self) -> Any:
        """The run's :class:`~aitoolbox_like.adapters.supergradients.sg_logger.SGLogger` (one per context)."""
        if self.state.get('logger') is None:
            self.state['logger'] = SGLogger(self.loop)
        return self.state['logger']

    def metric_collection(self, split: str) -> SGMetricCollection:
        """The collection of the training params' metrics list of ``split`` (rebuilt when the list changes)."""
        metrics = self.training_params.get(METRICS_LISTS.get(split, 'valid_metrics_list')) or []
        cached = self.state['collections'].get(split)
        if cached is None or cached[0] is not metrics:
            cached = self.state['collections'][split] = (metrics, SGMetricCollection(metrics))
        return cached[1]

    def reset_collection(self, split: str) -> SGMetricCollection:
        collection = self.metric_collection(split)
        collection.reset()
        return collection

    def sg_metrics(self, split: str, values: Dict[str, Any]) -> Dict[str, Any]:
        """SG's names for the metrics of the current loader end (``split`` 'train', or the type of the evaluation
        pass entered; ``values`` the history-named ones): the loss items (SG's meter when something fed it, else
        the loop's value), the computed metrics (once per epoch or pass) and the split's history values without
        their prefix. Names already in ``values`` are left out."""
        prefix = EVAL_PREFIXES.get(split, 'train_')
        key = (self.loop.epoch, 'train') if split == 'train' else self.state['pass_key']
        names = loss_names(self.loop)
        renamed = sg_names(values, prefix, names)
        meter = self.state['train_meter' if split == 'train' else 'pass_meter']
        if meter is not None and meter.count:
            average = meter.average
            renamed.update(zip(names, average if isinstance(average, tuple) else (average,)))
        renamed.update(self.computed_metrics(split, key))
        found = {name: value for name, value in renamed.items() if name not in values}
        self.state['sg'] = (key, found)
        return found

    def final_sg_metrics(self, values: Dict[str, Any]) -> Dict[str, Any]:
        """SG's names at the end of training, where SG's context still holds its last loader end's metrics: those
        of the training epoch or evaluation pass entered last. Names already in ``values`` are left out."""
        split = self.state['last']
        if split is None:
            return {}
        key = (self.loop.epoch, 'train') if split == 'train' else self.state['pass_key']
        cached = self.state['sg']
        found = cached[1] if cached is not None and cached[0] == key else \
            self.sg_metrics(split, epoch_metrics(self.loop, EVAL_PREFIXES.get(split, 'train_')))
        return {name: value for name, value in found.items() if name not in values}

    def computed_metrics(self, split: str, key: Tuple[int, Any]) -> Dict[str, Any]:
        """``compute()`` of the split's collection, once per ``key``: ``(epoch, pass)``."""
        computed = self.state['computed'].get(split)
        if computed is None or computed[0] != key:
            collection = self.metric_collection(split)
            # a metric nothing fed in this epoch or pass has no value (SG's trainer always feeds its metrics)
            computed = self.state['computed'][split] = (key, collection.compute() if collection.updates else {})
        return computed[1]

    def best_epoch_sg_metrics(self, values: Dict[str, Any]) -> Dict[str, Any]:
        """SG's names at the best epoch: the validation history values renamed, and the metrics the epoch's last
        validation pass computed."""
        renamed = sg_names(values, 'val_', loss_names(self.loop))
        computed = self.state['computed'].get('validation')
        if computed is not None and computed[0][0] == self.loop.epoch:
            renamed.update(computed[1])
        return {name: value for name, value in renamed.items() if name not in values}

    def __repr__(self) -> str:
        return f'PhaseContext(epoch={self.loop.epoch}, batch_idx={self.batch_idx})'


_CONTEXTS: 'weakref.WeakKeyDictionary[TrainLoop, PhaseContext]' = weakref.WeakKeyDictionary()


def context_for(loop: 'TrainLoop', metric_to_watch: Optional[str] = None) -> PhaseContext:
    """The loop's one PhaseContext (created by its first SG callback)."""
    context = _CONTEXTS.get(loop)
    if context is None:
        context = _CONTEXTS[loop] = PhaseContext(loop, metric_to_watch)
    return context

