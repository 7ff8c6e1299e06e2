"""Learning-rate schedulers inside real fits, compared with torch's own schedulers stepped by hand."""
import contextlib
import math
import os

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as tls

from aitoolbox_like import MultiOptimizer, TrainLoop, TTModel
from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.callbacks.train_schedule import (
    AbstractScheduler, ConstantWithWarmupScheduler, CosineScheduler, CosineWithWarmupScheduler, ExponentialScheduler,
    FunctionScheduler, GeneralLRSchedulerCallback, HardRestartsCosineWithWarmupScheduler, LambdaLRScheduler,
    LinearWarmupScheduler, LinearWithWarmupScheduler, LRMonitor, LRSchedulerCallback, MultiStepLRScheduler,
    PolynomialScheduler, ReduceLROnPlateauMetricScheduler, ReduceLROnPlateauScheduler, StepLRScheduler)
from aitoolbox_like.checkpoint import check_weights_only_safe
from helpers import MLP, loaders

BASE_LR = 0.1


class LRRecorder(AbstractCallback):
    """The learning rate each optimizer update uses, per optimizer index."""

    def __init__(self):
        super().__init__('lr recorder', execution_order=-5)
        self.lrs = {}

    def on_after_gradient_update(self, optimizer_idx):
        optimizer = self.train_loop_obj.optimizer
        if isinstance(optimizer, MultiOptimizer):
            optimizer = optimizer[optimizer_idx]
        self.lrs.setdefault(optimizer_idx, []).append(optimizer.param_groups[0]['lr'])


def make_loop(n=24, batch_size=8, lr=BASE_LR, optimizer_fn=None, **kwargs):
    torch.manual_seed(0)
    model = MLP()
    train, val, test = loaders(n=n, batch_size=batch_size)
    optimizer = optimizer_fn(model) if optimizer_fn else torch.optim.SGD(model.parameters(), lr=lr)
    return TrainLoop(model, train, val, test, optimizer, nn.CrossEntropyLoss(), **kwargs)


def torch_lrs(make_scheduler, num_steps, lr=BASE_LR):
    """LR before each of num_steps steps of a torch scheduler on a parallel dummy optimizer."""
    dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    scheduler = make_scheduler(dummy)
    lrs = []
    for _ in range(num_steps):
        lrs.append(dummy.param_groups[0]['lr'])
        dummy.step()
        scheduler.step()
    return lrs


def per_update(epoch_lrs, updates_per_epoch):
    return [lr for lr in epoch_lrs for _ in range(updates_per_epoch)]


def test_step_lr_per_epoch_matches_torch_and_goes_into_history():
    loop, rec = make_loop(), LRRecorder()
    loop.fit(num_epochs=5, callbacks=[StepLRScheduler(step_size=2, gamma=0.5), rec])
    expected = torch_lrs(lambda o: tls.StepLR(o, step_size=2, gamma=0.5), 5)
    assert rec.lrs[0] == pytest.approx(per_update(expected, 3))
    assert loop.train_history['lr'] == pytest.approx(expected)
    assert loop.train_history.get_epochs('lr') == [0, 1, 2, 3, 4]


def test_multistep_and_general_wrapper_match_torch():
    loop, rec = make_loop(), LRRecorder()
    loop.fit(num_epochs=4, callbacks=[MultiStepLRScheduler([1, 3], gamma=0.1), rec])
    assert rec.lrs[0] == pytest.approx(per_update(torch_lrs(lambda o: tls.MultiStepLR(o, [1, 3], 0.1), 4), 3))

    loop, rec = make_loop(), LRRecorder()
    loop.fit(num_epochs=4, callbacks=[GeneralLRSchedulerCallback(tls.ExponentialLR, gamma=0.7), rec])
    assert rec.lrs[0] == pytest.approx(per_update(torch_lrs(lambda o: tls.ExponentialLR(o, 0.7), 4), 3))


# The published warm-up shapes (HuggingFace transformers' get_*_schedule_with_warmup, which AIToolbox's
# schedulers.warmup follows), written out here so that the expected curves owe nothing to the code under test.
def hf_linear(step, warmup, total):
    if step < warmup:
        return step / max(1, warmup)
    return max(0., (total - step) / max(1, total - warmup))


def hf_cosine(step, warmup, total, num_cycles=0.5):
    if step < warmup:
        return step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return max(0., 0.5 * (1. + math.cos(math.pi * num_cycles * 2. * progress)))


def hf_hard_restarts(step, warmup, total, num_cycles=1.):
    if step < warmup:
        return step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    if progress >= 1.:
        return 0.
    return max(0., 0.5 * (1. + math.cos(math.pi * ((num_cycles * progress) % 1.))))


def hf_constant(step, warmup):
    return step / max(1., warmup) if step < warmup else 1.


def test_published_shapes_as_written_here_have_their_landmarks():
    # Guards the oracle itself against a slip: warm-up ends at 1, half a cosine wave ends at 0, hard restarts
    # climb back to 1 at each cycle's start, and every decay is 0 from num_training_steps on.
    assert [hf_linear(t, 2, 6) for t in range(8)] == [0., .5, 1., .75, .5, .25, 0., 0.]
    assert [hf_constant(t, 4) for t in range(6)] == [0., .25, .5, .75, 1., 1.]
    assert hf_cosine(2, 2, 10) == 1. and hf_cosine(6, 2, 10) == pytest.approx(.5) and hf_cosine(10, 2, 10) == 0.
    assert hf_cosine(10, 2, 10, num_cycles=1.) == 1.          # a full wave comes back up
    assert [hf_hard_restarts(t, 2, 10, 2) for t in (2, 6, 10, 11)] == [1., 1., 0., 0.]
    assert hf_hard_restarts(4, 2, 10, 2) == pytest.approx(.5)


# Four epochs of 3 updates: 12 steps, past num_training_steps=10, so the tail after the schedule is checked too.
@pytest.mark.parametrize('cls, args, shape', [
    (LinearWithWarmupScheduler, dict(num_warmup_steps=3, num_training_steps=10), lambda t: hf_linear(t, 3, 10)),
    (LinearWithWarmupScheduler, dict(num_warmup_steps=0, num_training_steps=8), lambda t: hf_linear(t, 0, 8)),
    (CosineWithWarmupScheduler, dict(num_warmup_steps=2, num_training_steps=10), lambda t: hf_cosine(t, 2, 10)),
    (CosineWithWarmupScheduler, dict(num_warmup_steps=3, num_training_steps=11, num_cycles=1.25),
     lambda t: hf_cosine(t, 3, 11, 1.25)),
    (HardRestartsCosineWithWarmupScheduler, dict(num_warmup_steps=2, num_training_steps=10, num_cycles=2),
     lambda t: hf_hard_restarts(t, 2, 10, 2)),
    # AIToolbox's default is half a wave (transformers' is 1): one decay that ends at 0.5, then 0 after the end
    (HardRestartsCosineWithWarmupScheduler, dict(num_warmup_steps=1, num_training_steps=9),
     lambda t: hf_hard_restarts(t, 1, 9, 0.5)),
    (ConstantWithWarmupScheduler, dict(num_warmup_steps=4), lambda t: hf_constant(t, 4)),
    (ConstantWithWarmupScheduler, dict(num_warmup_steps=1), lambda t: hf_constant(t, 1)),
])
def test_warmup_schedulers_follow_the_published_shapes_once_per_real_update_with_grad_accumulation(cls, args, shape):
    # 5 batches of 8 per epoch, grad_accumulation=2: updates after batches 2, 4 and 5 (last) -> 3 per epoch.
    loop, rec, callback = make_loop(n=40), LRRecorder(), cls(**args)
    loop.fit(num_epochs=4, callbacks=[callback, rec], grad_accumulation=2)
    expected = [BASE_LR * shape(step) for step in range(12)]
    assert len(rec.lrs[0]) == 12
    assert rec.lrs[0] == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert callback.scheduler.last_epoch == 12


def test_lambda_lr_on_epoch_and_on_batch():
    fn = lambda step: 0.9 ** step   # noqa: E731
    loop, rec = make_loop(), LRRecorder()
    loop.fit(num_epochs=3, callbacks=[LambdaLRScheduler(fn, execute_epoch_end=False, execute_batch_end=True), rec])
    assert rec.lrs[0] == pytest.approx(torch_lrs(lambda o: tls.LambdaLR(o, fn), 9))

    loop, rec = make_loop(), LRRecorder()
    loop.fit(num_epochs=3, callbacks=[LambdaLRScheduler(fn), rec])
    assert rec.lrs[0] == pytest.approx(per_update(torch_lrs(lambda o: tls.LambdaLR(o, fn), 3), 3))


@pytest.mark.parametrize('callback_fn, torch_fn, interval', [
    (lambda: ExponentialScheduler(0.8), lambda o: tls.ExponentialLR(o, 0.8), 'epoch'),
    (lambda: PolynomialScheduler(num_training_steps=12, power=2.), lambda o: tls.PolynomialLR(o, 12, 2.), 'step'),
    # num_training_steps=None: the whole fit, 4 epochs x 3 updates.
    (lambda: CosineScheduler(min_lr_factor=0.1), lambda o: tls.CosineAnnealingLR(o, 12, eta_min=0.01), 'step'),
    (lambda: CosineScheduler(interval='epoch'), lambda o: tls.CosineAnnealingLR(o, 4), 'epoch'),
    (lambda: LinearWarmupScheduler(5, start_factor=0.2), lambda o: tls.LinearLR(o, 0.2, 1.0, 5), 'step'),
    (lambda: LinearWarmupScheduler(2, interval='epoch', start_factor=0.5),
     lambda o: tls.LinearLR(o, 0.5, 1.0, 2), 'epoch'),
])
def test_common_schedules_match_torch(callback_fn, torch_fn, interval):
    loop, rec = make_loop(), LRRecorder()
    loop.fit(num_epochs=4, callbacks=[callback_fn(), rec])
    if interval == 'step':
        expected = torch_lrs(torch_fn, 12)
    else:
        expected = per_update(torch_lrs(torch_fn, 4), 3)
    assert rec.lrs[0] == pytest.approx(expected, rel=1e-6, abs=1e-12)


def test_warmup_then_decay_and_user_function():
    loop, rec = make_loop(), LRRecorder()
    loop.fit(num_epochs=4, callbacks=[ExponentialScheduler(0.5, interval='step', num_warmup_steps=4), rec])
    expected = [BASE_LR * t / 4 for t in range(4)] + [BASE_LR * 0.5 ** t for t in range(8)]
    assert rec.lrs[0] == pytest.approx(expected)

    loop, rec = make_loop(), LRRecorder()
    loop.fit(num_epochs=3, callbacks=[FunctionScheduler(lambda epoch, lr0: lr0 / (1 + epoch)), rec])
    assert rec.lrs[0] == pytest.approx(per_update([BASE_LR, BASE_LR / 2, BASE_LR / 3], 3))


def test_torch_scheduler_wrapper_per_step_and_built_instance():
    loop, rec = make_loop(), LRRecorder()
    loop.fit(num_epochs=2, callbacks=[
        LRSchedulerCallback(tls.OneCycleLR, interval='step', max_lr=1.0, total_steps=6), rec])
    assert rec.lrs[0] == pytest.approx(torch_lrs(lambda o: tls.OneCycleLR(o, max_lr=1.0, total_steps=6), 6))

    loop, rec = make_loop(), LRRecorder()
    built = tls.StepLR(loop.optimizer, step_size=1, gamma=0.5)
    loop.fit(num_epochs=3, callbacks=[LRSchedulerCallback(built), rec])
    assert rec.lrs[0] == pytest.approx(per_update([0.1, 0.05, 0.025], 3))


class MetricWriter(AbstractCallback):
    """Writes a scripted metric into the history on the epochs given."""

    def __init__(self, name, values_by_epoch, execution_order=0):
        super().__init__('metric writer', execution_order)
        self.name, self.values_by_epoch = name, values_by_epoch

    def on_epoch_end(self):
        epoch = self.train_loop_obj.epoch
        if epoch in self.values_by_epoch:
            self.train_loop_obj.insert_metric_result_into_history(self.name, self.values_by_epoch[epoch])


def test_plateau_on_metric_steps_only_on_new_values():
    # The metric is computed every 2nd epoch; the scheduler is registered before the writer yet runs after it.
    values = {0: 1.0, 2: 1.0, 4: 1.0, 6: 1.0}
    loop, rec = make_loop(), LRRecorder()
    scheduler = ReduceLROnPlateauMetricScheduler('val_metric', patience=1, factor=0.5)
    loop.fit(num_epochs=8, callbacks=[scheduler, MetricWriter('val_metric', values), rec])
    dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=BASE_LR)
    reference = tls.ReduceLROnPlateau(dummy, patience=1, factor=0.5)
    expected = []
    for epoch in range(8):
        expected.append(dummy.param_groups[0]['lr'])
        if epoch in values:
            reference.step(values[epoch])
    assert loop.train_history['lr'] == pytest.approx(expected)
    # Had stale values been re-read every epoch, the LR would have dropped already at epoch 3.
    assert expected[3] == BASE_LR and expected[5] < BASE_LR

    loop = make_loop()
    wrapper = LRSchedulerCallback(tls.ReduceLROnPlateau, monitor='val_metric', patience=1, factor=0.5)
    loop.fit(num_epochs=8, callbacks=[wrapper, MetricWriter('val_metric', values)])
    assert loop.train_history['lr'] == pytest.approx(expected)


def test_plateau_on_validation_loss_matches_torch_fed_by_hand():
    loop = make_loop()
    loop.fit(num_epochs=5, callbacks=[ReduceLROnPlateauScheduler(patience=0, factor=0.5, threshold=0.05)])
    dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=BASE_LR)
    reference = tls.ReduceLROnPlateau(dummy, patience=0, factor=0.5, threshold=0.05)
    expected = []
    for val_loss in loop.train_history['val_loss']:
        expected.append(dummy.param_groups[0]['lr'])
        reference.step(val_loss)
    assert loop.train_history['lr'] == pytest.approx(expected)
    assert min(expected) < BASE_LR      # the plateau rule fired at least once

    with pytest.raises(ValueError, match='no_such_metric'):
        make_loop().fit(num_epochs=1, callbacks=[ReduceLROnPlateauMetricScheduler('no_such_metric')])


def two_optimizers(model):
    layers = list(model.net)
    return MultiOptimizer([torch.optim.SGD(layers[0].parameters(), lr=0.1),
                           torch.optim.SGD(layers[3].parameters(), lr=0.2)])


def test_multi_optimizer_each_scheduler_drives_its_own_optimizer():
    loop, rec = make_loop(optimizer_fn=two_optimizers), LRRecorder()
    warmup = LinearWithWarmupScheduler(3, 9, optimizer_idx=1)
    loop.fit(num_epochs=3, callbacks=[StepLRScheduler(1, gamma=0.5, optimizer_idx=0), warmup, rec])
    assert rec.lrs[0] == pytest.approx(per_update(torch_lrs(lambda o: tls.StepLR(o, 1, 0.5), 3), 3))
    assert rec.lrs[1] == pytest.approx([0.2 * hf_linear(t, 3, 9) for t in range(9)], rel=1e-12, abs=1e-15)
    assert set(loop.train_history.keys()) >= {'lr_0_0', 'lr_1_0'} and 'lr' not in loop.train_history
    assert loop.train_history['lr_1_0'] == pytest.approx([0.0, 0.2 * 6 / 6 * 1.0, 0.2 * 3 / 6])

    with pytest.raises(ValueError, match='optimizer_idx'):
        make_loop(optimizer_fn=two_optimizers).fit(num_epochs=1, callbacks=[StepLRScheduler(1)])


class InfOnBatches(TTModel):
    """A classifier whose loss is infinite on the batches flagged in the data (a fp16 overflow stand-in)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 2)

    def forward(self, x):
        return self.net(x)

    def get_loss(self, batch, criterion, device):
        x, y, poison = batch
        return criterion(self(x), y) * poison.max()

    def get_predictions(self, batch, device):
        x, y, _ = batch
        return self(x), y, None


def fake_fp16_loop(optimizer_fn, poisoned_batches, num_batches=8):
    """A CPU loop whose updates go through a real (CPU) GradScaler, as under use_amp='fp16' on CUDA."""
    torch.manual_seed(0)
    x, y = torch.randn(num_batches * 4, 4), torch.randint(0, 2, (num_batches * 4,))
    poison = torch.ones(num_batches * 4)
    for b in poisoned_batches:
        poison[b * 4:(b + 1) * 4] = float('inf')
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y, poison), batch_size=4)
    model = InfOnBatches()
    loop = TrainLoop(model, data, None, None, optimizer_fn(model), nn.CrossEntropyLoss(), end_auto_eval=False)
    loop._amp.mode, loop._amp.uses_scaler = 'fp16', True
    loop._amp.autocast = contextlib.nullcontext
    loop.amp_scaler = loop._amp.scaler = torch.amp.GradScaler('cpu', init_scale=2. ** 8)
    return loop


@pytest.mark.parametrize('poisoned', [[2, 5], [0, 5]])     # [0, ...]: a fused optimizer's first update skipped
@pytest.mark.parametrize('fused', [False, True])
def test_batch_scheduler_does_not_step_when_grad_scaler_skips_the_update(fused, poisoned):
    loop = fake_fp16_loop(lambda m: torch.optim.Adam(m.parameters(), lr=BASE_LR, fused=fused), poisoned)
    rec = LRRecorder()
    callback = LinearWithWarmupScheduler(num_warmup_steps=4, num_training_steps=8)
    weights_before = loop.model.net.weight.detach().clone()
    loop.fit(num_epochs=1, callbacks=[callback, rec])
    assert loop.amp_scaler.get_scale() == 2. ** 6            # the scaler really skipped two updates
    assert not torch.equal(weights_before, loop.model.net.weight)
    # 8 update attempts; the schedule advances only after the 6 that were applied.
    expected, step = [], 0
    for batch in range(8):
        expected.append(BASE_LR * hf_linear(step, 4, 8))
        if batch not in poisoned:
            step += 1
    assert rec.lrs[0] == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert callback.scheduler.last_epoch == 6


def test_scheduler_state_resumes_the_same_curve():
    full, rec_full = make_loop(), LRRecorder()
    full.fit(num_epochs=4, callbacks=[LinearWithWarmupScheduler(4, 12), rec_full])

    first = make_loop()
    scheduler = LinearWithWarmupScheduler(4, 12)
    first.fit(num_epochs=2, callbacks=[scheduler])
    state = first.callbacks_handler.callbacks_state_dict()
    check_weights_only_safe(state)
    state = {k: v for k, v in state.items() if k == scheduler.state_key}
    assert state and isinstance(scheduler, AbstractScheduler) and first.get_schedulers() == [scheduler]

    second, rec = make_loop(), LRRecorder()
    resumed = LinearWithWarmupScheduler(4, 12)
    resumed.load_state_dict(state[scheduler.state_key])    # before registration: applied once built
    second.fit(num_epochs=2, callbacks=[resumed, rec])
    assert rec.lrs[0] == pytest.approx(rec_full.lrs[0][6:])


def test_one_lr_monitor_and_multiple_param_groups():
    def two_groups(model):
        layers = list(model.net)
        return torch.optim.SGD([{'params': layers[0].parameters()}, {'params': layers[3].parameters(), 'lr': 0.01}],
                               lr=0.1)
    loop = make_loop(optimizer_fn=two_groups)
    loop.fit(num_epochs=2, callbacks=[StepLRScheduler(1, gamma=0.5), LRMonitor(), LRMonitor()])
    # the user's monitors are kept (the default one is not added beside them), and only one of them writes
    assert sum(isinstance(cb, LRMonitor) for cb in loop.callbacks) == 2
    assert loop.train_history['lr_0_0'] == pytest.approx([0.1, 0.05])
    assert loop.train_history['lr_0_1'] == pytest.approx([0.01, 0.005])


def test_bad_arguments_fail_clearly():
    with pytest.raises(ValueError, match='interval'):
        CosineScheduler(interval='batch')
    with pytest.raises(ValueError, match='monitor'):
        LRSchedulerCallback(tls.ReduceLROnPlateau, interval='step', monitor='val_loss')
    with pytest.raises(ValueError, match='validation_loader'):
        loop = make_loop()
        loop.validation_loader = None
        loop.fit(num_epochs=1, callbacks=[ReduceLROnPlateauScheduler()])


def test_plateau_scheduler_is_registered_without_a_validation_loader_and_fit_refuses_before_the_first_step():
    # AIToolbox code registers schedulers on a loop whose loaders are None; the check belongs to fit.
    loop = TrainLoop(MLP(), None, None, None, None, None)
    loop.callbacks_handler.register_callbacks([ReduceLROnPlateauScheduler()])
    trained = make_loop()
    trained.validation_loader = None
    before = {k: v.clone() for k, v in trained.model.state_dict().items()}
    with pytest.raises(ValueError, match='validation_loader'):
        trained.fit(num_epochs=1, callbacks=[ReduceLROnPlateauScheduler()])
    assert all(torch.equal(before[k], v) for k, v in trained.model.state_dict().items())


# ---- one-cycle ----------------------------------------------------------------------------------------------

def _one_cycle_reference(total_steps, **kwargs):
    """(lr, momentum) before each update of torch's OneCycleLR driven by hand on a parallel optimizer."""
    dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=BASE_LR)
    scheduler = tls.OneCycleLR(dummy, total_steps=total_steps, **kwargs)
    values = []
    for _ in range(total_steps):
        values.append((dummy.param_groups[0]['lr'], dummy.param_groups[0]['momentum']))
        dummy.step()
        scheduler.step()
    return values


class LRMomentumRecorder(LRRecorder):
    def on_after_gradient_update(self, optimizer_idx):
        group = self.train_loop_obj.optimizer.param_groups[0]
        self.lrs.setdefault(0, []).append((group['lr'], group['momentum']))


@pytest.mark.parametrize('grad_accumulation, kwargs', [
    (1, {}), (2, {}), (1, dict(pct_start=0.5, anneal_strategy='linear', three_phase=True, div_factor=10.))])
def test_one_cycle_over_the_fit_equals_torch_one_cycle_by_hand(grad_accumulation, kwargs):
    from aitoolbox_like.callbacks.train_schedule import OneCycleScheduler
    loop, rec = make_loop(n=40), LRMomentumRecorder()      # 5 batches per epoch
    callback = OneCycleScheduler(max_lr=0.5, **kwargs)
    loop.fit(num_epochs=4, callbacks=[callback, rec], grad_accumulation=grad_accumulation)
    total = loop.get_num_optimizer_updates()
    assert total == 4 * -(-5 // grad_accumulation) == callback.scheduler.total_steps
    assert rec.lrs[0] == _one_cycle_reference(total, max_lr=0.5, **kwargs)
    assert isinstance(callback, AbstractScheduler) and loop.get_schedulers() == [callback]
    # a later fit past the cycle keeps the last rate instead of failing
    loop.fit(num_epochs=5)
    assert callback.scheduler.last_epoch == total


def test_one_cycle_resume_is_exact(tmp_path):
    from aitoolbox_like.callbacks.train_schedule import OneCycleScheduler
    from aitoolbox_like.callbacks.abstract import StopTraining
    from aitoolbox_like.tracking import TrainLoopCheckpoint

    class Interrupt(AbstractCallback):
        # the run is cut after global batch 10 (in epoch 2 of 4), as a killed process would be
        def __init__(self):
            super().__init__('interrupt')

        def on_batch_end(self):
            if self.train_loop_obj.total_iteration_idx == 10:
                raise StopTraining('interrupted')

    def run(folder, num_epochs, resume_from=None, iteration_save_freq=0, extra=()):
        torch.manual_seed(0)
        model = MLP(dropout=0.3)
        train, val, test = loaders(n=40, batch_size=8)
        loop = TrainLoopCheckpoint(model, train, val, test, torch.optim.SGD(model.parameters(), lr=BASE_LR),
                                   nn.CrossEntropyLoss(), 'proj', 'cycle', str(folder), {}, cloud_save_mode='local',
                                   iteration_save_freq=iteration_save_freq, progress_bar=False)
        rec = LRMomentumRecorder()
        loop.fit(num_epochs=num_epochs, callbacks=[OneCycleScheduler(max_lr=0.5), rec, *extra],
                 resume_from=resume_from)
        return loop, rec

    reference, reference_rec = run(tmp_path / 'reference', 4)
    first, _ = run(tmp_path / 'interrupted', 4, iteration_save_freq=4, extra=[Interrupt()])
    folder = os.path.join(first.experiment.dir_path, 'checkpoint_model')
    mid = next(f for f in sorted(os.listdir(folder)) if f.endswith('_E1_ITER8.pth'))   # inside epoch 1
    resumed, rec = run(tmp_path / 'interrupted', 4, resume_from=os.path.join(folder, mid))
    assert rec.lrs[0] == reference_rec.lrs[0][9:]
    assert all(torch.equal(a, b) for a, b in zip(resumed.model.state_dict().values(),
                                                   reference.model.state_dict().values()))


def test_verbose_of_aitoolbox_era_code_is_dropped_with_a_warning():
    # torch's schedulers no longer take verbose=; AIToolbox examples pass it (ReduceLROnPlateauScheduler(verbose=True)).
    loop = make_loop()
    with pytest.warns(UserWarning, match='verbose=True ignored'):
        loop.fit(num_epochs=2, callbacks=[ReduceLROnPlateauScheduler(patience=0, verbose=True)])
    assert len(loop.train_history['val_loss']) == 2


# ---- warmup_ratio: transformers' ceil(ratio x total optimizer updates), resolved when the fit starts ----------------

@pytest.mark.parametrize('cls, args, shape', [
    # 5 batches a epoch with grad_accumulation=2: 3 updates an epoch, 12 in 4 epochs; ceil(0.3 x 12) = 4 warm-up steps
    (LinearWithWarmupScheduler, dict(warmup_ratio=0.3), lambda t: hf_linear(t, 4, 12)),
    (CosineWithWarmupScheduler, dict(warmup_ratio=0.3), lambda t: hf_cosine(t, 4, 12)),
    (HardRestartsCosineWithWarmupScheduler, dict(warmup_ratio=0.3, num_cycles=2),
     lambda t: hf_hard_restarts(t, 4, 12, 2)),
    (ConstantWithWarmupScheduler, dict(warmup_ratio=0.3), lambda t: hf_constant(t, 4)),
    # a ratio of the given training steps: ceil(0.25 x 10) = 3
    (LinearWithWarmupScheduler, dict(warmup_ratio=0.25, num_training_steps=10), lambda t: hf_linear(t, 3, 10)),
])
@pytest.mark.parametrize('registered_before_fit', [False, True])
def test_warmup_ratio_is_transformers_share_of_the_fits_optimizer_updates(cls, args, shape, registered_before_fit):
    loop, rec, callback = make_loop(n=40), LRRecorder(), cls(**args)
    if registered_before_fit:       # the fit's length is unknown then: a schedule that needs it is built at its start
        loop.callbacks_handler.register_callbacks([callback])
        assert (callback.scheduler is None) == ('num_training_steps' not in args)
    loop.fit(num_epochs=4, callbacks=[callback, rec], grad_accumulation=2)
    assert rec.lrs[0] == pytest.approx([BASE_LR * shape(step) for step in range(12)], rel=1e-12, abs=1e-15)
    assert callback.warmup_steps == math.ceil(args['warmup_ratio'] * args.get('num_training_steps', 12))


def test_warmup_ratio_of_our_schedules_per_update_and_per_epoch():
    # 3 updates an epoch, 12 in all: ceil(0.2 x 12) = 3 warm-up updates, then the cosine over the other 9
    loop, rec = make_loop(), LRRecorder()
    loop.fit(num_epochs=4, callbacks=[CosineScheduler(warmup_ratio=0.2), rec])
    expected = [BASE_LR * (t / 3 if t < 3 else 0.5 * (1 + math.cos(math.pi * (t - 3) / 9))) for t in range(12)]
    assert rec.lrs[0] == pytest.approx(expected, rel=1e-12, abs=1e-15)
    # per epoch: ceil(0.5 x 4 epochs) = 2 warm-up epochs from 0.5 x lr
    loop, rec = make_loop(), LRRecorder()
    loop.fit(num_epochs=4, callbacks=[LinearWarmupScheduler(interval='epoch', start_factor=0.5, warmup_ratio=0.5), rec])
    assert rec.lrs[0] == pytest.approx(per_update(torch_lrs(lambda o: tls.LinearLR(o, 0.5, 1.0, 2), 4), 3))


@pytest.mark.parametrize('make', [
    lambda: LinearWithWarmupScheduler(num_warmup_steps=2, warmup_ratio=0.1),
    lambda: ConstantWithWarmupScheduler(2, warmup_ratio=0.1),
    lambda: CosineScheduler(num_warmup_steps=2, warmup_ratio=0.1),
    lambda: LinearWarmupScheduler(2, warmup_ratio=0.1),
])
def test_warmup_ratio_and_num_warmup_steps_together_are_refused(make):
    with pytest.raises(ValueError, match=r'num_warmup_steps=2 and warmup_ratio=0\.1; give one of them'):
        make()


@pytest.mark.parametrize('make, message', [
    (lambda: LinearWithWarmupScheduler(warmup_ratio=1.5), r'warmup_ratio must be a number in \[0, 1\]'),
    (lambda: LinearWithWarmupScheduler(num_training_steps=10), r'pass num_warmup_steps=<steps> or warmup_ratio='),
    (lambda: LinearWarmupScheduler(), r'pass num_warmup_steps=<steps> or warmup_ratio='),
])
def test_warmup_arguments_that_say_no_warm_up_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_aitoolbox_warmup_signatures_still_take_positional_counts():
    # AIToolbox 1.8.0's calls: (num_warmup_steps, num_training_steps) positional, last_epoch and optimizer_idx by name
    loop, rec = make_loop(n=40), LRRecorder()
    loop.fit(num_epochs=4, callbacks=[LinearWithWarmupScheduler(3, 12, last_epoch=-1), rec], grad_accumulation=2)
    assert rec.lrs[0] == pytest.approx([BASE_LR * hf_linear(t, 3, 12) for t in range(12)], rel=1e-12, abs=1e-15)


def test_a_function_building_the_scheduler_gets_the_keyword_arguments():
    # LRSchedulerCallback(function, **kwargs) builds function(optimizer, **kwargs), as it does a class
    def schedule(optimizer, gamma):
        return tls.ExponentialLR(optimizer, gamma)
    loop, rec = make_loop(), LRRecorder()
    loop.fit(num_epochs=3, callbacks=[LRSchedulerCallback(schedule, interval='step', gamma=0.5), rec])
    assert rec.lrs[0] == pytest.approx(torch_lrs(lambda o: tls.ExponentialLR(o, 0.5), 9))
