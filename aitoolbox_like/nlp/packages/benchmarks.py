"""Result packages of the GLUE and XNLI benchmarks (AIToolbox's ``GLUEResultPackage`` and ``XNLIResultPackage``)."""
from typing import Any, Dict

from ...results.abstract import AbstractResultPackage
from ..metrics.glue import GLUEMetric, XNLIMetric
from ._common import flatten

__all__ = ['GLUEResultPackage', 'XNLIResultPackage']


class GLUEResultPackage(AbstractResultPackage):
    """The task's GLUE metrics, e.g. ``GLUE_mrpc_acc``, ``GLUE_mrpc_f1``, ``GLUE_mrpc_acc_and_f1``."""

    def __init__(self, task_name: str) -> None:
        """GLUE task result package

        Args:
            task_name (str): the GLUE task (``'cola'``, ``'sst-2'``, ``'mrpc'``, ``'sts-b'``, ``'qqp'``, ``'mnli'``,
                ``'mnli-mm'``, ``'qnli'``, ``'rte'``, ``'wnli'``, ``'hans'``)
        """
        super().__init__('GLUE benchmark')
        self.task_name = task_name

    def prepare_results_dict(self) -> Dict[str, Any]:
        return flatten(GLUEMetric(self.y_true, self.y_predicted, self.task_name).get_metric_dict())


class XNLIResultPackage(AbstractResultPackage):
    """XNLI accuracy: ``xnli_accuracy_acc``."""

    def __init__(self) -> None:
        """XNLI task result package"""
        super().__init__('XNLI benchmark')

    def prepare_results_dict(self) -> Dict[str, Any]:
        return flatten(XNLIMetric(self.y_true, self.y_predicted).get_metric_dict())
