"""ExponentialMovingAverage and StochasticWeightAveraging inside real fits: the averages equal hand computations
(SWA: a hand-written torch.optim.swa_utils loop, to the bit), evaluation and the final model use them, and an
interrupted run resumed from its checkpoint ends with the same averages and weights, to the bit."""
import math
import os

import pytest
import torch
from torch import nn
from torch.optim import swa_utils
from torch.utils.data import DataLoader

from aitoolbox_like import TrainLoop, TTBasicModel
from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.callbacks.model_save import ModelTrainEndSave
from aitoolbox_like.callbacks.weight_averaging import ExponentialMovingAverage, StochasticWeightAveraging
from aitoolbox_like.checkpoint import check_weights_only_safe, load_checkpoint
from aitoolbox_like.results.basic import ClassificationResultPackage
from aitoolbox_like.tracking import TrainLoopCheckpoint
from helpers import MLP, classification_data, loaders


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_bit_equal(a, b):
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f'differ: {different}'


def make_loop(seed=0, dropout=0.3, cls=TrainLoop, **kwargs):
    torch.manual_seed(seed)
    model = MLP(dropout=dropout)
    train, val, test = loaders(n=40, batch_size=6)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    kwargs.setdefault('progress_bar', False)
    return cls(model, train, val, test, optimizer, nn.CrossEntropyLoss(), **kwargs)


class WeightsAfterUpdates(AbstractCallback):
    """The weights after every applied optimizer update (runs after the EMA callback)."""

    def __init__(self):
        super().__init__('weights recorder', execution_order=50)
        self.weights = []

    def on_batch_end(self):
        if self.train_loop_obj.optimizer_update_applied():
            self.weights.append(snapshot(self.train_loop_obj.model))


# ---------------------------------------------------------------------------------------------- EMA


@pytest.mark.parametrize('use_warmup, update_every, grad_accumulation', [
    (False, 1, 1), (True, 1, 1), (False, 2, 3)])
def test_ema_follows_the_formula_on_applied_updates(use_warmup, update_every, grad_accumulation):
    loop = make_loop()
    initial = snapshot(loop.model)
    ema = ExponentialMovingAverage(decay=0.9, use_warmup=use_warmup, warmup_steps=5, update_every=update_every,
                                   swap_at_end=False)
    recorder = WeightsAfterUpdates()
    loop.fit(num_epochs=3, callbacks=[ema, recorder], grad_accumulation=grad_accumulation)

    updates_per_epoch = math.ceil(7 / grad_accumulation)
    assert len(recorder.weights) == 3 * updates_per_epoch == ema.num_optimizer_updates
    expected = {k: v.double() for k, v in initial.items()}
    n = 0
    for i, weights in enumerate(recorder.weights, 1):
        if i % update_every:
            continue
        n += 1
        decay = 0.9 * (1 - math.exp(-n / 5)) if use_warmup else 0.9
        assert ema.current_decay(n) == pytest.approx(decay)
        expected = {k: decay * expected[k] + (1 - decay) * weights[k].double() for k in expected}
    assert ema.num_updates == n
    for k, v in ema.ema_state_dict().items():
        torch.testing.assert_close(v.double(), expected[k], rtol=1e-5, atol=1e-6)
    # evaluation swapped the average in and out: the training weights are those of the last update
    assert_bit_equal(snapshot(loop.model), recorder.weights[-1])


def test_evaluation_uses_the_ema_and_leaves_the_training_trajectory_alone():
    plain = make_loop()
    plain.fit(num_epochs=3, callbacks=[ExponentialMovingAverage(decay=0.8, evaluate_with_ema=False,
                                                                swap_at_end=False)])
    loop = make_loop()
    ema = ExponentialMovingAverage(decay=0.8, swap_at_end=False)
    loop.fit(num_epochs=3, callbacks=[ema])
    # Same training weights to the bit, though every evaluation pass ran with the EMA weights.
    assert_bit_equal(snapshot(loop.model), snapshot(plain.model))
    assert loop.train_history['accumulated_loss'] == plain.train_history['accumulated_loss']
    assert loop.train_history['val_loss'] != plain.train_history['val_loss']

    # The last val_loss is the EMA model's.
    ema_model = make_loop().model
    ema.copy_to(ema_model)
    probe = make_loop()
    probe.model.load_state_dict(ema.ema_state_dict())
    assert probe.evaluate_loss_on_validation_set().item() == pytest.approx(loop.train_history['val_loss'][-1])
    # predict_* after fit also uses it, and the model is back to the training weights afterwards.
    before = snapshot(loop.model)
    y_pred, _, _ = loop.predict_on_validation_set(force_prediction=True)
    torch.testing.assert_close(y_pred, probe.predict_on_validation_set()[0])
    assert_bit_equal(snapshot(loop.model), before)


def test_swap_at_end_gives_the_model_the_ema_and_the_final_saved_model_holds_it(tmp_path):
    reference = make_loop()
    reference_ema = ExponentialMovingAverage(decay=0.8, swap_at_end=False)
    reference.fit(num_epochs=4, callbacks=[reference_ema])

    loop = make_loop()
    ema = ExponentialMovingAverage(decay=0.8)
    saver = ModelTrainEndSave('proj', 'ema', str(tmp_path), {}, val_result_package=ClassificationResultPackage(),
                              cloud_save_mode='local')
    loop.fit(num_epochs=2, callbacks=[ema, saver])
    assert_bit_equal(snapshot(loop.model), ema.ema_state_dict())
    saved = load_checkpoint(saver.saved_files[0])
    assert_bit_equal(saved['model_state_dict'], ema.ema_state_dict())
    assert 'training_weights' in saved['callbacks'][ema.state_key]

    # A second fit continues from the training weights, not the average: the run equals the uninterrupted one.
    loop.fit(num_epochs=4, callbacks=[ema])
    assert_bit_equal(ema.ema_state_dict(), reference_ema.ema_state_dict())
    assert_bit_equal(snapshot(loop.model), reference_ema.ema_state_dict())
    assert_bit_equal(ema.state_dict()['training_weights'], snapshot(reference.model))


def _checkpoint_loop(tmp_path, seed=0, iteration_save_freq=0):
    return make_loop(seed=seed, cls=TrainLoopCheckpoint, project_name='proj', experiment_name='run',
                     local_model_result_folder_path=str(tmp_path / 'results'), hyperparams={},
                     cloud_save_mode='local', iteration_save_freq=iteration_save_freq)


def _latest(loop, suffix):
    folder = os.path.join(loop.experiment.dir_path, 'checkpoint_model')
    return os.path.join(folder, next(f for f in sorted(os.listdir(folder)) if f.endswith(suffix)))


@pytest.mark.parametrize('iteration_save_freq, first_fit, checkpoint_suffix', [
    (0, dict(num_epochs=2), '_E1.pth'),
    (4, dict(num_iterations=10), '_E1_ITER8.pth'),      # inside epoch 1, inside a gradient-accumulation window
])
def test_ema_resume_is_exact(tmp_path, iteration_save_freq, first_fit, checkpoint_suffix):
    def callbacks():
        return [ExponentialMovingAverage(decay=0.9, use_warmup=True, warmup_steps=3, update_every=2)]

    reference = _checkpoint_loop(tmp_path / 'reference')
    reference_cbs = callbacks()
    reference.fit(num_epochs=3, callbacks=reference_cbs, grad_accumulation=2)

    first = _checkpoint_loop(tmp_path / 'interrupted', iteration_save_freq=iteration_save_freq)
    first.fit(callbacks=callbacks(), grad_accumulation=2, **first_fit)
    path = _latest(first, checkpoint_suffix)
    check_weights_only_safe(load_checkpoint(path))

    torch.manual_seed(123)
    resumed = _checkpoint_loop(tmp_path / 'interrupted', seed=9)
    resumed_cbs = callbacks()
    resumed.fit(num_epochs=3, callbacks=resumed_cbs, grad_accumulation=2, resume_from=path)

    assert resumed_cbs[0].num_updates == reference_cbs[0].num_updates
    assert_bit_equal(resumed_cbs[0].ema_state_dict(), reference_cbs[0].ema_state_dict())
    assert_bit_equal(snapshot(resumed.model), snapshot(reference.model))
    assert resumed.train_history.train_history == reference.train_history.train_history


def test_ema_arguments_are_checked():
    with pytest.raises(ValueError, match='decay'):
        ExponentialMovingAverage(decay=1.0)
    with pytest.raises(ValueError, match='update_every'):
        ExponentialMovingAverage(update_every=0)
    assert ExponentialMovingAverage(decay=0.99).state_key != ExponentialMovingAverage(decay=0.9).state_key


# ---------------------------------------------------------------------------------------------- SWA


class BNNet(TTBasicModel):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)


def _swa_parts(seed=0):
    torch.manual_seed(seed)
    model = BNNet()
    train = DataLoader(classification_data(40), batch_size=6, shuffle=True, drop_last=True)
    val = DataLoader(classification_data(18, seed=1), batch_size=6)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, train, val, optimizer


def _hand_written_swa(num_epochs, swa_start, swa_lr, anneal_epochs):
    model, train, _, optimizer = _swa_parts()
    criterion = nn.CrossEntropyLoss()
    swa_model = swa_scheduler = None
    lrs = []
    for epoch in range(num_epochs):
        model.train()
        for x, y in train:
            lrs.append(optimizer.param_groups[0]['lr'])
            criterion(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        if epoch >= swa_start:
            if swa_model is None:
                swa_model = swa_utils.AveragedModel(model)
                swa_scheduler = swa_utils.SWALR(optimizer, swa_lr=swa_lr, anneal_epochs=anneal_epochs)
            swa_model.update_parameters(model)
            swa_scheduler.step()
    with torch.random.fork_rng():
        swa_utils.update_bn(train, swa_model)
    return swa_model, lrs


class LRs(AbstractCallback):
    def __init__(self):
        super().__init__('lrs', execution_order=-5)
        self.lrs = []

    def on_batch_begin(self):
        self.lrs.append(self.train_loop_obj.optimizer.param_groups[0]['lr'])


def test_swa_equals_a_hand_written_swa_utils_loop():
    swa_model, hand_lrs = _hand_written_swa(num_epochs=5, swa_start=2, swa_lr=0.02, anneal_epochs=2)

    model, train, val, optimizer = _swa_parts()
    loop = TrainLoop(model, train, val, None, optimizer, nn.CrossEntropyLoss(), progress_bar=False)
    swa, lrs = StochasticWeightAveraging(swa_start_epoch=2, swa_lr=0.02, anneal_epochs=2), LRs()
    loop.fit(num_epochs=5, callbacks=[swa, lrs])

    assert lrs.lrs == hand_lrs
    assert swa.swa_model is not None and swa.swa_model.n_averaged.item() == 3
    # The loop's model now holds the averaged weights with BatchNorm statistics recomputed over the train loader.
    assert_bit_equal(snapshot(loop.model), snapshot(swa_model.module))


def test_swa_default_arguments_and_fraction_start():
    model, train, val, optimizer = _swa_parts()
    loop = TrainLoop(model, train, val, None, optimizer, nn.CrossEntropyLoss(), progress_bar=False)
    swa = StochasticWeightAveraging()
    loop.fit(num_epochs=5, callbacks=[swa])
    assert swa.resolved_start_epoch() == 4
    assert swa.swa_model.n_averaged.item() == 1
    # swa_lr=None keeps the learning rate the optimizer had
    assert optimizer.param_groups[0]['lr'] == pytest.approx(0.1)


def test_swa_resume_is_exact(tmp_path):
    def run(folder, num_epochs, resume_from=None, seed=0):
        model, train, val, optimizer = _swa_parts(seed)
        loop = TrainLoopCheckpoint(model, train, val, None, optimizer, nn.CrossEntropyLoss(), 'proj', 'swa',
                                   str(folder), {}, cloud_save_mode='local', progress_bar=False)
        swa = StochasticWeightAveraging(swa_start_epoch=1, swa_lr=0.02, anneal_epochs=3)
        loop.fit(num_epochs=num_epochs, callbacks=[swa], resume_from=resume_from)
        return loop, swa

    reference, reference_swa = run(tmp_path / 'reference', 5)
    first, _ = run(tmp_path / 'interrupted', 3)        # averaging started at the end of epoch 1
    path = _latest(first, '_E2.pth')
    state = load_checkpoint(path)['callbacks']['StochasticWeightAveraging']
    assert state['swa_model']['n_averaged'].item() == 2

    torch.manual_seed(77)
    resumed, resumed_swa = run(tmp_path / 'interrupted', 5, resume_from=path, seed=4)
    assert_bit_equal(snapshot(resumed_swa.swa_model), snapshot(reference_swa.swa_model))
    assert_bit_equal(snapshot(resumed.model), snapshot(reference.model))
    assert resumed.optimizer.param_groups[0]['lr'] == reference.optimizer.param_groups[0]['lr']


def test_swa_arguments_are_checked():
    with pytest.raises(ValueError, match='swa_start_epoch'):
        StochasticWeightAveraging(swa_start_epoch=1.5)
    with pytest.raises(ValueError, match='anneal_strategy'):
        StochasticWeightAveraging(anneal_strategy='step')
