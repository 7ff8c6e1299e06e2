"""Result packages: turn (y_true, y_predicted) into a dict of metric_name -> Python number.

AIToolbox equivalents:

* ``aitoolbox.experiment.result_package.abstract_result_packages`` -> :mod:`.abstract`
* ``aitoolbox.experiment.result_package.basic_packages`` and ``torch_metrics_packages`` -> :mod:`.basic`
* ``aitoolbox.experiment.core_metrics`` -> :mod:`.metrics`

scikit-learn and torchmetrics are imported only when a metric is computed / a TorchMetricsPackage is created
(``pip install aitoolbox_like[metrics]``).
"""

from .abstract import AbstractResultPackage, MultipleResultPackageWrapper, PreCalculatedResultPackage
from .basic import (BinaryClassificationResultPackage, ClassificationResultPackage, GeneralResultPackage,
                    HFEvaluateResultPackage, RegressionResultPackage, TorchMetricsPackage)
from .metrics import (AbstractBaseMetric, AccuracyMetric, F1ScoreMetric, MeanAbsoluteErrorMetric,
                      MeanSquaredErrorMetric, PrecisionMetric, PrecisionRecallCurveAUCMetric, R2ScoreMetric,
                      RecallMetric, ROCAUCMetric)

__all__ = [
    'AbstractResultPackage', 'PreCalculatedResultPackage', 'MultipleResultPackageWrapper',
    'GeneralResultPackage', 'ClassificationResultPackage', 'BinaryClassificationResultPackage',
    'RegressionResultPackage', 'TorchMetricsPackage', 'HFEvaluateResultPackage',
    'AbstractBaseMetric', 'AccuracyMetric', 'F1ScoreMetric', 'PrecisionMetric', 'RecallMetric', 'ROCAUCMetric',
    'PrecisionRecallCurveAUCMetric', 'MeanSquaredErrorMetric', 'MeanAbsoluteErrorMetric', 'R2ScoreMetric',
]
