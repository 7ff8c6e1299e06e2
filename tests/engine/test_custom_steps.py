"""Custom training steps (``train_step`` on a callback or the model): the GAN and SAM examples train, checkpoint and
resume to the bit like the standard step, equal a hand-written PyTorch loop doing the same, and StopTraining raised
inside a custom step ends training cleanly."""
import math
import os

import pytest
import torch
from torch import nn

from aitoolbox_like import MultiLoss, StopTraining, TrainLoop
from aitoolbox_like.callbacks.abstract import AbstractCallback
from helpers import Interrupt, MLP, load_example, loaders, state_equal

gan = load_example('gan_digits')
sam = load_example('sam_digits')


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def optimizer_states(optimizer):
    states = optimizer.state_dict()
    return states if isinstance(states, list) else [states]


def assert_same_optimizer_state(a, b):
    for state_a, state_b in zip(optimizer_states(a), optimizer_states(b), strict=True):
        assert state_a['param_groups'] == state_b['param_groups']
        assert state_a['state'].keys() == state_b['state'].keys()
        for key in state_a['state']:
            assert state_equal(state_a['state'][key], state_b['state'][key]), key


def latest_checkpoint(loop):
    with open(os.path.join(loop.experiment.work_dir, 'latest_checkpoint.txt')) as f:
        return f.read()


def changed(before, after, prefix=''):
    return any(not torch.equal(before[k], after[k]) for k in before if k.startswith(prefix))


# ---------------------------------------------------------------------------------------------------------- GAN


def gan_loop(out, *extra):
    return gan.build(gan.parse_args(['--output-dir', str(out), '--batch-size', '128', *extra]))


def test_gan_trains_both_networks_and_records_each_loss(tmp_path):
    loop = gan_loop(tmp_path)
    before = weights(loop.model)
    loop.fit(num_epochs=2)
    after = weights(loop.model)
    assert changed(before, after, 'generator.') and changed(before, after, 'discriminator.')
    history = loop.train_history
    for name in ('accumulated_loss_generator', 'accumulated_loss_discriminator', 'accumulated_loss'):
        assert len(history[name]) == 2, name
        assert all(math.isfinite(v) for v in history[name]), name
    assert history['accumulated_loss'][0] == pytest.approx(
        history['accumulated_loss_generator'][0] + history['accumulated_loss_discriminator'][0])
    assert isinstance(loop.loss, MultiLoss)
    assert loop.train_step_owner is loop.model


def test_gan_resumes_after_an_epoch_to_the_bit(tmp_path):
    reference = gan_loop(tmp_path / 'reference')
    reference.fit(num_epochs=3)

    first = gan_loop(tmp_path / 'run')                         # 15 batches per epoch
    first.fit(num_epochs=3, callbacks=[Interrupt(batch=30)])
    assert latest_checkpoint(first).endswith('_E1.pth')
    resumed = gan_loop(tmp_path / 'run', '--seed', '5')      # other initial weights
    torch.manual_seed(123)                                     # and another RNG state
    resumed.fit(num_epochs=3, resume_from='latest')

    assert state_equal(weights(resumed.model), weights(reference.model))
    assert_same_optimizer_state(resumed.optimizer, reference.optimizer)
    assert resumed.train_history.train_history == reference.train_history.train_history


def test_gan_resumes_inside_an_epoch_to_the_bit(tmp_path):
    reference = gan_loop(tmp_path / 'reference')           # 15 batches per epoch
    reference.fit(num_epochs=2)

    first = gan_loop(tmp_path / 'run', '--iteration-save-freq', '10')
    first.fit(num_epochs=2, callbacks=[Interrupt(batch=23)])
    assert latest_checkpoint(first).endswith('_E1_ITER20.pth')       # batches 15..20 of epoch 1 trained
    resumed = gan_loop(tmp_path / 'run', '--seed', '3')
    resumed.fit(num_epochs=2, resume_from='latest')

    assert state_equal(weights(resumed.model), weights(reference.model))
    assert_same_optimizer_state(resumed.optimizer, reference.optimizer)
    assert resumed.train_history.train_history == reference.train_history.train_history


# ---------------------------------------------------------------------------------------------------------- SAM


def sam_loop(out, *extra):
    return sam.build(sam.parse_args(['--output-dir', str(out), '--batch-size', '128', *extra]))


def test_sam_trains(tmp_path):
    loop = sam_loop(tmp_path)
    before = weights(loop.model)
    loop.fit(num_epochs=2, callbacks=sam.callbacks())
    assert changed(before, weights(loop.model))
    history = loop.train_history
    assert all(math.isfinite(v) for v in history['accumulated_loss'] + history['val_loss'])
    assert history['val_loss'][-1] < history['val_loss'][0]
    assert isinstance(loop.train_step_owner, sam.SAMStep)
    # The base optimizer's momentum is the checkpointed optimizer state.
    assert all('momentum_buffer' in s for s in loop.optimizer.state_dict()['state'].values())


def test_sam_resumes_after_an_epoch_to_the_bit(tmp_path):
    reference = sam_loop(tmp_path / 'reference')
    reference.fit(num_epochs=3, callbacks=sam.callbacks())

    first = sam_loop(tmp_path / 'run')                         # 11 batches per epoch
    first.fit(num_epochs=3, callbacks=sam.callbacks() + [Interrupt(batch=11)])
    resumed = sam_loop(tmp_path / 'run', '--seed', '9')
    torch.manual_seed(77)
    resumed.fit(num_epochs=3, callbacks=sam.callbacks(), resume_from='latest')

    assert state_equal(weights(resumed.model), weights(reference.model))
    assert_same_optimizer_state(resumed.optimizer, reference.optimizer)
    assert resumed.optimizer.param_groups[0]['lr'] == reference.optimizer.param_groups[0]['lr']   # the schedule
    assert resumed.train_history.train_history == reference.train_history.train_history


def test_sam_resumes_inside_an_epoch_to_the_bit(tmp_path):
    reference = sam_loop(tmp_path / 'reference')           # 11 batches per epoch
    reference.fit(num_epochs=2, callbacks=sam.callbacks())

    first = sam_loop(tmp_path / 'run', '--iteration-save-freq', '7')
    first.fit(num_epochs=2, callbacks=sam.callbacks() + [Interrupt(batch=17)])
    assert latest_checkpoint(first).endswith('_E1_ITER14.pth')
    resumed = sam_loop(tmp_path / 'run', '--seed', '2')
    resumed.fit(num_epochs=2, callbacks=sam.callbacks(), resume_from='latest')

    assert state_equal(weights(resumed.model), weights(reference.model))
    assert_same_optimizer_state(resumed.optimizer, reference.optimizer)
    assert resumed.train_history.train_history == reference.train_history.train_history


def hand_written_sam(model, train_loader, lr, rho, num_epochs):
    """SAM written out in plain PyTorch: the same arithmetic, the same order of random draws."""
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    params = list(model.parameters())
    model.train()
    for _ in range(num_epochs):
        for x, y in train_loader:
            criterion(model(x), y).backward()
            with torch.no_grad():
                norm = torch.norm(torch.stack([p.grad.norm(p=2) for p in params]), p=2)
                scale = rho / (norm + 1e-12)
                originals = [p.detach().clone() for p in params]
                for p in params:
                    p.add_(p.grad * scale.to(p))
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            with torch.no_grad():
                for p, original in zip(params, originals):
                    p.copy_(original)
            optimizer.step()
            optimizer.zero_grad()
    return optimizer


def test_sam_step_equals_hand_written_sam_to_the_bit():
    torch.manual_seed(0)
    reference = sam.DigitsMLP()
    torch.manual_seed(0)
    model = sam.DigitsMLP()

    torch.manual_seed(4)
    train, _ = sam.digits_loaders(batch_size=128)
    reference_optimizer = hand_written_sam(reference, train, lr=0.1, rho=0.05, num_epochs=2)

    torch.manual_seed(4)
    train, val = sam.digits_loaders(batch_size=128)
    optimizer = sam.SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9)
    # The end-of-epoch evaluation (val_loss) must not disturb the training randomness (shuffle, dropout).
    TrainLoop(model, train, val, None, optimizer, nn.CrossEntropyLoss(), progress_bar=False).fit(
        num_epochs=2, callbacks=[sam.SAMStep()])

    assert state_equal(weights(model), weights(reference))
    ours, theirs = optimizer.state_dict(), reference_optimizer.state_dict()
    assert [{k: v for k, v in g.items() if k != 'rho'} for g in ours['param_groups']] == theirs['param_groups']
    assert all(state_equal(ours['state'][i], theirs['state'][i]) for i in theirs['state'])


# ------------------------------------------------------------------------------------------------------- StopTraining


class StoppingStep(AbstractCallback):
    """A plain custom step (forward_loss / backward / step_optimizers) that stops training at a given batch."""

    def __init__(self, stop_at):
        super().__init__('stopping step')
        self.stop_at = stop_at

    def train_step(self, batch):
        loop = self.train_loop_obj
        if loop.total_iteration_idx == self.stop_at:
            raise StopTraining('enough')
        loss = loop.forward_loss(batch)
        loop.backward(loss)
        loop.step_optimizers()
        return loss


class Recorder(AbstractCallback):
    def __init__(self):
        super().__init__('recorder')
        self.events = []

    def on_batch_end(self):
        self.events.append(('batch_end', self.train_loop_obj.total_iteration_idx))

    def on_train_stopped(self, reason):
        self.events.append(('stopped', reason))

    def on_train_end(self):
        self.events.append(('train_end', None))

    def on_exception(self, exception):
        self.events.append(('exception', exception))


def test_stop_training_inside_a_custom_step_ends_training_cleanly():
    torch.manual_seed(0)
    model = MLP()
    train, val, test = loaders()          # 7 batches per epoch
    loop = TrainLoop(model, train, val, test, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                     progress_bar=False)
    recorder = Recorder()
    assert loop.fit(num_epochs=3, callbacks=[StoppingStep(stop_at=9), recorder]) is model

    kinds = [kind for kind, _ in recorder.events]
    assert kinds == ['batch_end'] * 9 + ['stopped', 'train_end']       # batches 0..8 ended, batch 9 did not
    reason = recorder.events[-2][1]
    assert isinstance(reason, StopTraining) and str(reason) == 'enough'
    assert loop.epochs_completed == 1
    assert 'train_end_test_loss' in loop.train_history


def test_a_custom_step_equals_the_standard_step_to_the_bit():
    """A train_step that does what the standard step does (forward_loss, backward, step_optimizers) trains the same
    weights, with gradient accumulation too."""
    class PlainStep(AbstractCallback):
        def __init__(self):
            super().__init__('plain step')

        def train_step(self, batch):
            loop = self.train_loop_obj
            loss = loop.forward_loss(batch)
            loop.backward(loss)
            if loop.should_execute_optimizer_update():
                loop.step_optimizers()
            return loss

    results = []
    for callbacks in ([], [PlainStep()]):
        torch.manual_seed(1)
        model = MLP(dropout=0.2)
        train, val, _ = loaders()
        loop = TrainLoop(model, train, val, None, torch.optim.Adam(model.parameters(), lr=0.01),
                         nn.CrossEntropyLoss(), progress_bar=False)
        loop.fit(num_epochs=2, callbacks=callbacks, grad_accumulation=3)
        results.append((weights(model), loop.train_history.train_history))
    assert state_equal(results[0][0], results[1][0])
    assert results[0][1] == results[1][1]


class SkipEveryOtherUpdate(AbstractCallback):
    """A custom step that leaves out every other update (as a spike-skipping step does): it zeroes the gradients and
    does not call step_optimizers."""

    def __init__(self):
        super().__init__('skip every other update')
        self.applied = []

    def train_step(self, batch):
        loop = self.train_loop_obj
        loss = loop.forward_loss(batch)
        loop.backward(loss)
        apply = loop.total_iteration_idx % 2 == 0
        if apply:
            loop.step_optimizers()
        else:
            loop.optimizer.zero_grad()
        self.applied.append(apply)
        return loss

    def on_batch_end(self):
        # Read by every consumer after the step: False on a batch whose update was left out.
        assert self.train_loop_obj.optimizer_update_applied() is self.applied[-1]


def test_an_update_a_custom_step_leaves_out_moves_no_schedule_and_no_average():
    from aitoolbox_like.callbacks.train_schedule import LinearWarmupScheduler, LinearWithWarmupScheduler
    from aitoolbox_like.callbacks.weight_averaging import ExponentialMovingAverage
    torch.manual_seed(0)
    model = MLP()
    train, val, _ = loaders()           # 7 batches per epoch: 14 batches, 7 updates applied
    base_lr = 0.1
    optimizer = torch.optim.SGD(model.parameters(), lr=base_lr)
    step = SkipEveryOtherUpdate()
    warmup = LinearWarmupScheduler(num_warmup_steps=20)
    ema = ExponentialMovingAverage(decay=0.9)
    loop = TrainLoop(model, train, val, None, optimizer, nn.CrossEntropyLoss(), progress_bar=False)
    loop.fit(num_epochs=2, callbacks=[step, warmup, ema])
    applied = sum(step.applied)
    assert len(step.applied) == 14 and applied == 7
    # The warm-up counts the applied updates only: 7 of 20 warm-up steps.
    assert optimizer.param_groups[0]['lr'] == pytest.approx(base_lr * 7 / 20)
    assert ema.num_optimizer_updates == 7

    # AIToolbox's warm-up scheduler (a LambdaLR stepped per applied update) too.
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=base_lr)
    aitoolbox_warmup = LinearWithWarmupScheduler(num_warmup_steps=10, num_training_steps=100)
    loop = TrainLoop(model, train, val, None, optimizer, nn.CrossEntropyLoss(), progress_bar=False)
    loop.fit(num_epochs=2, callbacks=[SkipEveryOtherUpdate(), aitoolbox_warmup])
    assert optimizer.param_groups[0]['lr'] == pytest.approx(base_lr * 7 / 10)
