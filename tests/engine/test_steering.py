"""A callback steers the run: ``loop.skip_update()`` leaves one step's optimizer update out (nothing that counts
updates moves: schedulers, EMA, the optimizer's own step count) and ``loop.end_epoch()`` ends the epoch after the
batch, applying an open gradient-accumulation window. Compared with a hand-written PyTorch loop doing the same, to
the bit. (The distributed half, every rank acting alike, is in tests/distributed/test_steering_ddp.py.)"""
import logging

import pytest
import torch
from torch import nn

from aitoolbox_like import TrainLoop
from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.callbacks.train_schedule import LRSchedulerCallback
from aitoolbox_like.callbacks.weight_averaging import ExponentialMovingAverage
from aitoolbox_like.engine.steering import StepRequestError
from helpers import MLP, loaders, state_equal

SKIPPED = {2, 5}        # global batch indices whose update is left out


def _parts(seed=0):
    torch.manual_seed(seed)
    model = MLP()
    train, _, _ = loaders(n=48, shuffle=False)          # 6 batches an epoch
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, train, optimizer


def _hand_written(epochs=2, skipped=SKIPPED, grad_accumulation=1, ends=None, ema_decay=None):
    """The PyTorch loop: Adam, a per-update StepLR, the updates of the ``skipped`` windows left out (zero_grad, no
    step, the schedule not stepped); ``ends``: {epoch: last batch index} ends an epoch early, its window applied."""
    model, train, optimizer = _parts()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    criterion = nn.CrossEntropyLoss()
    ema = {k: v.detach().clone() for k, v in model.state_dict().items()} if ema_decay else None
    idx, window_skipped = -1, False
    for epoch in range(epochs):
        batches = list(train)
        last = (ends or {}).get(epoch, len(batches) - 1)
        for i, (x, y) in enumerate(batches[:last + 1]):
            idx += 1
            (criterion(model(x), y) / grad_accumulation).backward()
            window_skipped = window_skipped or idx in skipped
            if (i + 1) % grad_accumulation == 0 or i == last:
                if not window_skipped:
                    optimizer.step()
                    scheduler.step()
                    if ema is not None:
                        with torch.no_grad():
                            for k, v in model.state_dict().items():
                                ema[k].lerp_(v, 1 - ema_decay)
                optimizer.zero_grad()
                window_skipped = False
    return model, optimizer, ema


class SkipAt(AbstractCallback):
    """Calls skip_update() in ``hook`` of the batches ``at``; records update_skipped at on_batch_end."""

    def __init__(self, hook, at=SKIPPED):
        super().__init__('skip at')
        self.hook, self.at, self.seen = hook, set(at), []
        setattr(self, hook, self._maybe_skip)

    def hooks_in_use(self):
        return [self.hook, 'on_batch_end']

    def _maybe_skip(self, *args):
        if self.train_loop_obj.total_iteration_idx in self.at:
            self.train_loop_obj.skip_update()

    def on_batch_end(self):
        if self.train_loop_obj.update_skipped:
            self.seen.append(self.train_loop_obj.total_iteration_idx)


def _loop(**kwargs):
    model, train, optimizer = _parts()
    return TrainLoop(model, train, None, None, optimizer, nn.CrossEntropyLoss(), progress_bar=False, **kwargs), model


def _schedule(optimizer):
    return LRSchedulerCallback(torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5), interval='step')


def _assert_same(model, optimizer, reference_model, reference_optimizer):
    assert state_equal(model.state_dict(), reference_model.state_dict())
    ours, theirs = optimizer.state_dict(), reference_optimizer.state_dict()
    assert ours['param_groups'] == theirs['param_groups']           # the learning rate the schedule reached
    for key in theirs['state']:
        assert state_equal(ours['state'][key], theirs['state'][key]), key      # Adam's step count and moments


@pytest.mark.parametrize('hook', ['on_after_loss', 'on_after_backward', 'on_after_gradient_update'])
def test_skip_update_from_any_hook_before_the_step_equals_the_hand_written_loop_leaving_it_out(hook):
    reference, reference_optimizer, reference_ema = _hand_written(ema_decay=0.9)
    loop, model = _loop()
    skipper = SkipAt(hook)
    ema = ExponentialMovingAverage(decay=0.9, evaluate_with_ema=False, swap_at_end=False)
    loop.fit(num_epochs=2, callbacks=[skipper, _schedule(loop.optimizer), ema])
    _assert_same(model, loop.optimizer, reference, reference_optimizer)
    assert all(torch.equal(ema.ema[k], v) for k, v in reference_ema.items())
    assert ema.num_optimizer_updates == 12 - len(SKIPPED)
    assert skipper.seen == sorted(SKIPPED)
    assert loop.steering.skipped_updates == len(SKIPPED)


def test_inside_a_gradient_accumulation_window_the_windows_update_is_left_out():
    reference, reference_optimizer, _ = _hand_written(grad_accumulation=4)
    loop, model = _loop()
    loop.fit(num_epochs=2, callbacks=[SkipAt('on_after_backward'), _schedule(loop.optimizer)], grad_accumulation=4)
    _assert_same(model, loop.optimizer, reference, reference_optimizer)


def test_a_custom_train_step_skips_through_skip_update_before_step_optimizers():
    class Step(AbstractCallback):
        def __init__(self):
            super().__init__('step')

        def train_step(self, batch):
            loop = self.train_loop_obj
            loss = loop.forward_loss(batch)
            loop.backward(loss)
            if loop.total_iteration_idx in SKIPPED:
                loop.skip_update()
            loop.step_optimizers()
            return loss

    reference, reference_optimizer, _ = _hand_written()
    loop, model = _loop()
    loop.fit(num_epochs=2, callbacks=[Step(), _schedule(loop.optimizer)])
    _assert_same(model, loop.optimizer, reference, reference_optimizer)


def test_skip_update_after_the_optimizer_stepped_or_outside_fit_is_refused():
    class Late(AbstractCallback):
        def __init__(self, hook):
            super().__init__('late')
            self.hook = hook
            setattr(self, hook, lambda *args: self.train_loop_obj.skip_update())

        def hooks_in_use(self):
            return [self.hook]

    for hook in ('on_after_optimizer_step', 'on_batch_end'):
        loop, model = _loop()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(StepRequestError, match='after the optimizer update of batch 0 began'):
            loop.fit(num_epochs=1, callbacks=[Late(hook)])
        if hook == 'on_after_optimizer_step':       # the update that was asked to be left out had been applied
            assert not state_equal(before, model.state_dict())
    loop, _ = _loop()
    with pytest.raises(StepRequestError, match='during fit'):
        loop.skip_update()
    with pytest.raises(StepRequestError, match='during fit'):
        loop.end_epoch()


class EndEpochAt(AbstractCallback):
    def __init__(self, hook, at):
        super().__init__('end epoch at')
        self.hook, self.at, self.last_batches = hook, at, []
        setattr(self, hook, self._maybe_end)

    def hooks_in_use(self):
        return [self.hook, 'on_train_epoch_end']

    def _maybe_end(self, *args):
        loop = self.train_loop_obj
        if self.at.get(loop.epoch) == loop.iteration:
            loop.end_epoch()

    def on_train_epoch_end(self):
        self.last_batches.append((self.train_loop_obj.iteration, self.train_loop_obj.is_last_batch))


@pytest.mark.parametrize('hook', ['on_batch_begin', 'on_after_backward'])
def test_end_epoch_ends_after_the_batch_and_applies_the_open_accumulation_window(hook):
    ends = {0: 1, 1: 4}     # epoch 0 ends after batch 1 (inside a window of 3), epoch 1 after batch 4
    reference, reference_optimizer, _ = _hand_written(skipped=(), grad_accumulation=3, ends=ends)
    loop, model = _loop()
    ender = EndEpochAt(hook, ends)
    loop.fit(num_epochs=2, callbacks=[ender, _schedule(loop.optimizer)], grad_accumulation=3)
    _assert_same(model, loop.optimizer, reference, reference_optimizer)
    assert ender.last_batches == [(1, True), (4, True)]
    assert loop.epochs_completed == 2 and loop.total_iteration_idx == 6
    assert len(loop.train_history['accumulated_loss']) == 2


def test_end_epoch_from_on_batch_end_inside_a_window_applies_it_after_the_batch_and_says_so(caplog):
    ends = {0: 1}
    reference, reference_optimizer, _ = _hand_written(skipped=(), grad_accumulation=3, ends=ends, epochs=1)
    loop, model = _loop()
    with caplog.at_level(logging.WARNING, logger='aitoolbox_like'):
        loop.fit(num_epochs=1, callbacks=[EndEpochAt('on_batch_end', ends)], grad_accumulation=3)
    assert state_equal(model.state_dict(), reference.state_dict())
    assert 'end_epoch() was called in on_batch_end of batch 1, inside a gradient-accumulation window' in caplog.text
