"""GLUE and XNLI metrics (AIToolbox's ``GLUEMetric`` and ``XNLIMetric``), computed as the ``glue_compute_metrics``
and ``xnli_compute_metrics`` helpers of transformers 4 computed them (transformers 5 removed both): accuracy,
F1 of the positive class, Matthews correlation, Pearson and Spearman correlation, by task."""
from typing import Any, Callable, Dict

import numpy as np

from ...results.metrics import AbstractBaseMetric
from .._requires import require

__all__ = ['GLUE_TASKS', 'glue_compute_metrics', 'xnli_compute_metrics', 'GLUEMetric', 'XNLIMetric']


def _accuracy(preds: np.ndarray, labels: np.ndarray) -> Dict[str, float]:
    return {'acc': float((preds == labels).mean())}


def _accuracy_and_f1(preds: np.ndarray, labels: np.ndarray) -> Dict[str, float]:
    metrics = require('sklearn.metrics', 'scikit-learn', 'the GLUE F1 score')
    acc = float((preds == labels).mean())
    f1 = float(metrics.f1_score(y_true=labels, y_pred=preds))
    return {'acc': acc, 'f1': f1, 'acc_and_f1': (acc + f1) / 2}


def _pearson_and_spearman(preds: np.ndarray, labels: np.ndarray) -> Dict[str, float]:
    stats = require('scipy.stats', 'scipy', 'the GLUE STS-B correlations')
    pearson = float(stats.pearsonr(preds, labels)[0])
    spearman = float(stats.spearmanr(preds, labels)[0])
    return {'pearson': pearson, 'spearmanr': spearman, 'corr': (pearson + spearman) / 2}


def _matthews(preds: np.ndarray, labels: np.ndarray) -> Dict[str, float]:
    metrics = require('sklearn.metrics', 'scikit-learn', 'the GLUE CoLA Matthews correlation')
    return {'mcc': float(metrics.matthews_corrcoef(labels, preds))}


def _prefixed(prefix: str) -> Callable[[np.ndarray, np.ndarray], Dict[str, float]]:
    def accuracy(preds: np.ndarray, labels: np.ndarray) -> Dict[str, float]:
        return {f'{prefix}/acc': _accuracy(preds, labels)['acc']}
    return accuracy


#: each GLUE task's metrics, by the task names transformers used
GLUE_TASKS: Dict[str, Callable[[np.ndarray, np.ndarray], Dict[str, float]]] = {
    'cola': _matthews,
    'sst-2': _accuracy,
    'mrpc': _accuracy_and_f1,
    'sts-b': _pearson_and_spearman,
    'qqp': _accuracy_and_f1,
    'mnli': _prefixed('mnli'),
    'mnli-mm': _prefixed('mnli-mm'),
    'qnli': _accuracy,
    'rte': _accuracy,
    'wnli': _accuracy,
    'hans': _accuracy,
}


def _as_arrays(preds: Any, labels: Any) -> Any:
    preds, labels = np.asarray(preds), np.asarray(labels)
    if len(preds) != len(labels):
        raise ValueError(f'{len(preds)} predictions but {len(labels)} labels: pass one prediction per label')
    return preds, labels


def glue_compute_metrics(task_name: str, preds: Any, labels: Any) -> Dict[str, float]:
    """The metrics of a GLUE task, keyed as transformers 4's ``glue_compute_metrics`` keyed them

    Args:
        task_name (str): one of ``GLUE_TASKS`` (``'cola'``, ``'sst-2'``, ``'mrpc'``, ``'sts-b'``, ``'qqp'``,
            ``'mnli'``, ``'mnli-mm'``, ``'qnli'``, ``'rte'``, ``'wnli'``, ``'hans'``)
        preds: predicted labels (scores for ``'sts-b'``)
        labels: true labels (scores for ``'sts-b'``)

    Returns:
        dict: e.g. ``{'acc': ..., 'f1': ..., 'acc_and_f1': ...}`` for MRPC, ``{'mnli/acc': ...}`` for MNLI

    Raises:
        KeyError: an unknown task name
        ValueError: predictions and labels differ in length
    """
    if task_name not in GLUE_TASKS:
        raise KeyError(f'{task_name!r} is not a GLUE task; the tasks are {", ".join(GLUE_TASKS)}')
    return GLUE_TASKS[task_name](*_as_arrays(preds, labels))


def xnli_compute_metrics(task_name: str, preds: Any, labels: Any) -> Dict[str, float]:
    """XNLI's accuracy, ``{'acc': ...}``, as transformers 4's ``xnli_compute_metrics`` computed it

    Raises:
        KeyError: a task name other than ``'xnli'``
    """
    if task_name != 'xnli':
        raise KeyError(f'{task_name!r} is not an XNLI task; the only one is \'xnli\'')
    return _accuracy(*_as_arrays(preds, labels))


class GLUEMetric(AbstractBaseMetric):
    """The metrics of a GLUE task, with ``/`` in their names replaced by ``_`` (``mnli_acc``)."""

    def __init__(self, y_true: Any, y_predicted: Any, task_name: str) -> None:
        """GLUE evaluation metrics

        Args:
            y_true: true labels (scores for STS-B)
            y_predicted: predicted labels (scores for STS-B)
            task_name (str): the GLUE task (:data:`GLUE_TASKS`)
        """
        self.task_name = task_name
        super().__init__(y_true, y_predicted, metric_name=f'GLUE_{task_name}')

    def calculate_metric(self) -> Dict[str, float]:
        metrics = glue_compute_metrics(self.task_name, self.y_predicted, self.y_true)
        return {name.replace('/', '_'): value for name, value in metrics.items()}


class XNLIMetric(AbstractBaseMetric):
    """XNLI accuracy, ``{'acc': ...}``."""

    def __init__(self, y_true: Any, y_predicted: Any) -> None:
        """XNLI evaluation metrics

        Args:
            y_true: true labels
            y_predicted: predicted labels
        """
        super().__init__(y_true, y_predicted, metric_name='xnli_accuracy')

    def calculate_metric(self) -> Dict[str, float]:
        metrics = xnli_compute_metrics('xnli', self.y_predicted, self.y_true)
        return {name.replace('/', '_'): value for name, value in metrics.items()}
