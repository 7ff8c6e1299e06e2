"""Basic callbacks inside real fits: stopping rules, data subsets, function hooks, timing, progress."""
import copy
import pickle

import pytest
import torch
from torch import nn

from aitoolbox_like import MultiLoss, TrainLoop, TTModel
from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.callbacks.basic import (
    AllPredictionsSame, DataSubsetTestRun, EarlyStopping, FunctionOnTrainLoop, ListRegisteredCallbacks, ProgressBar,
    RestoreBestWeights, TerminateOnNaN, ThresholdEarlyStopping, Timer)
from aitoolbox_like.checkpoint import check_weights_only_safe
from helpers import MLP, loaders, state_equal


def make_loop(n=32, batch_size=8, lr=0.1, model=None, **kwargs):
    torch.manual_seed(0)
    model = model or MLP()
    train, val, test = loaders(n=n, batch_size=batch_size)
    kwargs.setdefault('progress_bar', False)
    return TrainLoop(model, train, val, test, torch.optim.SGD(model.parameters(), lr=lr), nn.CrossEntropyLoss(),
                     **kwargs)


class MetricWriter(AbstractCallback):
    """Writes a scripted metric into the history on the epochs given, and snapshots the weights."""

    def __init__(self, name, values_by_epoch):
        super().__init__('metric writer')
        self.name, self.values_by_epoch = name, values_by_epoch
        self.weights = {}

    def on_epoch_end(self):
        loop = self.train_loop_obj
        self.weights[loop.epoch] = copy.deepcopy(loop.model.state_dict())
        if loop.epoch in self.values_by_epoch:
            loop.insert_metric_result_into_history(self.name, self.values_by_epoch[loop.epoch])


def epochs_trained(loop):
    return len(loop.train_history['accumulated_loss'])


@pytest.mark.parametrize('name, values, patience, stop_epoch', [
    ('my_error', [1.0, 0.8, 0.85, 0.9, 0.1, 0.1], 1, 3),      # 'auto' minimises *error*
    ('val_acc', [0.5, 0.6, 0.6, 0.55, 0.9, 0.9], 1, 3),       # ... and maximises anything else
    ('val_acc', [0.5, 0.6, 0.6, 0.55, 0.9, 0.9], 0, 2),
    ('val_acc', [0.5, 0.6, 0.7, 0.8, 0.9, 0.95], 0, 5),       # always improving: runs all 6 epochs
])
def test_early_stopping_epoch(name, values, patience, stop_epoch):
    loop = make_loop()
    loop.fit(num_epochs=6, callbacks=[EarlyStopping(name, patience=patience),
                                      MetricWriter(name, dict(enumerate(values)))])
    assert epochs_trained(loop) == stop_epoch + 1
    assert loop.early_stop == (stop_epoch < 5)


def test_early_stopping_min_delta_and_explicit_mode():
    loop = make_loop()
    # 'score' would be maximised under 'auto'; mode='min' and improvements of < 0.05 do not count.
    loop.fit(num_epochs=6, callbacks=[EarlyStopping('score', min_delta=0.05, patience=1, mode='min'),
                                      MetricWriter('score', dict(enumerate([1.0, 0.9, 0.88, 0.87, 0.5, 0.4])))])
    assert epochs_trained(loop) == 4


def test_early_stopping_with_evaluation_every_k_epochs_ignores_stale_values():
    # Evaluated on even epochs only: patience counts evaluations (epochs 4 and 6), not epochs.
    values = {0: 1.0, 2: 0.9, 4: 0.95, 6: 0.97, 8: 0.5}
    loop = make_loop()
    loop.fit(num_epochs=9, callbacks=[EarlyStopping('val_metric_loss', patience=1),
                                      MetricWriter('val_metric_loss', values)])
    assert epochs_trained(loop) == 7      # re-reading the old value at epoch 5 would have stopped at 5


def test_early_stopping_on_real_validation_loss_with_end_auto_eval_interval():
    loop = make_loop(lr=0.0, end_auto_eval=2)          # no learning: val_loss never improves
    loop.fit(num_epochs=10, callbacks=[EarlyStopping(patience=1)])
    assert loop.train_history.get_epochs('val_loss') == [0, 2, 4]
    assert epochs_trained(loop) == 5


def test_restore_best_weights_before_the_end_of_training_test_loss():
    writer = MetricWriter('val_acc', dict(enumerate([0.5, 0.9, 0.6, 0.7, 0.8])))
    stopper = EarlyStopping('val_acc', patience=1, restore_best_weights=True)
    loop = make_loop()
    loop.fit(num_epochs=8, callbacks=[stopper, writer])
    assert epochs_trained(loop) == 4 and stopper.best_epoch == 1
    assert state_equal(loop.model.state_dict(), writer.weights[1])
    assert not state_equal(loop.model.state_dict(), writer.weights[3])
    assert loop.train_history['train_end_test_loss'][-1] == \
        pytest.approx(loop.evaluate_loss_on_test_set(force_prediction=True).item())
    state = stopper.state_dict()
    check_weights_only_safe(state)
    fresh = EarlyStopping('val_acc', patience=1, restore_best_weights=True)
    fresh.load_state_dict(state)
    assert fresh.best_epoch == 1 and fresh.best_performance == 0.9
    assert state_equal(fresh.best_weights, writer.weights[1])


def test_restore_best_weights_when_training_runs_to_the_end():
    writer = MetricWriter('val_acc', dict(enumerate([0.5, 0.9, 0.6, 0.7])))
    loop = make_loop()
    loop.fit(num_epochs=4, callbacks=[EarlyStopping('val_acc', patience=5, restore_best_weights=True), writer])
    assert epochs_trained(loop) == 4 and not loop.early_stop
    assert state_equal(loop.model.state_dict(), writer.weights[1])


def test_restore_best_weights_trains_every_epoch_and_ends_with_the_best_one():
    # transformers' load_best_model_at_end: no stopping however long the metric stalls; the best epoch's weights are
    # back before the end-of-training test loss; only a strict improvement counts (a tie keeps the earlier epoch)
    writer = MetricWriter('val_acc', dict(enumerate([0.5, 0.9, 0.6, 0.9, 0.7, 0.8])))
    best = RestoreBestWeights('val_acc')
    loop = make_loop()
    loop.fit(num_epochs=6, callbacks=[best, writer])
    assert epochs_trained(loop) == 6 and not loop.early_stop and best.best_epoch == 1
    assert state_equal(loop.model.state_dict(), writer.weights[1])
    assert loop.train_history['train_end_test_loss'][-1] == \
        pytest.approx(loop.evaluate_loss_on_test_set(force_prediction=True).item())
    assert best.state_key == 'RestoreBestWeights_val_acc'
    # beside an EarlyStopping on the same metric, each keeps its own state in a checkpoint
    assert best.state_key != EarlyStopping('val_acc').state_key


def test_early_stopping_bad_setup_fails_clearly():
    loop = make_loop()
    loop.validation_loader = None
    with pytest.raises(ValueError, match='validation_loader'):
        loop.fit(num_epochs=1, callbacks=[EarlyStopping()])
    with pytest.raises(ValueError, match='end_auto_eval'):
        make_loop(end_auto_eval=False).fit(num_epochs=1, callbacks=[EarlyStopping('loss')])
    with pytest.raises(ValueError, match='mode'):
        EarlyStopping(mode='maximise')


def test_threshold_early_stopping():
    loop = make_loop()
    loop.fit(num_epochs=6, callbacks=[ThresholdEarlyStopping('val_acc', 0.5, patience=1),
                                      MetricWriter('val_acc', dict(enumerate([0.3, 0.6, 0.4, 0.45, 0.9, 0.9])))])
    assert epochs_trained(loop) == 4
    loop = make_loop()
    loop.fit(num_epochs=4, callbacks=[ThresholdEarlyStopping('my_loss', 1.0),
                                      MetricWriter('my_loss', dict(enumerate([0.3, 0.6, 1.5, 0.1])))])
    assert epochs_trained(loop) == 3


class Poisonable(TTModel):
    """A classifier whose loss(es) can be made NaN from a callback."""

    def __init__(self, multi=False):
        super().__init__()
        self.net = nn.Linear(6, 3)
        self.factor = 1.0
        self.multi = multi

    def forward(self, x):
        return self.net(x)

    def get_loss(self, batch, criterion, device):
        x, y = batch
        loss = criterion(self(x), y)
        if self.multi:
            return MultiLoss({'main': loss, 'aux': (self.net.weight ** 2).mean() * self.factor})
        return loss * self.factor

    def get_predictions(self, batch, device):
        x, y = batch
        return self(x), y, None


def poison_at(total_iteration_idx):
    def poison(loop):
        if loop.total_iteration_idx == total_iteration_idx:
            loop.model.factor = float('nan')
    return poison


def test_terminate_on_nan_at_epoch_end():
    loop = make_loop(model=Poisonable())
    loop.fit(num_epochs=6, callbacks=[TerminateOnNaN(), FunctionOnTrainLoop(poison_at(9), batch_begin=True)])
    # 4 batches per epoch: batch 9 is in epoch 2, whose 'loss' is NaN.
    assert epochs_trained(loop) == 3 and loop.early_stop


@pytest.mark.parametrize('multi', [False, True])
@pytest.mark.parametrize('every, stop_at', [(1, 9), (2, 9), (3, 10), (50, 11)])
def test_terminate_on_nan_within_the_epoch(multi, every, stop_at):
    stops = []
    loop = make_loop(model=Poisonable(multi=multi), end_auto_eval=False)
    loop.fit(num_epochs=6, callbacks=[
        TerminateOnNaN(check_every_batch=True, check_every_n_steps=every),
        FunctionOnTrainLoop(poison_at(9), batch_begin=True),
        FunctionOnTrainLoop(lambda lp: stops.append(lp.total_iteration_idx), train_end=True)])
    # Epoch 2 holds batches 8-11: the flag is read after every `every` batches of the epoch and at its end.
    assert stops == [stop_at]
    assert epochs_trained(loop) == (2 if stop_at < 11 else 3)


def test_all_predictions_same():
    model = MLP()
    last = model.net[-1]
    nn.init.zeros_(last.weight)
    nn.init.zeros_(last.bias)
    loop = make_loop(model=model, lr=0.0)
    loop.fit(num_epochs=3, callbacks=[AllPredictionsSame(value=0., stop_training=True)])
    assert epochs_trained(loop) == 1 and loop.early_stop

    loop = make_loop()
    loop.fit(num_epochs=3, callbacks=[AllPredictionsSame(value=0., stop_training=True)])
    assert epochs_trained(loop) == 3


class BatchCounter(AbstractCallback):
    def __init__(self):
        super().__init__('batch counter')
        self.per_epoch = []
        self.loaders = []

    def on_epoch_end(self):
        self.per_epoch.append(len(self.train_loop_obj.loss_batch_accum))
        self.loaders.append(self.train_loop_obj.train_loader)


class LoaderLengthAtRegistration(AbstractCallback):
    def __init__(self):
        super().__init__('records len(train_loader) at registration', execution_order=0)

    def on_train_loop_registration(self):
        self.length = len(self.train_loop_obj.train_loader)


def test_data_subset_test_run_trains_on_lists_of_the_first_batches():
    counter = BatchCounter()
    at_registration = LoaderLengthAtRegistration()
    loop = make_loop()
    first_val_x, first_val_y = next(iter(loop.validation_loader))
    loop.fit(num_epochs=2, callbacks=[DataSubsetTestRun(num_train_batches=2, num_val_batches=1), counter,
                                      at_registration])
    assert counter.per_epoch == [2, 2]
    # AIToolbox's record: plain lists of the batches, read once (the same batches every epoch)
    assert type(loop.train_loader) is list and type(loop.validation_loader) is list
    assert [len(x) for x, _ in loop.train_loader] == [8, 8]
    assert counter.loaders[0] is counter.loaders[1] is loop.train_loader
    assert len(loop.validation_loader) == 1 and len(loop.test_loader) == 3     # 0 keeps the test loader whole
    # registered after it (execution order -100), a callback already sees the subset's length
    assert at_registration.length == 2
    with torch.no_grad():
        expected = nn.functional.cross_entropy(loop.model(first_val_x), first_val_y)
    assert loop.train_history['val_loss'][-1] == pytest.approx(expected.item())

    loop.fit(num_epochs=3, callbacks=[DataSubsetTestRun(num_train_batches=1)])   # a subset of the list
    assert counter.per_epoch == [2, 2, 1] and len(loop.train_loader) == 1

    loop = make_loop()
    loop.test_loader = None
    with pytest.raises(ValueError, match='test_loader'):
        loop.fit(num_epochs=1, callbacks=[DataSubsetTestRun(num_test_batches=1)])


def count_call(loop):
    loop.function_calls = getattr(loop, 'function_calls', 0) + 1


def test_function_on_train_loop_dispatched_only_on_enabled_hooks():
    loop = make_loop()
    callback = FunctionOnTrainLoop(count_call, tl_registration=True, epoch_end=True)
    loop.fit(num_epochs=3, callbacks=[callback])
    assert loop.function_calls == 1 + 3
    assert isinstance(callback, FunctionOnTrainLoop)
    assert loop.callbacks_handler.has_hook('on_epoch_end')
    assert not loop.callbacks_handler.has_hook('on_batch_end')

    loop = make_loop()
    loop.fit(num_epochs=2, grad_accumulation=3,
             callbacks=[FunctionOnTrainLoop(count_call, after_optimizer_step=True)])
    assert loop.function_calls == 2 * 2        # 4 batches / accumulation 3 -> 2 updates per epoch
    assert loop.grad_cb_used

    restored = pickle.loads(pickle.dumps(FunctionOnTrainLoop(count_call, batch_end=True)))
    loop = make_loop()
    loop.fit(num_epochs=1, callbacks=[restored])
    assert loop.function_calls == 4 and not loop.callbacks_handler.has_hook('on_epoch_end')


def test_list_registered_callbacks(capsys):
    make_loop().fit(num_epochs=1, callbacks=[ListRegisteredCallbacks(), EarlyStopping()])
    out = capsys.readouterr().out
    assert 'EarlyStopping' in out and 'Print the list of registered callbacks' in out


def test_timer_writes_epoch_time_and_throughput():
    loop = make_loop(n=53)                   # 7 batches: six of 8 samples and one of 5
    loop.fit(num_epochs=2, callbacks=[Timer()])
    history = loop.train_history
    for key in ('epoch_time', 'train_time', 'batches_per_sec', 'samples_per_sec'):
        assert len(history[key]) == 2 and all(v > 0 for v in history[key])
    assert all(e >= t for e, t in zip(history['epoch_time'], history['train_time']))
    ratios = [s / b for s, b in zip(history['samples_per_sec'], history['batches_per_sec'])]
    assert ratios == pytest.approx([53 / 7] * 2)

    loop = make_loop(n=53)
    loop.fit(num_epochs=1, callbacks=[Timer(), DataSubsetTestRun(num_train_batches=2)])
    # the subset is a list of batches: no batch_size to count samples by
    assert len(loop.train_history['batches_per_sec']) == 1 and 'samples_per_sec' not in loop.train_history


def test_progress_bar_shows_epoch_metrics(capsys):
    make_loop(progress_bar=True).fit(num_epochs=2)
    err = capsys.readouterr().err
    assert 'Epoch 2/2' in err and 'val_loss=' in err and 'accumulated_loss=' in err
    loop = make_loop()
    loop.fit(num_epochs=1, callbacks=[ProgressBar(loss_refresh_steps=1)])
    assert 'loss=' in capsys.readouterr().err
