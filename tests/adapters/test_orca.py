"""BigDL Orca-style callbacks (aitoolbox_like.adapters.orca): Orca 2.4.0's hook order and counters over a fit (its
torch_runner.py), the tutorial's hook names beside Orca's, the tutorial's MainCallback usages as a user writes them
with only the import changed, MainCallback with fp16 / gradient accumulation, runner.stop, the runner's statistics
and checkpoints. Orca's own callback classes run from its wheel in `make orca-check` (tools/orca_check)."""
import os

import pytest
import torch
from torch import nn

from aitoolbox_like import TrainLoop, TTBasicModel, TTModel
from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.adapters.orca import (ORCA_HOOKS, TUTORIAL_HOOKS, Callback, MainCallBack, MainCallback, Runner,
                                           runner_for)


class Net(TTBasicModel):
    """The batch is (features, target): Orca's default forward and the loop's standard step agree on it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc(x)


def batches(num_batches, seed, batch_size=4, last=None):
    """A list of (features, labels) batches; ``last``: the size of the last batch."""
    g = torch.Generator().manual_seed(seed)
    sizes = [batch_size] * num_batches
    if last is not None:
        sizes[-1] = last
    return [(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)) for n in sizes]


def make_loop(train=2, val=1, model_class=Net, lr=0.1, **kwargs):
    torch.manual_seed(0)
    model = model_class()
    train_data = batches(train, 1) if isinstance(train, int) else train
    return TrainLoop(model, train_data, batches(val, 2) if val else None, None,
                     torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9), nn.CrossEntropyLoss(),
                     progress_bar=False, **kwargs)


def hand_written(train_data, epochs, lr=0.1, scheduler=None, loss_of=None, model_class=Net):
    """Orca's runner as a plain PyTorch loop: per batch forward, zero_grad / backward / step; the scheduler per
    epoch. Returns the model and the batch losses."""
    torch.manual_seed(0)
    model = model_class()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    lr_scheduler = scheduler(optimizer) if scheduler else None
    criterion = nn.CrossEntropyLoss()
    losses = []
    for _ in range(epochs):
        for x, y in train_data:
            loss = loss_of(model, x, y) if loss_of else criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        if lr_scheduler is not None:
            lr_scheduler.step()
    return model, losses


def same_weights(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def runner_state(runner):
    return runner.epochs, runner.global_step, runner.__dict__.get('batch_idx')


class Recorder(Callback):
    """Every Orca 2.4.0 point a training fit reaches, with (epochs, global_step, batch_idx) and the per-iteration
    attributes set. No super().__init__(), as many Orca users write it."""

    def __init__(self, log=None):
        self.log = [] if log is None else log

    def record(self, name, runner):
        present = tuple(sorted(a for a in ('batch', 'output', 'loss', 'target') if a in runner.__dict__))
        self.log.append((name,) + runner_state(runner) + (present,))

    def before_run(self, runner):
        self.record('before_run', runner)

    def before_train_epoch(self, runner):
        self.record('before_train_epoch', runner)

    def before_train_iter(self, runner):
        self.record('before_train_iter', runner)

    def after_train_iter(self, runner):
        self.record('after_train_iter', runner)

    def before_val_epoch(self, runner):
        self.record('before_val_epoch', runner)

    def before_val_iter(self, runner):
        self.record('before_val_iter', runner)

    def after_val_iter(self, runner):
        self.record('after_val_iter', runner)

    def after_val_epoch(self, runner):
        self.record('after_val_epoch', runner)

    def after_train_epoch(self, runner):
        self.record('after_train_epoch', runner)

    def after_run(self, runner):
        self.record('after_run', runner)


class LoggingMain(MainCallback):
    """The default MainCallback, logging its own points into a Recorder's log."""

    def __init__(self, log):
        self.log = log

    def on_train_forward(self, runner):
        self.log.append(('on_train_forward',) + runner_state(runner))
        super().on_train_forward(runner)

    def on_iter_backward(self, runner):
        self.log.append(('on_iter_backward',) + runner_state(runner))
        super().on_iter_backward(runner)

    def on_val_forward(self, runner):
        self.log.append(('on_val_forward',) + runner_state(runner))
        super().on_val_forward(runner)

    def on_lr_adjust(self, runner):
        self.log.append(('on_lr_adjust',) + runner_state(runner))
        super().on_lr_adjust(runner)


# ---- Orca's order and counters (torch_runner.py) -------------------------------------------------------------

def test_hooks_run_in_orca_s_order_with_orca_s_counters():
    log = []
    loop = make_loop(train=2, val=1)
    loop.fit(num_epochs=2, callbacks=[LoggingMain(log), Recorder(log)])
    batch, out = ('batch',), ('batch', 'loss', 'output', 'target')
    expected = [('before_run', 0, 0, None, ())]
    for e in range(2):
        expected.append(('before_train_epoch', e, 2 * e, None, ()))
        for b in range(2):
            # Orca keeps the training target until a validation batch ends (it deletes output and loss sooner)
            before = ('batch', 'target') if b else batch
            expected += [('before_train_iter', e, 2 * e + b, b, before),
                         ('on_train_forward', e, 2 * e + b, b),
                         ('on_iter_backward', e, 2 * e + b, b),
                         # global_step counts the batch before after_train_iter; after_train_epoch runs after the
                         # validation, and only then does epochs count the epoch
                         ('after_train_iter', e, 2 * e + b + 1, b, out)]
        expected += [('on_lr_adjust', e, 2 * e + 2, 1),
                     ('before_val_epoch', e, 2 * e + 2, None, ('target',)),
                     ('before_val_iter', e, 2 * e + 2, 0, ('batch', 'target')),
                     ('on_val_forward', e, 2 * e + 2, 0),
                     ('after_val_iter', e, 2 * e + 2, 0, out),
                     ('after_val_epoch', e, 2 * e + 2, None, ()),
                     ('after_train_epoch', e + 1, 2 * e + 2, None, ())]
    expected.append(('after_run', 2, 4, None, ()))
    assert log == expected


def test_orca_points_sit_on_our_hooks_mixed_with_our_callbacks():
    log = []

    class Ours(AbstractCallback):
        def __init__(self):
            super().__init__('ours')

        def on_epoch_begin(self):
            log.append('ours.on_epoch_begin')

        def on_batch_end(self):
            log.append('ours.on_batch_end')

        def on_train_epoch_end(self):
            log.append('ours.on_train_epoch_end')

        def on_eval_end(self, dataset_info):
            log.append(f'ours.on_eval_end:{dataset_info["type"]}')

        def on_epoch_end(self):
            log.append('ours.on_epoch_end')

    class Orca(Callback):
        def before_train_epoch(self, runner):
            log.append('before_train_epoch')

        def after_train_iter(self, runner):
            log.append('after_train_iter')

        def on_lr_adjust(self, runner):      # Orca calls it on every callback that has it
            log.append('on_lr_adjust')

        def after_val_epoch(self, runner):
            log.append('after_val_epoch')

        def after_train_epoch(self, runner):
            log.append('after_train_epoch')

    make_loop(train=1, val=1).fit(num_epochs=1, callbacks=[Ours(), Orca()])
    assert log == ['ours.on_epoch_begin', 'before_train_epoch', 'ours.on_batch_end', 'after_train_iter',
                   'ours.on_train_epoch_end', 'on_lr_adjust', 'ours.on_eval_end:validation',
                   'after_val_epoch', 'ours.on_epoch_end', 'after_train_epoch']
    assert {ORCA_HOOKS[name] for name in ('before_train_epoch', 'after_train_iter', 'on_lr_adjust',
                                          'after_train_epoch')} == \
        {'on_epoch_begin', 'on_batch_end', 'on_train_epoch_end', 'on_epoch_end'}


def test_generic_hooks_chain_as_in_orca_s_base_class():
    log = []

    class Generic(Callback):
        def before_epoch(self, runner):
            log.append(('before_epoch', runner.epochs))

        def after_epoch(self, runner):
            log.append(('after_epoch', runner.epochs))

        def before_iter(self, runner):
            log.append(('before_iter', runner.batch_idx))

        def after_iter(self, runner):
            log.append(('after_iter', runner.batch_idx))

    class OwnTrainEpoch(Generic):
        def before_train_epoch(self, runner):       # no super(): before_epoch is not called for it
            log.append(('own before_train_epoch', runner.epochs))

    make_loop(train=1, val=1).fit(num_epochs=1, callbacks=[Generic()])
    assert log == [('before_epoch', 0), ('before_iter', 0), ('after_iter', 0),       # training epoch and batch
                   ('before_epoch', 0), ('before_iter', 0), ('after_iter', 0), ('after_epoch', 0),     # validation
                   ('after_epoch', 1)]                                                   # after_train_epoch
    log.clear()
    make_loop(train=1, val=0).fit(num_epochs=1, callbacks=[OwnTrainEpoch()])
    assert log == [('own before_train_epoch', 0), ('before_iter', 0), ('after_iter', 0), ('after_epoch', 1)]


def test_every_n_iter_and_every_n_epoch_are_orca_s():
    cb = Callback()
    runner = runner_for(make_loop())
    runner.global_step, runner.epochs = 4, 6
    assert cb.every_n_iter(runner, 5) and not cb.every_n_iter(runner, 4) and not cb.every_n_iter(runner, 0)
    assert cb.every_n_epoch(runner, 3) and not cb.every_n_epoch(runner, 4) and not cb.every_n_epoch(runner, -1)


def test_the_tutorial_s_names_are_not_called_as_on_orca_2_4_and_a_warning_names_orca_s(caplog):
    """Orca 2.4.0's runner never calls the names of its callback tutorial (on_run_begin, on_epoch_begin(runner),
    ...): neither does the adapter; registering such a callback names Orca 2.4.0's method for each point."""
    log = []

    class Both(Callback):
        def on_run_begin(self, runner):
            log.append('on_run_begin')

        def before_run(self, runner):
            log.append('before_run')

        def on_epoch_begin(self, runner):
            log.append(('on_epoch_begin', runner.epochs))

        def on_iter_end(self, runner):
            log.append('on_iter_end')

        def after_train_epoch(self, runner):
            log.append('after_train_epoch')

        def on_epoch_end(self, runner):
            log.append('on_epoch_end')

    loop = make_loop(train=1, val=0)
    loop.fit(num_epochs=1, callbacks=[Both()])
    assert log == ['before_run', 'after_train_epoch']
    warning = next(r.getMessage() for r in caplog.records if 'tutorial' in r.getMessage())
    assert 'on_run_begin' in warning and 'before_run' in warning and 'after_train_epoch' in warning
    assert [TUTORIAL_HOOKS[name] for name in ('on_run_begin', 'on_epoch_begin', 'on_epoch_end')] == \
        ['before_run', 'before_train_epoch', 'after_train_epoch']
    # the user's own code may still call its method with a runner
    log.clear()
    Both().on_epoch_end(runner_for(loop))
    assert log == ['on_epoch_end']


def test_orca_2_2_keras_style_callbacks_get_orca_2_2_s_calls_without_clashing_with_the_loop_s_hooks():
    """Orca <= 2.2's Keras-style methods share their names with the loop's hooks: they are called where Orca 2.2's
    runner called them, with its arguments, and the callback's 2.4-style methods still run."""
    log = []

    class Keras(Callback):
        def on_train_begin(self):
            log.append(('on_train_begin', type(self.model).__name__, self.trainer.epochs))

        def before_run(self, runner):
            log.append('before_run')

        def on_epoch_begin(self, epoch):
            log.append(('on_epoch_begin', epoch))

        def on_batch_begin(self, batch):
            log.append(('on_batch_begin', batch))

        def on_batch_end(self, batch, logs=None):
            log.append(('on_batch_end', batch, sorted(logs)))
            super().on_batch_end(batch, logs)       # Orca 2.2's base method: a no-op

        def on_epoch_end(self, epoch, logs=None):
            log.append(('on_epoch_end', epoch, logs['train_loss'] == logs['train_loss'], 'val_loss' in logs))

        def on_train_end(self, logs=None):
            log.append(('on_train_end', logs['epoch']))

        def set_trainer(self, trainer):
            self.trainer = trainer

    loop = make_loop(train=2, val=1)
    loop.fit(num_epochs=2, callbacks=[MainCallback(), Keras()])
    assert log == [('on_train_begin', 'list', 0), 'before_run',
                   ('on_epoch_begin', 0), ('on_batch_begin', 0), ('on_batch_end', 0, ['train_loss']),
                   ('on_batch_begin', 1), ('on_batch_end', 1, ['train_loss']), ('on_epoch_end', 1, True, True),
                   ('on_epoch_begin', 1), ('on_batch_begin', 0), ('on_batch_end', 0, ['train_loss']),
                   ('on_batch_begin', 1), ('on_batch_end', 1, ['train_loss']), ('on_epoch_end', 2, True, True),
                   ('on_train_end', 2)]


# ---- the runner ---------------------------------------------------------------------------------------------

def test_the_runner_reads_the_loop_and_is_shared_by_the_loop_s_orca_callbacks():
    seen = {}

    class Writer(Callback):
        def before_run(self, runner):
            runner.shared_note = 'kept'
            runner.put('key', 1)

        def before_train_epoch(self, runner):
            seen['fields'] = (runner.model is loop.model, runner.models == [loop.model],
                              runner.optimizer is loop.optimizer, runner.optimizers == [loop.optimizer],
                              runner.criterion is loop.criterion, runner.train_loader is train_data,
                              runner.val_loader is loop.validation_loader, runner.num_epochs, runner.rank,
                              runner.size, runner.world_size, runner.scheduler, runner.config)

    class Reader(Callback):
        def after_run(self, runner):
            seen['shared'] = (runner.shared_note, runner.get('key'), runner is runner_for(loop))

    train_data = batches(2, 1)
    loop = make_loop(train=train_data)
    loop.fit(num_epochs=1, callbacks=[Writer(), Reader()])
    assert seen['fields'] == (True, True, True, True, True, True, True, 1, 0, 1, 1, None, {})
    assert seen['shared'] == ('kept', 1, True)
    assert loop.train_loader is train_data          # the loader is the user's again after the epoch
    runner = runner_for(loop)
    with pytest.raises(AttributeError, match=r'runner.output is not set now: it is set by the MainCallback'):
        runner.output
    with pytest.raises(RuntimeError, match='key missing is not stored'):
        runner.get('missing')
    runner.remove('key')
    assert isinstance(runner, Runner)


def test_metrics_stats_and_epoch_stats_are_orca_s_sample_weighted_means():
    seen = []

    class Stats(Callback):
        def after_train_iter(self, runner):
            seen.append(dict(runner.metrics_stats))

        def after_train_epoch(self, runner):
            seen.append(dict(runner.epoch_stats))

    train_data = batches(3, 1, last=2)          # 4, 4 and 2 samples: the weighting shows
    val_data = batches(2, 2, last=1)
    torch.manual_seed(0)
    model = Net()
    loop = TrainLoop(model, train_data, val_data, None, torch.optim.SGD(model.parameters(), lr=0.1),
                     nn.CrossEntropyLoss(), progress_bar=False)
    losses = []

    class Keep(AbstractCallback):
        def __init__(self):
            super().__init__('keep')

        def on_batch_end(self):
            losses.append(loop.loss.item())

    val_losses = []
    loop.fit(num_epochs=1, callbacks=[Keep(), Stats()])
    # The validation statistics of the model after the epoch, as Orca's _validate computes them.
    with torch.no_grad():
        val_losses = [(nn.CrossEntropyLoss()(model(x), y).item(), len(y)) for x, y in val_data]
    sizes = [4, 4, 2]
    assert seen[:3] == [{'train_loss': loss, 'num_samples': n} for loss, n in zip(losses, sizes)]
    assert seen[3] == {
        'epoch': 1, 'batch_count': 3, 'num_samples': 10,
        'train_loss': sum(loss * n for loss, n in zip(losses, sizes)) / 10, 'last_train_loss': losses[-1],
        'val_loss': sum(loss * n for loss, n in val_losses) / 5, 'val_num_samples': 5}


def test_epoch_stats_are_the_same_whether_metrics_stats_was_read_or_not():
    stats = {}

    class Reads(Callback):
        def after_train_iter(self, runner):
            runner.metrics_stats

        def after_train_epoch(self, runner):
            stats['read'] = runner.epoch_stats

    class DoesNotRead(Callback):
        def after_train_epoch(self, runner):
            stats['lazy'] = runner.epoch_stats

    class AddsToTheFirst(Callback):
        def after_train_iter(self, runner):
            if runner.batch_idx == 0:
                runner.metrics_stats['accuracy'] = 0.5      # Orca averages what after_train_iter leaves there

        def after_train_epoch(self, runner):
            stats['added'] = runner.epoch_stats

    make_loop(train=3).fit(num_epochs=1, callbacks=[Reads()])
    make_loop(train=3).fit(num_epochs=1, callbacks=[DoesNotRead()])
    make_loop(train=3).fit(num_epochs=1, callbacks=[AddsToTheFirst()])
    assert stats['read'] == stats['lazy'] and stats['read']['batch_count'] == 3
    assert stats['added'] == {**stats['read'], 'accuracy': 0.5, 'last_accuracy': 0.5}


def test_runner_num_epochs_set_in_before_run_sets_the_epochs_of_the_fit():
    class ThreeEpochs(Callback):
        def before_run(self, runner):
            runner.num_epochs = 3

    loop = make_loop(train=1, val=0)
    loop.fit(num_epochs=1, callbacks=[ThreeEpochs()])
    assert loop.epochs_completed == 3


# ---- MainCallback -------------------------------------------------------------------------------------------

def test_main_callback_trains_as_orca_s_runner_bit_for_bit():
    train_data = batches(3, 1)
    loop = make_loop(train=train_data)
    runner_for(loop).scheduler = torch.optim.lr_scheduler.StepLR(loop.optimizer, step_size=1, gamma=0.5)
    loop.fit(num_epochs=2, callbacks=[MainCallback()])
    model, losses = hand_written(train_data, 2,
                                 scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5))
    assert same_weights(loop.model, model)
    assert loop.optimizer.param_groups[0]['lr'] == 0.025
    assert runner_for(loop).lr_scheduler is runner_for(loop).scheduler
    assert loop.train_history['accumulated_loss'] == [pytest.approx(sum(losses[:3]) / 3, abs=0, rel=1e-15),
                                                      pytest.approx(sum(losses[3:]) / 3, abs=0, rel=1e-15)]
    assert MainCallBack is MainCallback


def test_main_callback_owns_the_step_and_the_standard_step_gives_the_same_weights():
    a, b = make_loop(train=3), make_loop(train=3)
    a.fit(num_epochs=2, callbacks=[MainCallback()])
    b.fit(num_epochs=2)
    assert a.train_step_owner is not None and b.train_step_owner is None
    assert same_weights(a.model, b.model)
    assert MainCallback().hooks_in_use().count('train_step') == 1 and 'train_step' not in Callback().hooks_in_use()


def test_the_tutorial_s_main_callback_as_written_there():
    # The tutorial's MainCallback methods (runner.outputs, runner.lr_scheduler), as a user copies them.
    class TutorialMain(MainCallBack):
        def on_iter_forward(self, runner):
            inputs, targets = runner.batch
            runner.outputs = runner.model(inputs)
            inputs, targets = runner.batch
            runner.loss = runner.criterion(runner.outputs, targets)

        def on_iter_backward(self, runner):
            runner.optimizer.zero_grad()
            runner.loss.backward()
            runner.optimizer.step()

        def on_lr_adjust(self, runner):
            if runner.lr_scheduler is not None:
                runner.lr_scheduler.step()

    seen = []

    class Sees(Callback):
        def after_train_iter(self, runner):
            seen.append(runner.output is runner.outputs)

    train_data = batches(3, 1)
    loop = make_loop(train=train_data)
    runner_for(loop).lr_scheduler = torch.optim.lr_scheduler.StepLR(loop.optimizer, step_size=1, gamma=0.5)
    loop.fit(num_epochs=2, callbacks=[TutorialMain(), Sees()])
    model, _ = hand_written(train_data, 2,
                            scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5))
    assert same_weights(loop.model, model) and seen == [True] * 6
    assert runner_for(loop).scheduler is runner_for(loop).lr_scheduler and loop.optimizer.param_groups[0]['lr'] == 0.025


class LossDictNet(TTModel):
    """Called with targets, the model returns a dict of losses (as Mask-RCNN does): the tutorial's Usage 1."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x, targets=None):
        logits = self.fc(x)
        if targets is None:
            return logits
        return {'classifier': nn.functional.cross_entropy(logits, targets),
                'weights': 0.01 * (self.fc.weight ** 2).sum()}

    def get_loss(self, batch_data, criterion, device):
        x, y = batch_data
        return sum(self(x.to(device), y.to(device)).values())

    def get_predictions(self, batch_data, device):
        x, y = batch_data
        return self(x.to(device)), y, None


def test_usage_1_a_model_computing_its_losses_as_the_tutorial_writes_it():
    # The tutorial's Usage 1, as a user writes it; only the import line changed:
    # from aitoolbox_like.adapters.orca import MainCallBack
    class CustomMainCB(MainCallBack):
        def on_iter_forward(self, runner):
            # Forward features
            image, target = runner.batch
            runner.output = runner.model(image, target)
            # Compute loss
            runner.loss = sum(loss for loss in runner.output.values())

    train_data = batches(3, 1)
    loop = make_loop(train=train_data, model_class=LossDictNet)
    loop.fit(num_epochs=2, callbacks=[CustomMainCB()])
    model, _ = hand_written(train_data, 2, model_class=LossDictNet,
                            loss_of=lambda model, x, y: sum(loss for loss in model(x, y).values()))
    assert same_weights(loop.model, model)
    assert runner_for(loop).epoch_stats['val_loss'] == pytest.approx(loop.train_history['val_loss'][-1], rel=1e-6)


# The tutorial's Usage 2 reads these as free names of its module.
initial_lr, epoch_size, gamma, step_index = 0.1, 2, 0.5, 2


def test_usage_2_the_learning_rate_set_by_hand_as_the_tutorial_writes_it():
    # The tutorial's Usage 2, as a user writes it; only the import line changed.
    class CustomMainCB(MainCallBack):
        def on_lr_adjust(self, runner):
            warmup_epoch = 5
            if runner.epochs <= warmup_epoch:
                lr = 1e-6 + (initial_lr - 1e-6) * runner.batch_idx / (epoch_size * warmup_epoch)
            else:
                lr = initial_lr * (gamma ** (step_index))
            for param_group in runner.optimizer.param_groups:
                param_group['lr'] = lr
            return lr

    lrs = []

    class Lr(Callback):
        def after_train_epoch(self, runner):
            lrs.append(runner.optimizer.param_groups[0]['lr'])

    loop = make_loop(train=epoch_size, val=0)
    loop.fit(num_epochs=7, callbacks=[CustomMainCB(), Lr()])
    # on_lr_adjust runs after each epoch's batches: runner.epochs is the epochs completed before it (0 to 6), and
    # runner.batch_idx the last batch's index (Orca deletes it by then; the tutorial reads it).
    warm = 1e-6 + (initial_lr - 1e-6) * (epoch_size - 1) / (epoch_size * 5)
    assert lrs == [warm] * 6 + [initial_lr * gamma ** step_index]


class OrcasOwnBackward(MainCallback):
    """Orca's MainCallback backward as Orca writes it: zero_grad, backward, step on the runner's optimizer."""

    def on_iter_backward(self, runner):
        runner.optimizer.zero_grad()
        runner.loss.backward()
        runner.optimizer.step()


def test_a_main_callback_s_own_backward_trains_and_our_schedulers_still_see_its_updates():
    from aitoolbox_like.callbacks.train_schedule import StepLRScheduler
    train_data = batches(3, 1)
    loop = make_loop(train=train_data)
    loop.fit(num_epochs=2, callbacks=[OrcasOwnBackward(), StepLRScheduler(step_size=1, gamma=0.5)])
    model, _ = hand_written(train_data, 2,
                            scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5))
    assert same_weights(loop.model, model)
    assert loop.optimizer.param_groups[0]['lr'] == 0.025


def test_gradient_accumulation_is_honoured_by_the_default_backward_and_refused_with_an_own_backward():
    a, b = make_loop(train=5), make_loop(train=5)
    a.fit(num_epochs=2, callbacks=[MainCallback()], grad_accumulation=2)
    b.fit(num_epochs=2, grad_accumulation=2)        # the loop's standard step, accumulating
    assert same_weights(a.model, b.model)
    with pytest.raises(ValueError, match=r'OrcasOwnBackward overrides on_iter_backward.*grad_accumulation=2.*Fix: '
                                         r'remove the on_iter_backward override'):
        make_loop().fit(num_epochs=1, callbacks=[OrcasOwnBackward()], grad_accumulation=2)

    class CountsThenSteps(MainCallback):
        backward_through_loop = True            # its backward is MainCallback's, through the loop
        calls = 0

        def on_iter_backward(self, runner):
            CountsThenSteps.calls += 1
            super().on_iter_backward(runner)

    c = make_loop(train=5)
    c.fit(num_epochs=2, callbacks=[CountsThenSteps()], grad_accumulation=2)
    assert same_weights(c.model, b.model) and CountsThenSteps.calls == 10


def test_fp16_is_refused_with_an_own_backward(monkeypatch):
    # fp16 needs CUDA; the refusal is decided on loop.precision before the first step.
    monkeypatch.setattr(TrainLoop, 'precision', property(lambda loop: 'fp16'))
    with pytest.raises(ValueError, match=r"use_amp='fp16'.*GradScaler.*backward_through_loop = True"):
        make_loop().fit(num_epochs=1, callbacks=[OrcasOwnBackward()])


def test_bf16_runs_the_main_callback_s_forward_under_the_loop_s_autocast():
    a, b = make_loop(train=3, use_amp='bf16'), make_loop(train=3, use_amp='bf16')
    dtypes = []

    class Main(MainCallback):
        def on_train_forward(self, runner):
            super().on_train_forward(runner)
            dtypes.append(runner.output.dtype)

    a.fit(num_epochs=1, callbacks=[Main()])
    b.fit(num_epochs=1)
    assert dtypes == [torch.bfloat16] * 3
    assert same_weights(a.model, b.model)


def test_two_main_callbacks_are_refused():
    with pytest.raises(ValueError, match='only one callback .* may own the training step'):
        make_loop().fit(num_epochs=1, callbacks=[MainCallback(), MainCallback()])


def test_a_forward_that_sets_no_loss_is_named():
    class NoLoss(MainCallback):
        def on_iter_forward(self, runner):
            runner.output = runner.model(runner.batch[0])

    with pytest.raises(RuntimeError, match='must set runner.loss'):
        make_loop().fit(num_epochs=1, callbacks=[NoLoss()])


# ---- stopping -----------------------------------------------------------------------------------------------

class MaxSteps(Callback):
    """A max-steps callback written as Orca's MaxstepsCallback is: the epochs from the loader, stop at the step."""

    def __init__(self, max_step):
        super().__init__()
        self.max_step = max_step

    def before_run(self, runner):
        runner.num_epochs = -(-self.max_step // len(runner.train_loader))

    def after_train_iter(self, runner):
        if runner.global_step >= self.max_step:
            runner.stop = True


def test_max_steps_trains_exactly_that_many_steps_then_validates_and_stops():
    log = []
    loop = make_loop(train=5, val=1)
    steps = []
    loop.optimizer.register_step_post_hook(lambda *args: steps.append(1))
    loop.fit(num_epochs=1, callbacks=[MainCallback(), MaxSteps(7), Recorder(log)])
    assert len(steps) == 7 and loop.total_iteration_idx + 1 == 7
    assert loop.epochs_completed == 2 and len(loop.train_history['val_loss']) == 2     # the cut epoch is validated
    assert [entry[:3] for entry in log if entry[0] in ('after_val_epoch', 'after_train_epoch', 'after_run')] == \
        [('after_val_epoch', 0, 5), ('after_train_epoch', 1, 5), ('after_val_epoch', 1, 7),
         ('after_train_epoch', 2, 7), ('after_run', 2, 7)]
    uninterrupted = make_loop(train=5, val=1)
    uninterrupted.fit(num_iterations=7, callbacks=[MainCallback()])
    assert same_weights(loop.model, uninterrupted.model)


def test_stop_ends_the_epoch_after_the_batch_still_validates_then_ends_training():
    class StopAtSecondBatch(Callback):
        def after_train_iter(self, runner):
            if runner.batch_idx == 1:
                runner.stop = True

    loop = make_loop(train=4, val=1)
    loop.fit(num_epochs=3, callbacks=[StopAtSecondBatch()])
    assert loop.total_iteration_idx + 1 == 2 and loop.epochs_completed == 1
    assert len(loop.train_history['val_loss']) == 1 and loop.early_stop
    assert isinstance(loop.train_loader, list)      # the user's loader is back
    # A second fit starts with runner.stop cleared.
    loop.fit(num_epochs=2)
    assert loop.epochs_completed == 2


# ---- predictions and checkpoints ------------------------------------------------------------------------------

def test_prediction_hooks_run_for_prediction_passes_outside_fit_only():
    log = []

    class Pred(Callback):
        def before_pred_epoch(self, runner):
            log.append('before_pred_epoch')

        def before_pred_iter(self, runner):
            log.append(('before_pred_iter', runner.batch_idx))

        def after_pred_iter(self, runner):
            log.append(('after_pred_iter', tuple(runner.output.shape)))

        def after_pred_epoch(self, runner):
            log.append('after_pred_epoch')

    class PredictsDuringFit(AbstractCallback):
        def __init__(self):
            super().__init__('predicts')

        def on_epoch_end(self):
            self.train_loop_obj.predict_on_validation_set()

    loop = make_loop(train=1, val=2)
    loop.fit(num_epochs=1, callbacks=[PredictsDuringFit(), Pred()])
    assert log == []
    loop.predict_on_validation_set(force_prediction=True)
    assert log == ['before_pred_epoch', ('before_pred_iter', 0), ('after_pred_iter', (4, 3)),
                   ('before_pred_iter', 1), ('after_pred_iter', (4, 3)), 'after_pred_epoch']


class EpochCheckpoint(Callback):
    """An Orca-style checkpoint callback: Orca's checkpoint file per epoch (runner.save_checkpoint), and 'last'."""

    def __init__(self, folder):
        super().__init__()
        self.folder = folder

    def after_train_epoch(self, runner):
        if self.every_n_epoch(runner, 1):
            runner.save_checkpoint(os.path.join(self.folder, f'test-epoch={runner.epochs}.ckpt'))

    def after_run(self, runner):
        runner.save_checkpoint(os.path.join(self.folder, 'last.ckpt'), save_weights_only=True)


def test_checkpoints_are_orca_s_files_and_a_reloaded_model_evaluates_the_same(tmp_path):
    loop = make_loop(train=3, val=2)
    runner_for(loop).scheduler = torch.optim.lr_scheduler.StepLR(loop.optimizer, step_size=1)
    loop.fit(num_epochs=2, callbacks=[MainCallback(), EpochCheckpoint(str(tmp_path))])
    assert sorted(os.listdir(tmp_path)) == ['last.ckpt', 'test-epoch=1.ckpt', 'test-epoch=2.ckpt']
    full = torch.load(tmp_path / 'test-epoch=2.ckpt', weights_only=True)
    assert sorted(full) == ['epoch', 'models', 'optimizers', 'schedulers'] and full['epoch'] == 2
    assert sorted(torch.load(tmp_path / 'last.ckpt', weights_only=True)) == ['epoch', 'models']

    torch.manual_seed(1)
    model = Net()
    fresh = TrainLoop(model, batches(3, 1), batches(2, 2), None, torch.optim.SGD(model.parameters(), lr=0.1),
                      nn.CrossEntropyLoss(), progress_bar=False)
    runner = runner_for(fresh)
    runner.load_checkpoint(str(tmp_path / 'test-epoch=1.ckpt'))
    assert runner.epochs == 1
    runner.load_checkpoint(str(tmp_path / 'last.ckpt'))
    assert torch.equal(fresh.evaluate_loss_on_validation_set(), loop.evaluate_loss_on_validation_set())
    runner.remove_checkpoint(str(tmp_path / 'last.ckpt'))
    assert not (tmp_path / 'last.ckpt').exists()


def test_a_failed_fit_gives_the_loader_back_and_runs_no_after_run():
    ran = []

    class Fails(Callback):
        def after_train_iter(self, runner):
            raise KeyError('boom')

        def after_run(self, runner):
            ran.append('after_run')

    train_data = batches(2, 1)
    loop = make_loop(train=train_data)
    with pytest.raises(KeyError, match='boom'):
        loop.fit(num_epochs=1, callbacks=[Fails()])
    assert loop.train_loader is train_data and ran == []


def test_a_validation_pass_inside_a_training_batch_keeps_the_batch_s_attributes():
    log = []

    class EvaluatesMidEpoch(AbstractCallback):
        def __init__(self):
            super().__init__('evaluates')

        def on_batch_end(self):
            if self.train_loop_obj.iteration == 0:
                self.train_loop_obj.evaluate_loss_on_validation_set(force_prediction=True)

    loop = make_loop(train=2, val=1)
    loop.fit(num_epochs=1, callbacks=[MainCallback(), EvaluatesMidEpoch(), Recorder(log)])
    names = [entry[0] for entry in log]
    assert names[:6] == ['before_run', 'before_train_epoch', 'before_train_iter', 'before_val_epoch',
                         'before_val_iter', 'after_val_iter']
    assert log[7] == ('after_train_iter', 0, 1, 0, ('batch', 'loss', 'output', 'target'))
    assert runner_for(loop).epoch_stats['batch_count'] == 2


# ---- a user's whole Orca setup -------------------------------------------------------------------------------

class Plain(nn.Module):
    """A plain nn.Module (no TTModel methods), counting its forwards."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)
        self.forwards = 0

    def forward(self, x):
        self.forwards += 1
        return self.fc(x)


def test_a_plain_module_trains_with_a_main_callback_validated_in_one_forward_with_orca_s_metrics():
    from aitoolbox_like.callbacks.basic import EarlyStopping
    from aitoolbox_like.adapters.orca import Accuracy
    stats = []

    class Stats(Callback):
        def after_train_epoch(self, runner):
            stats.append(dict(runner.epoch_stats))

    torch.manual_seed(0)
    model = Plain()
    loop = TrainLoop(model, batches(3, 1), batches(2, 2, last=3), None, torch.optim.SGD(model.parameters(), lr=0.1),
                     nn.CrossEntropyLoss(), progress_bar=False, eval_loss_weighting='sample')
    runner_for(loop).metrics = [Accuracy()]
    early = EarlyStopping(monitor='val_loss', patience=5)
    loop.fit(num_epochs=2, callbacks=[Stats(), MainCallback(), early])
    # one forward per training batch and per validation batch (Orca's on_val_forward is the evaluation's forward)
    assert model.forwards == 2 * (3 + 2)
    history = loop.train_history
    # the history's val_loss is Orca's (its batch losses weighted by samples), its metrics under Orca's names
    assert history['val_loss'] == [s['val_loss'] for s in stats]
    assert history['val_accuracy'] == [s['val_accuracy'] for s in stats]
    model.eval()
    x = torch.cat([b[0] for b in batches(2, 2, last=3)])
    y = torch.cat([b[1] for b in batches(2, 2, last=3)])
    assert stats[-1]['val_accuracy'] == pytest.approx(float((model(x).argmax(1) == y).float().mean()))


def test_the_main_callback_runs_first_as_orca_s_estimator_puts_it():
    order = []

    class Other(Callback):
        def before_run(self, runner):
            order.append('other')

    class Main(MainCallback):
        def before_run(self, runner):
            order.append('main')

    make_loop().fit(num_epochs=1, callbacks=[Other(), Main()])
    assert order == ['main', 'other']


def test_loading_an_orca_checkpoint_continues_the_epoch_count(tmp_path):
    seen = []

    class Epochs(Callback):
        def after_train_epoch(self, runner):
            seen.append(runner.epochs)

    loop = make_loop()
    loop.fit(num_epochs=2, callbacks=[MainCallback()])
    path = runner_for(loop).save_checkpoint(str(tmp_path / 'epoch2.ckpt'))
    fresh = make_loop()
    runner_for(fresh).load_checkpoint(path)
    fresh.fit(num_epochs=3, callbacks=[MainCallback(), Epochs()])
    assert seen == [3] and fresh.epochs_completed == 3


def test_orca_callbacks_and_the_runner_continue_after_a_resume(tmp_path):
    """Attributes of Orca callbacks (no state_dict) and what they keep on the runner are in the loop's checkpoints,
    restored after before_run: a run interrupted after epoch 2 and resumed ends as the one never interrupted."""
    from aitoolbox_like.tracking import TrainLoopCheckpoint

    class Patience(Callback):
        def before_run(self, runner):
            self.best, self.wait = float('inf'), 0       # set up for every run, as Orca callbacks do

        def after_train_epoch(self, runner):
            if runner.epoch_stats['val_loss'] < self.best - 0.05:
                self.best, self.wait = runner.epoch_stats['val_loss'], 0
            else:
                self.wait += 1
            runner.put('epochs_seen', runner.get('epochs_seen') + 1) if runner.epochs > 1 else \
                runner.put('epochs_seen', 1)

    class Interrupt(AbstractCallback):
        def on_epoch_end(self):
            if self.train_loop_obj.epoch == 1:
                raise KeyboardInterrupt

    def run(folder, extra=()):
        torch.manual_seed(0)
        model = Net()
        loop = TrainLoopCheckpoint(model, batches(3, 1), batches(2, 2), None,
                                   torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                                   'proj', 'orca', str(folder), {}, cloud_save_mode='local', progress_bar=False)
        runner_for(loop).scheduler = torch.optim.lr_scheduler.StepLR(loop.optimizer, step_size=1, gamma=0.5)
        patience = Patience()
        return loop, patience, [MainCallback(), patience, *extra]

    whole, whole_patience, callbacks = run(tmp_path / 'whole')
    whole.fit(num_epochs=4, callbacks=callbacks)
    first, _, callbacks = run(tmp_path / 'resumed', [Interrupt('interrupt')])
    with pytest.raises(KeyboardInterrupt):
        first.fit(num_epochs=4, callbacks=callbacks)
    resumed, patience, callbacks = run(tmp_path / 'resumed')
    resumed.fit(num_epochs=4, callbacks=callbacks, resume_from='latest')
    assert (patience.best, patience.wait) == (whole_patience.best, whole_patience.wait)
    assert runner_for(resumed).get('epochs_seen') == runner_for(whole).get('epochs_seen') == 4
    assert runner_for(resumed).scheduler.state_dict() == runner_for(whole).scheduler.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(resumed.model.parameters(), whole.model.parameters()))


def test_a_bigdl_callback_kept_on_its_bigdl_import_is_refused_naming_the_import_to_change(tmp_path, monkeypatch):
    package = tmp_path / 'bigdl' / 'orca' / 'learn' / 'pytorch' / 'callbacks'
    package.mkdir(parents=True)
    for folder in [tmp_path / 'bigdl', *package.parents][:5]:
        (folder / '__init__.py').touch()
    (package / '__init__.py').write_text('class Callback:\n    pass\n\n\nclass MainCallback(Callback):\n    pass\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    from bigdl.orca.learn.pytorch.callbacks import MainCallback as BigDLMainCallback

    class Mine(BigDLMainCallback):
        pass

    with pytest.raises(TypeError, match=r'derive Mine from aitoolbox_like\.adapters\.orca'):
        make_loop().fit(num_epochs=1, callbacks=[Mine()])
    with pytest.raises(TypeError, match=r'from aitoolbox_like\.adapters\.orca import MainCallback'):
        make_loop().fit(num_epochs=1, callbacks=[BigDLMainCallback()])
