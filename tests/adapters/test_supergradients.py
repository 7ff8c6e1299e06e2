"""SuperGradients-style callbacks (aitoolbox_like.adapters.supergradients): SG's method order over a fit, phase
callbacks with the real batch tensors and model outputs in their context, multi_process_safe, the SG page's
SaveFirstBatchCallback."""
import glob
import importlib.util
import json
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import MultiLoss, TrainLoop, distributed
from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.adapters import supergradients as sg
from aitoolbox_like.adapters.supergradients import (SG_METHOD_HOOKS, Callback, Phase, PhaseCallback, PhaseContext,
                                                     multi_process_safe)
from aitoolbox_like.tracking import TrainLoopCheckpoint
from helpers import EXAMPLES_DIR, ImageClassifier, image_batches


Net, batches = ImageClassifier, image_batches      # 8x8 images (64 features), 10 classes


def make_loop(train=2, val=1, test=1, loop_class=TrainLoop, **kwargs):
    torch.manual_seed(0)
    model = Net()
    return loop_class(model, batches(train, 1), batches(val, 2) if val else None, batches(test, 3) if test else None,
                      torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), **kwargs)


class RecordAll(Callback):
    """Overrides every SG method; records (method, epoch, batch_idx). No super().__init__(), as in SG."""

    def __init__(self):
        self.events = []


for _name in SG_METHOD_HOOKS:
    setattr(RecordAll, _name, (lambda name: lambda self, context: self.events.append(
        (name, context.epoch, context.batch_idx)))(_name))


def expected_sg_order(loop, num_epochs, train, val, test):
    """The order of SuperGradients' documentation (the Callback class docstring), for this fit."""
    val_losses = dict(zip(loop.train_history.get_epochs('val_loss'), loop.train_history['val_loss']))
    events = [('on_training_start', 0, None)]
    best = None
    for epoch in range(num_epochs):
        events.append(('on_train_loader_start', epoch, None))
        for i in range(train):
            events += [(name, epoch, i) for name in (
                'on_train_batch_start', 'on_train_batch_loss_end', 'on_train_batch_backward_end',
                'on_train_batch_gradient_step_start', 'on_train_batch_gradient_step_end', 'on_train_batch_end')]
        events.append(('on_train_loader_end', epoch, None))
        # the loss pass over the training set that the end-of-epoch evaluation makes is not a validation pass
        events.append(('on_validation_loader_start', epoch, None))
        for i in range(val):
            events += [('on_validation_batch_start', epoch, i), ('on_validation_batch_end', epoch, i)]
        events.append(('on_validation_loader_end', epoch, None))
        val_loss = val_losses[epoch]
        if best is None or val_loss < best:
            best = val_loss
            events.append(('on_validation_end_best_epoch', epoch, None))
    last = num_epochs - 1
    events.append(('on_test_loader_start', last, None))
    for i in range(test):
        events += [('on_test_batch_start', last, i), ('on_test_batch_end', last, i)]
    events += [('on_test_loader_end', last, None), ('on_training_end', last, None)]
    return events


def test_sg_methods_run_in_the_documented_order():
    loop = make_loop(train=3, val=2, test=2)
    recorder = RecordAll()
    loop.fit(num_epochs=3, callbacks=[recorder])
    assert recorder.events == expected_sg_order(loop, 3, train=3, val=2, test=2)
    assert recorder.callback_name == 'RecordAll' and recorder.execution_order == 0


def test_train_batch_start_sees_the_batch_about_to_be_trained():
    # needs loop.batch set before on_batch_begin, as docs/loop-state.md documents
    class FirstInputs(Callback):
        def __init__(self):
            self.seen = []

        def on_train_batch_start(self, context):
            self.seen.append((context.batch_idx, context.inputs, context.target))

    loop = make_loop(train=2)
    callback = FirstInputs()
    loop.fit(num_epochs=1, callbacks=[callback])
    assert [(i, x is loop.train_loader[i][0], y is loop.train_loader[i][1]) for i, x, y in callback.seen] == \
        [(0, True, True), (1, True, True)]


def test_a_validation_pass_requested_by_another_callback_is_a_validation_phase():
    class PredictEveryEpoch(AbstractCallback):
        def __init__(self):
            super().__init__('predict', execution_order=-1)

        def on_epoch_end(self):
            self.y_pred, _, _ = self.train_loop_obj.predict_on_validation_set()

    class ValidationBatches(Callback):
        def __init__(self):
            self.seen = []

        def on_validation_batch_end(self, context):
            self.seen.append((context.epoch, context.preds, context.loss))

    predictor, recorder = PredictEveryEpoch(), ValidationBatches()
    loop = make_loop(train=2, val=1, test=None, end_auto_eval=False)   # no loss passes: only the predictions
    loop.fit(num_epochs=2, callbacks=[predictor, recorder])
    assert [epoch for epoch, _, _ in recorder.seen] == [0, 1]
    preds, loss = recorder.seen[-1][1], recorder.seen[-1][2]
    assert torch.equal(preds, predictor.y_pred) and loss is None


def test_only_the_hooks_behind_the_used_methods_are_called():
    class OnlyEpochEnd(Callback):
        def on_train_loader_end(self, context):
            pass

    assert OnlyEpochEnd().hooks_in_use() == ['on_train_epoch_end']
    assert PhaseCallback(Phase.TRAIN_EPOCH_START).hooks_in_use() == ['on_epoch_begin']
    # batch_idx of an evaluation batch is counted from the pass's start; the model's output of a loss pass is kept
    # (a forward hook set at the start of fit)
    assert PhaseCallback(Phase.VALIDATION_BATCH_END).hooks_in_use() == [
        'on_train_begin', 'on_eval_begin', 'on_eval_batch_begin', 'on_eval_batch_end', 'on_train_end', 'on_exception']
    assert PhaseCallback(Phase.VALIDATION_EPOCH_END).hooks_in_use() == ['on_eval_end']
    assert PhaseCallback(Phase.POST_TRAINING).hooks_in_use() == ['on_train_end', 'on_exception']
    # a method after the training forward also keeps the model's output (a forward hook set at the start of fit)
    assert PhaseCallback(Phase.TRAIN_BATCH_STEP).hooks_in_use() == [
        'on_train_begin', 'on_after_optimizer_step', 'on_train_end', 'on_exception']
    loop = make_loop()
    callback = OnlyEpochEnd()
    loop.fit(num_epochs=1, callbacks=[callback])
    lists = loop.callbacks_handler.hook_lists
    assert [name for name, fns in lists.items() if any(getattr(f, '__self__', None) is callback for f in fns)] == \
        ['on_train_epoch_end']


def read_field(context, name):
    """A context field, or the NoExperimentFolderError reading it raises (ckpt_dir without an experiment)."""
    try:
        return getattr(context, name)
    except sg.NoExperimentFolderError as error:
        return error


class Snapshot(PhaseCallback):
    """Records what the context holds when its phase runs."""

    def __init__(self, phase):
        super().__init__(phase)
        self.calls = []

    def __call__(self, context):
        self.calls.append({name: read_field(context, name) for name in (
            'epoch', 'batch_idx', 'inputs', 'target', 'additional_batch_items', 'preds', 'loss', 'loss_log_items',
            'loss_logging_items_names', 'net', 'optimizer', 'criterion', 'device', 'train_loader', 'valid_loader',
            'test_loader', 'ckpt_dir', 'metrics_dict', 'ddp_silent_mode')} | {'loop_loss': context.loop.loss,
                                                   'requires_grad': getattr(context.loss, 'requires_grad', None)})


def test_phase_callbacks_run_at_their_phases_with_the_real_tensors():
    loop = make_loop(train=3, val=2, test=1)
    phases = {phase: Snapshot(phase) for phase in Phase}
    loop.fit(num_epochs=2, callbacks=list(phases.values()))
    calls = {phase: cb.calls for phase, cb in phases.items()}
    counts = {phase.name: len(c) for phase, c in calls.items()}
    assert counts == {'PRE_TRAINING': 1, 'TRAIN_EPOCH_START': 2, 'TRAIN_BATCH_END': 6, 'TRAIN_BATCH_STEP': 6,
                      'TRAIN_EPOCH_END': 2, 'VALIDATION_BATCH_END': 4, 'VALIDATION_EPOCH_END': 2,
                      'VALIDATION_END_BEST_EPOCH': counts['VALIDATION_END_BEST_EPOCH'], 'TEST_BATCH_END': 1,
                      'TEST_END': 1, 'POST_TRAINING': 1, 'AVERAGE_BEST_MODELS_VALIDATION_START': 0,
                      'AVERAGE_BEST_MODELS_VALIDATION_END': 0}     # the loop does not average the best models
    assert 1 <= counts['VALIDATION_END_BEST_EPOCH'] <= 2

    model, criterion = loop.model, loop.criterion
    # TRAIN_BATCH_END (SG's PhaseCallback: on_train_batch_loss_end): the batch, the model's output, the loss
    for i, call in enumerate(calls[Phase.TRAIN_BATCH_END]):
        x, y = loop.train_loader[i % 3]
        assert call['epoch'] == i // 3 and call['batch_idx'] == i % 3
        assert call['inputs'] is x and call['target'] is y
        assert call['loss'] is call['loop_loss'] and call['requires_grad']
        assert call['preds'].shape == (4, 10)
        assert torch.allclose(criterion(call['preds'], y), call['loss'])
        assert call['loss_logging_items_names'] == ['CrossEntropyLoss']     # SG's name: the criterion's class
        assert torch.equal(call['loss_log_items'], call['loss'].detach().reshape(1))
    # TRAIN_BATCH_STEP: after the update, same batch and loss
    for i, call in enumerate(calls[Phase.TRAIN_BATCH_STEP]):
        assert call['inputs'] is loop.train_loader[i % 3][0] and call['loss'] is not None
    # VALIDATION_BATCH_END of the end-of-epoch loss pass: the validation batch and its loss
    for i, call in enumerate(calls[Phase.VALIDATION_BATCH_END]):
        x, y = loop.validation_loader[i % 2]
        assert call['batch_idx'] == i % 2 and call['inputs'] is x and call['target'] is y
        # the model's output in the loss pass (the adapter's forward hook), of which the batch loss is computed
        assert torch.allclose(criterion(call['preds'], y), call['loss'])
    final = calls[Phase.VALIDATION_BATCH_END][-1]
    x, y = loop.validation_loader[1]
    with torch.no_grad():
        assert torch.allclose(final['loss'], criterion(model(x), y))
    test_call = calls[Phase.TEST_BATCH_END][0]
    assert test_call['inputs'] is loop.test_loader[0][0] and test_call['epoch'] == 1
    # loop-derived fields
    pre = calls[Phase.PRE_TRAINING][0]
    assert pre['net'] is model and pre['optimizer'] is loop.optimizer and pre['criterion'] is criterion
    assert pre['device'] == loop.device and pre['train_loader'] is loop.train_loader
    assert pre['valid_loader'] is loop.validation_loader and pre['test_loader'] is loop.test_loader
    assert pre['ddp_silent_mode'] is False
    # no experiment: no checkpoint folder, and reading it says how to get one
    assert isinstance(pre['ckpt_dir'], sg.NoExperimentFolderError) and 'ModelCheckpoint' in str(pre['ckpt_dir'])
    best = calls[Phase.VALIDATION_END_BEST_EPOCH][-1]
    assert best['metrics_dict']['val_loss'] == loop.train_history['val_loss'][best['epoch']]


# ---- the PhaseContext fields SG fills at each phase (docs/hooks-from-other-libraries.md, "PhaseContext fields by
# phase"), over one fit of 2 epochs: 3 training, 2 validation and 1 test batch ----------------------------------------

EPOCHS, TRAIN_BATCHES, VAL_BATCHES, TEST_BATCHES = 2, 3, 2, 1


@pytest.fixture(scope='module')
def phase_fit():
    loop = make_loop(train=TRAIN_BATCHES, val=VAL_BATCHES, test=TEST_BATCHES)
    snapshots = {phase: Snapshot(phase) for phase in Phase}
    loop.fit(num_epochs=EPOCHS, callbacks=list(snapshots.values()))
    return loop, {phase: snapshot.calls for phase, snapshot in snapshots.items()}


def recorded(loop, name, epoch):
    """The history value of ``name`` recorded in ``epoch``."""
    history = loop.train_history
    return dict(zip(history.get_epochs(name), history[name]))[epoch]


def expected_calls(loop, phase):
    """(epoch, batch_idx, batch, metrics_dict) of each call of ``phase`` in ``phase_fit``, as SG fills them: the
    batch is the one the phase is about (None at the epoch-level phases, where SG's context only has the last
    training batch's leftovers); metrics_dict is None where SG sets none."""
    epochs, last = range(EPOCHS), EPOCHS - 1
    train, val, test = loop.train_loader, loop.validation_loader, loop.test_loader
    val_losses = [recorded(loop, 'val_loss', epoch) for epoch in epochs]
    best_epochs = [e for e in epochs if all(val_losses[e] < val_losses[before] for before in range(e))]
    return {
        Phase.PRE_TRAINING: [(0, None, None, None)],
        Phase.TRAIN_EPOCH_START: [(e, None, None, None) for e in epochs],
        Phase.TRAIN_BATCH_END: [(e, i, train[i], None) for e in epochs for i in range(TRAIN_BATCHES)],
        Phase.TRAIN_BATCH_STEP: [(e, i, train[i], None) for e in epochs for i in range(TRAIN_BATCHES)],
        # SG: the train loss items and metrics of the epoch; ours: the mean batch loss, 'accumulated_loss', beside
        # SG's name for it (the criterion's class name)
        Phase.TRAIN_EPOCH_END: [(e, None, None, both('accumulated_loss', recorded(loop, 'accumulated_loss', e)))
                                for e in epochs],
        Phase.VALIDATION_BATCH_END: [(e, i, val[i], None) for e in epochs for i in range(VAL_BATCHES)],
        # SG: the validation metrics of the pass; the loop records them after the pass, the adapter has them already
        Phase.VALIDATION_EPOCH_END: [(e, None, None, both('val_loss', val_losses[e])) for e in epochs],
        Phase.VALIDATION_END_BEST_EPOCH: [(e, None, None, both('val_loss', val_losses[e])) for e in best_epochs],
        Phase.TEST_BATCH_END: [(last, i, test[i], None) for i in range(TEST_BATCHES)],
        # the end-of-training test loss pass: the loop records it as 'train_end_test_loss'
        Phase.TEST_END: [(last, None, None, both('test_loss', loop.train_history['train_end_test_loss'][-1]))],
        # SG's context still holds its last loader end's metrics: the test pass's, beside the history's
        Phase.POST_TRAINING: [(last, None, None, {**{name: recorded(loop, name, last) for name in (
            'accumulated_loss', 'val_loss', 'train_end_test_loss')},
            'CrossEntropyLoss': loop.train_history['train_end_test_loss'][-1]})],
        Phase.AVERAGE_BEST_MODELS_VALIDATION_START: [],
        Phase.AVERAGE_BEST_MODELS_VALIDATION_END: [],
    }[phase]


def both(name, value):
    """A loss under its history name and under SG's (the criterion's class name, CrossEntropyLoss here)."""
    return {name: value, 'CrossEntropyLoss': value}


def assert_batch_fields(phase, call, batch, criterion):
    """inputs / target / preds / loss of one call: those of ``batch`` where SG fills them, else None."""
    if batch is None:
        assert all(call[name] is None for name in ('inputs', 'target', 'additional_batch_items', 'preds', 'loss',
                                                   'loss_log_items'))
        return
    x, y = batch
    assert call['inputs'] is x and call['target'] is y and call['additional_batch_items'] is None
    loss = call['loss']
    assert call['loss_logging_items_names'] == ['CrossEntropyLoss']
    assert torch.equal(call['loss_log_items'], loss.detach().reshape(1))
    # the model's output of this batch (kept by the adapter's forward hook) and its loss
    assert call['preds'].shape == (4, 10) and torch.allclose(criterion(call['preds'], y), loss)
    if phase in (Phase.TRAIN_BATCH_END, Phase.TRAIN_BATCH_STEP):
        assert loss is call['loop_loss'] and loss.requires_grad          # the loss being trained
    else:
        assert loss.dim() == 0 and not loss.requires_grad                 # the end-of-epoch loss pass


@pytest.mark.parametrize('phase', list(Phase), ids=lambda phase: phase.name)
def test_phase_context_fields_at_each_phase(phase_fit, phase):
    loop, calls = phase_fit
    expected = expected_calls(loop, phase)
    got = calls[phase]
    assert [(c['epoch'], c['batch_idx']) for c in got] == [(epoch, idx) for epoch, idx, _, _ in expected]
    for call, (_, _, batch, metrics) in zip(got, expected):
        assert call['metrics_dict'] == metrics
        assert_batch_fields(phase, call, batch, loop.criterion)
    # fields read from the loop are there at every phase
    assert all(c['net'] is loop.model and c['optimizer'] is loop.optimizer and c['device'] == loop.device
               for c in got)


@pytest.mark.parametrize('weighting', ['batch', 'sample'])
def test_validation_epoch_end_has_the_val_loss_the_loop_records_after_it(weighting):
    # validation batches of 4 and 1 samples: the loop's two weightings of the batch losses give different means
    class Record(Callback):
        def __init__(self):
            self.batch_losses, self.ends = [], []

        def on_validation_batch_end(self, context):
            self.batch_losses.append(context.loss.item())

        def on_validation_loader_end(self, context):
            self.ends.append(context.metrics_dict)

    torch.manual_seed(0)
    model = Net()
    validation = batches(1, 2) + batches(1, 5, batch_size=1)
    loop = TrainLoop(model, batches(2, 1), validation, None, torch.optim.SGD(model.parameters(), lr=0.1),
                     nn.CrossEntropyLoss(), eval_loss_weighting=weighting)
    record = Record()
    loop.fit(num_epochs=2, callbacks=[record])
    assert record.ends == [both('val_loss', value) for value in loop.train_history['val_loss']]
    weights = [1, 1] if weighting == 'batch' else [4, 1]
    for epoch, end in enumerate(record.ends):
        losses = record.batch_losses[2 * epoch:2 * epoch + 2]
        mean = sum(loss * w for loss, w in zip(losses, weights)) / sum(weights)
        assert end['val_loss'] == pytest.approx(mean, rel=1e-6)


def test_metrics_dict_has_what_callbacks_recorded_before_the_phase():
    class PredictAndRecord(AbstractCallback):
        """A ModelPerformanceEvaluation stand-in: a validation predictions pass, then 'val_acc' recorded."""

        def __init__(self):
            super().__init__('predict', execution_order=-1)

        def on_batch_end(self):
            if self.train_loop_obj.iteration == 0:
                self.train_loop_obj.insert_metric_result_into_history('train_running', 1.0)

        def on_epoch_end(self):
            loop = self.train_loop_obj
            loop.predict_on_validation_set()
            loop.insert_metric_result_into_history('val_acc', 0.5 + loop.epoch)

    class Record(Callback):
        def __init__(self):
            self.seen = []

        def on_train_loader_end(self, context):
            self.seen.append(('train_end', context.metrics_dict))

        def on_validation_loader_end(self, context):
            self.seen.append(('val_end', context.metrics_dict))

        def on_validation_end_best_epoch(self, context):
            self.seen.append(('best', context.metrics_dict))

    record = Record()
    loop = make_loop(train=2, val=1, test=None)
    loop.fit(num_epochs=1, callbacks=[PredictAndRecord(), record])
    val_loss, accumulated = loop.train_history['val_loss'][0], loop.train_history['accumulated_loss'][0]
    # beside the history names, SG's: the loss as the criterion's class name, a metric without its split's prefix
    assert record.seen == [
        ('train_end', {'train_running': 1.0, 'accumulated_loss': accumulated, 'running': 1.0,
                       'CrossEntropyLoss': accumulated}),
        ('val_end', both('val_loss', val_loss)),        # the loss pass
        ('val_end', both('val_loss', val_loss)),        # the predictions pass: 'val_acc' is recorded after it
        ('best', {'val_loss': val_loss, 'val_acc': 0.5, 'CrossEntropyLoss': val_loss, 'acc': 0.5}),
    ]


class TwoLosses(Net):
    def get_loss(self, batch_data, criterion, device):
        x, y = batch_data
        out = self(x.to(device))
        return MultiLoss({'ce': criterion(out, y.to(device)), 'l2': out.pow(2).mean()})


def test_a_multi_loss_gives_one_entry_per_part_as_the_history():
    class Record(Callback):
        def __init__(self):
            self.seen = []

        def on_train_loader_end(self, context):
            self.seen.append(context.metrics_dict)

        def on_validation_loader_end(self, context):
            self.seen.append(context.metrics_dict)

    torch.manual_seed(0)
    model = TwoLosses()
    loop = TrainLoop(model, batches(2, 1), batches(2, 2), None, torch.optim.SGD(model.parameters(), lr=0.1),
                     nn.CrossEntropyLoss())
    record = Record()
    loop.fit(num_epochs=1, callbacks=[record])
    history = loop.train_history
    # SG's names of the parts: the MultiLoss's names (SG has no entry for their sum)
    assert record.seen == [{**{name: history[name][0] for name in ('accumulated_loss_ce', 'accumulated_loss_l2',
                                                                    'accumulated_loss')},
                            'ce': history['accumulated_loss_ce'][0], 'l2': history['accumulated_loss_l2'][0]},
                           {**{name: history[name][0] for name in ('val_loss_ce', 'val_loss_l2', 'val_loss')},
                            'ce': history['val_loss_ce'][0], 'l2': history['val_loss_l2'][0]}]


class EpochMetrics(Callback):
    """Writes the metrics_dict of each epoch-level phase to <out_dir>/<name>_rank<k>.json (a DDP test)."""

    def __init__(self, name, out_dir, device_idx_execution=None):
        self.name, self.out_dir, self.device_idx_execution = name, out_dir, device_idx_execution
        self.seen = []

    def on_train_loader_end(self, context):
        self.seen.append(['train_end', context.metrics_dict])

    def on_validation_loader_end(self, context):
        self.seen.append(['val_end', context.metrics_dict])

    def on_test_loader_end(self, context):
        self.seen.append(['test_end', context.metrics_dict])

    def on_training_end(self, context):
        path = os.path.join(self.out_dir, f'{self.name}_rank{dist.get_rank()}.json')
        with open(path, 'w') as f:
            json.dump(self.seen, f)


@pytest.mark.timeout(120)
def test_ddp_metrics_dict_is_the_mean_over_processes(tmp_path, monkeypatch):
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)

    def loader(n, batch_size):
        return DataLoader(TensorDataset(torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)),
                          batch_size=batch_size)

    model = Net()
    loop = TrainLoop(model, loader(16, 4), loader(7, 2), loader(5, 2), torch.optim.SGD(model.parameters(), lr=0.1),
                     nn.CrossEntropyLoss(), gpu_mode='ddp')
    out = str(tmp_path)
    loop.fit(num_epochs=2, num_gpus=2, on_gpu=False, callbacks=[
        EpochMetrics('everywhere', out), EpochMetrics('rank0only', out, device_idx_execution=0)])
    history = loop.train_history

    def seen(name, rank):
        with open(os.path.join(out, f'{name}_rank{rank}.json')) as f:
            return [tuple(item) for item in json.load(f)]

    expected = []
    for epoch in range(2):
        expected += [('train_end', both('accumulated_loss', history['accumulated_loss'][epoch])),
                     ('val_end', both('val_loss', history['val_loss'][epoch]))]
    expected.append(('test_end', both('test_loss', history['train_end_test_loss'][-1])))
    # both processes hand the values the loop records: means over the whole data sets
    assert seen('everywhere', 0) == seen('everywhere', 1) == expected
    # a callback on one rank cannot join the reduction: its own process's means, and no hang
    assert [(phase, sorted(metrics)) for phase, metrics in seen('rank0only', 0)] == \
        [(phase, sorted(metrics)) for phase, metrics in expected]
    assert not os.path.exists(os.path.join(out, 'rank0only_rank1.json'))


def test_validation_predictions_give_preds_and_the_best_epoch_follows_metric_to_watch():
    class Accuracy(AbstractCallback):
        def __init__(self):
            super().__init__('accuracy', execution_order=-1)

        def on_epoch_end(self):
            y_pred, y_true, _ = self.train_loop_obj.predict_on_validation_set()
            self.train_loop_obj.insert_metric_result_into_history('val_acc', -float(self.train_loop_obj.epoch))

    class Best(Callback):
        metric_to_watch = 'val_acc'
        greater_metric_to_watch_is_better = True

        def __init__(self):
            self.best_epochs, self.preds = [], []

        def on_validation_batch_end(self, context):
            if context.preds is not None:
                self.preds.append((context.preds, context.target))

        def on_validation_end_best_epoch(self, context):
            self.best_epochs.append(context.epoch)

    best = Best()
    loop = make_loop(train=2, val=1, test=None)
    loop.fit(num_epochs=3, callbacks=[Accuracy(), best])
    assert best.best_epochs == [0]          # val_acc 0, -1, -2: only the first epoch is the best
    state = best.state_dict()
    assert state['best_metric'] == 0.0
    # its own attributes are its state too (SG callbacks have no state_dict): a fresh one continues from them
    again = Best()
    again.register_train_loop_object(make_loop())
    again.load_state_dict(state)
    assert again.best_epochs == [0] and len(again.preds) == len(best.preds)
    preds, target = best.preds[-1]
    assert preds.shape == (4, 10) and target is loop.validation_loader[0][1]


def test_stop_training_and_update_context():
    class StopAfterFirstEpoch(PhaseCallback):
        def __init__(self):
            super().__init__(Phase.TRAIN_EPOCH_END)

        def __call__(self, context):
            context.update_context(note='mine')
            assert context.note == 'mine'
            context.stop_training = True

    loop = make_loop()
    loop.fit(num_epochs=5, callbacks=[StopAfterFirstEpoch()])
    assert loop.epochs_completed == 1


def test_a_custom_train_step_still_gets_the_loss_phase():
    class Step(AbstractCallback):
        def __init__(self):
            super().__init__('step')

        def train_step(self, batch):
            loop = self.train_loop_obj
            loss = loop.forward_loss(batch)
            loop.backward(loss)
            loop.step_optimizers()
            return loss

    class Order(Callback):
        def __init__(self):
            self.events = []

        def on_train_batch_loss_end(self, context):
            self.events.append(('loss_end', context.loss is not None, context.preds is not None))

        def on_train_batch_backward_end(self, context):
            self.events.append(('backward_end',))

        def on_train_batch_end(self, context):
            self.events.append(('batch_end',))

    order = Order()
    make_loop(train=1).fit(num_epochs=1, callbacks=[Step(), order])
    assert order.events == [('backward_end',), ('loss_end', True, True), ('batch_end',)]


def test_training_end_runs_once_also_when_fit_fails():
    class Boom(PhaseCallback):
        def __init__(self):
            super().__init__(Phase.TRAIN_EPOCH_END)

        def __call__(self, context):
            raise RuntimeError('boom')

    class End(Callback):
        def __init__(self):
            self.ends = 0

        def on_training_end(self, context):
            self.ends += 1

    end = End()
    with pytest.raises(RuntimeError, match='boom'):
        make_loop().fit(num_epochs=2, callbacks=[Boom(), end])
    assert end.ends == 1


def test_multi_process_safe_runs_only_on_the_main_process(monkeypatch):
    calls = []

    @multi_process_safe
    def record(value):
        calls.append(value)
        return value * 2

    assert record(3) == 6 and calls == [3]          # a single process is the main process
    assert record.__name__ == 'record'
    monkeypatch.setattr(distributed.processes, 'get_rank', lambda: 1)
    assert record(4) is None and calls == [3]       # another rank of a DDP run: not called


def test_phase_context_has_the_fields_the_sg_pages_name():
    names = ('epoch batch_idx optimizer metrics_dict inputs preds target metrics_compute_fn loss_avg_meter '
             'loss_log_items criterion device experiment_name net lr_warmup_epochs train_loader sg_logger '
             'valid_loader test_loader training_params ddp_silent_mode architecture metric_to_watch valid_metrics '
             'ema_model loss_logging_items_names valid_loaders_dict stop_training loss').split()
    context = PhaseContext(make_loop())
    missing = [name for name in names if not hasattr(context, name)]
    assert missing == []
    # the checkpoint folder of a loop without an experiment folder: an error naming the fix, not os.path.join's
    for name in ('ckpt_dir', 'checkpoints_dir_path'):
        with pytest.raises(sg.NoExperimentFolderError, match=r'PhaseContext.ckpt_dir: the TrainLoop has no '
                                                              r'experiment folder.*ModelCheckpoint'):
            os.path.join(getattr(context, name), 'batch_images')
    # SG's fields with no counterpart here: reading one names it
    for name in ('checkpoint_params', 'arch_params', 'context_methods', 'metric_idx_in_results_tuple'):
        with pytest.raises(sg.UnavailableFieldError, match=f'PhaseContext.{name} is not available'):
            getattr(context, name)
    context.checkpoint_params = 'mine'          # assigned, it is the callback's own value
    assert context.checkpoint_params == 'mine'
    assert [p.name for p in Phase] == ['PRE_TRAINING', 'TRAIN_EPOCH_START', 'TRAIN_BATCH_END', 'TRAIN_BATCH_STEP',
                                       'TRAIN_EPOCH_END', 'VALIDATION_BATCH_END', 'VALIDATION_EPOCH_END',
                                       'VALIDATION_END_BEST_EPOCH', 'TEST_BATCH_END', 'TEST_END',
                                       'AVERAGE_BEST_MODELS_VALIDATION_START', 'AVERAGE_BEST_MODELS_VALIDATION_END',
                                       'POST_TRAINING']


# ---- the SG page's SaveFirstBatchCallback, with only its imports changed -----------------------------------------
# One line added: the page's on_training_start creates outputs_path but never stores it (self.outputs_path stays
# None and the first save_image fails in SuperGradients too), so the copy stores it.

from aitoolbox_like.adapters.supergradients import Callback, PhaseContext  # noqa: E402,F811
from aitoolbox_like.adapters.supergradients import multi_process_safe  # noqa: E402,F811
from aitoolbox_like.adapters.supergradients import save_image  # noqa: E402


class SaveFirstBatchCallback(Callback):
    def __init__(self):
        self.outputs_path = None
        self.saved_first_validation_batch = False

    @multi_process_safe
    def on_training_start(self, context: PhaseContext) -> None:
        outputs_path = os.path.join(context.ckpt_dir, "batch_images")
        os.makedirs(outputs_path, exist_ok=True)
        self.outputs_path = outputs_path    # the added line (the page's own bug)

    @multi_process_safe
    def on_train_batch_start(self, context: PhaseContext) -> None:
        if context.batch_idx == 0:
            save_image(context.inputs, os.path.join(self.outputs_path, f"first_train_batch_epoch_{context.epoch}.png"))

    @multi_process_safe
    def on_validation_batch_start(self, context: PhaseContext) -> None:
        if context.batch_idx == 0 and not self.saved_first_validation_batch:
            save_image(context.inputs, os.path.join(self.outputs_path, f"first_validation_batch_epoch_{context.epoch}.png"))
            self.saved_first_validation_batch = True


def test_save_first_batch_callback_of_the_sg_page(tmp_path):
    loop = make_loop(train=2, val=2, test=None, loop_class=TrainLoopCheckpoint, project_name='sg',
                     experiment_name='first_batch', local_model_result_folder_path=str(tmp_path), hyperparams={},
                     cloud_save_mode=None)
    callback = SaveFirstBatchCallback()
    loop.fit(num_epochs=2, callbacks=[callback])
    folder = os.path.join(loop.experiment.dir_path, 'checkpoint_model', 'batch_images')
    assert callback.outputs_path == folder
    assert sorted(os.listdir(folder)) == ['first_train_batch_epoch_0.png', 'first_train_batch_epoch_1.png',
                                          'first_validation_batch_epoch_0.png']
    # the image is the first batch itself: 4 images of 8x8 in one row of the grid (torchvision's layout, padding 2)
    grid = np.asarray(Image.open(os.path.join(folder, 'first_train_batch_epoch_0.png')).convert('L'))
    assert grid.shape == (12, 42)
    first_image = loop.train_loader[0][0][0, 0]
    assert np.abs(grid[2:10, 2:10] - (first_image.numpy() * 255)).max() <= 1
    assert glob.glob(os.path.join(loop.experiment.dir_path, 'checkpoint_model', '*.pth'))


def test_the_supergradients_example_runs(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location('sg_example', os.path.join(EXAMPLES_DIR,
                                                                             'supergradients_style_callback.py'))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    loop = example.main(['--epochs', '2', '--output-dir', str(tmp_path)])
    [folder] = glob.glob(os.path.join(str(tmp_path), 'digits', 'sg_callbacks_*', 'checkpoint_model', 'batch_images'))
    assert sorted(os.listdir(folder)) == ['first_train_batch_epoch_0.png', 'first_train_batch_epoch_1.png',
                                          'first_validation_batch_epoch_0.png']
    assert 'best val_loss so far' in capsys.readouterr().out
    assert len(loop.train_history['val_loss']) == 2
