"""TensorBoard callbacks (``pip install aitoolbox_like[tensorboard]``).

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

The base class and the helpers these callbacks share are defined in ``tensorboard_base`` and importable from here.
"""
import logging
from typing import Any, Dict, List, Optional, Sequence

from .. import distributed
from ._common import check_int
# The base class and the helpers the TensorBoard callbacks share (visualization and wandb use some as well),
# importable from here as AIToolbox has them.
from .tensorboard_base import (TensorboardReporterBaseCB, experiment_log_dir, first_batch, summary_writer_class,
                               unwrap_model)

logger = logging.getLogger(__name__)


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
