"""Ready-made result packages.

Fixed compared with AIToolbox 1.8.0:

* ``GeneralResultPackage`` ran the hyperparameters quality check inside the metric computation, so it
  crashed (``TypeError``) whenever no hyperparameters were passed, and its metrics-list check tested
  for metric *instances* although it calls metric *classes*; the list is now checked at construction
  and duplicate metric names raise instead of silently overwriting each other;
* ``BinaryClassificationResultPackage`` also reports precision and recall, accepts float 0./1.
  targets and ``(n, 1)`` / ``(n, 2)`` predictions, and rejects multi-class targets with a clear error;
* ``RegressionResultPackage`` also reports R^2;
* ``TorchMetricsPackage`` called the metric's ``forward`` (accumulating state forever, a memory leak
  for list-state metrics), returned tensors instead of numbers and accepted no
  ``strict_content_check``; it now resets, updates, computes and resets again, and returns Python
  floats / lists.
"""
from __future__ import annotations

import functools
import numbers
from types import ModuleType
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from .abstract import AbstractResultPackage
from .conversion import is_torch_tensor
from .metrics import (AbstractBaseMetric, AccuracyMetric, F1ScoreMetric, MeanAbsoluteErrorMetric,
                      MeanSquaredErrorMetric, PrecisionMetric, PrecisionRecallCurveAUCMetric, R2ScoreMetric,
                      RecallMetric, ROCAUCMetric, import_sklearn_metrics, is_integer_valued, positive_class_scores,
                      true_labels)

__all__ = ['GeneralResultPackage', 'ClassificationResultPackage', 'BinaryClassificationResultPackage',
           'RegressionResultPackage', 'TorchMetricsPackage']


def _callable_name(fn: Any) -> str:
    while hasattr(fn, 'func') and not hasattr(fn, '__name__'):  # functools.partial
        fn = fn.func
    return getattr(fn, '__name__', type(fn).__name__)


def _metric_class(fn: Any) -> Any:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


class GeneralResultPackage(AbstractResultPackage):
    """Runs a list of metric classes (or callables) on the targets and predictions."""

    def __init__(self, metrics_list: Sequence[Callable[[Any, Any], Any]], strict_content_check: bool = False,
                 **kwargs: Any) -> None:
        """Result package running the given metrics

        Args:
            metrics_list (list): metric classes derived from
                :class:`~aitoolbox_like.results.metrics.AbstractBaseMetric` (called as
                ``MetricClass(y_true, y_predicted)``). Use ``functools.partial(MetricClass, arg=...)`` for
                extra arguments. Any callable ``fn(y_true, y_predicted)`` returning a metric object, a dict
                or a number also works (a number is stored under the callable's ``__name__``).
            strict_content_check (bool): raise instead of warn on content problems (e.g. empty metrics list)
            **kwargs: additional package metadata

        Raises:
            TypeError: when metrics_list is not a list of callables (e.g. holds already computed metric objects)
        """
        AbstractResultPackage.__init__(self, pkg_name='GeneralResultPackage',
                                       strict_content_check=strict_content_check, **kwargs)
        if not isinstance(metrics_list, (list, tuple)):
            raise TypeError(f'metrics_list must be a list of metric classes; got {type(metrics_list).__name__}.')
        self.metrics_list = list(metrics_list)
        self.qa_check_metrics_list()

    def qa_check_metrics_list(self) -> None:
        """Check the metrics list: warn (or raise under strict_content_check) when empty

        Raises:
            TypeError: for an element that is not callable
        """
        if len(self.metrics_list) == 0:
            self.warn_about_result_data_problem('Metrics list is empty: GeneralResultPackage will produce no results.')
        for metric in self.metrics_list:
            if isinstance(metric, AbstractBaseMetric):
                raise TypeError(f'metrics_list holds an already computed metric object ({metric.metric_name}): '
                                f'pass the metric class, e.g. {type(metric).__name__}, or functools.partial('
                                f'{type(metric).__name__}, ...) for extra arguments.')
            if not callable(metric):
                raise TypeError(f'metrics_list elements must be metric classes or callables '
                                f'fn(y_true, y_predicted); got {metric!r}.')

    def import_dependencies(self) -> None:
        """scikit-learn's metrics, when a metric of the list computes with them (``uses_sklearn``)."""
        if any(getattr(_metric_class(metric), 'uses_sklearn', False) for metric in self.metrics_list):
            import_sklearn_metrics()

    def prepare_results_dict(self) -> Dict[str, Any]:
        """Every metric's dict merged; a metric name produced twice is a ValueError."""
        results_dict: Dict[str, Any] = {}
        for metric in self.metrics_list:
            result = metric(self.y_true, self.y_predicted)
            metric_dict: Dict[str, Any]
            if isinstance(result, AbstractBaseMetric):
                metric_dict = result.get_metric_dict()
            elif isinstance(result, dict):
                metric_dict = result
            elif isinstance(result, (numbers.Number, np.generic)) or is_torch_tensor(result):
                metric_dict = {_callable_name(metric): result}
            else:
                raise TypeError(f'Metric {_callable_name(metric)} returned {type(result).__name__}; expected a metric '
                                f'object, a dict or a number.')
            duplicated = [name for name in metric_dict if name in results_dict]
            if duplicated:
                raise ValueError(f'Metric name(s) {duplicated} computed twice in GeneralResultPackage: give the metrics '
                                 f'distinct names, e.g. functools.partial(MetricClass, metric_name=...).')
            results_dict.update(metric_dict)
        return results_dict


class ClassificationResultPackage(AbstractResultPackage):
    """Multi-class classification: accuracy."""

    #: The names of the results (``get_results()`` keys), known before any evaluation.
    metric_names: Tuple[str, ...] = ('Accuracy',)

    def __init__(self, strict_content_check: bool = False, **kwargs: Any) -> None:
        """Multi-class classification result package: ``{'Accuracy': ...}``

        As in AIToolbox only accuracy is reported (add e.g. ``GeneralResultPackage([functools.partial(
        F1ScoreMetric, positive_class_thresh=None, average='macro')])`` for more).

        Accepted inputs:
            * y_true: class indices ``(n,)`` (also ``(n, 1)``) or one-hot ``(n, C)``
            * y_predicted: class indices ``(n,)``, or per-class scores / probabilities / logits ``(n, C)``,
              reduced with argmax

        Args:
            strict_content_check (bool): raise instead of warn on content problems
            **kwargs: additional package metadata
        """
        AbstractResultPackage.__init__(self, pkg_name='ClassificationResult',
                                       strict_content_check=strict_content_check, **kwargs)

    def prepare_results_dict(self) -> Dict[str, Any]:
        """``{'Accuracy': ...}`` of the argmax-ed / given labels."""
        return AccuracyMetric(self.y_true, self.y_predicted, positive_class_thresh=None).get_metric_dict()


class BinaryClassificationResultPackage(AbstractResultPackage):
    """Binary classification: accuracy, ROC AUC, PR AUC, F1, precision and recall."""

    #: The names of the results (``get_results()`` keys), known before any evaluation.
    metric_names: Tuple[str, ...] = ('Accuracy', 'ROC_AUC', 'PrecisionRecall_AUC', 'F1_score', 'Precision', 'Recall')

    def __init__(self, positive_class_thresh: Optional[float] = 0.5, strict_content_check: bool = False,
                 **kwargs: Any) -> None:
        """Binary classification result package

        Reports ``Accuracy``, ``ROC_AUC``, ``PrecisionRecall_AUC``, ``F1_score``, ``Precision`` and ``Recall``.

        Accepted inputs:
            * y_true: labels 0/1 (int, bool or float) of shape ``(n,)`` or ``(n, 1)``
            * y_predicted: positive-class probabilities ``(n,)`` / ``(n, 1)``, or two-column class
              probabilities ``(n, 2)`` (second column used). For accuracy, F1, precision and recall they are
              thresholded (``p >= positive_class_thresh``); the AUCs use them as scores.

        Args:
            positive_class_thresh (float or None): probability threshold of the positive class; None when
                y_predicted already holds 0/1 labels (the AUCs are then computed on those labels)
            strict_content_check (bool): raise instead of warn on content problems
            **kwargs: additional package metadata
        """
        AbstractResultPackage.__init__(self, pkg_name='BinaryClassificationResult',
                                       strict_content_check=strict_content_check, **kwargs)
        self.positive_class_thresh = positive_class_thresh

    def import_dependencies(self) -> None:
        """scikit-learn's metrics (F1, precision, recall and the AUCs are computed with them)."""
        import_sklearn_metrics()

    def prepare_results_dict(self) -> Dict[str, Any]:
        """The six binary metrics; multi-class targets or predictions are a ValueError."""
        y_true = true_labels(self.y_true)
        labels = np.unique(y_true)
        if not (is_integer_valued(labels) and set(labels.astype(int).tolist()) <= {0, 1}):
            raise ValueError(f'BinaryClassificationResultPackage expects y_true labels 0/1; found '
                             f'{labels.tolist()[:10]}. Use ClassificationResultPackage for multi-class targets.')
        y_true = y_true.astype(int)
        y_predicted = np.asarray(self.y_predicted)
        if y_predicted.ndim > 2 or (y_predicted.ndim == 2 and y_predicted.shape[1] > 2):
            raise ValueError(f'y_predicted has shape {y_predicted.shape}; binary classification expects '
                             f'(n,), (n, 1) or (n, 2) probabilities. Use ClassificationResultPackage for multi-class.')
        y_score = positive_class_scores(y_predicted)

        thresh = self.positive_class_thresh
        return {
            **AccuracyMetric(y_true, y_score, positive_class_thresh=thresh).get_metric_dict(),
            **ROCAUCMetric(y_true, y_score).get_metric_dict(),
            **PrecisionRecallCurveAUCMetric(y_true, y_score).get_metric_dict(),
            **F1ScoreMetric(y_true, y_score, positive_class_thresh=thresh).get_metric_dict(),
            **PrecisionMetric(y_true, y_score, positive_class_thresh=thresh).get_metric_dict(),
            **RecallMetric(y_true, y_score, positive_class_thresh=thresh).get_metric_dict(),
        }


class RegressionResultPackage(AbstractResultPackage):
    """Regression: mean squared error, mean absolute error and R^2."""

    #: The names of the results (``get_results()`` keys), known before any evaluation.
    metric_names: Tuple[str, ...] = ('Mean_squared_error', 'Mean_absolute_error', 'R2_score')

    def __init__(self, strict_content_check: bool = False, **kwargs: Any) -> None:
        """Regression result package: ``Mean_squared_error``, ``Mean_absolute_error`` and ``R2_score``

        y_true and y_predicted of shape ``(n,)`` or ``(n, 1)`` (mixing the two is fine), or ``(n, k)`` for k
        outputs (uniform average over the outputs).

        Args:
            strict_content_check (bool): raise instead of warn on content problems
            **kwargs: additional package metadata
        """
        AbstractResultPackage.__init__(self, pkg_name='RegressionResult',
                                       strict_content_check=strict_content_check, **kwargs)

    def prepare_results_dict(self) -> Dict[str, Any]:
        """``Mean_squared_error``, ``Mean_absolute_error`` and ``R2_score``."""
        return {
            **MeanSquaredErrorMetric(self.y_true, self.y_predicted).get_metric_dict(),
            **MeanAbsoluteErrorMetric(self.y_true, self.y_predicted).get_metric_dict(),
            **R2ScoreMetric(self.y_true, self.y_predicted).get_metric_dict(),
        }


# ----------------------------------------------------------------------------------------------
# torchmetrics
# ----------------------------------------------------------------------------------------------

def _import_torchmetrics() -> ModuleType:
    try:
        import torchmetrics
    except ImportError as exc:
        raise ImportError('TorchMetricsPackage needs torchmetrics: pip install aitoolbox_like[metrics]') from exc
    except (RuntimeError, OSError) as exc:
        # e.g. an installed torchvision built for another torch: torchmetrics imports it when present
        raise ImportError(f'torchmetrics is installed but failed to import ({type(exc).__name__}: {exc}). This usually '
                          f'means a torch extension package (often torchvision) does not match the installed torch: '
                          f'reinstall it for this torch build, or uninstall it.') from exc
    return torchmetrics


def _as_tensor(values: Any, name: str) -> Any:
    import torch
    if isinstance(values, torch.Tensor):
        return values.detach()
    if isinstance(values, (list, tuple)) and len(values) > 0 and all(isinstance(v, torch.Tensor) for v in values):
        values = [v.detach() for v in values]
        return torch.stack(values) if values[0].ndim == 0 else torch.cat(values)
    try:
        return torch.as_tensor(np.asarray(values))
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f'{name} could not be converted to a torch tensor ({exc}): pass a tensor, a numpy array '
                         f'or a list of numbers.') from exc


def _has_update(metric: Any) -> bool:
    return callable(getattr(metric, 'update', None))


class TorchMetricsPackage(AbstractResultPackage):
    """Computes torchmetrics metrics (a metric, a collection, or a dict / list of metrics)."""

    def __init__(self, torch_metrics: Any, strict_content_check: bool = False, **kwargs: Any) -> None:
        """Result package computing `torchmetrics <https://lightning.ai/docs/torchmetrics>`_ metrics

        On each evaluation the metric is reset, updated once with the whole ``(y_predicted, y_true)``, computed
        and reset again, so one package can be reused every epoch with independent results.

        Result names are ``'<name>_PTLMetrics'`` (as in AIToolbox), where name is the metric class name for a
        single metric, or the collection's key for a MetricCollection / dict / list. Scalar results are Python
        floats (ints for integer metrics), non-scalar results (e.g. a confusion matrix) nested lists.

        A metric that is not a ``torchmetrics.Metric`` works when it has ``compute()``, ``reset()`` and
        ``update(predicted, target)``; one without ``update()`` but callable is used as AIToolbox's package used
        every metric: ``metric(y_predicted, y_true)`` gives the results (the data as given, no resets).

        Args:
            torch_metrics (torchmetrics.Metric or torchmetrics.MetricCollection or dict or list): a metric,
                a collection, a dict ``{name: metric}`` or a list of metrics (the last two are wrapped in a
                MetricCollection), or an object with the methods above
            strict_content_check (bool): raise instead of warn on content problems
            **kwargs: additional package metadata

        Raises:
            ImportError: a dict / list of metrics is given and torchmetrics is not installed
            TypeError: when torch_metrics is none of the above
        """
        AbstractResultPackage.__init__(self, pkg_name='Torch Metrics', strict_content_check=strict_content_check,
                                       np_array=False, **kwargs)
        if isinstance(torch_metrics, (dict, list, tuple)):
            if len(torch_metrics) == 0:
                raise ValueError('torch_metrics is empty: give at least one torchmetrics metric.')
            torch_metrics = _import_torchmetrics().MetricCollection(torch_metrics)
        # Duck typing: a user's metric class need not subclass torchmetrics.Metric. Besides compute() and reset(),
        # it is fed either by update() (torchmetrics' protocol) or by being called, which is all AIToolbox's
        # package used (metric(y_predicted, y_true)), so metrics written for AIToolbox keep working.
        missing = [f'{m}()' for m in ('compute', 'reset') if not callable(getattr(torch_metrics, m, None))]
        if not _has_update(torch_metrics) and not callable(torch_metrics):
            missing.insert(0, 'update() or __call__()')
        if missing:
            raise TypeError(f'torch_metrics must be a torchmetrics.Metric / MetricCollection, a dict / list of them, '
                            f'or an object with compute(), reset() and either update(predicted, target) or '
                            f'__call__(predicted, target); got {type(torch_metrics).__name__} without '
                            f'{", ".join(missing)}.')
        self.metric: Any = torch_metrics

    def _check_targets_and_predictions(self, y_true: Any, y_predicted: Any) -> None:
        """As every package, except for a metric without update(): it is given the data as it is, unchecked, as
        AIToolbox gave it (the metric decides what it accepts)."""
        if _has_update(self.metric):
            super()._check_targets_and_predictions(y_true, y_predicted)

    def _metric_device(self) -> Any:
        metric = self.metric
        if hasattr(metric, 'values') and not hasattr(metric, 'device'):
            metric = next(iter(metric.values()), None)
        return getattr(metric, 'device', None)

    def prepare_results_dict(self) -> Dict[str, Any]:
        """Reset, update once with all the data, compute, reset; results named ``<name>_PTLMetrics``.

        A metric without update() is called instead, ``metric(y_predicted, y_true)``, with the data as given and
        without resets, as AIToolbox's package did.
        """
        if not _has_update(self.metric):
            return self._named_results(self.metric(self.y_predicted, self.y_true))
        y_true = _as_tensor(self.y_true, 'y_true')
        y_predicted = _as_tensor(self.y_predicted, 'y_predicted')
        device = self._metric_device()
        if device is not None:
            y_true, y_predicted = y_true.to(device), y_predicted.to(device)

        self.metric.reset()
        try:
            self.metric.update(y_predicted, y_true)
            metric_result = self.metric.compute()
        finally:
            self.metric.reset()
        return self._named_results(metric_result)

    def _named_results(self, metric_result: Any) -> Dict[str, Any]:
        if not isinstance(metric_result, dict):
            metric_result = {type(self.metric).__name__: metric_result}
        # the suffix tells the torchmetrics (PyTorch Lightning metrics) results from the aitoolbox_like ones
        return {f'{name}_PTLMetrics': value for name, value in metric_result.items()}

    def metric_compute(self) -> Any:
        """Compute the metric's current accumulated state (``torchmetrics`` ``compute()``)"""
        return self.metric.compute()

    def metric_reset(self) -> None:
        """Reset the metric's state"""
        self.metric.reset()


class HFEvaluateResultPackage(AbstractResultPackage):
    """Computes a HuggingFace Evaluate metric (any object whose ``compute`` takes references and predictions)."""

    def __init__(self, hf_evaluate_metric: Any, use_models_additional_results: bool = True, **kwargs: Any) -> None:
        """Result package around a `HuggingFace Evaluate <https://huggingface.co/docs/evaluate>`_ metric.

        Only the metric's ``compute(references=..., predictions=..., **inputs)`` is called, so any object with
        that method works (``evaluate`` itself is not imported). Result names get the suffix ``'_HFEvaluate'``
        as in AIToolbox.

        Args:
            hf_evaluate_metric: an ``evaluate.EvaluationModule`` (e.g. ``evaluate.load('accuracy')``) or any
                object with a ``compute(references, predictions, **kwargs)`` method
            use_models_additional_results (bool): also pass the model's prediction metadata (the
                ``additional_results`` given to ``prepare_result_package``) to ``compute``
            **kwargs: extra inputs to ``compute`` known before predicting (kept as package metadata)
        """
        if not callable(getattr(hf_evaluate_metric, 'compute', None)):
            raise TypeError(f'hf_evaluate_metric must have a compute(references=..., predictions=...) method, e.g. '
                            f'evaluate.load("accuracy"); got {type(hf_evaluate_metric).__name__}')
        AbstractResultPackage.__init__(self, pkg_name='HuggingFace Evaluate metrics', **kwargs)
        self.metric: Any = hf_evaluate_metric
        self.use_models_additional_results = use_models_additional_results

    def prepare_results_dict(self) -> Dict[str, Any]:
        """The metric's ``compute`` results, named ``<name>_HFEvaluate``."""
        inputs = dict(self.package_metadata)
        if self.use_models_additional_results:
            inputs.update((self.additional_results or {}).get('additional_results') or {})
        result = self.metric.compute(references=self.y_true, predictions=self.y_predicted, **inputs)
        if isinstance(result, dict):
            result = {f'{name}_HFEvaluate': value for name, value in result.items()}
        return result
