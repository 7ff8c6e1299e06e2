"""engine/evaluation.py: what a fit evaluates by default, the one pass that gives the validation loss and the
metrics, AIToolbox's end-of-epoch evaluation of the training set where AIToolbox's code asks for it."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TrainLoop
from aitoolbox_like.callbacks.performance_eval import ModelPerformanceEvaluation
from aitoolbox_like.results import ClassificationResultPackage
from helpers import MLP, loaders

TRAIN, VAL = 0.0, 1.0       # the first feature of every sample says which set it comes from


def tagged_loaders(n_train=40, n_val=24, batch_size=8):
    g = torch.Generator().manual_seed(0)

    def data(n, tag):
        x = torch.randn(n, 6, generator=g)
        x[:, 0] = tag
        return TensorDataset(x, (x[:, 1] > 0).long())
    return (DataLoader(data(n_train, TRAIN), batch_size=batch_size, shuffle=True),
            DataLoader(data(n_val, VAL), batch_size=batch_size))


class CountingMLP(MLP):
    """Counts the samples each forward sees, per set and per mode (train / eval)."""

    def __init__(self):
        super().__init__()
        self.seen = {}

    def forward(self, x):
        for tag, name in ((TRAIN, 'train'), (VAL, 'validation')):
            count = int((x[:, 0] == tag).sum())
            if count:
                key = (name, 'train' if self.training else 'eval')
                self.seen[key] = self.seen.get(key, 0) + count
        return super().forward(x)


class RecordingPackage(ClassificationResultPackage):
    """Keeps the predictions and targets it was given."""

    def __init__(self):
        super().__init__()
        self.given = []

    def prepare_result_package(self, y_true, y_predicted, hyperparameters=None, **kwargs):
        self.given.append((y_true.clone(), y_predicted.clone()))
        super().prepare_result_package(y_true, y_predicted, hyperparameters, **kwargs)


def test_a_default_fit_with_a_metric_trains_each_sample_once_and_runs_the_validation_set_once_per_epoch():
    torch.manual_seed(0)
    model = CountingMLP()
    train, val = tagged_loaders()
    loop = TrainLoop(model, train, val, None, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    loop.fit(num_epochs=3, callbacks=[ModelPerformanceEvaluation(ClassificationResultPackage(), {})])

    assert model.seen == {('train', 'train'): 3 * 40, ('validation', 'eval'): 3 * 24}
    history = loop.train_history
    assert len(history['accumulated_loss']) == len(history['val_loss']) == len(history['val_Accuracy']) == 3
    assert history['loss'] == []        # AIToolbox's training-set pass is asked for with eval_train_set=True


class TwoPassMLP(MLP):
    """The same model, evaluated as before the one-pass evaluation: its own get_predictions (a subclass's, so the
    inherited get_loss_and_predictions no longer speaks for it)."""

    def get_predictions(self, batch_data, device):
        return MLP.get_predictions(self, batch_data, device)


def fit_with_metric(model_cls, **loop_kwargs):
    torch.manual_seed(0)
    model = model_cls()
    train, val, _ = loaders()
    package = RecordingPackage()
    loop = TrainLoop(model, train, val, None, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                     **loop_kwargs)
    loop.fit(num_epochs=2, callbacks=[ModelPerformanceEvaluation(package, {}, on_train_data=True)])
    return loop, package


def test_the_one_pass_gives_what_the_two_passes_gave_to_the_bit():
    one, one_package = fit_with_metric(MLP, eval_train_set=True)
    two, two_package = fit_with_metric(TwoPassMLP, eval_train_set=True)
    # Three evaluations (two epochs and the end of training), validation and train packages each.
    assert len(one_package.given) == len(two_package.given) == 3
    for (y_true, y_pred), (y_true_2, y_pred_2) in zip(one_package.given, two_package.given):
        assert torch.equal(y_true, y_true_2) and torch.equal(y_pred, y_pred_2)
    for name in ('loss', 'accumulated_loss', 'val_loss', 'val_Accuracy', 'train_Accuracy'):
        assert one.train_history[name] == two.train_history[name], name
    assert len(one.train_history['loss']) == 2


def test_the_one_pass_runs_each_evaluated_set_once():
    for model_cls, passes in ((MLP, 1), (TwoPassMLP, 2)):
        torch.manual_seed(0)
        model = model_cls()
        train, val, _ = loaders()
        loop = TrainLoop(model, train, val, None, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                         eval_train_set=True)
        kinds = []

        class PassRecorder(ModelPerformanceEvaluation):
            def on_eval_begin(self, dataset_info):
                kinds.append((dataset_info['type'], dataset_info['kind'], dataset_info.get('with_predictions', False)))
        loop.fit(num_epochs=1, callbacks=[PassRecorder(ClassificationResultPackage(), {}, on_train_data=True)])
        epoch = kinds[:passes * 2]
        if passes == 1:
            assert epoch == [('train', 'loss', True), ('validation', 'loss', True)]
        else:
            assert epoch == [('train', 'loss', False), ('validation', 'loss', False),
                             ('train', 'predictions', False), ('validation', 'predictions', False)]


class PenalisedMLP(MLP):
    """A subclass whose own get_loss adds a penalty: its evaluation loss must keep it."""

    def get_loss(self, batch_data, criterion, device):
        return MLP.get_loss(self, batch_data, criterion, device) + 1.0


def test_a_subclass_with_its_own_loss_is_evaluated_with_it():
    loop, _ = fit_with_metric(PenalisedMLP)
    plain, _ = fit_with_metric(MLP)
    # The same weights (the penalty is a constant), and a validation loss 1.0 higher.
    for with_penalty, without in zip(loop.train_history['val_loss'], plain.train_history['val_loss']):
        assert abs(with_penalty - without - 1.0) < 1e-6


def test_aitoolbox_s_loops_evaluate_the_training_set_as_aitoolbox_did():
    from aitoolbox_like.torchtrain.train_loop import TrainLoop as AIToolboxTrainLoop
    for loop_cls, kwargs, evaluates_train_set in ((AIToolboxTrainLoop, {}, True), (TrainLoop, {}, False),
                                                  (TrainLoop, {'eval_train_set': True}, True),
                                                  (AIToolboxTrainLoop, {'eval_train_set': False}, False)):
        torch.manual_seed(0)
        model = CountingMLP()
        train, val = tagged_loaders()
        loop = loop_cls(model, train, val, None, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                        **kwargs)
        loop.fit(num_epochs=2)
        assert isinstance(loop, TrainLoop)
        assert loop.eval_train_set is evaluates_train_set
        assert (('train', 'eval') in model.seen) is evaluates_train_set, (loop_cls, kwargs)
        assert len(loop.train_history['loss']) == (2 if evaluates_train_set else 0)
        assert loop.train_loss_name == ('loss' if evaluates_train_set else 'accumulated_loss')
    # The loss AIToolbox's loop records: the float64 mean of the batch means over the training set, in eval mode.
    in_order = DataLoader(train.dataset, batch_size=8)
    aitoolbox_loop = AIToolboxTrainLoop(loop.model, in_order, val, None, None, nn.CrossEntropyLoss())
    loop.model.eval()
    with torch.no_grad():
        expected = torch.mean(torch.DoubleTensor([nn.functional.cross_entropy(loop.model(x), y)
                                                  for x, y in in_order]))
    assert aitoolbox_loop.evaluate_loss_on_train_set().item() == expected.item()


def test_the_aitoolbox_tracking_loops_are_both_aitoolbox_s_and_ours(tmp_path):
    from aitoolbox_like.torchtrain.train_loop import TrainLoop as AIToolboxTrainLoop
    from aitoolbox_like.torchtrain.train_loop import TrainLoopCheckpointEndSave
    from aitoolbox_like.tracking import TrainLoopCheckpointEndSave as OurCheckpointEndSave
    torch.manual_seed(0)
    model = MLP()
    train, val, _ = loaders()
    loop = TrainLoopCheckpointEndSave(model, train, val, None, torch.optim.SGD(model.parameters(), lr=0.1),
                                      nn.CrossEntropyLoss(), 'proj', 'exp', str(tmp_path), {},
                                      val_result_package=ClassificationResultPackage(), cloud_save_mode='local')
    assert isinstance(loop, (AIToolboxTrainLoop)) and isinstance(loop, OurCheckpointEndSave)
    loop.fit(num_epochs=1)
    assert len(loop.train_history['loss']) == 1 and len(loop.train_history['val_loss']) == 1
