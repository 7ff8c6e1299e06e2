"""LossSpikeGuard on data with one spiking batch: 'skip' equals the fit that leaves that update out by hand, to the
bit; 'rollback' equals a fit on the batches it kept, to 1e-6; both are counted in the history and survive a resume.
(HangWatchdog, which ends its process, is in tests/distributed/test_hang_watchdog.py.)"""
import logging

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import AbstractCallback, TrainLoop, TTBasicModel
from aitoolbox_like.callbacks.health import HangWatchdog, LossSpikeGuard
from aitoolbox_like.callbacks.model_save import ModelCheckpoint
from aitoolbox_like.callbacks.train_schedule import LRSchedulerCallback

BATCHES, SPIKE = 20, 13         # batches per epoch, the spiking batch of each epoch


class Linear(TTBasicModel):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def forward(self, x):
        return self.layer(x)


def _batches():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCHES * 4, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-1.0], [0.5], [2.0]]) + 0.05 * torch.randn(BATCHES * 4, 1, generator=g)
    y[SPIKE * 4:(SPIKE + 1) * 4] *= 60          # one batch whose loss is thousands of times the others'
    return x, y


def _loop(keep=None):
    """The loop over the batches (``keep``: only these batch indices, in order)."""
    torch.manual_seed(0)
    model = Linear()
    x, y = _batches()
    if keep is not None:
        rows = torch.cat([torch.arange(b * 4, (b + 1) * 4) for b in keep])
        x, y = x[rows], y[rows]
    loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    return TrainLoop(model, loader, None, None, optimizer, nn.MSELoss(), progress_bar=False), model


def _schedule(loop):
    return LRSchedulerCallback(torch.optim.lr_scheduler.StepLR(loop.optimizer, step_size=3, gamma=0.9),
                               interval='step')


class SkipByHand(AbstractCallback):
    may_skip_updates = True

    def __init__(self, at):
        super().__init__('skip by hand')
        self.at = set(at)

    def on_after_backward(self):
        if self.train_loop_obj.total_iteration_idx in self.at:
            self.train_loop_obj.skip_update()


def _equal(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize('monitor', ['loss', 'grad_norm'])
def test_skip_leaves_out_the_spikes_update_as_a_fit_that_skips_it_by_hand(monitor, caplog):
    by_hand, by_hand_model = _loop()
    by_hand.fit(num_epochs=2, callbacks=[SkipByHand({SPIKE, BATCHES + SPIKE}), _schedule(by_hand)])
    guarded, model = _loop()
    guard = LossSpikeGuard(window=8, threshold=20, monitor=monitor)
    with caplog.at_level(logging.WARNING, logger='aitoolbox_like'):
        guarded.fit(num_epochs=2, callbacks=[guard, _schedule(guarded)])
    assert _equal(model.state_dict(), by_hand_model.state_dict())
    assert _equal(guarded.optimizer.state_dict()['state'][0], by_hand.optimizer.state_dict()['state'][0])
    assert [e['batch'] for e in guard.skipped] == [SPIKE, BATCHES + SPIKE] and guard.updates == 2 * BATCHES - 2
    assert guarded.train_history['loss_spikes_skipped'] == [1, 1]
    assert guarded.train_history['loss_spikes_rolled_back'] == [0, 0]
    assert f'at batch {SPIKE} is' in caplog.text and 'its update is left out' in caplog.text
    plain, plain_model = _loop()
    plain.fit(num_epochs=2, callbacks=[_schedule(plain)])
    assert not _equal(model.state_dict(), plain_model.state_dict())


@pytest.mark.parametrize('snapshot_to', ['host', 'device'])
def test_rollback_restores_a_snapshot_and_equals_a_fit_on_the_batches_it_kept(snapshot_to, caplog):
    """Snapshots every 4 updates (after batches 0, 3, 7, 11); the spike at batch 13 (update 14) goes back to the
    newest snapshot at least 4 updates before it, after batch 7, and skips 6 batches: batches 8 to 13 are never
    trained, training continues with batch 14."""
    guarded, model = _loop()
    guard = LossSpikeGuard(window=8, threshold=20, action='rollback', rollback_steps=4, skip_batches=6,
                           snapshot_to=snapshot_to)
    with caplog.at_level(logging.WARNING, logger='aitoolbox_like'):
        guarded.fit(num_epochs=1, callbacks=[guard, _schedule(guarded)])
    kept = list(range(8)) + list(range(14, BATCHES))
    oracle, oracle_model = _loop(keep=kept)
    oracle.fit(num_epochs=1, callbacks=[_schedule(oracle)])
    for name, value in oracle_model.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=1e-6, atol=1e-6)
    for key, value in oracle.optimizer.state_dict()['state'][0].items():
        torch.testing.assert_close(guarded.optimizer.state_dict()['state'][0][key], value, rtol=1e-6, atol=1e-6)
    assert guarded.optimizer.param_groups[0]['lr'] == oracle.optimizer.param_groups[0]['lr']
    assert guarded.train_history['accumulated_loss'] == pytest.approx(oracle.train_history['accumulated_loss'])
    assert [(e['batch'], e['to_batch'], e['continue_at']) for e in guard.rollbacks] == [(SPIKE, 7, 14)]
    assert guarded.train_history['loss_spikes_rolled_back'] == [1] and guard.updates == len(kept)
    assert 'rolled back to the snapshot after batch 7' in caplog.text
    assert guard.snapshot_bytes >= 2 * 5 * 4         # the weights and the momentum: 5 floats each


def test_the_guards_state_is_in_the_checkpoint_and_a_resumed_run_continues_it(tmp_path):
    def fit(num_epochs, resume_from=None):
        loop, model = _loop()
        guard = LossSpikeGuard(window=8, threshold=20)
        saver = ModelCheckpoint('p', 'e', str(tmp_path), {}, cloud_save_mode='local', async_save=False)
        loop.fit(num_epochs=num_epochs, callbacks=[guard, saver], resume_from=resume_from)
        return model, guard

    uninterrupted, guard = fit(2)
    fit(1)
    resumed, resumed_guard = fit(2, resume_from='latest')
    assert _equal(resumed.state_dict(), uninterrupted.state_dict())
    assert resumed_guard.skipped == guard.skipped and list(resumed_guard.values) == list(guard.values)


def test_arguments_are_checked_where_given():
    with pytest.raises(ValueError, match="action must be one of"):
        LossSpikeGuard(action='restart')
    with pytest.raises(ValueError, match="window must be an int >= 2"):
        LossSpikeGuard(window=1)
    with pytest.raises(ValueError, match='timeout_s must be a number'):
        HangWatchdog(timeout_s=0)
    with pytest.raises(ValueError, match='exit_code must be a non-zero int'):
        HangWatchdog(timeout_s=1, exit_code=0)
