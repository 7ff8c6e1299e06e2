"""TensorBoard callbacks (``pip install aitoolbox_like[tensorboard]``), their base class
(:class:`TensorboardReporterBaseCB`: the log folder, the SummaryWriter and the shared writing helpers), and the helpers
the callbacks that look at the model share (the unwrapped model, a first batch drawn without touching the training's
random state; visualization and wandb use some of them).

All of them run on rank 0 only (device_idx_execution=0) and call no collective: they read the training history,
the loop's per-batch losses, the optimizer and the (unwrapped) model, so a distributed run cannot hang on them.
Batch losses are rank 0's own losses; history metrics are the global ones.

One exception, under FSDP (gpu_mode='fsdp') only: parameters and gradients are sharded there, and the histograms
of TensorboardParameterHistograms and of TensorboardFullTracking(histogram_frequency=k) are of the whole tensors,
gathered from every rank (``full_tensor``, a collective). These two set ``collective_when_sharded``, so the FSDP
launcher runs them on every rank; all ranks gather at the same points and only the main process writes event
files. The model graph is not written under FSDP (tracing would run the sharded model's forward on one rank).

Event files go to ``<experiment folder>/tensorboard/<project>_<experiment>`` (is_project=True, the default)
or to ``log_dir`` itself (is_project=False). Open them with ``tensorboard --logdir <that folder>``.
"""
import logging
import os
import warnings
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Type

import torch
from torch.nn.parallel import DistributedDataParallel

from .. import distributed
from ..experiment import is_cloud_mode
from ._common import BatchLossReader, check_int
from ._common import is_number as _is_number
from .abstract import AbstractExperimentCallback
from .gradient import whole_tensor
from .performance_eval import history_series

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

logger = logging.getLogger(__name__)


def summary_writer_class() -> Type['SummaryWriter']:
    """``torch.utils.tensorboard.SummaryWriter``, or an ImportError with the install hint when the tensorboard
    extra is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ImportError('The TensorBoard callbacks need the tensorboard package: '
                          'pip install aitoolbox_like[tensorboard]') from exc
    return SummaryWriter


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DistributedDataParallel wrapper: running the wrapper on one rank would start
    its buffer broadcast, a collective the other ranks never join."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def first_batch(data_loader: Iterable[Any]) -> Any:
    """The first batch of a fresh pass over ``data_loader``, drawn without changing the training's random
    state: the global RNGs are forked, and a generator given to the loader or its sampler is restored."""
    generators = [g for g in (getattr(data_loader, 'generator', None),
                              getattr(getattr(data_loader, 'sampler', None), 'generator', None))
                  if isinstance(g, torch.Generator)]
    states = [g.get_state() for g in generators]
    devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            return next(iter(data_loader))
    finally:
        for generator, state in zip(generators, states):
            generator.set_state(state)


def experiment_log_dir(callback: AbstractExperimentCallback, log_dir_name: str = 'tensorboard') -> str:
    """TensorBoard run folder of an experiment callback: ``<experiment dir>/<log_dir_name>/<project>_<experiment>``."""
    return os.path.join(callback.experiment_dir_path, log_dir_name,
                        f'{callback.project_name}_{callback.experiment_name}')


class TensorboardReporterBaseCB(AbstractExperimentCallback):
    """Base of the TensorBoard callbacks: the log folder, the SummaryWriter and the shared writing helpers
    (arguments: see ``__init__``)."""

    # Set by the subclasses that use the helpers reading them (batch losses, history metrics, hyperparameters,
    # gradient histograms).
    batch_sync_frequency: int
    metric_names: Optional[Sequence[str]]
    hparams: Optional[Dict[str, Any]]
    _grads_logged_epoch: Optional[int]

    def __init__(self, callback_name: str, log_dir: Optional[str] = None, is_project: bool = True,
                 project_name: Optional[str] = None, experiment_name: Optional[str] = None,
                 local_model_result_folder_path: Optional[str] = None, cloud_save_mode: Optional[str] = None,
                 bucket_name: Optional[str] = None, cloud_dir_prefix: Optional[str] = None, **kwargs: Any) -> None:
        """Base of the TensorBoard callbacks: sets up the log folder and a SummaryWriter (``self.tb_writer``).

        Args:
            callback_name (str): a readable name.
            log_dir (str or None): folder name inside the experiment folder (is_project=True, default
                'tensorboard'), or the full path of the log folder (is_project=False).
            is_project (bool): write into the experiment folder (details inferred from a tracking TrainLoop,
                else ./experiments/default_project/experiment_<timestamp>).
            project_name, experiment_name, local_model_result_folder_path, cloud_save_mode, bucket_name,
                cloud_dir_prefix: the experiment folder (see AbstractExperimentCallback). With a cloud mode the
                event files are uploaded (upload_experiment_files) after each epoch and at the end.
            **kwargs: arguments of ``torch.utils.tensorboard.SummaryWriter`` (e.g. flush_secs).
        """
        super().__init__(callback_name, project_name, experiment_name, local_model_result_folder_path,
                         cloud_save_mode, bucket_name, cloud_dir_prefix, execution_order=97, device_idx_execution=0)
        self._summary_writer = summary_writer_class()     # a missing extra fails at construction
        self.log_dir: str = 'tensorboard' if log_dir is None else os.path.expanduser(log_dir)
        self.is_project = is_project
        self.tb_writer_kwargs = kwargs
        self.tb_writer: Optional['SummaryWriter'] = None     # created at registration
        self.cloud_results_saver: Any = None
        self.last_written_files: List[str] = []
        self._batch_losses = BatchLossReader()

    @property
    def writes_events(self) -> bool:
        """Whether this process writes the event files: True wherever the callback runs, except on the ranks other
        than the main one under FSDP, which only take part in gathering whole tensors for the histograms."""
        return self.tb_writer is not None

    @property
    def _writer(self) -> 'SummaryWriter':
        """The SummaryWriter; the hooks that write run only after registration created it."""
        writer = self.tb_writer
        assert writer is not None, f'{self.callback_name}: the SummaryWriter is created at registration'
        return writer

    # ---- set-up ---------------------------------------------------------------------------------

    def on_train_loop_registration(self) -> None:
        """Infer the experiment folder (is_project=True), create the log folder and open the SummaryWriter (in the
        main process only, when the callback runs on every rank: under FSDP, see the module's docstring)."""
        if self.is_project:
            self.try_infer_experiment_details(infer_cloud_details=True)
            self.prepare_results_saver()
        if self.device_idx_execution is None and not self.train_loop_obj.is_main_process():
            self.tb_writer = None          # this rank only joins the gathers of whole tensors
            return
        self.log_dir = self.create_log_dir()
        logger.info('%s: TensorBoard event files go to %s', type(self).__name__, self.log_dir)
        if not self.is_project and 'filename_suffix' not in self.tb_writer_kwargs:
            self.tb_writer_kwargs['filename_suffix'] = f'_{self.train_loop_obj.experiment_timestamp}'
        self.tb_writer = self._summary_writer(log_dir=self.log_dir, **self.tb_writer_kwargs)

    def create_log_dir(self) -> str:
        """Create and return the log folder."""
        path = self.log_dir
        if self.is_project:
            path = experiment_log_dir(self, self.log_dir)
        os.makedirs(path, exist_ok=True)
        return path

    def prepare_results_saver(self) -> None:
        """Kept for AIToolbox compatibility: uploads go through upload_experiment_files()."""
        self.cloud_results_saver = None

    def on_train_end(self) -> None:
        """Close the SummaryWriter and upload the event files."""
        if not self.writes_events:
            return
        self._writer.close()       # writing again later (a second fit) reopens a new event file
        self.upload_to_cloud()

    def on_exception(self, exception: BaseException) -> None:
        """Close the SummaryWriter (if open), so the events written so far are on disk."""
        if self.tb_writer is not None:
            self.tb_writer.close()

    def upload_to_cloud(self) -> None:
        """Upload the event files (only with a cloud cloud_save_mode)."""
        if not is_cloud_mode(self.cloud_save_mode) or not self.writes_events:
            return
        self._writer.flush()
        paths = [os.path.join(root, name) for root, _, names in os.walk(self.log_dir) for name in names]
        self.upload_experiment_files(paths)

    # ---- batch losses ---------------------------------------------------------------------------

    def log_mid_train_loss(self) -> None:
        """Write the per-batch training losses not written yet (``train_loss/last_batch_<name>`` and the
        epoch's running mean ``train_loss/accumulated_batch_<name>``, name 'loss' for a single loss) for the
        steps that are multiples of ``batch_log_frequency``.

        All pending losses are copied to the host in one transfer, so the cost is one host-device sync per
        call, however many steps it covers. Steps are the loop's total_iteration_idx (global batch index).
        """
        frequency = getattr(self, 'batch_log_frequency', 1) or 1
        for step, values, means in self._batch_losses.read_new(self.train_loop_obj):
            if step % frequency == 0:
                for name, value in values.items():
                    self._writer.add_scalar(f'train_loss/last_batch_{name}', value, step)
                    self._writer.add_scalar(f'train_loss/accumulated_batch_{name}', means[name], step)

    def _maybe_log_mid_train_loss(self) -> None:
        if (self.train_loop_obj.total_iteration_idx + 1) % self.batch_sync_frequency == 0:
            self.log_mid_train_loss()

    # ---- history metrics ------------------------------------------------------------------------

    def log_train_history_metrics(self, metric_names: Iterable[str], only_epoch: Optional[int] = None) -> None:
        """Write the latest value of each named history metric (tag ``loss/<m>`` for losses, else
        ``metrics/<m>``; dict-valued metrics per key), at step = epoch of the value.

        Args:
            metric_names (iterable of str): history names; missing ones are skipped.
            only_epoch (int or None): write only values recorded in this epoch, so metrics computed every
                k epochs are not written again with a later epoch's step (AIToolbox repeated them).
        """
        for name, (epochs, values) in history_series(self.train_loop_obj.train_history, list(metric_names)).items():
            if not values or not _is_number(values[-1]):
                continue
            if only_epoch is not None and epochs[-1] != only_epoch:
                continue
            prefix = 'loss' if 'loss' in name else 'metrics'
            self._writer.add_scalar(f'{prefix}/{name}', values[-1], epochs[-1])

    def _history_names(self) -> List[str]:
        history = self.train_loop_obj.train_history
        return list(history.keys()) if self.metric_names is None else list(self.metric_names)

    def _log_epoch_history(self) -> None:
        names = [n for n in self._history_names() if not n.startswith('train_end_')]
        self.log_train_history_metrics(names, only_epoch=self.train_loop_obj.epoch)

    def _hparams_to_write(self) -> Optional[Dict[str, Any]]:
        """The given hparams, else the tracking TrainLoop's ``hyperparams`` (None when neither exists)."""
        return self.hparams if self.hparams is not None else getattr(self.train_loop_obj, 'hyperparams', None)

    def _log_gradient_histograms_once(self, due: bool) -> None:
        """Gradient histograms at the first optimizer update of an epoch in which ``due``."""
        epoch = self.train_loop_obj.epoch
        if self._grads_logged_epoch != epoch and due:
            self._grads_logged_epoch = epoch
            self.log_gradient_histograms(epoch)

    def _log_train_end_history(self) -> None:
        history = self.train_loop_obj.train_history
        wanted = self._history_names()
        names = [n for n in history.keys() if n.startswith('train_end_')
                 and (self.metric_names is None or n in wanted or n[len('train_end_'):] in wanted)]
        self.log_train_history_metrics(names)

    # ---- learning rates, histograms, graph, hyperparameters ---------------------------------------

    def log_learning_rates(self, step: int) -> None:
        """``learning_rate/group_<i>`` of each param group (``learning_rate/optimizer_<k>_group_<i>`` for a
        MultiOptimizer)."""
        optimizers = self.train_loop_obj.optimizers
        for k, opt in enumerate(optimizers):
            for i, group in enumerate(getattr(opt, 'param_groups', [])):
                if 'lr' not in group:
                    continue
                lr = group['lr']
                tag = f'learning_rate/optimizer_{k}_group_{i}' if len(optimizers) > 1 else f'learning_rate/group_{i}'
                self._writer.add_scalar(tag, float(lr), step)

    def log_parameter_histograms(self, step: int) -> None:
        """A ``parameters/<name>`` histogram of every model parameter at ``step``. Under FSDP each parameter is
        gathered whole, one at a time (a collective: every rank runs this callback and calls this together); the
        main process writes."""
        model = unwrap_model(self.train_loop_obj.model)
        # Read through state_dict: after an evaluation pass FSDP keeps the root unit's parameters gathered, as plain
        # tensors whose storage it frees later (which fails once a histogram has shared it with numpy); state_dict
        # reshards first and gives every parameter as its shard.
        state = model.state_dict()
        for name, param in model.named_parameters():
            value = whole_tensor(self, state[name] if name in state else param.detach())
            if self.writes_events:
                self._writer.add_histogram(f'parameters/{name}', value, step)

    def log_gradient_histograms(self, step: int) -> None:
        """A ``gradients/<name>`` histogram of every model parameter that has a gradient, at ``step`` (under FSDP,
        of the whole gradient, gathered as in log_parameter_histograms)."""
        for name, param in unwrap_model(self.train_loop_obj.model).named_parameters():
            if param.grad is not None:
                value = whole_tensor(self, param.grad.detach())
                if self.writes_events:
                    self._writer.add_histogram(f'gradients/{name}', value, step)

    def log_model_graph(self, input_to_model: Any = None) -> bool:
        """Trace the model once and write its graph. Without ``input_to_model`` the inputs are the first
        train batch minus its last element (the TTBasicModel convention: ``(*inputs, target)``). A model
        that cannot be traced only gets a warning; training goes on."""
        loop = self.train_loop_obj
        model = unwrap_model(loop.model)
        if distributed.is_fsdp_model(model):
            # Tracing runs the model's forward, which under FSDP gathers each block's parameters from every rank.
            logger.warning("%s: the model graph is not written under gpu_mode='fsdp' (tracing the sharded model is a "
                           "collective the other ranks do not join)", self.callback_name)
            return False
        try:
            if input_to_model is None:
                batch = first_batch(loop.train_loader)
                if not isinstance(batch, (list, tuple)) or len(batch) < 2:
                    raise ValueError('the first train batch is not (*inputs, target); pass input_to_model')
                input_to_model = tuple(batch[:-1])
            input_to_model = _to_device(input_to_model, loop.device)
            if isinstance(input_to_model, (list, tuple)) and len(input_to_model) == 1:
                input_to_model = input_to_model[0]
            was_training = model.training
            model.eval()
            try:
                with warnings.catch_warnings():
                    # add_graph traces with torch.jit.trace, which warns about its own deprecation
                    warnings.simplefilter('ignore', DeprecationWarning)
                    self._writer.add_graph(model, input_to_model)
            finally:
                model.train(was_training)
        except Exception as exc:       # the graph is a nice-to-have; never stop training for it
            logger.warning('%s: could not write the model graph (%s: %s)', self.callback_name,
                           type(exc).__name__, exc)
            return False
        return True

    def log_hparams(self, hparams: Dict[str, Any], metric_names: Optional[Iterable[str]] = None) -> Dict[str, float]:
        """Write hyperparameters with the final value of metrics for TensorBoard's HPARAMS tab.

        Values that are not bool / int / float / str / None are written as their ``str()``. The metrics are
        written as scalars ``hparam/<metric>`` (the last numeric value of each history metric, or of those
        named), at step = last epoch.
        """
        from torch.utils.tensorboard.summary import hparams as hparams_summary
        hparam_dict = {str(k): v if v is None or isinstance(v, (bool, int, float, str)) else str(v)
                       for k, v in hparams.items()}
        history = self.train_loop_obj.train_history
        names = history.keys() if metric_names is None else [m for m in metric_names if m in history]
        final: Dict[str, float] = {}
        for name, (_, values) in history_series(history, list(names)).items():
            if values and _is_number(values[-1]):
                final[f'hparam/{name}'] = float(values[-1])
        # Written into this run (SummaryWriter.add_hparams would start a separate run folder for them).
        writer = self._writer
        file_writer = writer.file_writer or writer._get_file_writer()   # reopened after close()
        for summary in hparams_summary(hparam_dict, final):
            file_writer.add_summary(summary)
        for tag, value in final.items():
            writer.add_scalar(tag, value, self.train_loop_obj.epoch)
        return final


def _to_device(data: Any, device: torch.device) -> Any:
    if isinstance(data, torch.Tensor):
        return data.to(device)
    if isinstance(data, (list, tuple)):
        return type(data)(_to_device(d, device) for d in data)
    return data


# ------------------------------------------------------------------------------------- the TensorBoard callbacks


class TensorboardTrainBatchLoss(TensorboardReporterBaseCB):
    """Training loss of every k-th batch (arguments: see ``__init__``)."""

    def __init__(self, batch_log_frequency: int = 1, log_dir: Optional[str] = None, is_project: bool = True,
                 project_name: Optional[str] = None, experiment_name: Optional[str] = None,
                 local_model_result_folder_path: Optional[str] = None, cloud_save_mode: Optional[str] = None,
                 bucket_name: Optional[str] = None, cloud_dir_prefix: Optional[str] = None,
                 batch_sync_frequency: int = 100, **kwargs: Any) -> None:
        """Training loss of every ``batch_log_frequency``-th batch (step = global batch index).

        The losses stay on the device during training and are copied to the host in one transfer every
        ``batch_sync_frequency`` steps and at the end of each epoch, so even the default
        ``batch_log_frequency=1`` (AIToolbox's) costs one host-device sync per 100 steps rather than one per
        step. Lower ``batch_sync_frequency`` to see the curve update sooner during long epochs.

        Args:
            batch_log_frequency (int): write every k-th batch's loss.
            batch_sync_frequency (int): copy pending losses to the host every n steps (one sync each time).
            log_dir, is_project, project_name, experiment_name, local_model_result_folder_path, cloud_save_mode,
                bucket_name, cloud_dir_prefix, **kwargs: see TensorboardReporterBaseCB.
        """
        super().__init__('Tensorboard end of batch report of batch loss', log_dir, is_project, project_name,
                         experiment_name, local_model_result_folder_path, cloud_save_mode, bucket_name,
                         cloud_dir_prefix, **kwargs)
        check_int('batch_log_frequency', batch_log_frequency)
        check_int('batch_sync_frequency', batch_sync_frequency)
        self.batch_log_frequency = batch_log_frequency
        self.batch_sync_frequency = batch_sync_frequency

    def on_batch_end(self) -> None:
        """Write the pending batch losses every ``batch_sync_frequency`` steps."""
        self._maybe_log_mid_train_loss()

    def on_epoch_end(self) -> None:
        """Write the epoch's remaining batch losses, flush and upload."""
        self.log_mid_train_loss()
        self._writer.flush()
        self.upload_to_cloud()

    def on_train_end(self) -> None:
        """Write the remaining batch losses, then close the writer and upload."""
        self.log_mid_train_loss()      # a StopTraining mid-epoch skips on_epoch_end
        super().on_train_end()


class TensorboardTrainHistoryMetric(TensorboardReporterBaseCB):
    """History metrics after each epoch and the ``train_end_*`` metrics at the end (arguments: see
    ``__init__``)."""

    def __init__(self, metric_names: Optional[Sequence[str]] = None, log_dir: Optional[str] = None,
                 is_project: bool = True, project_name: Optional[str] = None, experiment_name: Optional[str] = None,
                 local_model_result_folder_path: Optional[str] = None, cloud_save_mode: Optional[str] = None,
                 bucket_name: Optional[str] = None, cloud_dir_prefix: Optional[str] = None, **kwargs: Any) -> None:
        """History metrics after each epoch (step = epoch) and the ``train_end_*`` metrics at the end.

        Args:
            metric_names (list or None): history names to write (None: all numeric ones).
            log_dir, is_project, project_name, experiment_name, local_model_result_folder_path, cloud_save_mode,
                bucket_name, cloud_dir_prefix, **kwargs: see TensorboardReporterBaseCB.
        """
        super().__init__('Tensorboard end of epoch report of train history metrics', log_dir, is_project,
                         project_name, experiment_name, local_model_result_folder_path, cloud_save_mode,
                         bucket_name, cloud_dir_prefix, **kwargs)
        self.metric_names = metric_names

    def on_epoch_end(self) -> None:
        """Write the history values of this epoch, flush and upload."""
        self._log_epoch_history()
        self._writer.flush()
        self.upload_to_cloud()

    def on_train_end(self) -> None:
        """Write the ``train_end_*`` metrics, then close the writer and upload."""
        self._log_train_end_history()
        super().on_train_end()


class TensorboardLearningRate(TensorboardReporterBaseCB):
    """Learning rate of each param group, per epoch or every k-th batch (arguments: see ``__init__``)."""

    def __init__(self, batch_log_frequency: Optional[int] = None, log_dir: Optional[str] = None,
                 is_project: bool = True, project_name: Optional[str] = None, experiment_name: Optional[str] = None,
                 local_model_result_folder_path: Optional[str] = None, cloud_save_mode: Optional[str] = None,
                 bucket_name: Optional[str] = None, cloud_dir_prefix: Optional[str] = None, **kwargs: Any) -> None:
        """Learning rate of each param group: after each epoch (step = epoch), or with
        ``batch_log_frequency=k`` every k-th batch (step = global batch index; for warmup schedules).
        Reading a learning rate is a Python float, no device sync."""
        super().__init__('Tensorboard learning rate report', log_dir, is_project, project_name, experiment_name,
                         local_model_result_folder_path, cloud_save_mode, bucket_name, cloud_dir_prefix, **kwargs)
        check_int('batch_log_frequency', batch_log_frequency, allow_none=True)
        self.batch_log_frequency = batch_log_frequency

    def on_batch_end(self) -> None:
        """Write the learning rates every ``batch_log_frequency``-th batch (when set)."""
        step = self.train_loop_obj.total_iteration_idx
        if self.batch_log_frequency is not None and step % self.batch_log_frequency == 0:
            self.log_learning_rates(step)

    def on_epoch_end(self) -> None:
        """Write the learning rates (without ``batch_log_frequency``), flush and upload."""
        if self.batch_log_frequency is None:
            self.log_learning_rates(self.train_loop_obj.epoch)
        self._writer.flush()
        self.upload_to_cloud()


class TensorboardParameterHistograms(TensorboardReporterBaseCB):
    """Parameter and gradient histograms every k epochs (arguments: see ``__init__``). Under FSDP it runs on every
    rank to gather the whole tensors (see the module's docstring)."""

    # Read by the FSDP launcher (distributed/launch.py): under gpu_mode='fsdp' this callback then runs on every rank.
    collective_when_sharded = True

    def __init__(self, histogram_frequency: int = 1, log_gradients: bool = True, log_dir: Optional[str] = None,
                 is_project: bool = True, project_name: Optional[str] = None, experiment_name: Optional[str] = None,
                 local_model_result_folder_path: Optional[str] = None, cloud_save_mode: Optional[str] = None,
                 bucket_name: Optional[str] = None, cloud_dir_prefix: Optional[str] = None, **kwargs: Any) -> None:
        """Histograms of the parameters (``parameters/<name>``, after the epoch) and of their gradients
        (``gradients/<name>``, at the epoch's first optimizer update, after unscaling) every
        ``histogram_frequency`` epochs (epochs 0, k, 2k, ...; step = epoch). Each histogram copies the
        tensor to the host, so keep k large for big models."""
        super().__init__('Tensorboard parameter and gradient histograms', log_dir, is_project, project_name,
                         experiment_name, local_model_result_folder_path, cloud_save_mode, bucket_name,
                         cloud_dir_prefix, **kwargs)
        check_int('histogram_frequency', histogram_frequency)
        self.histogram_frequency = histogram_frequency
        self.log_gradients = log_gradients
        self._grads_logged_epoch = None

    def _due(self) -> bool:
        return self.train_loop_obj.epoch % self.histogram_frequency == 0

    def on_after_optimizer_step(self) -> None:
        """Gradient histograms at the first optimizer update of a due epoch."""
        if self.log_gradients:
            self._log_gradient_histograms_once(self._due())

    def on_epoch_end(self) -> None:
        """Parameter histograms in a due epoch, flush and upload."""
        if self._due():
            self.log_parameter_histograms(self.train_loop_obj.epoch)
        if self.writes_events:
            self._writer.flush()
            self.upload_to_cloud()


class TensorboardModelGraph(TensorboardReporterBaseCB):
    """The model graph, written once at the start of the first fit (arguments: see ``__init__``)."""

    def __init__(self, input_to_model: Any = None, log_dir: Optional[str] = None, is_project: bool = True,
                 project_name: Optional[str] = None, experiment_name: Optional[str] = None,
                 local_model_result_folder_path: Optional[str] = None, cloud_save_mode: Optional[str] = None,
                 bucket_name: Optional[str] = None, cloud_dir_prefix: Optional[str] = None, **kwargs: Any) -> None:
        """The model graph, written once at the start of the first fit (see
        TensorboardReporterBaseCB.log_model_graph for how the example input is found)."""
        super().__init__('Tensorboard model graph', log_dir, is_project, project_name, experiment_name,
                         local_model_result_folder_path, cloud_save_mode, bucket_name, cloud_dir_prefix, **kwargs)
        self.input_to_model = input_to_model
        self._graph_written = False

    def on_train_begin(self) -> None:
        """Write the model graph (first fit only)."""
        if not self._graph_written:
            self._graph_written = True
            self.log_model_graph(self.input_to_model)
            self._writer.flush()


class TensorboardHyperparameters(TensorboardReporterBaseCB):
    """Hyperparameters and final metrics for the HPARAMS tab, at the end of training (arguments: see
    ``__init__``)."""

    def __init__(self, hparams: Optional[Dict[str, Any]] = None, metric_names: Optional[Sequence[str]] = None,
                 log_dir: Optional[str] = None, is_project: bool = True, project_name: Optional[str] = None,
                 experiment_name: Optional[str] = None, local_model_result_folder_path: Optional[str] = None,
                 cloud_save_mode: Optional[str] = None, bucket_name: Optional[str] = None,
                 cloud_dir_prefix: Optional[str] = None, **kwargs: Any) -> None:
        """Hyperparameters and final metrics for TensorBoard's HPARAMS tab, written at the end of training.

        Args:
            hparams (dict or None): the hyperparameters; None uses the tracking TrainLoop's ``hyperparams``.
            metric_names (list or None): history metrics whose final value is reported (None: all numeric).
        """
        super().__init__('Tensorboard hyperparameters', log_dir, is_project, project_name, experiment_name,
                         local_model_result_folder_path, cloud_save_mode, bucket_name, cloud_dir_prefix, **kwargs)
        if hparams is not None and not isinstance(hparams, dict):
            raise TypeError(f'hparams must be a dict of name -> value, got {type(hparams).__qualname__}')
        self.hparams = hparams
        self.metric_names = metric_names

    def on_train_end(self) -> None:
        """Write the hyperparameters with the final metrics, then close the writer and upload."""
        if not self.train_loop_obj.interrupted:      # the final metrics come at the run's real end
            hparams = self._hparams_to_write()
            if hparams:
                self.log_hparams(hparams, self.metric_names)
            else:
                logger.warning('%s: no hyperparameters to write; pass hparams={...}', self.callback_name)
        super().on_train_end()


class TensorboardFullTracking(TensorboardReporterBaseCB):
    """Batch losses, history metrics and learning rates in one event file, plus optional histograms, graph and
    hyperparameters (arguments: see ``__init__``). With histograms under FSDP it runs on every rank to gather the
    whole tensors; the other ranks do nothing else (see the module's docstring)."""

    @property
    def collective_when_sharded(self) -> bool:
        """Read by the FSDP launcher (distributed/launch.py): with histograms, under gpu_mode='fsdp' this callback runs on every
        rank (the histograms gather whole tensors); without, it stays on rank 0."""
        return self.histogram_frequency is not None

    def __init__(self, metric_names: Optional[Sequence[str]] = None, batch_log_frequency: int = 1,
                 log_dir: Optional[str] = None, is_project: bool = True, project_name: Optional[str] = None,
                 experiment_name: Optional[str] = None, local_model_result_folder_path: Optional[str] = None,
                 cloud_save_mode: Optional[str] = None, bucket_name: Optional[str] = None,
                 cloud_dir_prefix: Optional[str] = None, batch_sync_frequency: int = 100,
                 log_learning_rate: bool = True, histogram_frequency: Optional[int] = None, log_graph: bool = False,
                 hparams: Optional[Dict[str, Any]] = None, **kwargs: Any) -> None:
        """Batch losses, history metrics and learning rates in one callback (one event file), plus optional
        histograms, model graph and hyperparameters.

        Args:
            metric_names (list or None): history metrics to write after each epoch (None: all numeric).
            batch_log_frequency (int): write every k-th batch loss (see TensorboardTrainBatchLoss for the cost).
            batch_sync_frequency (int): copy pending batch losses to the host every n steps.
            log_learning_rate (bool): learning rates after each epoch.
            histogram_frequency (int or None): parameter and gradient histograms every k epochs (None: off).
            log_graph (bool): write the model graph at the start of training (first batch as input).
            hparams (dict or None): write these hyperparameters with the final metrics at the end (None:
                the tracking TrainLoop's ``hyperparams`` if it has them, else nothing).
            log_dir, is_project, project_name, experiment_name, local_model_result_folder_path, cloud_save_mode,
                bucket_name, cloud_dir_prefix, **kwargs: see TensorboardReporterBaseCB.
        """
        super().__init__('Tensorboard full tracking', log_dir, is_project, project_name, experiment_name,
                         local_model_result_folder_path, cloud_save_mode, bucket_name, cloud_dir_prefix, **kwargs)
        check_int('batch_log_frequency', batch_log_frequency)
        check_int('batch_sync_frequency', batch_sync_frequency)
        check_int('histogram_frequency', histogram_frequency, allow_none=True)
        self.metric_names = metric_names
        self.batch_log_frequency = batch_log_frequency
        self.batch_sync_frequency = batch_sync_frequency
        self.log_learning_rate = log_learning_rate
        self.histogram_frequency = histogram_frequency
        self.log_graph = log_graph
        self.hparams = hparams
        self._graph_written = False
        self._grads_logged_epoch = None

    def _histograms_due(self) -> bool:
        return self.histogram_frequency is not None and self.train_loop_obj.epoch % self.histogram_frequency == 0

    def on_train_begin(self) -> None:
        """Write the model graph (with log_graph, first fit only)."""
        if self.log_graph and not self._graph_written and self.writes_events:
            self._graph_written = True
            self.log_model_graph()

    def hooks_in_use(self) -> List[str]:
        """Every hook it overrides, but on_batch_end (batch losses) only where it writes: the other ranks of an FSDP
        run only gather for the histograms, and the step then costs them nothing."""
        hooks = super().hooks_in_use()
        if self.device_idx_execution is None and not distributed.is_main_process():
            hooks = [name for name in hooks if name != 'on_batch_end']
        return hooks

    def on_batch_end(self) -> None:
        """Write the pending batch losses every ``batch_sync_frequency`` steps."""
        self._maybe_log_mid_train_loss()

    def on_after_optimizer_step(self) -> None:
        """Gradient histograms at the first optimizer update of a due epoch."""
        self._log_gradient_histograms_once(self._histograms_due())

    def on_epoch_end(self) -> None:
        """Batch losses, history metrics, learning rates and (when due) parameter histograms; flush and
        upload."""
        epoch = self.train_loop_obj.epoch
        if self.writes_events:
            self.log_mid_train_loss()
            self._log_epoch_history()
            if self.log_learning_rate:
                self.log_learning_rates(epoch)
        if self._histograms_due():
            self.log_parameter_histograms(epoch)
        if self.writes_events:
            self._writer.flush()
            self.upload_to_cloud()

    def on_train_end(self) -> None:
        """Remaining batch losses, ``train_end_*`` metrics and hyperparameters; then close and upload."""
        if not self.writes_events:
            return
        self.log_mid_train_loss()
        if not self.train_loop_obj.interrupted:      # the final metrics come at the run's real end
            self._log_train_end_history()
            hparams = self._hparams_to_write()
            if hparams:
                self.log_hparams(hparams, self.metric_names)
        super().on_train_end()
