"""Tests of aitoolbox_like.results: numbers checked against scikit-learn called directly."""

import functools
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from sklearn import metrics as skm

from aitoolbox_like.results import (
    AbstractBaseMetric, AbstractResultPackage, AccuracyMetric, BinaryClassificationResultPackage,
    ClassificationResultPackage, F1ScoreMetric, GeneralResultPackage, MeanAbsoluteErrorMetric,
    MeanSquaredErrorMetric, MultipleResultPackageWrapper, PrecisionMetric, PrecisionRecallCurveAUCMetric,
    PreCalculatedResultPackage, R2ScoreMetric, RecallMetric, RegressionResultPackage, ROCAUCMetric,
    TorchMetricsPackage,
)

# Hand-made binary data: probabilities of the positive class, one of them exactly on the threshold.
Y_BIN = np.array([0, 0, 1, 1, 1, 0, 1, 0, 1, 1])
P_BIN = np.array([0.1, 0.6, 0.8, 0.4, 0.9, 0.2, 0.5, 0.3, 0.7, 0.35])
L_BIN = (P_BIN >= 0.5).astype(int)  # [0 1 1 0 1 0 1 0 1 0]

# Multi-class data: 3 classes, per-class logits.
Y_MC = np.array([0, 1, 2, 2, 1, 0, 2, 1])
LOGITS_MC = np.array([[2.0, 0.1, -1.0],
                      [0.3, 1.5, 0.2],
                      [0.1, 0.2, 3.0],
                      [1.0, 0.5, 0.2],   # wrong: predicts 0
                      [0.0, 2.0, 1.0],
                      [0.2, 0.9, 0.1],   # wrong: predicts 1
                      [-1.0, 0.0, 0.5],
                      [0.1, 0.4, 0.3]])

Y_REG = np.array([3.0, -0.5, 2.0, 7.0, 4.2])
P_REG = np.array([2.5, 0.0, 2.1, 7.8, 3.9])


class CountingPackage(AbstractResultPackage):
    def __init__(self, **kwargs):
        super().__init__(pkg_name='Counting', **kwargs)
        self.calls = 0

    def prepare_results_dict(self):
        self.calls += 1
        return {'n': len(self.y_true), 'mean_pred': np.mean(self.y_predicted)}


class EmptyPackage(AbstractResultPackage):
    def prepare_results_dict(self):
        return {}


# ------------------------------------------------------------------------------------------------
# Packages vs sklearn
# ------------------------------------------------------------------------------------------------

def test_binary_classification_package_matches_sklearn():
    pkg = BinaryClassificationResultPackage()
    pkg.prepare_result_package(Y_BIN, P_BIN)
    res = pkg.get_results()

    precision, recall, _ = skm.precision_recall_curve(Y_BIN, P_BIN)
    expected = {
        'Accuracy': skm.accuracy_score(Y_BIN, L_BIN),
        'ROC_AUC': skm.roc_auc_score(Y_BIN, P_BIN),
        'PrecisionRecall_AUC': skm.auc(recall, precision),
        'F1_score': skm.f1_score(Y_BIN, L_BIN),
        'Precision': skm.precision_score(Y_BIN, L_BIN),
        'Recall': skm.recall_score(Y_BIN, L_BIN),
    }
    assert list(res) == list(expected)
    for name, value in expected.items():
        assert res[name] == pytest.approx(value), name
        assert type(res[name]) is float, name
    json.dumps(res)  # plain Python values


def test_binary_threshold_is_inclusive_for_all_label_metrics():
    # p == thresh counts as positive for accuracy AND F1/precision/recall (AIToolbox used > for F1)
    y = np.array([1, 0, 1, 0])
    p = np.array([0.5, 0.2, 0.9, 0.7])
    pkg = BinaryClassificationResultPackage(positive_class_thresh=0.5)
    pkg.prepare_result_package(y, p)
    res = pkg.get_results()
    labels = np.array([1, 0, 1, 1])
    assert res['Accuracy'] == pytest.approx(0.75)
    assert res['Recall'] == pytest.approx(skm.recall_score(y, labels)) == pytest.approx(1.0)
    assert res['Precision'] == pytest.approx(skm.precision_score(y, labels))
    assert res['F1_score'] == pytest.approx(skm.f1_score(y, labels))


def test_binary_custom_threshold_none_threshold_and_input_shapes():
    pkg = BinaryClassificationResultPackage(positive_class_thresh=0.75)
    pkg.prepare_result_package(torch.tensor(Y_BIN, dtype=torch.float32).unsqueeze(1),
                               torch.tensor(P_BIN).unsqueeze(1))
    labels = (P_BIN >= 0.75).astype(int)
    assert pkg.get_results()['F1_score'] == pytest.approx(skm.f1_score(Y_BIN, labels))
    assert pkg.get_results()['ROC_AUC'] == pytest.approx(skm.roc_auc_score(Y_BIN, P_BIN))

    # (n, 2) class probabilities: the positive-class column is used
    two_col = np.stack([1 - P_BIN, P_BIN], axis=1)
    pkg = BinaryClassificationResultPackage()
    pkg.prepare_result_package(Y_BIN.tolist(), two_col)
    assert pkg.get_results()['ROC_AUC'] == pytest.approx(skm.roc_auc_score(Y_BIN, P_BIN))
    assert pkg.get_results()['Accuracy'] == pytest.approx(skm.accuracy_score(Y_BIN, L_BIN))

    # positive_class_thresh=None: predictions are used as given (already labels)
    pkg = BinaryClassificationResultPackage(positive_class_thresh=None)
    pkg.prepare_result_package(Y_BIN, L_BIN)
    res = pkg.get_results()
    assert res['Accuracy'] == pytest.approx(skm.accuracy_score(Y_BIN, L_BIN))
    assert res['ROC_AUC'] == pytest.approx(skm.roc_auc_score(Y_BIN, L_BIN))


def test_classification_package_indices_and_logits():
    pred_idx = LOGITS_MC.argmax(axis=1)
    expected = skm.accuracy_score(Y_MC, pred_idx)
    assert expected == pytest.approx(6 / 8)

    pkg = ClassificationResultPackage()
    pkg.prepare_result_package(Y_MC, LOGITS_MC)
    assert pkg.get_results() == {'Accuracy': pytest.approx(expected)}

    pkg.prepare_result_package(torch.tensor(Y_MC), torch.tensor(pred_idx))
    assert pkg.get_results()['Accuracy'] == pytest.approx(expected)

    one_hot = np.eye(3)[Y_MC]
    pkg.prepare_result_package(one_hot, LOGITS_MC)
    assert pkg.get_results()['Accuracy'] == pytest.approx(expected)


def test_classification_package_rejects_probabilities_without_threshold():
    pkg = ClassificationResultPackage()
    pkg.prepare_result_package(Y_BIN, P_BIN)
    with pytest.raises(ValueError, match='non-integer'):
        pkg.get_results()


def test_regression_package_matches_sklearn():
    pkg = RegressionResultPackage()
    pkg.prepare_result_package(Y_REG, P_REG.reshape(-1, 1))  # (n,) vs (n, 1) is fine
    res = pkg.get_results()
    assert res == {
        'Mean_squared_error': pytest.approx(skm.mean_squared_error(Y_REG, P_REG)),
        'Mean_absolute_error': pytest.approx(skm.mean_absolute_error(Y_REG, P_REG)),
        'R2_score': pytest.approx(skm.r2_score(Y_REG, P_REG)),
    }
    assert all(type(v) is float for v in res.values())


def test_general_result_package_runs_metric_classes_and_callables():
    macro_f1 = functools.partial(F1ScoreMetric, positive_class_thresh=None, average='macro', metric_name='F1_macro')

    def n_examples(y_true, y_predicted):
        return np.int64(len(y_true))

    pkg = GeneralResultPackage([AccuracyMetric, macro_f1, n_examples])
    pkg.prepare_result_package(Y_MC, LOGITS_MC)
    res = pkg.get_results()
    pred_idx = LOGITS_MC.argmax(axis=1)
    assert res['Accuracy'] == pytest.approx(skm.accuracy_score(Y_MC, pred_idx))
    assert res['F1_macro'] == pytest.approx(skm.f1_score(Y_MC, pred_idx, average='macro'))
    assert res['n_examples'] == 8 and type(res['n_examples']) is int


def test_general_result_package_bad_metrics_list():
    with pytest.raises(TypeError, match='pass the metric class'):
        GeneralResultPackage([AccuracyMetric(Y_BIN, L_BIN)])
    with pytest.raises(TypeError, match='callables'):
        GeneralResultPackage(['Accuracy'])
    with pytest.warns(UserWarning, match='empty'):
        GeneralResultPackage([])
    with pytest.raises(ValueError, match='empty'):
        GeneralResultPackage([], strict_content_check=True)

    pkg = GeneralResultPackage([AccuracyMetric, AccuracyMetric])
    pkg.prepare_result_package(Y_BIN, P_BIN)
    with pytest.raises(ValueError, match='computed twice'):
        pkg.get_results()


# ------------------------------------------------------------------------------------------------
# Metrics
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('metric_cls, sk_fn, name', [
    (F1ScoreMetric, skm.f1_score, 'F1_score'),
    (PrecisionMetric, skm.precision_score, 'Precision'),
    (RecallMetric, skm.recall_score, 'Recall'),
])
def test_thresholded_metrics(metric_cls, sk_fn, name):
    m = metric_cls(Y_BIN, P_BIN)
    assert m.get_metric_dict() == {name: pytest.approx(sk_fn(Y_BIN, L_BIN))}
    assert metric_cls(Y_BIN, L_BIN, positive_class_thresh=None).get_metric() == pytest.approx(sk_fn(Y_BIN, L_BIN))


def test_metric_objects_api():
    acc = AccuracyMetric(Y_BIN, P_BIN)
    roc = ROCAUCMetric(Y_BIN, P_BIN)
    assert type(acc.get_metric()) is float and len(acc) == 1
    assert str(acc) == f'Accuracy: {acc.get_metric()}'
    assert acc + roc == {'Accuracy': acc.get_metric(), 'ROC_AUC': roc.get_metric()}
    assert {'x': 1} + acc == {'x': 1, 'Accuracy': acc.get_metric()}
    assert (acc < roc) == (acc.get_metric() < roc.get_metric())
    assert acc >= 0.0 and 'Accuracy' in acc and acc['Accuracy'] == acc.get_metric()
    assert AccuracyMetric(Y_BIN, P_BIN, metric_name='acc').get_metric_dict() == {'acc': acc.get_metric()}
    precision, recall, _ = skm.precision_recall_curve(Y_BIN, P_BIN)
    assert PrecisionRecallCurveAUCMetric(Y_BIN, P_BIN).get_metric() == pytest.approx(skm.auc(recall, precision))
    assert MeanSquaredErrorMetric(Y_REG, P_REG).get_metric() == pytest.approx(skm.mean_squared_error(Y_REG, P_REG))
    assert MeanAbsoluteErrorMetric(Y_REG, P_REG).get_metric() == pytest.approx(skm.mean_absolute_error(Y_REG, P_REG))
    assert R2ScoreMetric(Y_REG, P_REG).get_metric() == pytest.approx(skm.r2_score(Y_REG, P_REG))


def test_custom_metric_subclass():
    class MaxError(AbstractBaseMetric):
        DEFAULT_METRIC_NAME = 'Max_error'

        def calculate_metric(self):
            return np.max(np.abs(self.y_true - self.y_predicted))

    m = MaxError(Y_REG, P_REG)
    assert m.get_metric_dict() == {'Max_error': pytest.approx(skm.max_error(Y_REG, P_REG))}
    assert type(m.get_metric()) is float


def test_logits_given_to_threshold_raise():
    with pytest.raises(ValueError, match='sigmoid'):
        AccuracyMetric(Y_BIN, P_BIN * 6 - 3)


def test_auc_with_one_class_raises():
    with pytest.raises(ValueError, match='only one class'):
        ROCAUCMetric(np.ones(4), [0.2, 0.6, 0.7, 0.9])
    with pytest.raises(ValueError, match='only one class'):
        PrecisionRecallCurveAUCMetric(np.zeros(4), [0.2, 0.6, 0.7, 0.9])


# ------------------------------------------------------------------------------------------------
# Base package behaviour: caching, bad input, strict content check, combination
# ------------------------------------------------------------------------------------------------

def test_results_are_computed_lazily_once_and_recomputed_after_new_data():
    pkg = CountingPackage()
    pkg.prepare_result_package([1, 2, 3], np.array([1.0, 2.0, 4.0]), hyperparameters={'lr': 0.1})
    assert pkg.calls == 0
    first = pkg.get_results()
    assert first == {'n': 3, 'mean_pred': pytest.approx(7 / 3)}
    assert type(first['mean_pred']) is float
    first['n'] = 'mutated'
    assert pkg.get_results()['n'] == 3  # the cache is not the returned dict
    assert pkg.calls == 1
    assert len(pkg) == 2 and 'n' in pkg and pkg['n'] == 3

    pkg.prepare_result_package([1, 2], [5.0, 5.0])
    assert pkg.get_results() == {'n': 2, 'mean_pred': 5.0}
    assert pkg.calls == 2


def test_inputs_are_numpy_arrays():
    pkg = CountingPackage()
    pkg.prepare_result_package(torch.tensor([1, 0, 1]), [0.2, 0.4, 0.9])
    assert isinstance(pkg.y_true, np.ndarray) and isinstance(pkg.y_predicted, np.ndarray)
    pkg = CountingPackage(np_array=False)
    pkg.prepare_result_package([1, 0, 1], [0.2, 0.4, 0.9])
    assert pkg.y_true == [1, 0, 1]
    pkg = CountingPackage(np_array='auto')
    pkg.prepare_result_package([1, 0, 1], [[1, 2], [3], [4, 5, 6]])
    assert isinstance(pkg.y_true, np.ndarray) and isinstance(pkg.y_predicted, list)


@pytest.mark.parametrize('y_true, y_pred, match', [
    ([1, 0, 1], [1, 0], '3 examples but y_predicted has 2'),
    ([], [], 'at least one example'),
    (np.array(1), [1], 'scalar'),
])
def test_bad_input_raises_value_error(y_true, y_pred, match):
    with pytest.raises(ValueError, match=match):
        ClassificationResultPackage().prepare_result_package(y_true, y_pred)
    with pytest.raises(ValueError, match=match):
        AccuracyMetric(y_true, y_pred)


def test_missing_and_empty_results_warn_or_raise():
    with pytest.warns(UserWarning, match='prepare_result_package'):
        assert ClassificationResultPackage().get_results() is None
    with pytest.raises(ValueError, match='prepare_result_package'):
        ClassificationResultPackage(strict_content_check=True).get_results()

    empty = EmptyPackage()
    empty.prepare_result_package([1], [1])
    with pytest.warns(UserWarning, match='empty results'):
        assert empty.get_results() == {}
    strict_empty = EmptyPackage(strict_content_check=True)
    strict_empty.prepare_result_package([1], [1])
    with pytest.raises(ValueError, match='empty results'):
        strict_empty.get_results()

    with pytest.raises(ValueError, match='no results yet'):
        len(ClassificationResultPackage())
    assert 'not prepared' in str(ClassificationResultPackage())


def test_hyperparameters_check():
    pkg = ClassificationResultPackage()
    pkg.prepare_result_package([0, 1], [0, 1])
    with pytest.warns(UserWarning, match='Hyperparameters missing'):
        assert pkg.get_hyperparameters() is None
    hp = {'bash_script_path': 'run.sh', 'python_experiment_file_path': 'exp.py', 'lr': 0.1}
    pkg.prepare_result_package([0, 1], [0, 1], hyperparameters=hp)
    assert pkg.get_hyperparameters() == hp


def test_additional_results_dump_paths():
    class WithFiles(CountingPackage):
        def list_additional_results_dump_paths(self):
            return [['plot.png', '/tmp/plot.png']]

    assert ClassificationResultPackage().get_additional_results_dump_paths() is None
    pkg = WithFiles()
    pkg.prepare_result_package([1], [1.0])
    assert pkg.get_additional_results_dump_paths() == [['plot.png', '/tmp/plot.png']]

    other = WithFiles()
    other.prepare_result_package([2], [2.0])
    combined = pkg + other
    for _ in range(2):  # repeated calls must not grow the list
        assert combined.get_additional_results_dump_paths() == [['plot.png', '/tmp/plot.png']] * 2

    class BadFiles(CountingPackage):
        def list_additional_results_dump_paths(self):
            return ['plot.png']

    with pytest.raises(ValueError, match='not a list'):
        BadFiles().get_additional_results_dump_paths()


def test_add_nests_each_package_s_results_under_its_name_as_aitoolbox():
    cls_pkg = ClassificationResultPackage()
    cls_pkg.prepare_result_package(Y_MC, LOGITS_MC)
    bin_pkg = BinaryClassificationResultPackage()
    bin_pkg.prepare_result_package(Y_BIN, P_BIN)
    reg_pkg = RegressionResultPackage()
    reg_pkg.prepare_result_package(Y_REG, P_REG)

    combined = cls_pkg + bin_pkg + reg_pkg
    assert isinstance(combined, MultipleResultPackageWrapper)
    res = combined.get_results()
    assert set(res) == {'ClassificationResult', 'BinaryClassificationResult', 'RegressionResult'}
    assert res['ClassificationResult']['Accuracy'] == pytest.approx(6 / 8)
    assert res['BinaryClassificationResult']['Accuracy'] == pytest.approx(skm.accuracy_score(Y_BIN, L_BIN))
    assert res['BinaryClassificationResult']['ROC_AUC'] == pytest.approx(skm.roc_auc_score(Y_BIN, P_BIN))
    assert res['RegressionResult']['R2_score'] == pytest.approx(skm.r2_score(Y_REG, P_REG))
    assert [len(v) for v in res.values()] == [1, 6, 3] and len(combined) == 3
    assert '--> RegressionResult' in str(combined)

    # the combination is a snapshot: re-preparing the original does not change it
    cls_pkg.prepare_result_package(Y_MC, Y_MC)
    assert combined.get_results()['ClassificationResult']['Accuracy'] == pytest.approx(6 / 8)

    # same package type twice, dicts and sum()
    cls_pkg2 = ClassificationResultPackage()
    cls_pkg2.prepare_result_package(Y_MC, Y_MC)
    res2 = (cls_pkg + cls_pkg2).get_results()
    assert res2 == {'ClassificationResult': {'Accuracy': 1.0}, 'ClassificationResult1': {'Accuracy': 1.0}}
    with_dict = (cls_pkg + {'epoch_time': 3.5}).get_results()
    assert list(with_dict.values()) == [{'Accuracy': 1.0}, {'epoch_time': 3.5}]
    # dict + package: the package first, then the dict, as AIToolbox's __radd__ ordered them
    assert list(({'epoch_time': 3.5} + cls_pkg).get_results().values()) == [{'Accuracy': 1.0}, {'epoch_time': 3.5}]
    assert sum([cls_pkg, reg_pkg]).get_results()['RegressionResult']['Mean_absolute_error'] == pytest.approx(
        skm.mean_absolute_error(Y_REG, P_REG))
    with pytest.raises(TypeError):
        cls_pkg + 'Accuracy'
    with pytest.raises(ValueError, match='no results yet'):
        cls_pkg + ClassificationResultPackage()


def test_iadd_merges_in_place_and_rejects_duplicates():
    pkg = RegressionResultPackage()
    pkg.prepare_result_package(Y_REG, P_REG)
    pkg += {'extra': np.float32(2.0)}
    assert pkg.get_results()['extra'] == 2.0 and type(pkg.get_results()['extra']) is float
    with pytest.raises(ValueError, match='Duplicated'):
        pkg += {'R2_score': 0.0}

    pre = PreCalculatedResultPackage({'a': np.int64(1)})
    assert pre.get_results() == {'a': 1} and type(pre.get_results()['a']) is int


# ------------------------------------------------------------------------------------------------
# torchmetrics
# ------------------------------------------------------------------------------------------------

def test_torchmetrics_package_reused_gives_independent_results():
    from torchmetrics.classification import MulticlassAccuracy

    pkg = TorchMetricsPackage(MulticlassAccuracy(num_classes=3, average='micro'))
    pkg.prepare_result_package(torch.tensor(Y_MC), torch.tensor(LOGITS_MC, dtype=torch.float32))
    first = pkg.get_results()
    assert first == {'MulticlassAccuracy_PTLMetrics': pytest.approx(6 / 8)}
    assert type(first['MulticlassAccuracy_PTLMetrics']) is float

    # second "epoch": all correct; must not be averaged with the first one
    pkg.prepare_result_package(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2]))
    assert pkg.get_results() == {'MulticlassAccuracy_PTLMetrics': pytest.approx(1.0)}
    pkg.prepare_result_package(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 1, 0, 2]))
    assert pkg.get_results() == {'MulticlassAccuracy_PTLMetrics': pytest.approx(0.5)}
    json.dumps(pkg.get_results())


def test_torchmetrics_package_collection_dict_and_non_scalar():
    from torchmetrics import MetricCollection
    from torchmetrics.classification import BinaryF1Score, MulticlassAccuracy, MulticlassConfusionMatrix

    pkg = TorchMetricsPackage({'acc': MulticlassAccuracy(num_classes=3, average='micro'),
                               'cm': MulticlassConfusionMatrix(num_classes=3)})
    pkg.prepare_result_package(Y_MC, LOGITS_MC.astype(np.float32))  # numpy input is accepted too
    res = pkg.get_results()
    assert res['acc_PTLMetrics'] == pytest.approx(6 / 8)
    assert res['cm_PTLMetrics'] == skm.confusion_matrix(Y_MC, LOGITS_MC.argmax(axis=1)).tolist()
    json.dumps(res)

    coll = TorchMetricsPackage(MetricCollection([BinaryF1Score()]))
    coll.prepare_result_package(torch.tensor(Y_BIN), torch.tensor(P_BIN, dtype=torch.float32))
    # torchmetrics thresholds with p > 0.5 (the 0.5 prediction is negative), unlike our p >= thresh
    expected_f1 = skm.f1_score(Y_BIN, (P_BIN > 0.5).astype(int))
    assert expected_f1 != pytest.approx(skm.f1_score(Y_BIN, L_BIN))
    assert coll.get_results() == {'BinaryF1Score_PTLMetrics': pytest.approx(expected_f1)}

    with pytest.raises(TypeError, match='torchmetrics'):
        TorchMetricsPackage(skm.accuracy_score)
    with pytest.raises(ValueError, match='y_predicted has 2'):
        coll.prepare_result_package(torch.tensor([1, 0, 1]), torch.tensor([0.2, 0.9]))


def test_import_is_light():
    code = ('import sys, aitoolbox_like.results; '
            'print(sorted(m for m in ("sklearn", "torchmetrics") if m in sys.modules))')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == '[]'
