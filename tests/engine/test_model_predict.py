"""PyTorchModelPredictor on a trained model: predictions equal model(x) in eval mode, the loss equals the
hand-computed mean over samples, metrics and result packages match a hand computation, callbacks run, and
evaluate_model writes (and uploads) the experiment results."""
import logging
import os
import pickle

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from aitoolbox_like import AbstractCallback, ModelWrap, TTModel
from aitoolbox_like.results.reporting import matplotlib_available
from aitoolbox_like.model import AbstractModelFeedDefinition
from aitoolbox_like.model_predict import PyTorchModelPredictor
from aitoolbox_like.model.multi_loss_optim import MultiLoss
from aitoolbox_like.results.abstract import AbstractResultPackage
from aitoolbox_like.results.basic import ClassificationResultPackage
from aitoolbox_like.results.metrics import AccuracyMetric
from helpers import MLP, PlainMLP, classification_data

from s3_server import make_bucket, s3_server  # noqa: F401  (pytest fixture)

N = 17          # with batches of 8 the last batch has 1 sample, which a plain mean of batch losses would overweight


@pytest.fixture
def data():
    dataset = classification_data(N, seed=5)
    return dataset, DataLoader(dataset, batch_size=8)


@pytest.fixture
def model():
    torch.manual_seed(0)
    return MLP(dropout=0.5)      # dropout: predictions are only reproducible in eval mode


def eval_output(model, dataset):
    x, _ = dataset.tensors
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model(x)
    model.train(was_training)
    return out


def test_predictions_are_the_eval_mode_model_output_in_data_order(model, data):
    dataset, loader = data
    model.train()
    y_pred, y_true, metadata = PyTorchModelPredictor(model, loader).model_predict()
    torch.testing.assert_close(y_pred, eval_output(model, dataset))
    assert torch.equal(y_true, dataset.tensors[1])
    assert metadata == {}          # TTBasicModel's metadata, as in AIToolbox
    assert model.training          # the user's mode is restored


def test_every_call_predicts_with_the_current_weights(model, data):
    dataset, loader = data
    predictor = PyTorchModelPredictor(model, loader)
    first, _, _ = predictor.model_predict()
    with torch.no_grad():
        model.net[-1].bias.add_(1.0)
    second, _, _ = predictor.model_predict()
    torch.testing.assert_close(second, first + 1.0)
    torch.testing.assert_close(second, eval_output(model, dataset))


def batch_mean(loss_of_batch, loader):
    """AIToolbox's evaluated loss: the float64 mean of the per-batch mean losses."""
    with torch.no_grad():
        return torch.mean(torch.DoubleTensor([loss_of_batch(x, y) for x, y in loader]))


def test_loss_is_aitoolbox_s_mean_of_batch_means(model, data):
    dataset, loader = data
    loss = PyTorchModelPredictor(model, loader).model_get_loss(nn.CrossEntropyLoss())
    model.eval()
    expected = batch_mean(lambda x, y: nn.functional.cross_entropy(model(x), y), loader)
    assert loss.dim() == 0
    torch.testing.assert_close(loss, expected)


class TwoLossModel(TTModel):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(6, 3)

    def forward(self, x):
        return self.net(x)

    def get_loss(self, batch_data, criterion, device):
        x, y = batch_data
        out = self(x)
        return MultiLoss({'ce': criterion(out, y), 'l2': out.pow(2).mean()})

    def get_predictions(self, batch_data, device):
        x, y = batch_data
        return self(x), y, {'batch_sizes': [len(x)] * len(x)}


def test_multi_loss_and_metadata_come_back_per_loss_and_merged(data):
    dataset, loader = data
    torch.manual_seed(0)
    model = TwoLossModel()
    predictor = PyTorchModelPredictor(model, loader)
    loss = predictor.model_get_loss(nn.CrossEntropyLoss())
    torch.testing.assert_close(loss['ce'], batch_mean(lambda x, y: nn.functional.cross_entropy(model(x), y), loader))
    torch.testing.assert_close(loss['l2'], batch_mean(lambda x, y: model(x).pow(2).mean(), loader))
    _, _, metadata = predictor.model_predict()
    assert metadata == {'batch_sizes': [8] * 8 + [8] * 8 + [1]}


class Feed(AbstractModelFeedDefinition):
    def get_loss(self, model, batch_data, criterion, device):
        x, y = batch_data
        return criterion(model(x), y)

    def get_predictions(self, model, batch_data, device):
        x, y = batch_data
        return model(x), y, None


def test_model_wrap_is_supported(data):
    dataset, loader = data
    torch.manual_seed(0)
    net = PlainMLP()
    predictor = PyTorchModelPredictor(ModelWrap(net, Feed()), loader)
    y_pred, _, _ = predictor.model_predict()
    torch.testing.assert_close(y_pred, eval_output(net, dataset))
    net.eval()
    torch.testing.assert_close(predictor.model_get_loss(nn.CrossEntropyLoss()),
                               batch_mean(lambda x, y: nn.functional.cross_entropy(net(x), y), loader))


def manual_accuracy(model, dataset):
    return (eval_output(model, dataset).argmax(dim=1) == dataset.tensors[1]).double().mean().item()


def test_result_package_and_metrics_match_a_hand_computed_accuracy(model, data):
    dataset, loader = data
    predictor = PyTorchModelPredictor(model, loader)
    expected = manual_accuracy(model, dataset)

    package = ClassificationResultPackage()
    assert predictor.evaluate_result_package(package) is package
    assert package.get_results()['Accuracy'] == pytest.approx(expected)
    assert predictor.evaluate_result_package(ClassificationResultPackage(), return_result_package=False) == \
        {'Accuracy': pytest.approx(expected)}

    def accuracy(y_true, y_pred):
        return AccuracyMetric(y_true, y_pred, positive_class_thresh=None)

    metric = predictor.evaluate_metric(accuracy)
    assert metric.get_metric() == pytest.approx(expected)
    assert predictor.evaluate_metric(accuracy, return_metric=False) == {'Accuracy': pytest.approx(expected)}

    def accuracy_named(y_true, y_pred):
        return AccuracyMetric(y_true, y_pred, positive_class_thresh=None, metric_name='acc2')

    metrics = predictor.evaluate_metric_list([accuracy, accuracy_named])
    assert [m.get_metric() for m in metrics] == [pytest.approx(expected)] * 2
    assert predictor.evaluate_metric_list([accuracy, accuracy_named], return_metric_list=False) == \
        {'Accuracy': pytest.approx(expected), 'acc2': pytest.approx(expected)}


class LossPackage(AbstractResultPackage):
    def __init__(self):
        super().__init__(pkg_name='loss package')
        self.requires_loss = True

    def prepare_results_dict(self):
        return {'loss': self.additional_results['additional_results']['loss']}


def test_a_package_requiring_the_loss_gets_the_criterions_loss(model, data):
    dataset, loader = data
    predictor = PyTorchModelPredictor(model, loader)
    with pytest.raises(ValueError, match='model_get_loss'):
        predictor.evaluate_result_package(LossPackage())
    loss = predictor.model_get_loss(nn.CrossEntropyLoss()).item()
    assert predictor.evaluate_result_package(LossPackage(), return_result_package=False) == \
        {'loss': pytest.approx(loss)}


class Recorder(AbstractCallback):
    def __init__(self):
        super().__init__('recorder')
        self.batches, self.epoch_ends, self.batch_ends = [], 0, 0

    def on_after_batch_prediction(self, y_pred_batch, y_test_batch, metadata_batch, dataset_info):
        self.batches.append((len(y_pred_batch), dataset_info))

    def on_epoch_end(self):
        self.epoch_ends += 1

    def on_batch_end(self):
        self.batch_ends += 1


def test_callbacks_see_each_predicted_batch_and_run_on_demand(model, data):
    _, loader = data
    recorder = Recorder()
    predictor = PyTorchModelPredictor(model, loader, callbacks=[recorder])
    assert recorder.train_loop_obj is predictor.train_loop
    predictor.model_predict()
    assert recorder.batches == [(8, {'type': 'test'}), (8, {'type': 'test'}), (1, {'type': 'test'})]
    predictor.execute_epoch_end_callbacks()
    predictor.execute_batch_end_callbacks()
    assert (recorder.epoch_ends, recorder.batch_ends) == (1, 1)


def test_running_callbacks_without_any_logs_a_warning(model, data, caplog):
    predictor = PyTorchModelPredictor(model, data[1])
    with caplog.at_level(logging.WARNING, logger='aitoolbox_like.model_predict'):
        predictor.execute_epoch_end_callbacks()
        predictor.execute_batch_end_callbacks()
    assert len([r for r in caplog.records if 'no callbacks' in r.message]) == 2


def _results_file(paths):
    return next(p for p in paths if os.path.basename(p).startswith('results_hyperParams_hist_'))


def test_evaluate_model_saves_results_and_labels_locally(model, data, tmp_path):
    dataset, loader = data
    predictor = PyTorchModelPredictor(model, loader)
    paths = predictor.evaluate_model(ClassificationResultPackage(), 'proj', 'exp', str(tmp_path),
                                     cloud_save_mode='local', save_true_pred_labels=True)
    timestamp = predictor.train_loop.experiment_timestamp
    results_dir = tmp_path / 'proj' / f'exp_{timestamp}' / 'results'
    # AIToolbox's results pickle, the labels inside it; plots/ is created, but a metric with one value has no plot.
    assert paths == [str(results_dir / f'results_hyperParams_hist_exp_{timestamp}.p')]
    assert sorted(os.listdir(results_dir)) == sorted([f'results_hyperParams_hist_exp_{timestamp}.p'] +
                                                      (['plots'] if matplotlib_available() else []))
    with open(_results_file(paths), 'rb') as f:
        saved = pickle.load(f)
    assert list(saved) == ['y_true', 'y_predicted', 'experiment_name', 'experiment_results_local_path', 'results',
                           'hyperparameters', 'training_history']
    expected = manual_accuracy(model, dataset)
    assert saved['experiment_name'] == 'exp' and saved['experiment_results_local_path'] == str(results_dir)
    assert saved['results'] == {'Accuracy': pytest.approx(expected)}
    assert saved['training_history']['Accuracy'] == [pytest.approx(expected)]
    assert np.array_equal(np.asarray(saved['y_true']), dataset.tensors[1].numpy())
    # float32 outputs of batched and whole-set forwards differ in the last bits (BLAS blocking): a relative
    # tolerance alone fails on outputs near zero.
    np.testing.assert_allclose(np.asarray(saved['y_predicted']), eval_output(model, dataset).numpy(), rtol=1e-6,
                               atol=1e-6)

    # A second evaluation of the same experiment does not overwrite the first.
    again = predictor.evaluate_model(ClassificationResultPackage(), 'proj', 'exp', str(tmp_path),
                                     cloud_save_mode=None)
    third = predictor.evaluate_model(ClassificationResultPackage(), 'proj', 'exp', str(tmp_path),
                                     cloud_save_mode=None)
    folders = [os.path.basename(os.path.dirname(os.path.dirname(p[0]))) for p in (paths, again, third)]
    assert folders == [f'exp_{timestamp}', f'exp_{timestamp}_1', f'exp_{timestamp}_2']
    assert os.path.isfile(_results_file(paths)) and os.path.isfile(again[0]) and os.path.isfile(third[0])


def test_evaluate_model_refuses_an_unknown_cloud_save_mode_before_predicting(model, data, tmp_path):
    recorder = Recorder()
    predictor = PyTorchModelPredictor(model, data[1], callbacks=[recorder])
    with pytest.raises(ValueError, match='cloud_save_mode must be one of'):
        predictor.evaluate_model(ClassificationResultPackage(), 'proj', 'exp', str(tmp_path), cloud_save_mode='gc')
    assert recorder.batches == [] and not (tmp_path / 'proj').exists()


def test_evaluate_model_uploads_to_s3(model, data, tmp_path, s3_server):
    bucket = make_bucket(s3_server)
    predictor = PyTorchModelPredictor(model, data[1])
    paths = predictor.evaluate_model(ClassificationResultPackage(), 'proj', 'exp', str(tmp_path),
                                     cloud_save_mode='s3', bucket_name=bucket, cloud_dir_prefix='runs',
                                     endpoint_url=s3_server.endpoint_url)
    folder = f'exp_{predictor.train_loop.experiment_timestamp}'
    key = f'runs/proj/{folder}/results/{os.path.basename(_results_file(paths))}'
    body = s3_server.client().get_object(Bucket=bucket, Key=key)['Body'].read()
    with open(_results_file(paths), 'rb') as f:
        assert body == f.read()
