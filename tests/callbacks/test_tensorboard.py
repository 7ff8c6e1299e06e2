import glob
import os

import pytest
import torch

from aitoolbox_like import TrainLoop
from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.callbacks.performance_eval import ModelPerformanceEvaluation
from aitoolbox_like.callbacks.tensorboard import (TensorboardFullTracking, TensorboardHyperparameters,
                                                  TensorboardLearningRate, TensorboardModelGraph,
                                                  TensorboardParameterHistograms, TensorboardTrainBatchLoss,
                                                  TensorboardTrainHistoryMetric)
from aitoolbox_like.results import ClassificationResultPackage
from helpers import MLP, loaders

pytest.importorskip('tensorboard')
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def make_loop(**kwargs):
    torch.manual_seed(0)
    train, val, test = loaders()      # 53 train samples, batch 8: 7 batches per epoch
    model = MLP()
    return TrainLoop(model, train, val, test, torch.optim.SGD(model.parameters(), lr=0.1),
                     torch.nn.CrossEntropyLoss(), progress_bar=False, **kwargs)


def read_events(log_dir):
    acc = EventAccumulator(log_dir, size_guidance={'scalars': 0, 'histograms': 0, 'tensors': 0})
    acc.Reload()
    return acc


def scalars(acc, tag):
    events = acc.Scalars(tag)
    return [e.step for e in events], [e.value for e in events]


class RecordBatchLosses(AbstractCallback):
    """Keeps every per-batch loss the loop recorded, per epoch (read after the epoch, in the test only)."""

    def __init__(self):
        super().__init__('record losses', execution_order=200)
        self.epochs = []

    def on_epoch_end(self):
        self.epochs.append([loss.item() for loss in self.train_loop_obj.loss_batch_accum])


def test_full_tracking_writes_batch_losses_history_and_learning_rate():
    loop = make_loop()
    tb = TensorboardFullTracking(batch_sync_frequency=3)
    recorder = RecordBatchLosses()
    loop.fit(num_epochs=2, callbacks=[ModelPerformanceEvaluation(ClassificationResultPackage(), {}), tb, recorder])
    assert tb.log_dir.endswith(os.path.join('tensorboard', 'default_project_experiment'))
    assert glob.glob(os.path.join('experiments', 'default_project', 'experiment_*', 'tensorboard',
                                  'default_project_experiment', 'events.out.tfevents.*'))
    acc = read_events(tb.log_dir)

    steps, values = scalars(acc, 'train_loss/last_batch_loss')
    all_losses = [v for epoch in recorder.epochs for v in epoch]
    assert steps == list(range(14))
    assert values == pytest.approx(all_losses, rel=1e-6)
    _, running = scalars(acc, 'train_loss/accumulated_batch_loss')
    expected_running = [sum(epoch[:i + 1]) / (i + 1) for epoch in recorder.epochs for i in range(len(epoch))]
    assert running == pytest.approx(expected_running, rel=1e-6)

    history = loop.train_history
    for tag, name in (('loss/val_loss', 'val_loss'), ('loss/accumulated_loss', 'accumulated_loss'),
                      ('metrics/val_Accuracy', 'val_Accuracy')):
        steps, values = scalars(acc, tag)
        assert steps == [0, 1] and values == pytest.approx(history[name], rel=1e-6)
    assert scalars(acc, 'metrics/train_end_val_Accuracy')[1] == pytest.approx(history['train_end_val_Accuracy'])
    assert scalars(acc, 'learning_rate/group_0') == ([0, 1], [pytest.approx(0.1)] * 2)


def test_batch_loss_every_k_steps_and_metrics_only_when_computed(tmp_path):
    loop = make_loop(end_auto_eval=2)
    batch_loss = TensorboardTrainBatchLoss(batch_log_frequency=3, log_dir=str(tmp_path / 'tb'), is_project=False)
    history_cb = TensorboardTrainHistoryMetric(metric_names=['val_loss', 'val_Accuracy'],
                                               log_dir=str(tmp_path / 'tb'), is_project=False)
    recorder = RecordBatchLosses()
    loop.fit(num_epochs=3, callbacks=[ModelPerformanceEvaluation(ClassificationResultPackage(), {}, eval_frequency=2),
                                      batch_loss, history_cb, recorder])
    acc = read_events(str(tmp_path / 'tb'))
    all_losses = [v for epoch in recorder.epochs for v in epoch]
    steps, values = scalars(acc, 'train_loss/last_batch_loss')
    assert steps == list(range(0, 21, 3))
    assert values == pytest.approx(all_losses[::3], rel=1e-6)
    # computed in epochs 0 and 2 only: no stale repeat at epoch 1 (AIToolbox wrote the old value again)
    assert scalars(acc, 'metrics/val_Accuracy') == ([0, 2], pytest.approx(loop.train_history['val_Accuracy']))
    assert scalars(acc, 'loss/val_loss') == ([0, 2], pytest.approx(loop.train_history['val_loss']))
    assert 'loss/accumulated_loss' not in acc.Tags()['scalars']


def test_histograms_every_k_epochs_match_parameters_and_gradients():
    loop = make_loop()
    grad_sums = {}

    class GradSpy(AbstractCallback):
        def __init__(self):
            super().__init__('grad spy')

        def on_after_optimizer_step(self):
            grad_sums.setdefault(loop.epoch, loop.model.net[0].weight.grad.sum().item())

    tb = TensorboardParameterHistograms(histogram_frequency=2)
    loop.fit(num_epochs=3, callbacks=[GradSpy(), tb])
    acc = read_events(tb.log_dir)
    params = acc.Histograms('parameters/net.0.weight')
    grads = acc.Histograms('gradients/net.0.weight')
    assert [h.step for h in params] == [0, 2] and [h.step for h in grads] == [0, 2]
    weight = loop.model.net[0].weight.detach()
    assert params[-1].histogram_value.num == weight.numel()
    assert params[-1].histogram_value.sum == pytest.approx(weight.sum().item(), abs=1e-4)
    assert [g.histogram_value.sum for g in grads] == pytest.approx([grad_sums[0], grad_sums[2]], abs=1e-5)


def test_graph_learning_rate_per_batch_and_hparams():
    loop = make_loop()
    graph = TensorboardModelGraph()
    lr = TensorboardLearningRate(batch_log_frequency=5)
    hp = TensorboardHyperparameters(hparams={'lr': 0.1, 'optimizer': torch.optim.SGD, 'layers': [16]})
    loop.fit(num_epochs=2, callbacks=[ModelPerformanceEvaluation(ClassificationResultPackage(), {}), graph, lr, hp])
    acc = read_events(graph.log_dir)
    assert acc.Tags()['graph']
    assert scalars(acc, 'learning_rate/group_0')[0] == [0, 5, 10]
    assert scalars(acc, 'hparam/val_Accuracy')[1] == pytest.approx([loop.train_history['val_Accuracy'][-1]])
    assert set(acc.PluginTagToContent('hparams')) == {'_hparams_/experiment', '_hparams_/session_start_info',
                                                      '_hparams_/session_end_info'}
    start_info = acc.PluginTagToContent('hparams')['_hparams_/session_start_info']
    assert b'optimizer' in start_info and b'SGD' in start_info


def test_graph_failure_is_a_warning_not_a_crash(caplog):
    loop = make_loop()
    graph = TensorboardModelGraph(input_to_model=torch.zeros(2, 99))     # wrong feature count
    loop.fit(num_epochs=1, callbacks=[graph])
    assert 'could not write the model graph' in caplog.text
    assert len(loop.train_history['val_loss']) == 1


def test_tracking_loop_details_and_bad_arguments(tmp_path):
    loop = make_loop()
    loop.project_name, loop.experiment_name = 'proj', 'exp'
    loop.local_model_result_folder_path = str(tmp_path)
    tb = TensorboardTrainHistoryMetric()
    loop.fit(num_epochs=1, callbacks=[tb])
    assert tb.log_dir == os.path.join(str(tmp_path), 'proj', f'exp_{loop.experiment_timestamp}', 'tensorboard',
                                      'proj_exp')
    with pytest.raises(ValueError, match='batch_log_frequency'):
        TensorboardTrainBatchLoss(batch_log_frequency=0)
    with pytest.raises(TypeError, match='hparams'):
        TensorboardHyperparameters(hparams=[('lr', 1)])
