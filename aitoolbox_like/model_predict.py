"""Predict with and evaluate an already trained model, without training (AIToolbox's
``torchtrain.model_predict``).

:class:`PyTorchModelPredictor` runs on a TrainLoop that has only a test loader, so predictions, losses,
result packages and callbacks behave exactly as they do at the end of training.
"""
import logging
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, Union

import torch

from .callbacks.abstract import AbstractCallback
from .experiment import Experiment, ExperimentUploader, is_cloud_mode, normalize_cloud_save_mode
from .results.savers import write_experiment_results
from .engine.history import TrainingHistory
from .model.multi_loss_optim import MultiLoss
from .storage.base import StorageError
from .engine.train_loop import TrainLoop

logger = logging.getLogger(__name__)

Predictions = Tuple[Any, Any, Optional[Dict[str, Any]]]


class PyTorchModelPredictor:
    """Predictions, loss and metrics of a trained model on one data loader.

    Every method makes a fresh pass over ``data_loader`` with the model in eval mode and without gradients
    (so loading other weights into the model between calls is picked up). During that pass the callbacks'
    ``on_after_batch_prediction(y_pred_batch, y_true_batch, metadata_batch, {'type': 'test'})`` is called for
    every batch; other hooks run only through :meth:`execute_batch_end_callbacks` /
    :meth:`execute_epoch_end_callbacks`.

    The model is moved to the loop's device (the GPU when CUDA is available) when the predictor is built.

    Args:
        model: the trained TTModel, TTBasicModel or ModelWrap.
        data_loader: the batches to predict on (any iterable of batches, e.g. a DataLoader).
        callbacks: AbstractCallback instances to register on the predictor's TrainLoop.

    Attributes:
        train_loop: the TrainLoop doing the work (its ``test_loader`` is ``data_loader``).
    """

    def __init__(self, model: Any, data_loader: Any, callbacks: Optional[List[AbstractCallback]] = None) -> None:
        self.model = model
        self.data_loader = data_loader
        self.train_loop = TrainLoop(model, None, None, data_loader, None, None)
        self.train_loop.callbacks_handler.register_callbacks(callbacks)
        self.train_loop.model.to(self.train_loop.device)
        # evaluate_model folders are <experiment>_<this>[_1, _2, ...]: claiming a taken folder renames the loop's
        # timestamp, so each evaluation starts again from the original one.
        self._base_timestamp = self.train_loop.experiment_timestamp

    # ---- predictions and loss -----------------------------------------------------------------

    def _predict(self) -> Predictions:
        return self.train_loop.predict_on_test_set(force_prediction=True, execute_callbacks=True)

    def model_predict(self) -> Predictions:
        """The model's predictions on the data loader.

        Returns:
            ``(y_pred, y_true, metadata)`` on the CPU: the model's ``get_predictions`` outputs of all batches
            joined (by default with ``torch.cat``), and the batches' metadata dicts merged (None when the model
            returns none).
        """
        return self._predict()

    def model_get_loss(self, loss_criterion: Any) -> Union[torch.Tensor, MultiLoss]:
        """The model's loss on the data loader (its ``get_loss_eval``).

        The criterion is kept on the predictor's loop for later calls (result packages that need the loss).

        Args:
            loss_criterion: the loss function passed to the model's ``get_loss_eval`` (e.g. ``nn.CrossEntropyLoss()``).

        Returns:
            the mean of the per-batch mean losses, as in AIToolbox (the mean over samples when the predictor's
            ``train_loop.eval_loss_weighting`` is ``'sample'``): a 0-dim float64 tensor on the CPU, or a MultiLoss
            of them.
        """
        self.train_loop.criterion = loss_criterion
        self.train_loop.move_criterion_to_device()
        return self.train_loop.evaluate_loss_on_test_set(force_prediction=True)

    # ---- metrics and result packages ----------------------------------------------------------

    def evaluate_result_package(self, result_package: Any, return_result_package: bool = True) -> Any:
        """Evaluate the model with a result package on the data loader.

        The package gets the predictions, the targets, empty hyperparameters and, as
        ``additional_results``, the merged prediction metadata (plus ``'loss'`` when the package sets
        ``requires_loss``; that needs a criterion, given by an earlier :meth:`model_get_loss`).

        Args:
            result_package: an AbstractResultPackage.
            return_result_package: True returns the prepared package, False only its results dict.

        Returns:
            the package, or ``result_package.get_results()``.

        Raises:
            ValueError: the package requires the loss and no criterion was given yet.
        """
        self._prepare_package(result_package)
        return result_package if return_result_package else result_package.get_results()

    def _prepare_package(self, result_package: Any) -> Predictions:
        y_pred, y_true, metadata = self._predict()
        additional_results = dict(metadata) if metadata else {}
        if getattr(result_package, 'requires_loss', False):
            if self.train_loop.criterion is None:
                raise ValueError(f'{type(result_package).__name__} requires the loss, but the predictor has no '
                                 f'criterion: call model_get_loss(criterion) first')
            additional_results['loss'] = self.train_loop.evaluate_loss_on_test_set(force_prediction=True,
                                                                                   float_dict_format=True)
        result_package.prepare_result_package(y_true, y_pred, hyperparameters={},
                                              additional_results=additional_results)
        return y_pred, y_true, metadata

    def evaluate_metric(self, metric_class: Type[Any], return_metric: bool = True) -> Any:
        """Evaluate the model with one metric computed directly on its predictions.

        For a model whose ``get_predictions`` output the metric can use as it is; use a result package when
        the output needs processing first.

        Args:
            metric_class: the metric class (not an instance), called as ``metric_class(y_true, y_pred)``,
                e.g. ``AccuracyMetric``.
            return_metric: True returns the metric object, False its ``get_metric_dict()``.
        """
        y_pred, y_true, _ = self._predict()
        metric = metric_class(y_true, y_pred)
        return metric if return_metric else metric.get_metric_dict()

    def evaluate_metric_list(self, metrics_class_list: Sequence[Type[Any]],
                             return_metric_list: bool = True) -> Union[List[Any], Dict[str, Any]]:
        """Evaluate the model with several metrics, from one pass over the data.

        Args:
            metrics_class_list: metric classes (not instances), each called as ``metric_class(y_true, y_pred)``.
            return_metric_list: True returns the list of metric objects, False one dict merging their
                ``get_metric_dict()`` results.
        """
        y_pred, y_true, _ = self._predict()
        metrics = [metric_class(y_true, y_pred) for metric_class in metrics_class_list]
        if return_metric_list:
            return metrics
        merged: Dict[str, Any] = {}
        for metric in metrics:
            merged.update(metric.get_metric_dict())
        return merged

    def evaluate_model(self, result_package: Any, project_name: str, experiment_name: str,
                       local_model_result_folder_path: str, cloud_save_mode: Optional[str] = 's3',
                       bucket_name: str = 'model-result', cloud_dir_prefix: str = '',
                       save_true_pred_labels: bool = False, endpoint_url: Optional[str] = None) -> List[str]:
        """Evaluate the model with a result package and save the results as an experiment.

        Writes AIToolbox's results file ``<local folder>/<project>/<experiment>_<timestamp>/results/
        results_hyperParams_hist_<experiment>_<timestamp>.p``: a pickle of ``{'experiment_name',
        'experiment_results_local_path', 'results', 'hyperparameters', 'training_history'}`` (a history holding
        each metric once), with ``save_true_pred_labels`` also ``'y_true'`` and ``'y_predicted'``; and the
        ``results/plots/`` folder (no plot: each metric has one value). With a cloud ``cloud_save_mode`` these and
        the package's additional result files are uploaded to the same keys under
        ``s3://<bucket>/<cloud_dir_prefix>/`` (``gs://``, ``az://``) before the method returns.

        Args:
            result_package: an AbstractResultPackage.
            project_name: name of the project folder.
            experiment_name: name of the experiment folder.
            local_model_result_folder_path: folder under which the project folder is created.
            cloud_save_mode: 's3' (or 'aws_s3' / 'aws') uploads to S3, 'gcs' (or 'google_storage') to Google Cloud
                Storage, 'azure' to Azure Blob Storage; 'local' / None keeps the files local only.
            bucket_name: the bucket (Azure: the container).
            cloud_dir_prefix: key prefix in the bucket.
            save_true_pred_labels: also save the targets and predictions.
            endpoint_url: the cloud's endpoint, e.g. an S3-compatible server (not in AIToolbox).

        Returns:
            the local paths of the files written.

        Raises:
            ValueError: an unknown cloud_save_mode.
            StorageError: an upload failed (the local files are kept).
        """
        normalize_cloud_save_mode(cloud_save_mode)      # a wrong mode fails before the pass over the data
        loop = self.train_loop
        loop.experiment_timestamp = self._base_timestamp
        experiment = Experiment(loop, project_name, experiment_name, local_model_result_folder_path)
        experiment.claim()        # may change loop.experiment_timestamp, so it comes before anything names it
        result_package.set_experiment_dir_path_for_additional_results(
            project_name=project_name, experiment_name=experiment_name,
            experiment_timestamp=loop.experiment_timestamp, local_model_result_folder_path=experiment.root)

        self._prepare_package(result_package)
        # As AIToolbox: a history holding each metric once, saved with the results by the results saver's path.
        history = TrainingHistory(has_validation=False)
        for metric_name, value in (result_package.get_results() or {}).items():
            history.insert_single_result_into_history(metric_name, value)

        results_dir = experiment.subdir('results')
        saved = write_experiment_results(results_dir, experiment_name, loop.experiment_timestamp, result_package,
                                         training_history=history, save_true_pred_labels=save_true_pred_labels,
                                         temp_dir=experiment.dir_path)
        written = [path for _, path in saved if os.path.isfile(path)]
        logger.info('Evaluation results of %s saved in %s', experiment_name, results_dir)

        if is_cloud_mode(cloud_save_mode):
            self._upload(experiment, written, cloud_save_mode, bucket_name, cloud_dir_prefix, endpoint_url)
        return written

    @staticmethod
    def _upload(experiment: Experiment, paths: List[str], cloud_save_mode: Optional[str], bucket_name: str,
                cloud_dir_prefix: str, endpoint_url: Optional[str]) -> None:
        # A predictor has no end of fit to wait at, so the upload finishes (or fails) here.
        uploader = ExperimentUploader(experiment, bucket_name, cloud_dir_prefix, endpoint_url,
                                      cloud_save_mode=cloud_save_mode)
        try:
            for path in paths:
                try:
                    uploader.upload_experiment_file(path)
                except ValueError:
                    logger.warning('%s is outside the experiment folder %s; not uploaded', path, experiment.dir_path)
            failures = uploader.wait()
        finally:
            failures_at_close = uploader.uploader.close(timeout=0)
        failures = failures + failures_at_close
        if failures:
            first = failures[0]
            raise StorageError(f'{len(failures)} upload(s) of the evaluation results failed, e.g. {first.local_path} '
                               f'-> {first.key}: {first.error} (the local files are kept)')

    # ---- callbacks ----------------------------------------------------------------------------

    def execute_batch_end_callbacks(self) -> None:
        """Run the registered callbacks' ``on_batch_end`` once (e.g. a callback that reports on demand)."""
        if not self.train_loop.callbacks:
            logger.warning('execute_batch_end_callbacks has no effect: no callbacks are registered')
        self.train_loop.callbacks_handler.fire('on_batch_end')

    def execute_epoch_end_callbacks(self) -> None:
        """Run the registered callbacks' ``on_epoch_end`` once (e.g. a performance-evaluation callback)."""
        if not self.train_loop.callbacks:
            logger.warning('execute_epoch_end_callbacks has no effect: no callbacks are registered')
        self.train_loop.callbacks_handler.fire('on_epoch_end')
