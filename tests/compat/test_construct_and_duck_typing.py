"""AIToolbox users build loops with missing pieces and pass duck-typed objects: construction accepts them,
each method checks what it uses, and a mistake is reported before the first training step."""
import copy

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import AbstractCallback, TrainLoop, TTModel
from aitoolbox_like.results import HFEvaluateResultPackage, TorchMetricsPackage
from helpers import MLP, loaders, state_equal


def hand_written(model, train_loader, optimizer, criterion, num_epochs):
    model.train()
    for _ in range(num_epochs):
        for x, y in train_loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return model


def fresh(seed=3):
    torch.manual_seed(seed)
    return MLP()


class Recorder(AbstractCallback):
    def __init__(self):
        super().__init__('recorder')
        self.calls = []

    def on_train_loop_registration(self):
        self.calls.append('registration')

    def on_epoch_end(self):
        self.calls.append('epoch_end')

    def on_batch_begin(self):
        self.calls.append('batch_begin')

    def on_train_end(self):
        self.calls.append('train_end')


def test_a_loop_of_none_pieces_drives_callbacks_without_fitting():
    # AIToolbox code drives the hooks by hand with its handler's execute_* names, on AIToolbox's TrainLoop.
    from aitoolbox_like.torchtrain.train_loop import TrainLoop as AIToolboxTrainLoop
    loop = AIToolboxTrainLoop(MLP(), None, None, None, None, None)
    recorder = Recorder()
    loop.callbacks_handler.register_callbacks([recorder])
    loop.callbacks_handler.execute_epoch_end()
    loop.callbacks_handler.execute_train_end()
    assert recorder.calls == ['registration', 'epoch_end', 'train_end']
    assert recorder.train_loop_obj is loop


def test_a_loop_with_only_a_test_loader_predicts_and_evaluates():
    model = fresh()
    _, _, test = loaders()
    loop = TrainLoop(model, None, None, test, None, nn.CrossEntropyLoss())
    y_pred, y_true, metadata = loop.predict_on_test_set()
    x_all = torch.cat([x for x, _ in test])
    model.eval()
    with torch.no_grad():
        assert torch.equal(y_pred, torch.cat([model(x) for x, _ in test]))
    assert torch.equal(y_true, torch.cat([y for _, y in test]))
    assert metadata == {}          # TTBasicModel returns {} metadata, as in AIToolbox
    with torch.no_grad():
        batch_means = [nn.CrossEntropyLoss()(model(x), y).item() for x, y in test]
        sample_mean = nn.CrossEntropyLoss(reduction='sum')(model(x_all), y_true) / len(y_true)
    # AIToolbox's mean of the batch means by default; the mean over samples on request
    assert loop.evaluate_loss_on_test_set(float_dict_format=True) == pytest.approx(sum(batch_means) / len(batch_means),
                                                                                   rel=1e-6)
    loop = TrainLoop(model, None, None, test, None, nn.CrossEntropyLoss(), eval_loss_weighting='sample')
    assert loop.evaluate_loss_on_test_set(float_dict_format=True) == pytest.approx(sample_mean.item(), rel=1e-6)
    with pytest.raises(ValueError, match='no validation loader'):
        loop.predict_on_validation_set()


@pytest.mark.parametrize('hook', ['on_train_loop_registration', 'on_train_begin'])
def test_optimizer_set_later_by_a_callback_trains_like_a_hand_written_loop(hook):
    train, _, _ = loaders(shuffle=False)
    reference = hand_written(fresh(), train, None, None, 0)
    reference_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    hand_written(reference, train, reference_opt, nn.CrossEntropyLoss(), 2)

    class SetOptimizer(AbstractCallback):
        def __init__(self):
            super().__init__('set optimizer')
    setattr(SetOptimizer, hook, lambda self: setattr(
        self.train_loop_obj, 'optimizer', torch.optim.SGD(self.train_loop_obj.model.parameters(), lr=0.1)))

    model = fresh()
    loop = TrainLoop(model, train, None, None, None, nn.CrossEntropyLoss(), end_auto_eval=False)
    loop.fit(num_epochs=2, callbacks=[SetOptimizer()])
    assert state_equal(model.state_dict(), reference.state_dict())


@pytest.mark.parametrize('pieces, error, match', [
    (dict(train_loader=None), ValueError, r'needs a train_loader.*train_loader=None'),
    (dict(optimizer=None), ValueError, r'needs an optimizer.*optimizer=None'),
    (dict(test_loader=5), TypeError, r'test_loader must be an iterable.*got int'),
    (dict(validation_loader='val.csv'), TypeError, r'validation_loader must be an iterable.*got str'),
])
def test_fit_refuses_missing_or_wrong_pieces_before_the_first_step(pieces, error, match):
    model = fresh()
    before = copy.deepcopy(model.state_dict())
    train, val, test = loaders()
    arguments = dict(train_loader=train, validation_loader=val, test_loader=test,
                     optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    arguments.update(pieces)
    loop = TrainLoop(model, arguments['train_loader'], arguments['validation_loader'], arguments['test_loader'],
                     arguments['optimizer'], nn.CrossEntropyLoss())
    recorder = Recorder()
    with pytest.raises(error, match=match):
        loop.fit(num_epochs=1, callbacks=[recorder])
    assert 'batch_begin' not in recorder.calls
    assert state_equal(model.state_dict(), before)


class LossBox:
    """A loss object that only supports backward(), item() and the division by grad_accumulation that AIToolbox
    applies to every loss (no detach(), no other arithmetic)."""

    def __init__(self, tensor):
        self._tensor = tensor

    def backward(self):
        self._tensor.backward()

    def item(self):
        return self._tensor.item()

    def __truediv__(self, divisor):
        return LossBox(self._tensor / divisor)


class BoxedLossModel(TTModel):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)

    def get_loss(self, batch_data, criterion, device):
        x, y = batch_data
        return LossBox(criterion(self(x), y))

    def get_predictions(self, batch_data, device):
        x, y = batch_data
        return self(x), y, None


class PlainSGD:
    """An optimizer with only step() and zero_grad(): no state_dict, no param_groups."""

    def __init__(self, params, lr):
        self.params, self.lr = list(params), lr

    @torch.no_grad()
    def step(self):
        for p in self.params:
            p.add_(p.grad, alpha=-self.lr)

    def zero_grad(self):
        for p in self.params:
            p.grad = None


def test_duck_typed_loss_optimizer_and_criterion_train_like_torch_objects():
    train, _, _ = loaders(shuffle=False)
    reference = fresh()
    hand_written(reference, train, torch.optim.SGD(reference.parameters(), lr=0.1), nn.CrossEntropyLoss(), 2)

    def criterion(predicted, target):      # any callable
        return nn.functional.cross_entropy(predicted, target)

    inner = fresh()
    loop = TrainLoop(BoxedLossModel(inner), train, None, None, PlainSGD(inner.parameters(), lr=0.1), criterion,
                     end_auto_eval=False)
    loop.fit(num_epochs=2)
    assert state_equal(inner.state_dict(), reference.state_dict())
    # the per-epoch mean of the boxed losses is still recorded
    assert len(loop.train_history['accumulated_loss']) == 2


def test_duck_typed_metric_in_torch_metrics_package():
    class MeanAbsoluteError:     # torchmetrics' methods, not a torchmetrics.Metric
        def reset(self):
            self.total, self.count = 0.0, 0

        def update(self, predicted, target):
            self.total += (predicted - target).abs().sum().item()
            self.count += target.numel()

        def compute(self):
            return self.total / self.count

    package = TorchMetricsPackage(MeanAbsoluteError())
    package.prepare_result_package(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1.0, 3.0, 1.0]))
    assert package.get_results() == {'MeanAbsoluteError_PTLMetrics': pytest.approx(4 / 3)}
    with pytest.raises(TypeError, match=r'compute\(\), reset\(\) and either update.*without compute\(\)\.'):
        TorchMetricsPackage(type('Half', (), {'update': lambda s: 0, 'reset': lambda s: 0})())
    with pytest.raises(TypeError, match=r'without update\(\) or __call__\(\)\.'):
        TorchMetricsPackage(type('Stateless', (), {'compute': lambda s: 0, 'reset': lambda s: 0})())


def test_metric_written_for_aitoolbox_is_called_as_aitoolbox_called_it():
    class CallableMetric:       # AIToolbox's package called every metric: metric(y_predicted, y_true)
        def __init__(self):
            self.calls, self.resets = [], 0

        def __call__(self, predicted, target):
            self.calls.append((predicted, target))
            return {'hits': sum(p == t for p, t in zip(predicted, target))}

        def compute(self):
            return 'accumulated'

        def reset(self):
            self.resets += 1

    metric = CallableMetric()
    package = TorchMetricsPackage(metric)
    package.prepare_result_package([1, 2, 3], [1, 0, 3])
    assert package.get_results() == {'hits_PTLMetrics': 2}
    assert metric.calls == [([1, 0, 3], [1, 2, 3])] and metric.resets == 0      # the data as given, no resets
    assert package.metric_compute() == 'accumulated'
    package.metric_reset()
    assert metric.resets == 1
    package.prepare_result_package([], [])          # unchecked: the metric decides what it accepts
    assert package.get_results() == {'hits_PTLMetrics': 0}


def test_hf_evaluate_package_calls_compute_with_references_and_model_metadata():
    class ExactMatch:
        def compute(self, references, predictions, ignore_case=False, weights=None):
            hits = [float(r == p) * w for r, p, w in zip(references, predictions, weights)]
            return {'exact_match': sum(hits) / len(hits), 'ignore_case': ignore_case}

    package = HFEvaluateResultPackage(ExactMatch(), ignore_case=True)
    package.prepare_result_package(['a', 'b', 'c'], ['a', 'x', 'c'], additional_results={'weights': [1, 1, 0]})
    assert package.get_results() == {'exact_match_HFEvaluate': pytest.approx(1 / 3), 'ignore_case_HFEvaluate': True}


def test_prediction_metadata_is_an_empty_dict_when_every_batch_gives_one():
    class EmptyMetadata(MLP):
        def get_predictions(self, batch_data, device):
            x, y = batch_data
            return self(x), y, {}

    _, _, test = loaders()
    loop = TrainLoop(EmptyMetadata(), None, None, test, None, None)
    assert loop.predict_on_test_set()[2] == {}
