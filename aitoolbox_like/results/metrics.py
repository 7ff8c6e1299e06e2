"""Core metrics (AIToolbox's ``aitoolbox.experiment.core_metrics``).

A metric object computes its value at construction::

    AccuracyMetric(y_true, y_predicted).get_metric()        # 0.75
    AccuracyMetric(y_true, y_predicted).get_metric_dict()   # {'Accuracy': 0.75}
    AccuracyMetric(...) + F1ScoreMetric(...)                # {'Accuracy': ..., 'F1_score': ...}

Accuracy and the regression metrics are computed with NumPy, as scikit-learn computes them (the same values, to the
bit); F1, precision, recall and the AUCs are scikit-learn's (``pip install aitoolbox_like[metrics]``), imported on
first use, or before the first epoch by ModelPerformanceEvaluation (``uses_sklearn``; scikit-learn and SciPy take
seconds to import, which must not land in the middle of a run). Results are plain Python floats.

Fixed compared with AIToolbox 1.8.0:

* F1 / precision / recall thresholded with ``>`` while accuracy used ``>=``; all use ``>=`` now;
* F1 / precision / recall crashed with ``positive_class_thresh=None``; None now means "the
  predictions already are labels";
* accuracy only printed a message when thresholding got logits and then failed inside sklearn; a
  ``ValueError`` now says what to do;
* predictions of shape ``(n, 1)`` and two-column binary probabilities ``(n, 2)`` are handled;
* results were numpy scalars, so comparisons / ``len()`` of metrics raised; they are Python floats now;
* ROC AUC / PR AUC with only one class present give a ``ValueError`` explaining why.
"""
from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from types import ModuleType
from typing import Any, ClassVar, Dict, Optional, Tuple, Union, cast

import numpy as np

from .conversion import check_targets_and_predictions, to_numpy, to_python

__all__ = ['AbstractBaseMetric', 'AccuracyMetric', 'F1ScoreMetric', 'PrecisionMetric', 'RecallMetric',
           'ROCAUCMetric', 'PrecisionRecallCurveAUCMetric', 'MeanSquaredErrorMetric', 'MeanAbsoluteErrorMetric',
           'R2ScoreMetric']


def _sklearn_metrics() -> ModuleType:
    try:
        from sklearn import metrics
    except ImportError as exc:
        raise ImportError('The aitoolbox_like metrics need scikit-learn: pip install aitoolbox_like[metrics]') from exc
    return metrics


def import_sklearn_metrics() -> None:
    """Import scikit-learn's metrics now (the result packages that use them do it when a fit starts)."""
    _sklearn_metrics()


class AbstractBaseMetric(ABC):
    """A metric computed from targets and predictions when it is constructed (see ``__init__``)."""

    #: name used when ``metric_name`` is not given
    DEFAULT_METRIC_NAME: ClassVar[Optional[str]] = None
    #: whether computing it imports scikit-learn (the packages that use it import it before the first epoch)
    uses_sklearn: ClassVar[bool] = False

    def __init__(self, y_true: Any, y_predicted: Any, metric_name: Optional[str] = None,
                 np_array: bool = True) -> None:
        """Base of all the metrics: converts the inputs, computes and stores the metric

        Args:
            y_true (numpy.ndarray or list or torch.Tensor): ground truth targets
            y_predicted (numpy.ndarray or list or torch.Tensor): predicted targets
            metric_name (str or None): name of the metric (key in the metric dict); None uses the class's
                default name (``DEFAULT_METRIC_NAME``, else the class name)
            np_array (bool): convert the targets to numpy arrays (torch tensors on any device are accepted)

        Raises:
            ValueError: on empty or mismatched-length inputs
        """
        if np_array:
            y_true = to_numpy(y_true, 'y_true')
            y_predicted = to_numpy(y_predicted, 'y_predicted')
        self._check_targets_and_predictions(y_true, y_predicted)
        self.y_true = y_true
        self.y_predicted = y_predicted
        self.metric_name: str = metric_name or self.DEFAULT_METRIC_NAME or type(self).__name__
        self.metric_result: Any = None
        self.metric_result = to_python(self.calculate_metric())

    def _check_targets_and_predictions(self, y_true: Any, y_predicted: Any) -> None:
        """Raise ValueError for targets / predictions no metric can compute from (missing, scalar, empty or of
        different lengths); a metric that takes other inputs (a perplexity of losses, plots) overrides it."""
        check_targets_and_predictions(y_true, y_predicted)

    @abstractmethod
    def calculate_metric(self) -> Any:
        """Compute the metric from ``self.y_true`` and ``self.y_predicted``

        Returns:
            float or dict: the metric result
        """

    def get_metric(self) -> Any:
        """Returns:
            float or dict: the metric result
        """
        return self.metric_result

    def get_metric_dict(self) -> Dict[str, Any]:
        """Returns:
            dict: ``{metric_name: metric_result}``
        """
        return {self.metric_name: self.metric_result}

    def __str__(self) -> str:
        return f'{self.metric_name}: {self.metric_result}'

    def __len__(self) -> int:
        result = self.metric_result
        if isinstance(result, (list, dict)):
            return len(result)
        if isinstance(result, numbers.Number):
            return 1
        if result is None:
            return 0
        raise TypeError(f'metric_result of type {type(result).__name__} has no length; '
                        f'expected a list, dict, float or int.')

    def _get_metric_self_other_val(self, other: Any) -> Tuple[Any, Any]:
        def is_scalar(value: object) -> bool:
            return isinstance(value, numbers.Real) and not isinstance(value, bool)

        other_val = other.metric_result if isinstance(other, AbstractBaseMetric) else other
        if is_scalar(self.metric_result) and is_scalar(other_val):
            return self.metric_result, other_val
        raise ValueError('Metrics can only be compared when both results are int or float.')

    def __lt__(self, other: Any) -> bool:
        self_val, other_val = self._get_metric_self_other_val(other)
        return self_val < other_val

    def __le__(self, other: Any) -> bool:
        self_val, other_val = self._get_metric_self_other_val(other)
        return self_val <= other_val

    def __gt__(self, other: Any) -> bool:
        self_val, other_val = self._get_metric_self_other_val(other)
        return self_val > other_val

    def __ge__(self, other: Any) -> bool:
        self_val, other_val = self._get_metric_self_other_val(other)
        return self_val >= other_val

    def __contains__(self, item: object) -> bool:
        if item == self.metric_name:
            return True
        return isinstance(self.metric_result, dict) and item in self.metric_result

    def __getitem__(self, item: str) -> Any:
        if item == self.metric_name:
            return self.metric_result
        if isinstance(self.metric_result, dict) and item in self.metric_result:
            return self.metric_result[item]
        raise KeyError(f'Key {item} not found')

    def __add__(self, other: Union[AbstractBaseMetric, Dict[str, Any]]) -> Dict[str, Any]:
        """Returns:
            dict: this metric's dict merged with ``other`` (metric or dict)
        """
        return self.concat_metric(other)

    def __radd__(self, other: Union[AbstractBaseMetric, Dict[str, Any]]) -> Dict[str, Any]:
        if isinstance(other, dict):
            return {**other, **self.get_metric_dict()}
        return self.concat_metric(other)

    def concat_metric(self, other: Union[AbstractBaseMetric, Dict[str, Any]]) -> Dict[str, Any]:
        """Merge this metric's dict with another metric or dict

        Returns:
            dict: combined metric dict
        """
        if isinstance(other, AbstractBaseMetric):
            other_metric_dict = other.get_metric_dict()
        elif isinstance(other, dict):
            other_metric_dict = other
        else:
            raise TypeError(f'Can only add a metric or a dict to a metric; got {type(other).__name__}.')
        return {**self.get_metric_dict(), **other_metric_dict}


# ----------------------------------------------------------------------------------------------
# Input shaping helpers
# ----------------------------------------------------------------------------------------------

def is_integer_valued(array: np.ndarray) -> bool:
    if array.dtype == bool or np.issubdtype(array.dtype, np.integer):
        return True
    if not np.issubdtype(array.dtype, np.number):
        return False
    return bool(np.all(np.isfinite(array)) and np.all(np.mod(array, 1) == 0))


def true_labels(y_true: Any) -> np.ndarray:
    """Class labels from y_true: one-hot ``(n, C)`` -> argmax, ``(n, 1)`` -> flattened"""
    y_true = np.asarray(y_true)
    if y_true.ndim == 2 and y_true.shape[1] > 1:
        return np.argmax(y_true, axis=1)
    if y_true.ndim == 2 and y_true.shape[1] == 1:
        return y_true.ravel()
    if y_true.ndim > 2:
        raise ValueError(f'y_true has shape {y_true.shape}: pass class labels of shape (n,) or one-hot (n, C).')
    return y_true


def _predicted_labels(y_predicted: Any, positive_class_thresh: Optional[float]) -> np.ndarray:
    """Predicted labels

    * ``(n, C)`` with C > 1: per-class scores / probabilities / logits -> argmax
    * ``(n,)`` or ``(n, 1)`` with a threshold: probabilities in [0, 1] -> ``p >= thresh``;
      integer class labels outside [0, 1] are kept as they are
    * ``(n,)`` or ``(n, 1)`` without a threshold: labels, used as they are
    """
    y_predicted = np.asarray(y_predicted)
    if y_predicted.ndim > 2:
        raise ValueError(f'y_predicted has shape {y_predicted.shape}: pass labels / probabilities of shape (n,) '
                         f'or per-class scores of shape (n, C).')
    if y_predicted.ndim == 2:
        if y_predicted.shape[1] > 1:
            return np.argmax(y_predicted, axis=1)
        y_predicted = y_predicted.ravel()

    if positive_class_thresh is None:
        if np.issubdtype(y_predicted.dtype, np.number) and not is_integer_valued(y_predicted):
            raise ValueError('y_predicted holds non-integer values but no positive_class_thresh was given: pass '
                             'class labels, per-class scores of shape (n, C), or set positive_class_thresh '
                             '(e.g. 0.5) to threshold positive-class probabilities.')
        return y_predicted

    if not np.issubdtype(y_predicted.dtype, np.number) and y_predicted.dtype != bool:
        return y_predicted
    if np.min(y_predicted) >= 0. and np.max(y_predicted) <= 1.:
        return (y_predicted >= positive_class_thresh).astype(int)
    if is_integer_valued(y_predicted):
        return y_predicted  # multi-class labels: nothing to threshold
    raise ValueError(f'y_predicted has values outside [0, 1] (min {np.min(y_predicted):.4g}, max '
                     f'{np.max(y_predicted):.4g}) so they are not probabilities (logits?). Apply a sigmoid first, '
                     f'or pass positive_class_thresh=None when y_predicted already holds labels.')


def positive_class_scores(y_predicted: Any) -> np.ndarray:
    """Positive-class scores: ``(n,)``, ``(n, 1)`` flattened, ``(n, 2)`` -> second column"""
    y_predicted = np.asarray(y_predicted)
    if y_predicted.ndim == 2 and y_predicted.shape[1] in (1, 2):
        return y_predicted[:, -1]
    return y_predicted


def _check_both_classes(y_true: np.ndarray, metric: str) -> None:
    classes = np.unique(y_true)
    if len(classes) < 2:
        raise ValueError(f'{metric} is undefined when y_true contains only one class (found only {classes.tolist()}): '
                         f'evaluate on data that contains both positive and negative examples.')


# ----------------------------------------------------------------------------------------------
# Classification
# ----------------------------------------------------------------------------------------------

class AccuracyMetric(AbstractBaseMetric):
    """Accuracy of predicted labels (probabilities thresholded, scores argmax-ed)."""
    DEFAULT_METRIC_NAME = 'Accuracy'

    def __init__(self, y_true: Any, y_predicted: Any, positive_class_thresh: Optional[float] = 0.5,
                 metric_name: Optional[str] = None) -> None:
        """Accuracy (sklearn ``accuracy_score``)

        Args:
            y_true: class labels ``(n,)`` or one-hot ``(n, C)``
            y_predicted: labels ``(n,)``, positive-class probabilities ``(n,)`` (thresholded), or per-class
                scores / logits ``(n, C)`` (argmax)
            positive_class_thresh (float or None): threshold for positive-class probabilities; None when
                y_predicted holds labels (e.g. multi-class)
            metric_name (str or None): defaults to ``'Accuracy'``
        """
        self.positive_class_thresh = positive_class_thresh
        AbstractBaseMetric.__init__(self, y_true, y_predicted, metric_name=metric_name)

    def calculate_metric(self) -> Any:
        """The fraction of predicted labels equal to the true ones, as sklearn's ``accuracy_score`` computes it (see
        ``__init__`` for how predictions become labels)."""
        self.y_predicted = _predicted_labels(self.y_predicted, self.positive_class_thresh)
        self.y_true = true_labels(self.y_true)
        for name, labels in (('y_true', self.y_true), ('y_predicted', self.y_predicted)):
            if np.issubdtype(labels.dtype, np.number) and not is_integer_valued(labels):
                raise ValueError(f'Accuracy needs class labels, but {name} holds continuous values (e.g. '
                                 f'{labels.ravel()[~np.isclose(labels.ravel(), np.round(labels.ravel()))][:3].tolist()})'
                                 f': pass labels, per-class scores of shape (n, C), or positive-class probabilities '
                                 f'with positive_class_thresh')
        return float(np.average(self.y_true == self.y_predicted))


class _ThresholdedScoreMetric(AbstractBaseMetric):
    _sklearn_fn: ClassVar[Optional[str]] = None
    uses_sklearn = True

    def __init__(self, y_true: Any, y_predicted: Any, positive_class_thresh: Optional[float] = 0.5,
                 average: str = 'binary', metric_name: Optional[str] = None) -> None:
        """
        Args:
            y_true: labels ``(n,)`` (0/1 for ``average='binary'``) or one-hot ``(n, C)``
            y_predicted: positive-class probabilities ``(n,)`` (thresholded with ``>=``), labels, or per-class
                scores ``(n, C)`` (argmax)
            positive_class_thresh (float or None): threshold; None when y_predicted already holds labels
            average (str): sklearn's ``average`` (``'binary'``, ``'macro'``, ``'micro'``, ``'weighted'``)
            metric_name (str or None): metric name, defaults to the class's name
        """
        self.positive_class_thresh = positive_class_thresh
        self.average = average
        AbstractBaseMetric.__init__(self, y_true, y_predicted, metric_name=metric_name)

    def calculate_metric(self) -> Any:
        """The sklearn score named by ``_sklearn_fn`` on the thresholded / argmax-ed labels."""
        y_label_predicted = _predicted_labels(self.y_predicted, self.positive_class_thresh)
        y_true = true_labels(self.y_true)
        fn = getattr(_sklearn_metrics(), cast(str, self._sklearn_fn))   # every concrete subclass sets it
        return fn(y_true, y_label_predicted, average=self.average, zero_division=0)


class F1ScoreMetric(_ThresholdedScoreMetric):
    """F1 score (sklearn ``f1_score``, 0 when undefined)"""
    DEFAULT_METRIC_NAME = 'F1_score'
    _sklearn_fn = 'f1_score'


class PrecisionMetric(_ThresholdedScoreMetric):
    """Precision (sklearn ``precision_score``, 0 when undefined)"""
    DEFAULT_METRIC_NAME = 'Precision'
    _sklearn_fn = 'precision_score'


class RecallMetric(_ThresholdedScoreMetric):
    """Recall (sklearn ``recall_score``, 0 when undefined)"""
    DEFAULT_METRIC_NAME = 'Recall'
    _sklearn_fn = 'recall_score'


class ROCAUCMetric(AbstractBaseMetric):
    """Area under the ROC curve of positive-class scores."""
    DEFAULT_METRIC_NAME = 'ROC_AUC'
    uses_sklearn = True

    def __init__(self, y_true: Any, y_predicted: Any, metric_name: Optional[str] = None) -> None:
        """Area under the ROC curve (sklearn ``roc_auc_score``)

        Args:
            y_true: binary labels ``(n,)``
            y_predicted: positive-class scores ``(n,)`` / ``(n, 1)``, or two-column probabilities ``(n, 2)``
                (second column used); for more than 2 classes ``(n, C)`` probabilities (one-vs-rest AUC)
            metric_name (str or None): defaults to ``'ROC_AUC'``
        """
        AbstractBaseMetric.__init__(self, y_true, y_predicted, metric_name=metric_name)

    def calculate_metric(self) -> Any:
        """sklearn's ``roc_auc_score`` (one-vs-rest for per-class probabilities)."""
        y_true = true_labels(self.y_true)
        y_score = positive_class_scores(self.y_predicted)
        _check_both_classes(y_true, 'ROC AUC')
        if y_score.ndim == 2:
            return _sklearn_metrics().roc_auc_score(y_true, y_score, multi_class='ovr')
        return _sklearn_metrics().roc_auc_score(y_true, y_score)


class PrecisionRecallCurveAUCMetric(AbstractBaseMetric):
    """Area under the precision-recall curve of positive-class scores."""
    DEFAULT_METRIC_NAME = 'PrecisionRecall_AUC'
    uses_sklearn = True

    def __init__(self, y_true: Any, y_predicted: Any, metric_name: Optional[str] = None) -> None:
        """Area under the precision-recall curve (sklearn ``precision_recall_curve`` + ``auc``)

        Args:
            y_true: binary labels ``(n,)``
            y_predicted: positive-class scores ``(n,)`` / ``(n, 1)`` or two-column probabilities ``(n, 2)``
            metric_name (str or None): defaults to ``'PrecisionRecall_AUC'``
        """
        AbstractBaseMetric.__init__(self, y_true, y_predicted, metric_name=metric_name)

    def calculate_metric(self) -> Any:
        """sklearn's ``auc`` of the ``precision_recall_curve``."""
        y_true = true_labels(self.y_true)
        y_score = positive_class_scores(self.y_predicted)
        if y_score.ndim != 1:
            raise ValueError(f'PR AUC needs positive-class scores of shape (n,); got y_predicted of shape '
                             f'{np.shape(self.y_predicted)}.')
        _check_both_classes(y_true, 'PR AUC')
        metrics = _sklearn_metrics()
        precision, recall, _ = metrics.precision_recall_curve(y_true, y_score)
        return metrics.auc(recall, precision)


# ----------------------------------------------------------------------------------------------
# Regression
# ----------------------------------------------------------------------------------------------

def _regression_arrays(y_true: Any, y_predicted: Any) -> Tuple[np.ndarray, np.ndarray]:
    y_true, y_predicted = np.asarray(y_true, dtype=float), np.asarray(y_predicted, dtype=float)
    # (n, 1) vs (n,) is the usual shape mismatch of a regression head: flatten both
    if y_true.ndim == 2 and y_true.shape[1] == 1:
        y_true = y_true.ravel()
    if y_predicted.ndim == 2 and y_predicted.shape[1] == 1:
        y_predicted = y_predicted.ravel()
    if y_true.shape != y_predicted.shape:
        raise ValueError(f'y_true has shape {y_true.shape} but y_predicted has shape {y_predicted.shape}: '
                         f'regression metrics need one predicted value per target value.')
    return y_true, y_predicted


def _columns(y_true: np.ndarray, y_predicted: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    # One column per output, as scikit-learn reduces them: a sum down a column adds in another order (and so to other
    # bits) than a sum along a flat array.
    if y_true.ndim == 1:
        return y_true.reshape(-1, 1), y_predicted.reshape(-1, 1)
    return y_true, y_predicted


class MeanSquaredErrorMetric(AbstractBaseMetric):
    """Mean squared error of regression predictions."""
    DEFAULT_METRIC_NAME = 'Mean_squared_error'

    def __init__(self, y_true: Any, y_predicted: Any, metric_name: Optional[str] = None) -> None:
        """Mean squared error (sklearn ``mean_squared_error``)"""
        AbstractBaseMetric.__init__(self, y_true, y_predicted, metric_name=metric_name)

    def calculate_metric(self) -> Any:
        """The mean of the squared errors, per output then over the outputs, as sklearn's ``mean_squared_error``
        ((n, 1) shapes flattened)."""
        y_true, y_predicted = _columns(*_regression_arrays(self.y_true, self.y_predicted))
        return float(np.average(np.average((y_true - y_predicted) ** 2, axis=0)))


class MeanAbsoluteErrorMetric(AbstractBaseMetric):
    """Mean absolute error of regression predictions."""
    DEFAULT_METRIC_NAME = 'Mean_absolute_error'

    def __init__(self, y_true: Any, y_predicted: Any, metric_name: Optional[str] = None) -> None:
        """Mean absolute error (sklearn ``mean_absolute_error``)"""
        AbstractBaseMetric.__init__(self, y_true, y_predicted, metric_name=metric_name)

    def calculate_metric(self) -> Any:
        """The mean of the absolute errors, per output then over the outputs, as sklearn's ``mean_absolute_error``
        ((n, 1) shapes flattened)."""
        y_true, y_predicted = _columns(*_regression_arrays(self.y_true, self.y_predicted))
        return float(np.average(np.average(np.abs(y_predicted - y_true), axis=0)))


class R2ScoreMetric(AbstractBaseMetric):
    """Coefficient of determination R^2 of regression predictions."""
    DEFAULT_METRIC_NAME = 'R2_score'

    def __init__(self, y_true: Any, y_predicted: Any, metric_name: Optional[str] = None) -> None:
        """Coefficient of determination R^2 (sklearn ``r2_score``)

        Raises:
            ValueError: with fewer than two examples (R^2 is undefined)
        """
        AbstractBaseMetric.__init__(self, y_true, y_predicted, metric_name=metric_name)

    def calculate_metric(self) -> Any:
        """R^2 per output, averaged over the outputs, as sklearn's ``r2_score`` computes it: ``1 - SS_res / SS_tot``,
        1.0 for a perfect fit of a constant target and 0.0 for an imperfect one ((n, 1) shapes flattened; at least two
        examples)."""
        y_true, y_predicted = _regression_arrays(self.y_true, self.y_predicted)
        if y_true.shape[0] < 2:
            raise ValueError('R2 score is undefined for fewer than two examples: evaluate on at least two.')
        y_true, y_predicted = _columns(y_true, y_predicted)
        residual = ((y_true - y_predicted) ** 2).sum(axis=0, dtype=np.float64)
        total = ((y_true - np.average(y_true, axis=0)) ** 2).sum(axis=0, dtype=np.float64)
        scores = np.ones(y_true.shape[1])
        defined = (total != 0) & (residual != 0)
        scores[defined] = 1 - residual[defined] / total[defined]
        scores[(residual != 0) & (total == 0)] = 0.0
        return float(np.average(scores))
