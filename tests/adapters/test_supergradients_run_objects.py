"""What SuperGradients' trainer gives its callbacks besides the phase fields, through the adapter: the training
params (attribute and dict access, lr_warmup_epochs), the one context of the run (shared, assignable by a
callback), phases by name, the loss meter over the epoch's batch losses, the metric collection SG's
MetricsUpdateCallback feeds and SG's metric names in metrics_dict, and a clear error for a field with no
counterpart. make sg-check runs SG's own callback classes on all of it (tools/sg_check)."""
import logging

import pytest
import torch
from torch import nn

from aitoolbox_like import TrainLoop
from helpers import ImageClassifier, image_batches
from aitoolbox_like.adapters.supergradients import (AverageMeter, Callback, Phase, PhaseCallback, PhaseContext,
                                                     SGMetricCollection, TrainingParams, UnavailableFieldError)


Net, batches = ImageClassifier, image_batches      # 8x8 images (64 features), 10 classes


def make_loop(train=3, val=2):
    torch.manual_seed(0)
    model = Net()
    return TrainLoop(model, batches(train, 1), batches(val, 2), None, torch.optim.SGD(model.parameters(), lr=0.1),
                     nn.CrossEntropyLoss(), progress_bar=False)


class Seen(PhaseCallback):
    """Calls ``read(context)`` at its phase and keeps what it returns."""

    def __init__(self, phase, read):
        super().__init__(phase)
        self.read, self.seen = read, []

    def __call__(self, context):
        self.seen.append(self.read(context))


def test_training_params_read_as_attributes_and_as_a_dict():
    params = TrainingParams({'max_epochs': 3}, lr_warmup_epochs=2)
    assert params.max_epochs == params['max_epochs'] == 3 and params.lr_warmup_epochs == 2
    assert params.lr_cooldown_epochs == 0 and params.warmup_mode == 'LinearEpochLRWarmup'    # SG's defaults
    params.initial_lr = 0.1
    assert params['initial_lr'] == 0.1 and params.to_dict()['initial_lr'] == 0.1
    params.override(optimizer_params={'momentum': 0.9})
    assert params.optimizer_params == {'momentum': 0.9}
    with pytest.raises(AttributeError, match="no 'max_epoch'"):
        params.max_epoch

    # a fit whose SG callbacks hold none: SG's defaults with the fit's settings, no warm-up (as SG: 0)
    seen = Seen(Phase.TRAIN_EPOCH_END, lambda c: (c.training_params.max_epochs, c.training_params['max_epochs'],
                                                  c.training_params.batch_accumulate, c.lr_warmup_epochs,
                                                  c.training_params.average_best_models))
    make_loop().fit(num_epochs=2, grad_accumulation=2, callbacks=[seen])
    assert seen.seen == [(2, 2, 2, 0, False)] * 2


def test_the_context_has_the_training_params_the_sg_callbacks_were_built_with():
    params = TrainingParams(max_epochs=2, lr_warmup_epochs=1)

    class BuiltFromParams(Callback):        # as SG's LR callbacks: built with the run's training params
        def __init__(self, training_params):
            self.training_params = training_params

        def on_train_loader_start(self, context):
            pass

    seen = Seen(Phase.TRAIN_EPOCH_START, lambda c: (c.training_params, c.lr_warmup_epochs))
    make_loop().fit(num_epochs=1, callbacks=[seen, BuiltFromParams(params)])
    assert seen.seen[0][0] is params and seen.seen[0][1] == 1


def test_a_phase_by_its_name():
    assert PhaseCallback('TRAIN_EPOCH_END').phase is Phase.TRAIN_EPOCH_END      # as SG's YAML recipes write it
    assert Phase.from_string('TEST_END') is Phase.TEST_END
    with pytest.raises(ValueError, match="Invalid phase string: 'TRAIN_END'"):
        PhaseCallback('TRAIN_END')
    with pytest.raises(TypeError, match='phase must be a Phase member'):
        PhaseCallback(3)


def test_one_context_for_the_run_which_a_callback_may_assign_to_itself():
    class KeepContext(PhaseCallback):        # SG's PhaseContextTestCallback: stores the context it is given
        def __init__(self, phase):
            super().__init__(phase)
            self.context = None

        def __call__(self, context):
            self.context = context

    class Note(PhaseCallback):
        def __init__(self):
            super().__init__(Phase.TRAIN_EPOCH_START)

        def __call__(self, context):
            context.update_context(note=context.epoch)

    keep = KeepContext('TRAIN_EPOCH_END')
    seen = Seen(Phase.TRAIN_EPOCH_END, lambda c: c.note)
    loop = make_loop()
    loop.fit(num_epochs=2, callbacks=[Note(), keep, seen])
    assert seen.seen == [0, 1]          # what one callback sets, the others see (SG's one context)
    assert isinstance(keep.context, PhaseContext) and keep.context.loop is loop
    assert keep.context is seen.context


def test_loss_avg_meter_is_over_the_epochs_batch_losses():
    class Losses(Callback):
        def __init__(self):
            self.losses, self.averages, self.ends = [], [], []

        def on_train_batch_loss_end(self, context):
            self.losses.append(context.loss.item())

        def on_train_batch_end(self, context):
            self.averages.append(context.loss_avg_meter.average)

        def on_train_loader_end(self, context):
            self.ends.append((context.loss_avg_meter.average, context.metrics_dict['CrossEntropyLoss']))

    record = Losses()
    loop = make_loop(train=3)
    loop.fit(num_epochs=2, callbacks=[record])
    for epoch in range(2):
        losses = record.losses[3 * epoch:3 * epoch + 3]
        running = [sum(losses[:i + 1]) / (i + 1) for i in range(3)]
        averages = record.averages[3 * epoch:3 * epoch + 3]
        assert all(len(average) == 1 for average in averages)      # SG's form: one value per loss item
        assert [average[0] for average in averages] == pytest.approx(running, rel=1e-12)
        accumulated = loop.train_history['accumulated_loss'][epoch]
        assert record.ends[epoch][0][0] == pytest.approx(accumulated, rel=1e-12)
        assert record.ends[epoch][1] == accumulated

    meter = AverageMeter()      # SG's meter: what update() is given, weighted by batch size
    meter.update(torch.tensor([1.0]), 4)
    meter.update(torch.tensor([4.0]), 1)
    assert meter.average == (pytest.approx(1.6),) and meter.count == 5


class Accuracy:
    """A metric with SG's (torchmetrics') interface: update(preds, target), compute(), reset()."""

    def __init__(self):
        self.reset()

    def update(self, preds, target):
        self.correct += int((preds.argmax(1) == target).sum())
        self.total += len(target)

    def compute(self):
        return self.correct / self.total

    def reset(self):
        self.correct = self.total = 0


class MetricsUpdate(PhaseCallback):
    """What SG's MetricsUpdateCallback does (SG's trainer adds one per batch-end phase)."""

    def __call__(self, context):
        context.metrics_compute_fn.update(**context.__dict__)
        context.loss_avg_meter.update(context.loss_log_items, len(context.inputs))


def test_metrics_compute_fn_gives_sg_names_in_metrics_dict():
    class Params(Callback):
        def __init__(self, training_params):
            self.training_params = training_params

    class ValidationEnd(Callback):
        def __init__(self):
            self.seen = []

        def on_validation_loader_end(self, context):
            # the hand-written evaluation of the same model on the same validation batches
            net, loader = context.net, context.valid_loader
            with torch.no_grad():
                outputs = [(net(x), y) for x, y in loader]
            correct = sum(int((out.argmax(1) == y).sum()) for out, y in outputs)
            losses = [float(nn.functional.cross_entropy(out, y)) for out, y in outputs]
            self.seen.append((dict(context.metrics_dict), correct / 8, sum(losses) / 2,
                              context.metrics_compute_fn, context.valid_metrics))

    params = TrainingParams(train_metrics_list=[Accuracy()], valid_metrics_list=[Accuracy()])
    end = ValidationEnd()
    loop = make_loop(train=3, val=2)
    loop.fit(num_epochs=2, callbacks=[Params(params), MetricsUpdate(Phase.TRAIN_BATCH_END),
                                      MetricsUpdate(Phase.VALIDATION_BATCH_END), end])
    for epoch, (metrics, accuracy, loss, collection, valid_metrics) in enumerate(end.seen):
        assert isinstance(collection, SGMetricCollection) and collection is valid_metrics
        assert metrics['Accuracy'] == accuracy       # SG's name: the metric's class name
        assert metrics['val_loss'] == loop.train_history['val_loss'][epoch]
        # SG's loss name: the criterion's; fed by the metrics update, SG's meter (weighted by batch size)
        assert metrics['CrossEntropyLoss'] == pytest.approx(loss, rel=1e-6)


def test_a_metric_nothing_fed_has_no_value():
    class Params(Callback):
        def __init__(self, training_params):
            self.training_params = training_params

    params = TrainingParams(valid_metrics_list=[Accuracy()])       # and no MetricsUpdate: nothing feeds it
    seen = Seen(Phase.VALIDATION_EPOCH_END, lambda c: sorted(c.metrics_dict))
    make_loop().fit(num_epochs=1, callbacks=[Params(params), seen])
    assert seen.seen == [['CrossEntropyLoss', 'val_loss']]


def test_a_field_with_no_counterpart_names_itself_to_the_callback_reading_it():
    seen = Seen(Phase.TRAIN_EPOCH_END, lambda c: c.arch_params.num_classes)
    with pytest.raises(UnavailableFieldError, match=r"PhaseContext.arch_params is not available.*SG's model-zoo "
                                                    r'architecture settings'):
        make_loop().fit(num_epochs=1, callbacks=[seen])
    assert Seen(Phase.TRAIN_EPOCH_END, None).hooks_in_use() == ['on_train_epoch_end']


def test_average_best_models_phases_never_run_and_say_so(caplog):
    class Averaging(Callback):
        def __init__(self):
            self.calls = 0

        def on_average_best_models_validation_start(self, context):
            self.calls += 1

    callback = Averaging()
    with caplog.at_level(logging.WARNING):
        make_loop().fit(num_epochs=1, callbacks=[callback])
    assert callback.calls == 0 and callback.hooks_in_use() == []
    assert 'on_average_best_models_validation_start never run here' in caplog.text
