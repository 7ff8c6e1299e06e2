"""skip_update() and LossSpikeGuard on a GPU. A fit whose callback leaves updates out, and one whose LossSpikeGuard
leaves a spike's update out, make no host sync (they run under ``torch.cuda.set_sync_debug_mode('error')``, which
raises at the first) and give the weights of a hand-written loop leaving the same updates out, to the bit. Under fp16
a left-out update goes through the GradScaler as the hand-written loop's does (unscaled, no step, zeroed, the
scaler's update); a rollback from pinned host memory equals a fit on the batches it kept."""
import contextlib

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import AbstractCallback, TrainLoop
from aitoolbox_like.callbacks.health import LossSpikeGuard
from aitoolbox_like.callbacks.train_schedule import LRSchedulerCallback
from gpu_common import Net, dataset, differing, make_optimizer, weights

SKIPPED = {2, 7}            # global batch indices whose update is left out (6 batches an epoch)
SPIKE = 4                   # the batch of each epoch whose inputs are 1000 times too large


@contextlib.contextmanager
def no_host_sync(device):
    """Raise at the first synchronizing CUDA call inside the block (nothing to check on the CPU)."""
    if device.type != 'cuda':
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode('error')
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _data(spike=False):
    data = dataset(96, 1)
    if spike:
        x, y = data.tensors
        x = x.clone()
        x[SPIKE * 16:(SPIKE + 1) * 16] *= 1000
        data = TensorDataset(x, y)
    return data


def _train_loader(spike=False, keep=None):
    """Workers and pinned memory, as a GPU run's loaders usually are (the loop then copies batches to the GPU
    without waiting); no shuffling."""
    data = _data(spike)
    if keep is not None:
        x, y = data.tensors
        rows = torch.cat([torch.arange(b * 16, (b + 1) * 16) for b in keep])
        data = TensorDataset(x[rows], y[rows])
    return DataLoader(data, batch_size=16, shuffle=False, num_workers=2, pin_memory=True)


def _model(device, optimizer='adam'):
    torch.manual_seed(0)
    model = Net(dropout=0.1).to(device)
    return model, make_optimizer(optimizer, model.parameters())


def _hand_written(device, skipped, optimizer='adam', amp=None, epochs=2):
    """The PyTorch loop: Adam and a per-update StepLR (or the fp16 AMP recipe), the updates of ``skipped`` left out
    (zero_grad, no step, the schedule not stepped; under fp16 unscaled and the scaler updated, as a skipped step)."""
    model, opt = _model(device, optimizer)
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler(device.type, enabled=amp == 'fp16')
    criterion = nn.CrossEntropyLoss()
    idx = -1
    for _ in range(epochs):
        for x, y in _train_loader():
            idx += 1
            with torch.autocast(device.type, dtype=torch.float16, enabled=amp == 'fp16'):
                loss = criterion(model(x.to(device)), y.to(device))
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            if idx not in skipped:
                scaler.step(opt)
                schedule.step()
            scaler.update()
            opt.zero_grad()
    return model, scaler


class SkipAt(AbstractCallback):
    def __init__(self, at):
        super().__init__('skip at')
        self.at = set(at)

    def on_after_backward(self):
        if self.train_loop_obj.total_iteration_idx in self.at:
            self.train_loop_obj.skip_update()


def _loop(device, train, optimizer='adam', **kwargs):
    model, opt = _model(device, optimizer)
    loop = TrainLoop(model, train, None, None, opt, nn.CrossEntropyLoss(), cuda_device_idx=0 if device.type == 'cuda'
                     else None, progress_bar=False, **kwargs)
    return loop, LRSchedulerCallback(torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5), interval='step')


def test_skip_update_makes_no_host_sync_and_equals_the_hand_written_loop(device):
    loop, schedule = _loop(device, _train_loader())
    with no_host_sync(device):
        loop.fit(num_epochs=2, callbacks=[SkipAt(SKIPPED), schedule])
    reference, _ = _hand_written(device, SKIPPED)
    assert differing(weights(loop.model), weights(reference)) == {}
    assert loop.steering.skipped_updates == len(SKIPPED)


def test_loss_spike_guard_skips_without_a_host_sync_as_a_fit_skipping_the_spike_by_hand(device):
    guarded, schedule = _loop(device, _train_loader(spike=True))
    guard = LossSpikeGuard(window=4, threshold=20)
    with no_host_sync(device):
        guarded.fit(num_epochs=2, callbacks=[guard, schedule])
    by_hand, by_hand_schedule = _loop(device, _train_loader(spike=True))
    by_hand.fit(num_epochs=2, callbacks=[SkipAt({SPIKE, 6 + SPIKE}), by_hand_schedule])
    assert [e['batch'] for e in guard.skipped] == [SPIKE, 6 + SPIKE]
    assert differing(weights(guarded.model), weights(by_hand.model)) == {}


def test_under_fp16_a_skipped_update_goes_through_the_grad_scaler_as_the_hand_written_loops(device):
    if device.type != 'cuda':
        pytest.skip('float16 with a GradScaler needs CUDA')
    loop, schedule = _loop(device, _train_loader(), optimizer='sgd', use_amp='fp16')
    loop.fit(num_epochs=2, callbacks=[SkipAt(SKIPPED), schedule])
    reference, scaler = _hand_written(device, SKIPPED, optimizer='sgd', amp='fp16')
    assert differing(weights(loop.model), weights(reference)) == {}
    assert loop.amp_scaler.get_scale() == scaler.get_scale()


def test_a_rollback_from_pinned_host_memory_equals_a_fit_on_the_kept_batches(device):
    # A snapshot after every update (two kept, in pinned host memory): the spike at batch 4 goes back to the one
    # after batch 3 and skips 2 batches, to the end of the epoch.
    guarded, schedule = _loop(device, _train_loader(spike=True))
    guard = LossSpikeGuard(window=4, threshold=20, action='rollback', rollback_steps=1, skip_batches=2)
    guarded.fit(num_epochs=1, callbacks=[guard, schedule])
    [rollback] = guard.rollbacks
    kept = list(range(rollback['to_batch'] + 1)) + list(range(rollback['continue_at'], 6))
    oracle, oracle_schedule = _loop(device, _train_loader(spike=True, keep=kept))
    oracle.fit(num_epochs=1, callbacks=[oracle_schedule])
    assert rollback['batch'] == SPIKE
    for name, value in weights(oracle.model).items():
        torch.testing.assert_close(weights(guarded.model)[name], value, rtol=1e-6, atol=1e-6)
