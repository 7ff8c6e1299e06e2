"""Performance evaluation and training-history reporting callbacks.

* :class:`ModelPerformanceEvaluation` computes a result package's metrics on the validation (and/or train)
  predictions and writes them into the training history as ``val_<metric>`` / ``train_<metric>``.
* :class:`ModelPerformancePrintReport` prints chosen history metrics.
* :class:`TrainHistoryFormatter` / :class:`MetricHistoryRename` derive new history entries from existing ones.
* :class:`ModelTrainHistoryPlot` / :class:`ModelTrainHistoryFileWriter` write the history into the
  experiment folder as plots (matplotlib) or text / TSV / CSV files.
"""
import copy
import csv
import logging
import os
import time
from collections.abc import Mapping
from typing import Optional

from ..results.reporting import TRAIN_VAL_SUFFIX, TrainingHistoryPlotter, append_epoch_text_block
from ..results.reporting import history_series    # public here too: the tensorboard / wandb callbacks use it
from ..engine.message_passing import MessageHandling
from ..results.basic import TorchMetricsPackage
from ._common import check_int, import_matplotlib
from ._common import is_number as _is_number
from ._common import lower_is_better    # public in this module (AIToolbox-style import path)
from .abstract import AbstractCallback, AbstractExperimentCallback

logger = logging.getLogger(__name__)


class ModelPerformanceEvaluation(AbstractCallback):
    def __init__(self, result_package, args, on_each_epoch=True, on_train_data=False, on_val_data=True,
                 eval_frequency=None, if_available_output_to_project_dir=True):
        """Compute a result package's metrics and store them in the training history.

        After each evaluated epoch the history holds ``val_<metric>`` (validation predictions) and/or
        ``train_<metric>`` (train predictions); at the end of training ``train_end_val_<metric>`` /
        ``train_end_train_<metric>``. Runs on every process of a distributed run: the loop's predict
        helpers gather the predictions of all ranks (once, without the sampler's padding), so every rank
        computes the same metrics and keeps the same history.

        Args:
            result_package (AbstractResultPackage): the metrics to compute, e.g. ClassificationResultPackage().
            args (dict or None): the hyperparameters, passed to the result package.
            on_each_epoch (bool): evaluate after every epoch (False: only at the end of training).
            on_train_data (bool): evaluate on the training set (a copy of result_package is used for it).
            on_val_data (bool): evaluate on the validation set.
            eval_frequency (int or None): evaluate only every k-th epoch (epochs 0, k, 2k, ...).
            if_available_output_to_project_dir (bool): with a tracking TrainLoop, tell the result package
                the experiment folder so its additional outputs go there.
        """
        super().__init__('Model performance calculator - evaluator')
        if not on_train_data and not on_val_data:
            raise ValueError('ModelPerformanceEvaluation: on_train_data and on_val_data are both False, so there is '
                             'nothing to evaluate; set at least one of them to True')
        for method in ('prepare_result_package', 'get_results'):
            if not callable(getattr(result_package, method, None)):
                raise TypeError(f'ModelPerformanceEvaluation: result_package must be a result package (e.g. '
                                f'aitoolbox_like.results.ClassificationResultPackage()), got '
                                f'{type(result_package).__qualname__} without {method}()')
        check_int('eval_frequency', eval_frequency, 1, allow_none=True, who='ModelPerformanceEvaluation')
        self.result_package = result_package
        self.args = args
        self.on_each_epoch = on_each_epoch
        self.on_train_data = on_train_data
        self.on_val_data = on_val_data
        self.eval_frequency = eval_frequency
        self.if_available_output_to_project_dir = if_available_output_to_project_dir
        self.train_result_package = copy.deepcopy(result_package) if on_train_data else None

    @property
    def state_key(self):
        return f'{type(self).__name__}[train={self.on_train_data},val={self.on_val_data}]'

    def on_train_loop_registration(self):
        loop = self.train_loop_obj
        details = [getattr(loop, a, None) for a in ('project_name', 'experiment_name',
                                                     'local_model_result_folder_path')]
        if self.if_available_output_to_project_dir and all(d is not None for d in details):
            project_name, experiment_name, folder = details
            for package in self._packages():
                if hasattr(package, 'set_experiment_dir_path_for_additional_results'):
                    package.set_experiment_dir_path_for_additional_results(
                        project_name, experiment_name, loop.experiment_timestamp, folder)
        for package in self._packages():
            if isinstance(package, TorchMetricsPackage) and callable(getattr(package.metric, 'to', None)):
                # In place, as torchmetrics' Metric.to is; AIToolbox metrics may return None.
                package.metric.to(loop.device)

    def on_train_begin(self):
        # Checked when training starts, not at registration: a loop may be given its loaders after the callbacks
        # (AIToolbox registered without checking), and still no epoch is lost.
        if self.on_val_data and self.train_loop_obj.validation_loader is None:
            raise ValueError('ModelPerformanceEvaluation(on_val_data=True) needs a validation_loader in the TrainLoop; '
                             'pass one, or use on_val_data=False, on_train_data=True')
        # What the metrics import (scikit-learn and SciPy take seconds), now rather than in the first epoch's end.
        for package in self._packages():
            import_dependencies = getattr(package, 'import_dependencies', None)
            if callable(import_dependencies):
                started = time.perf_counter()
                import_dependencies()
                seconds = time.perf_counter() - started
                if seconds > 0.1:
                    logger.info("%s: imported %s's dependencies before the first epoch (%.1f s)",
                                type(self).__name__, type(package).__name__, seconds)

    def _packages(self):
        return [p for p in (self.result_package if self.on_val_data else None, self.train_result_package)
                if p is not None]

    def _evaluates_this_epoch(self):
        return self.on_each_epoch and (self.eval_frequency is None
                                       or self.train_loop_obj.epoch % self.eval_frequency == 0)

    def on_train_epoch_end(self):
        # Said before the end-of-epoch evaluation: its loss pass over the same loader then also collects the
        # predictions, where the model can give both from one forward ('val_loss' and the metrics in one pass).
        if self._evaluates_this_epoch():
            evaluation = self.train_loop_obj.evaluation
            if self.on_val_data:
                evaluation.expect_predictions('validation')
            if self.on_train_data:
                evaluation.expect_predictions('train')

    def on_epoch_end(self):
        if self._evaluates_this_epoch():
            self.evaluate_model_performance()
        elif self.on_each_epoch:
            logger.debug('Skipping performance evaluation in epoch %d (evaluating every %d epochs)',
                         self.train_loop_obj.epoch, self.eval_frequency)
        for package in self._packages():
            if callable(getattr(package, 'metric_reset', None)):
                package.metric_reset()

    def on_train_end(self):
        if self.train_loop_obj.interrupted:     # end-of-training results belong to the run's real end
            return
        self.evaluate_model_performance(prefix='train_end_')

    def evaluate_model_performance(self, prefix=''):
        """Predict, compute the result packages and store their metrics in the history.

        Args:
            prefix (str): put in front of the history names (``'train_end_'`` at the end of training).
        """
        loop = self.train_loop_obj
        if self.on_train_data:
            self._prepare(self.train_result_package, loop.predict_on_train_set, loop.evaluate_loss_on_train_set)
        if self.on_val_data:
            self._prepare(self.result_package, loop.predict_on_validation_set, loop.evaluate_loss_on_validation_set)
        self.store_evaluated_metrics_to_history(prefix=prefix)

    def _prepare(self, package, predict, evaluate_loss):
        y_pred, y_true, metadata = predict()
        # AIToolbox wrote the loss into the metadata dict, which is None for most models (TypeError).
        additional_results = dict(metadata) if metadata else {}
        if getattr(package, 'requires_loss', False):
            additional_results['loss'] = evaluate_loss(float_dict_format=True)
        package.prepare_result_package(y_true, y_pred, hyperparameters=self.args,
                                       additional_results=additional_results)

    def store_evaluated_metrics_to_history(self, prefix=''):
        """Insert the last computed metrics into the history as ``<prefix>val_<m>`` / ``<prefix>train_<m>``."""
        loop = self.train_loop_obj
        for split, package in (('train', self.train_result_package),
                               ('val', self.result_package if self.on_val_data else None)):
            if package is None:
                continue
            results = package.get_results()
            if results is None:
                raise ValueError(f'{type(package).__name__}.get_results() returned None after prepare_result_package()')
            for metric_name, value in results.items():
                loop.insert_metric_result_into_history(f'{prefix}{split}_{metric_name}', _plain(value))


def _plain(value):
    """Numpy / torch scalars become Python numbers so the history stays JSON- and checkpoint-friendly."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if _is_number(value) and not isinstance(value, (int, float)):
        return float(value)
    if hasattr(value, 'item') and getattr(value, 'ndim', None) == 0:
        return value.item()
    return value


class ModelPerformancePrintReport(AbstractCallback):
    def __init__(self, metrics, on_each_epoch=True, report_frequency=None, strict_metric_reporting=True,
                 list_tracked_metrics=False):
        """Print chosen metrics of the training history after each epoch and at the end of training.

        List it after the callbacks that compute the metrics (it runs at execution_order 97, on rank 0).
        At the end of training each metric ``m`` is reported as ``train_end_m`` when that exists (e.g. from
        ModelPerformanceEvaluation) and otherwise as the last value of ``m``, so ``['val_loss']`` works at
        both points (AIToolbox raised for it at the end of training).

        Args:
            metrics (list of str): history names to print, e.g. ``['val_loss', 'val_Accuracy']``.
            on_each_epoch (bool): report after epochs (False: only at the end of training).
            report_frequency (int or None): report only every k-th epoch.
            strict_metric_reporting (bool): a missing metric raises ValueError (False: prints a note).
            list_tracked_metrics (bool): also print the names of all metrics in the history.
        """
        super().__init__('Model performance print reporter', execution_order=97, device_idx_execution=0)
        if isinstance(metrics, str):
            metrics = [metrics]
        if not metrics or not all(isinstance(m, str) for m in metrics):
            raise ValueError(f'metrics must be a non-empty list of history names such as [\'val_loss\'], got {metrics!r}')
        self.metrics = list(metrics)
        self.on_each_epoch = on_each_epoch
        self.report_frequency = report_frequency
        self.strict_metric_reporting = strict_metric_reporting
        self.list_tracked_metrics = list_tracked_metrics

    def on_epoch_end(self):
        if self.on_each_epoch and (self.report_frequency is None
                                   or self.train_loop_obj.epoch % self.report_frequency == 0):
            print('------------------  End of epoch performance report  -------------------')
            self.print_performance_report()

    def on_train_end(self):
        if self.train_loop_obj.interrupted:     # end-of-training results belong to the run's real end
            return
        print('-----------------  End of training performance report  -----------------')
        self.print_performance_report(prefix='train_end_')

    def print_performance_report(self, prefix=''):
        """Print ``name: last value`` for each metric (``prefix + name`` preferred when present)."""
        history = self.train_loop_obj.train_history
        if self.list_tracked_metrics:
            print(list(history.keys()))
        for metric_name in self.metrics:
            name = prefix + metric_name if prefix + metric_name in history else metric_name
            values = history.get(name)
            if values:
                print(f'{name}: {values[-1]}')
                continue
            message = (f'Metric {prefix + metric_name!r} expected for the report is not in the training history. '
                       f'Found: {list(history.keys())}. Compute it with a callback listed before this report '
                       f'(e.g. ModelPerformanceEvaluation), or pass strict_metric_reporting=False.')
            if self.strict_metric_reporting:
                raise ValueError(message)
            print(message)


class TrainHistoryFormatter(AbstractCallback):
    def __init__(self, input_metric_getter, output_metric_setter, epoch_end=True, train_end=False,
                 strict_metric_extract=True):
        """Derive a new history entry from the history.

        ``output_metric_setter(input_metric_getter(history))`` returns ``(new_name, value)``, inserted into
        the history after each epoch (epoch_end) or once at the end of training (train_end), but only when
        the input list has grown since the last time (so metrics computed every k epochs are formatted
        when they are computed; AIToolbox expected exactly ``epoch + 1`` values and failed otherwise). More
        than ``epoch + 1`` values after an epoch (the metric recorded twice in an epoch) is still an error, as
        in AIToolbox.

        Args:
            input_metric_getter (callable): history -> list of values of the input metric.
            output_metric_setter (callable): that list -> ``(output_name, output_value)``.
            epoch_end (bool): run after each epoch.
            train_end (bool): run at the end of training (exactly one of epoch_end / train_end is True).
            strict_metric_extract (bool): a missing or empty input metric, or one with more values than
                epochs, raises ValueError (False: warns and formats nothing).
        """
        if epoch_end == train_end:
            raise ValueError(f'TrainHistoryFormatter: set exactly one of epoch_end and train_end to True '
                             f'(got epoch_end={epoch_end}, train_end={train_end})')
        super().__init__('Train history general formatter engine')
        self.input_metric_getter = input_metric_getter
        self.output_metric_setter = output_metric_setter
        self.epoch_end = epoch_end
        self.train_end = train_end
        self.strict_metric_extract = strict_metric_extract
        self._seen_length = 0

    def on_epoch_end(self):
        if self.epoch_end and self.check_if_history_updated(train_end_phase=False):
            self.format_history()

    def on_train_end(self):
        if self.train_loop_obj.interrupted:     # end-of-training results belong to the run's real end
            return
        if self.train_end and self.check_if_history_updated(train_end_phase=True):
            self.format_history()

    def format_history(self):
        values = self.input_metric_getter(self.train_loop_obj.train_history)
        output_name, output_value = self.output_metric_setter(values)
        self.train_loop_obj.insert_metric_result_into_history(output_name, output_value)
        self._seen_length = len(values)

    def check_if_history_updated(self, train_end_phase):
        """True when the input metric has a value not formatted yet. A missing input metric (usually: the
        callback computing it runs after this one) or, after an epoch, one with more values than epochs so far
        (recorded twice in an epoch, which AIToolbox refused too) raises ValueError (strict) or warns."""
        history = self.train_loop_obj.train_history
        epoch = self.train_loop_obj.epoch
        missing: Optional[KeyError]
        try:
            values = self.input_metric_getter(history)
        except KeyError as exc:
            values, missing = None, exc
        else:
            missing = None
        if not values:
            phase = 'end of training' if train_end_phase else f'end of epoch {epoch}'
            message = (f'{self.callback_name}: the input metric is missing or empty at the {phase}'
                       f'{f" ({missing})" if missing else ""}; history has {list(history.keys())}. A callback '
                       f'computing it must run before this one (list it first or give it a lower execution_order).')
        elif not train_end_phase and len(values) > epoch + 1:
            message = (f'{self.callback_name}: the input metric has {len(values)} values at the end of epoch {epoch}, '
                       f'more than one per epoch: it was recorded more than once in an epoch (e.g. evaluated twice)')
        else:
            return len(values) > self._seen_length
        if self.strict_metric_extract:
            raise ValueError(message)
        logger.warning(message)
        return False


class MetricHistoryRename(TrainHistoryFormatter):
    def __init__(self, input_metric_path, new_metric_name, epoch_end=True, train_end=False,
                 strict_metric_extract=True):
        """Copy the latest value of a history metric under a new name.

        Args:
            input_metric_path (str or callable): the metric's history name, or a getter history -> list.
            new_metric_name (str): name of the copy.
            epoch_end, train_end, strict_metric_extract: as for TrainHistoryFormatter.
        """
        getter = input_metric_path if callable(input_metric_path) else _HistoryGetter(input_metric_path)
        super().__init__(getter, _RenameSetter(new_metric_name), epoch_end=epoch_end, train_end=train_end,
                         strict_metric_extract=strict_metric_extract)
        self.input_metric_path = input_metric_path
        self.new_metric_name = new_metric_name

    @property
    def state_key(self):
        return f'{type(self).__name__}[{self.new_metric_name}]'


class _HistoryGetter:
    # A class instead of a lambda so the callback stays picklable (DDP spawn pickles callbacks).
    def __init__(self, name):
        self.name = name

    def __call__(self, history):
        return history[self.name]


class _RenameSetter:
    def __init__(self, name):
        self.name = name

    def __call__(self, values):
        return self.name, values[-1]


class ModelTrainHistoryBaseCB(AbstractExperimentCallback):
    def __init__(self, callback_name, execution_order=0, epoch_end=True, train_end=False, file_format='',
                 project_name=None, experiment_name=None, local_model_result_folder_path=None,
                 cloud_save_mode=None, bucket_name=None, cloud_dir_prefix=None):
        """Base of the callbacks that write the training history into ``<experiment folder>/results``.

        The experiment details not given are inferred from a tracking TrainLoop, else default to
        ``./experiments/default_project/experiment_<timestamp>``. Runs on rank 0. The paths written by the
        last call are in ``self.last_written_files`` and, as in AIToolbox, posted on the loop's message service
        under ``'<ModelTrainHistoryPlot|ModelTrainHistoryFileWriter>_results_file_local_paths'`` until the end of
        the epoch; with a cloud cloud_save_mode (S3, GCS, Azure) they are uploaded too.
        """
        super().__init__(callback_name, project_name, experiment_name, local_model_result_folder_path,
                         cloud_save_mode, bucket_name, cloud_dir_prefix,
                         execution_order=execution_order, device_idx_execution=0)
        if not epoch_end and not train_end:
            raise ValueError(f'{callback_name}: epoch_end and train_end are both False, so nothing would be written; '
                             f'set at least one of them to True')
        self.epoch_end = epoch_end
        self.train_end = train_end
        self.file_format = file_format
        self.cloud_results_saver = None
        self.last_written_files = []

    def on_train_loop_registration(self):
        self.try_infer_experiment_details(infer_cloud_details=True)
        self.prepare_results_saver()

    def prepare_results_saver(self):
        """Kept for AIToolbox compatibility: uploads go through upload_experiment_files()."""
        self.cloud_results_saver = None

    @property
    def results_dir_path(self):
        return os.path.join(self.experiment_dir_path, 'results')

    def _upload_files(self, paths):
        self.upload_experiment_files(paths)

    def _post_paths(self, key, paths):
        """Post the written paths for the callbacks that run after this one in the same epoch (AIToolbox's
        ``<Callback>_results_file_local_paths`` messages, read with ``message_service.read_messages(key)``)."""
        service = self.message_service
        if service is not None:     # None only outside a TrainLoop (a callback driven by hand)
            service.write_message(key, list(paths), msg_handling_settings=MessageHandling.UNTIL_END_OF_EPOCH)


class ModelTrainHistoryPlot(ModelTrainHistoryBaseCB):
    def __init__(self, epoch_end=True, train_end=False, file_format='png',
                 project_name=None, experiment_name=None, local_model_result_folder_path=None,
                 cloud_save_mode=None, bucket_name=None, cloud_dir_prefix=None, train_val=True):
        """Plot every numeric history metric against the epochs (needs ``pip install aitoolbox_like[plots]``).

        Each call writes into ``<experiment>/results/<prefix>plots_epoch_<epoch>``: one ``<metric>.png`` per
        metric with at least two values (file_format='png'), or all plots in one ``<folder>.pdf``. Each plot's
        title gives the best value and its epoch (lowest for losses/errors, highest otherwise). Dict-valued
        metrics are plotted per key as ``<metric>_<key>``.

        With ``train_val`` the training and validation values of a metric are also drawn on one chart, in
        ``<prefix>plots_epoch_<epoch>_train_val/<m>_train_val.png`` (``.pdf``): ``loss_train_val.png`` for
        ``loss``, ``accumulated_loss`` and ``val_loss``; ``<m>_train_val.png`` for ``train_<m>`` and ``val_<m>``
        (TrainingHistoryPlotter.generate_train_val_report). Their folder is another one so that AIToolbox's keeps
        exactly its files; they are in ``last_written_files`` and uploaded, while the message on the message service
        lists AIToolbox's per-metric files only.

        Args:
            epoch_end (bool): plot after each epoch (prefix ''), in rank 0.
            train_end (bool): plot at the end of training (prefix 'train_end_').
            file_format (str): 'png' or 'pdf'.
            project_name, experiment_name, local_model_result_folder_path, cloud_save_mode, bucket_name,
                cloud_dir_prefix: the experiment folder (see AbstractExperimentCallback).
            train_val (bool): also draw each metric's training and validation values on one chart.
        """
        super().__init__('Model Train history Plot report', execution_order=97, epoch_end=epoch_end,
                         train_end=train_end, file_format=file_format, project_name=project_name,
                         experiment_name=experiment_name, local_model_result_folder_path=local_model_result_folder_path,
                         cloud_save_mode=cloud_save_mode, bucket_name=bucket_name, cloud_dir_prefix=cloud_dir_prefix)
        if file_format not in ('png', 'pdf'):
            raise ValueError(f"ModelTrainHistoryPlot: file_format {file_format!r} is not supported; use 'png' or 'pdf'")
        import_matplotlib('ModelTrainHistoryPlot')      # a missing extra fails here, not after the first epoch
        self.train_val = train_val

    def on_epoch_end(self):
        if self.epoch_end:
            self.plot_current_train_history()

    def on_train_end(self):
        if self.train_loop_obj.interrupted:     # end-of-training results belong to the run's real end
            return
        if self.train_end:
            self.plot_current_train_history(prefix='train_end_')

    def plot_current_train_history(self, prefix=''):
        """Write the plots of the current history; returns the written local paths.

        The paths are also posted on the message service under ``'ModelTrainHistoryPlot_results_file_local_paths'``
        until the end of the epoch (AIToolbox's message), for callbacks that run after this one.
        """
        plotter = TrainingHistoryPlotter(self.results_dir_path)
        history = self.train_loop_obj.train_history
        folder = f'{prefix}plots_epoch_{self.train_loop_obj.epoch}'
        saved = plotter.generate_report(history, plots_folder_name=folder, file_format=self.file_format)
        paths = [path for _, path in saved]
        # AIToolbox's message: its per-metric files, as AIToolbox's readers of it expect.
        self._post_paths('ModelTrainHistoryPlot_results_file_local_paths', paths)
        if self.train_val:
            paired = plotter.generate_train_val_report(history, plots_folder_name=folder + TRAIN_VAL_SUFFIX,
                                                       file_format=self.file_format)
            paths = paths + [path for _, path in paired]
        self.last_written_files = paths
        self._upload_files(paths)
        return paths


def make_metric_figure(metric_name, epochs, values):
    """A matplotlib Figure of one metric over the epochs, titled with its best value and epoch (the figure of
    ModelTrainHistoryPlot and TrainingHistoryPlotter).

    Uses a standalone Figure (no pyplot), so it needs no display, leaves the global matplotlib state (style,
    backend, open figures) alone and is freed with the object.
    """
    return TrainingHistoryPlotter.plot_performance_curve(metric_name, values, epochs)


class ModelTrainHistoryFileWriter(ModelTrainHistoryBaseCB):
    def __init__(self, epoch_end=True, train_end=False, file_format='txt',
                 project_name=None, experiment_name=None, local_model_result_folder_path=None,
                 cloud_save_mode=None, bucket_name=None, cloud_dir_prefix=None, skip_stale_values=False):
        """Append the metrics of each epoch to ``<experiment>/results/<prefix>results.<file_format>``.

        'txt' is a human-readable block per epoch; 'tsv' / 'csv' a table with an ``Epoch`` column and one
        column per metric (dict-valued metrics per key), a new header after a ``NEW_METRICS_DETECTED`` row
        when the metrics change. As in AIToolbox, each write lists the latest value of every metric in the
        history, so a metric computed only every k epochs repeats its last value in the epochs between;
        ``skip_stale_values=True`` leaves those out.

        Args:
            epoch_end (bool): write after each epoch.
            train_end (bool): write at the end of training (file ``train_end_results.<fmt>``).
            file_format (str): 'txt', 'tsv' or 'csv'.
            project_name, experiment_name, local_model_result_folder_path, cloud_save_mode, bucket_name,
                cloud_dir_prefix: the experiment folder (see AbstractExperimentCallback).
            skip_stale_values (bool): write only the values recorded in the written epoch (a metric not
                computed then: no 'txt' line, an empty 'tsv' / 'csv' cell).
        """
        super().__init__('Model Train performance history file writer', execution_order=97, epoch_end=epoch_end,
                         train_end=train_end, file_format=file_format, project_name=project_name,
                         experiment_name=experiment_name, local_model_result_folder_path=local_model_result_folder_path,
                         cloud_save_mode=cloud_save_mode, bucket_name=bucket_name, cloud_dir_prefix=cloud_dir_prefix)
        if file_format not in ('txt', 'tsv', 'csv'):
            raise ValueError(f"ModelTrainHistoryFileWriter: file_format {file_format!r} is not supported; use "
                             f"'txt', 'tsv' or 'csv'")
        self.skip_stale_values = skip_stale_values
        self._columns = {}       # file path -> metric columns of its current header

    def on_epoch_end(self):
        if self.epoch_end:
            self.write_current_train_history()

    def on_train_end(self):
        if self.train_loop_obj.interrupted:     # end-of-training results belong to the run's real end
            return
        if self.train_end:
            self.write_current_train_history(prefix='train_end_')

    def write_current_train_history(self, prefix=''):
        """Append the current epoch's metrics; returns the written local path."""
        epoch = self.train_loop_obj.epoch
        current = {}
        for name, (epochs, values) in history_series(self.train_loop_obj.train_history).items():
            if not self.skip_stale_values:
                if values:
                    current[name] = values[-1]
                continue
            for value_epoch, value in zip(reversed(epochs), reversed(values)):
                if value_epoch == epoch:
                    current[name] = value      # the latest value recorded in this epoch
                    break
        os.makedirs(self.results_dir_path, exist_ok=True)
        path = os.path.join(self.results_dir_path, f'{prefix}results.{self.file_format}')
        if self.file_format == 'txt':
            append_epoch_text_block(path, epoch, current)
        else:
            self._write_row(path, epoch, current, '\t' if self.file_format == 'tsv' else ',')
        self.last_written_files = [path]
        self._post_paths('ModelTrainHistoryFileWriter_results_file_local_paths', [path])
        self._upload_files([path])
        return path

    def _write_row(self, path, epoch, current, delimiter):
        columns = self._columns.get(path)
        if columns is None and os.path.exists(path):
            columns = _last_header(path, delimiter)       # continue a file from an earlier fit / run
        with open(path, 'a', newline='') as f:
            writer = csv.writer(f, delimiter=delimiter)
            names = list(current)
            if columns is None:
                columns = names
                writer.writerow(['Epoch'] + columns)
            elif set(names) != set(columns) and (not self.skip_stale_values or set(names) - set(columns)):
                # A skipped metric keeps its column (an empty cell); otherwise the header is the metrics written.
                columns = columns + [n for n in names if n not in columns] if self.skip_stale_values else names
                writer.writerow(['NEW_METRICS_DETECTED'])
                writer.writerow(['Epoch'] + columns)
            writer.writerow([epoch] + [current.get(name, '') for name in columns])
        self._columns[path] = columns


def _last_header(path, delimiter):
    header = None
    with open(path, newline='') as f:
        for row in csv.reader(f, delimiter=delimiter):
            if row and row[0] == 'Epoch':
                header = row[1:]
    return header
