"""An SG user's whole setup moved over: TrainingParamsCallback does what SG's Trainer.train does with
``training_params`` (warm-up and lr_mode with SG's numbers, the metrics lists and SG's metrics updates,
phase_callbacks, max_epochs, metric_to_watch driving the best epoch, the params nothing acts on), SG's
learning-rate code on an unnamed optimizer group, and context.sg_logger over the loop's logging. The expected
learning rates are those SG's own unit tests assert (lr_warmup_test, lr_cooldown_test) or a hand-written loop."""
import logging
import math
import os

import numpy as np
import pytest
import torch
from torch import nn

from aitoolbox_like import TrainLoop
from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.callbacks.model_save import ModelCheckpoint
from aitoolbox_like.adapters.supergradients import (Callback, LRCallbackBase, Phase, PhaseCallback,
                                                     TrainingParams, TrainingParamsCallback)
from aitoolbox_like.tracking import TrainLoopCheckpoint
from helpers import ImageClassifier, image_batches


class Net(ImageClassifier):
    """48 features (3x4x4 images) to 5 classes."""

    def __init__(self):
        super().__init__(48, 5)


def batches(num_batches, seed, batch_size=4):
    return image_batches(num_batches, seed, batch_size, image_shape=(3, 4, 4), classes=5)


def make_loop(train=2, val=2, lr=0.1, optimizer=None, **kwargs):
    torch.manual_seed(0)
    model = Net()
    optimizer = optimizer(model) if optimizer else torch.optim.SGD(model.parameters(), lr=lr)
    return TrainLoop(model, batches(train, 1), batches(val, 2) if val else None, None, optimizer,
                     nn.CrossEntropyLoss(), progress_bar=False, **kwargs)


class MulticlassAccuracy:
    """A hand-written metric with torchmetrics' interface (update(preds, target), compute, reset)."""

    def __init__(self):
        self.updates = 0
        self.reset()

    def update(self, preds, target):
        self.correct += int((preds.argmax(1) == target).sum())
        self.total += len(target)
        self.updates += 1

    def compute(self):
        return torch.tensor(self.correct / self.total)

    def reset(self):
        self.correct, self.total = 0, 0


class LRs(PhaseCallback):
    """SG's TestLRCallback: the learning rate at each epoch end."""

    def __init__(self):
        super().__init__(Phase.TRAIN_EPOCH_END)
        self.lrs = []

    def __call__(self, context):
        self.lrs.append(context.optimizer.param_groups[0]['lr'])


class Best(Callback):
    def __init__(self):
        self.best = []

    def on_validation_end_best_epoch(self, context):
        self.best.append((context.epoch, context.metric_to_watch, dict(context.metrics_dict)))


def params(**values):
    return {'max_epochs': 5, 'initial_lr': 1, 'metric_to_watch': 'CrossEntropyLoss',
            'greater_metric_to_watch_is_better': False, **values}


# ---- learning rates: SG's numbers -----------------------------------------------------------------------------

@pytest.mark.parametrize('values, expected', [
    # lr_warmup_test.test_lr_warmup
    ({'lr_updates': [10], 'lr_decay_factor': 0.1, 'lr_mode': 'StepLRScheduler', 'lr_warmup_epochs': 3},
     [0.25, 0.5, 0.75, 1.0, 1.0]),
    # lr_warmup_test.test_lr_warmup_with_lr_scheduling
    ({'cosine_final_lr_ratio': 0.2, 'lr_mode': 'CosineLRScheduler', 'lr_warmup_epochs': 3},
     [0.25, 0.5, 0.75, 0.9236067977499791, 0.4763932022500211]),
    # lr_warmup_test.test_warmup_linear_epoch_step (per epoch start, recorded at the epoch end)
    ({'lr_updates': [10], 'lr_decay_factor': 0.1, 'lr_mode': 'StepLRScheduler', 'lr_warmup_epochs': 3,
      'warmup_initial_lr': 4.0}, [4.0, 3.0, 2.0, 1.0, 1.0]),
    # lr_cooldown_test.test_lr_cooldown_with_lr_scheduling
    ({'max_epochs': 7, 'cosine_final_lr_ratio': 0.2, 'lr_mode': 'CosineLRScheduler', 'lr_cooldown_epochs': 2,
      'lr_warmup_epochs': 3}, [0.25, 0.5, 0.75, 0.9236067977499791, 0.4763932022500211, 0.4763932022500211,
                               0.4763932022500211]),
])
def test_warm_up_and_lr_mode_give_sgs_learning_rates(values, expected):
    lrs = LRs()
    setup = params(phase_callbacks=[lrs], **values)
    make_loop(train=2, val=1).fit(num_epochs=setup['max_epochs'], callbacks=[TrainingParamsCallback(setup)])
    assert lrs.lrs == pytest.approx(expected, rel=1e-9)


def test_the_users_cosine_with_warm_up_no_longer_stays_at_the_optimizers_rate():
    """The report: lr_mode='CosineLRScheduler' with lr_warmup_epochs=2 left the rate at 0.1 for the whole run."""
    seen = []

    class Record(Callback):
        def on_train_batch_start(self, context):
            seen.append((context.epoch, context.batch_idx, context.optimizer.param_groups[0]['lr']))

    loop = make_loop(train=3, val=1, lr=0.1)
    loop.fit(num_epochs=4, callbacks=[TrainingParamsCallback(
        {'max_epochs': 4, 'lr_mode': 'CosineLRScheduler', 'lr_warmup_epochs': 2, 'cosine_final_lr_ratio': 0.1,
         'metric_to_watch': 'CrossEntropyLoss'}), Record()])
    # a hand-written schedule: warm-up from 0.1/3 in equal steps per epoch, then a cosine per optimizer step over
    # the 2 epochs after it, set after each step (the first batch after the warm-up still has the warm-up's rate)
    initial, ratio, steps = 0.1, 0.1, 3 * 2
    expected = []
    for epoch in range(4):
        for i in range(3):
            if epoch <= 2 and i == 0:
                lr = initial / 3 + epoch * (initial - initial / 3) / 2
            elif epoch >= 2:
                step = 3 * (epoch - 2) + i - 1
                lr = initial * (ratio + (1 - ratio) * 0.5 * (1 + math.cos(math.pi * step / (steps + 1))))
            expected.append((epoch, i, lr))
    assert [(e, i) for e, i, _ in seen] == [(e, i) for e, i, _ in expected]
    assert [lr for _, _, lr in seen] == pytest.approx([lr for _, _, lr in expected], rel=1e-9)
    assert len({round(lr, 12) for _, _, lr in seen}) > 5


def test_a_torch_scheduler_lr_mode_and_reduce_on_plateau_on_an_sg_name():
    loop = make_loop(train=2, val=1, lr=0.1)
    loop.fit(num_epochs=3, callbacks=[TrainingParamsCallback(params(
        max_epochs=3, initial_lr=None, lr_mode={'StepLR': {'step_size': 1, 'gamma': 0.5, 'phase': 'TRAIN_EPOCH_END'}}))])
    assert loop.optimizer.param_groups[0]['lr'] == pytest.approx(0.1 * 0.5 ** 3)

    plateau = make_loop(train=2, val=1, lr=0.1)
    plateau.fit(num_epochs=3, callbacks=[TrainingParamsCallback(params(
        max_epochs=3, initial_lr=None, valid_metrics_list=[Constant()], metric_to_watch='Constant',
        lr_mode={'ReduceLROnPlateau': {'patience': 0, 'factor': 0.1, 'mode': 'max',
                                       'phase': Phase.VALIDATION_EPOCH_END, 'metric_name': 'Constant'}}))])
    # a constant never improves: the first epoch sets the best, each one after reduces the rate
    assert plateau.optimizer.param_groups[0]['lr'] == pytest.approx(0.1 * 0.1 ** 2)


class Constant:
    def update(self, preds, target):
        pass

    def compute(self):
        return 1.0

    def reset(self):
        pass


# ---- SG's learning-rate code on the loop's optimizer ------------------------------------------------------------

class SGStyleStep(PhaseCallback):
    """Learning-rate code written the way SG's callbacks are: a rate per group, looked up by the group's name."""

    def __init__(self, initial_lr):
        super().__init__(Phase.TRAIN_EPOCH_END)
        self.lr = {'default': initial_lr} if not isinstance(initial_lr, dict) else initial_lr

    def __call__(self, context):
        for group_name in self.lr:
            self.lr[group_name] /= 2
        for param_group in context.optimizer.param_groups:
            param_group['lr'] = self.lr[param_group['name']]


def test_sg_learning_rate_code_works_on_unnamed_optimizer_groups():
    loop = make_loop(lr=0.1)
    loop.fit(num_epochs=2, callbacks=[SGStyleStep(0.1)])        # no KeyError: 'name'
    assert loop.optimizer.param_groups[0]['name'] == 'default'
    assert loop.optimizer.param_groups[0]['lr'] == pytest.approx(0.025)

    # several groups are named as SG's trainer names them
    loop = make_loop(optimizer=lambda m: torch.optim.SGD([{'params': [m.fc.weight]}, {'params': [m.fc.bias]}],
                                                         lr=0.1))
    loop.fit(num_epochs=1, callbacks=[SGStyleStep({'group_0': 0.2, 'group_1': 0.4})])
    assert [(g['name'], g['lr']) for g in loop.optimizer.param_groups] == [('group_0', 0.1), ('group_1', 0.2)]

    # the adapter's own base reads a single rate without the name
    class Halve(LRCallbackBase):
        def __init__(self):
            super().__init__(Phase.TRAIN_EPOCH_END, initial_lr=0.1)

        def is_lr_scheduling_enabled(self, context):
            return True

        def perform_scheduling(self, context):
            self.lr = {name: lr / 2 for name, lr in self.lr.items()}
            self.update_lr(context.optimizer, context.epoch)

    loop = make_loop(optimizer=lambda m: torch.optim.SGD([{'params': [m.fc.weight]}, {'params': [m.fc.bias]}],
                                                         lr=0.1))
    loop.fit(num_epochs=1, callbacks=[Halve()])
    assert [g['lr'] for g in loop.optimizer.param_groups] == [0.05, 0.05]


def test_initial_lr_is_read_from_the_optimizer_or_set_on_it():
    setup = TrainingParamsCallback(params(initial_lr=None, lr_mode='StepLRScheduler', lr_updates=[1],
                                          lr_decay_factor=0.5, max_epochs=2))
    loop = make_loop(lr=0.3)
    loop.fit(num_epochs=2, callbacks=[setup])
    assert setup.training_params.initial_lr == 0.3                 # SG: read from an instantiated optimizer
    assert loop.optimizer.param_groups[0]['lr'] == pytest.approx(0.3 * 0.5)     # decayed once, after epoch 1
    loop = make_loop(lr=0.3)
    loop.fit(num_epochs=1, callbacks=[TrainingParamsCallback(params(max_epochs=1, initial_lr=0.05))])
    assert loop.optimizer.param_groups[0]['lr'] == 0.05            # SG builds its optimizer with initial_lr


# ---- metrics, metric_to_watch and the best epoch -----------------------------------------------------------------

class HandAccuracy(AbstractCallback):
    """A plain loop callback computing the validation accuracy by hand at each epoch end."""

    def __init__(self):
        super().__init__('hand accuracy', execution_order=-1)
        self.accuracies = []

    def on_epoch_end(self):
        loop = self.train_loop_obj
        with torch.no_grad():
            correct = sum(int((loop.model(x).argmax(1) == y).sum()) for x, y in loop.validation_loader)
        self.accuracies.append(correct / sum(len(y) for _, y in loop.validation_loader))


def test_metric_to_watch_drives_the_best_epoch_and_the_context():
    train_metric, valid_metric = MulticlassAccuracy(), MulticlassAccuracy()
    best, hand = Best(), HandAccuracy()
    loop = make_loop(train=3, val=3, lr=0.5)
    loop.fit(num_epochs=6, callbacks=[hand, TrainingParamsCallback(
        {'max_epochs': 6, 'train_metrics_list': [train_metric], 'valid_metrics_list': [valid_metric],
         'metric_to_watch': 'MulticlassAccuracy', 'greater_metric_to_watch_is_better': True}), best])
    # SG's metrics updates fed the metrics: every training batch, every validation batch (3 per epoch)
    assert train_metric.updates == 18 and valid_metric.updates == 18
    expected, top = [], -1.0
    for epoch, accuracy in enumerate(hand.accuracies):
        if accuracy > top:
            expected.append(epoch)
            top = accuracy
    assert [epoch for epoch, _, _ in best.best] == expected
    assert all(name == 'MulticlassAccuracy' for _, name, _ in best.best)
    for epoch, _, metrics in best.best:
        assert float(metrics['MulticlassAccuracy']) == pytest.approx(hand.accuracies[epoch])
        history = loop.train_history
        assert metrics['val_loss'] == dict(zip(history.get_epochs('val_loss'), history['val_loss']))[epoch]


def test_a_loss_to_watch_is_sgs_sample_weighted_validation_loss_lower_is_better():
    best = Best()
    loop = make_loop(train=2, val=2, lr=0.5, eval_loss_weighting='sample')
    loop.fit(num_epochs=4, callbacks=[TrainingParamsCallback(params(max_epochs=4, initial_lr=None)), best])
    val_losses = loop.train_history['val_loss']
    expected = [e for e in range(4) if all(val_losses[e] < val_losses[b] for b in range(e))]
    assert [epoch for epoch, _, _ in best.best] == expected
    for epoch, name, metrics in best.best:
        assert name == 'CrossEntropyLoss' and metrics['CrossEntropyLoss'] == pytest.approx(val_losses[epoch])


def test_a_misspelt_metric_to_watch_names_the_close_ones_and_a_loose_spelling_is_matched(caplog):
    loop = make_loop()
    with pytest.raises(ValueError, match=r"metric_to_watch='MulticlasAcuracy' is none of the validation results; "
                                         r"close names: 'MulticlassAccuracy'"):
        loop.fit(num_epochs=1, callbacks=[TrainingParamsCallback(
            {'max_epochs': 1, 'valid_metrics_list': [MulticlassAccuracy()], 'metric_to_watch': 'MulticlasAcuracy'})])

    best = Best()
    with caplog.at_level(logging.WARNING):
        make_loop().fit(num_epochs=1, callbacks=[TrainingParamsCallback(
            {'max_epochs': 1, 'valid_metrics_list': [MulticlassAccuracy()], 'metric_to_watch': 'multiclass_accuracy'}),
            best])
    assert "no exact match for metric_to_watch='multiclass_accuracy'" in caplog.text
    assert best.best[0][1] == 'MulticlassAccuracy'


def test_torchmetrics_multiclass_accuracy_is_watched_by_its_class_name():
    # the run: a torchmetrics metric in valid_metrics_list, watched by SG's name for it (its class name)
    from torchmetrics.classification import MulticlassAccuracy as TorchmetricsAccuracy
    best, hand = Best(), HandAccuracy()
    loop = make_loop(train=3, val=3, lr=0.5)
    loop.fit(num_epochs=4, callbacks=[hand, TrainingParamsCallback(
        {'max_epochs': 4, 'valid_metrics_list': [TorchmetricsAccuracy(num_classes=5, average='micro')],
         'metric_to_watch': 'MulticlassAccuracy', 'greater_metric_to_watch_is_better': True}), best])
    tops = [epoch for epoch, accuracy in enumerate(hand.accuracies) if accuracy > max(hand.accuracies[:epoch] + [-1])]
    assert [epoch for epoch, _, _ in best.best] == tops
    for epoch, name, metrics in best.best:
        assert name == 'MulticlassAccuracy'
        assert float(metrics['MulticlassAccuracy']) == pytest.approx(hand.accuracies[epoch])


class ItemsNet(Net):
    """A model fed SG's batch format, (inputs, targets, {name: item})."""

    def get_loss(self, batch_data, criterion, device):
        return criterion(self(batch_data[0].to(device)), batch_data[1].to(device))


class SeenIds:
    """A metric whose update takes an item of SG's batch dict by its name, as SG hands every context field."""

    def __init__(self):
        self.ids = []

    def update(self, preds, target, sample_ids):
        self.ids += sample_ids.tolist()

    def compute(self):
        return torch.tensor(float(len(self.ids)))

    def reset(self):
        pass


def test_sg_batch_format_gives_the_dict_and_each_item_as_a_context_field():
    class Seen(Callback):
        def __init__(self):
            self.seen = []

        def on_train_batch_start(self, context):
            self.seen.append((context.additional_batch_items, context.sample_ids.tolist(), context.epoch))

    g = torch.Generator().manual_seed(3)
    data = [(torch.rand(4, 3, 4, 4, generator=g), torch.randint(0, 5, (4,), generator=g),
             {'sample_ids': torch.arange(4 * i, 4 * i + 4), 'epoch': 99}) for i in range(2)]
    torch.manual_seed(0)
    model = ItemsNet()
    loop = TrainLoop(model, data, data, None, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                     progress_bar=False)
    seen, metric = Seen(), SeenIds()
    loop.fit(num_epochs=1, callbacks=[seen, TrainingParamsCallback(
        {'max_epochs': 1, 'valid_metrics_list': [metric], 'metric_to_watch': 'SeenIds'})])
    assert [(items is data[i][2], ids) for i, (items, ids, _) in enumerate(seen.seen)] == \
        [(True, [0, 1, 2, 3]), (True, [4, 5, 6, 7])]
    assert [epoch for _, _, epoch in seen.seen] == [0, 0]      # an item named like a context field does not hide it
    assert metric.ids == list(range(8))                         # SG's metrics update passed the item by its name


# ---- phase_callbacks, max_epochs, batch_accumulate, the params nothing acts on -----------------------------------

def test_phase_callbacks_run_and_max_epochs_must_agree_with_the_fit():
    lrs = LRs()
    setup = TrainingParamsCallback(params(max_epochs=3, phase_callbacks=[lrs]))
    loop = make_loop()
    with pytest.raises(ValueError, match=r'max_epochs=3 but fit\(num_epochs=2\).*call fit\(num_epochs=3\)'):
        loop.fit(num_epochs=2, callbacks=[setup])
    assert setup not in loop.callbacks          # not left half-registered
    loop.fit(num_epochs=3, callbacks=[setup])   # corrected, the same objects run
    assert len(lrs.lrs) == 3 and lrs in loop.callbacks

    taken = TrainingParamsCallback({'metric_to_watch': 'CrossEntropyLoss'})   # no max_epochs: the fit's
    make_loop().fit(num_epochs=2, callbacks=[taken])
    assert taken.training_params.max_epochs == 2

    with pytest.raises(ValueError, match=r'batch_accumulate=2 but the fit accumulates 1.*grad_accumulation=2'):
        make_loop().fit(num_epochs=1, callbacks=[TrainingParamsCallback(params(max_epochs=1, batch_accumulate=2))])
    with pytest.raises(TypeError, match=r"phase_callbacks\[0\] is 'SaveFirstBatchCallback'"):
        make_loop().fit(num_epochs=1, callbacks=[TrainingParamsCallback(
            params(max_epochs=1, phase_callbacks=['SaveFirstBatchCallback']))])


def test_one_warning_lists_the_params_nothing_acts_on(caplog):
    setup = TrainingParamsCallback(params(
        max_epochs=2, optimizer='Adam', optimizer_params={'momentum': 0.9}, ema=True, sg_logger='wandb_sg_logger',
        average_best_models=False, run_validation_freq=1, loss='CrossEntropyLoss', mixed_precision=False))
    loop = make_loop(optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))
    with caplog.at_level(logging.WARNING):
        loop.fit(num_epochs=1 * 2, callbacks=[setup])
        loop.fit(num_epochs=2, callbacks=[setup])       # a second fit: not said again
    warnings = [r.getMessage() for r in caplog.records if 'nothing here acts on' in r.getMessage()]
    assert len(warnings) == 1
    # 'optimizer' asks for Adam: not what the loop has; optimizer_params, loss and mixed_precision agree with it;
    # average_best_models=False and run_validation_freq=1 ask for nothing the loop does not do
    assert warnings[0].endswith("ema (callbacks.weight_averaging), optimizer (the TrainLoop's optimizer is used as "
                                "built), sg_logger (context.sg_logger writes to the TensorBoard callback of the fit)")


def test_training_params_object_and_clip_grad_norm():
    norms = []

    class Norm(Callback):
        execution_order = 1         # after the clipping (SG's trainer's callbacks run at 0.5)

        def on_train_batch_gradient_step_start(self, context):
            norms.append(float(torch.norm(torch.stack([p.grad.norm() for p in context.net.parameters()]))))

    setup = TrainingParamsCallback(TrainingParams(max_epochs=2, clip_grad_norm=0.01, metric_to_watch='CrossEntropyLoss'))
    seen = []
    make_loop(lr=1.0).fit(num_epochs=2, callbacks=[setup, Norm(), Seen(lambda c: c.training_params)(seen)])
    assert norms and all(n <= 0.01 + 1e-6 for n in norms)
    assert seen[0] is setup.training_params


def Seen(read):
    def make(store):
        class Keep(PhaseCallback):
            def __init__(self):
                super().__init__(Phase.TRAIN_EPOCH_END)

            def __call__(self, context):
                store.append(read(context))
        return Keep()
    return make


# ---- context.sg_logger -------------------------------------------------------------------------------------------

class EpochNumber:
    """SG's time unit of an epoch (get_value / get_name)."""

    def __init__(self, value):
        self.value = value

    def get_value(self):
        return self.value

    def get_name(self):
        return 'epoch'


def test_sg_logger_writes_scalars_to_history_and_images_to_the_experiment_folder(tmp_path):
    class Logs(Callback):
        def on_validation_loader_end(self, context):
            context.sg_logger.add_scalar('val/acc', 0.5 + context.epoch, global_step=EpochNumber(context.epoch))
            context.sg_logger.add_scalar('batch/time', 1.0, global_step=7)
            context.sg_logger.add_images('valid/batch', np.full((2, 4, 4, 3), 200, dtype=np.uint8),
                                         global_step=context.epoch, data_format='NHWC')

        def on_training_end(self, context):
            self.logger = context.sg_logger

    torch.manual_seed(0)
    model = Net()
    loop = TrainLoopCheckpoint(model, batches(2, 1), batches(1, 2), None, torch.optim.SGD(model.parameters(), lr=0.1),
                               nn.CrossEntropyLoss(), project_name='p', experiment_name='e',
                               local_model_result_folder_path=str(tmp_path), hyperparams={}, cloud_save_mode='local',
                               progress_bar=False)
    logs = Logs()
    loop.fit(num_epochs=2, callbacks=[logs])
    assert loop.train_history['val/acc'] == [0.5, 1.5] and loop.train_history.get_epochs('val/acc') == [0, 1]
    assert 'batch/time' not in loop.train_history.keys()          # not per epoch: kept by the logger only
    assert logs.logger.scalars['batch/time'] == [(7, 1.0), (7, 1.0)]
    folder = os.path.join(loop.experiment.dir_path, 'sg_logger', 'valid', 'batch')
    assert sorted(os.listdir(folder)) == ['step_0_0.png', 'step_0_1.png', 'step_1_0.png', 'step_1_1.png']
    step, images = logs.logger.images['valid/batch']
    assert step == 1 and images.shape == (2, 4, 4, 3)


# ---- SG's run folder, results and resume, as an SG user's setup meets them -----------------------------------------

class SaveMyBest(Callback):
    """Plain SG code: the best epoch's weights into the run's checkpoint folder."""

    def on_training_start(self, context):
        self.listed = os.listdir(context.ckpt_dir)      # SG's trainer made the folder before training

    def on_validation_end_best_epoch(self, context):
        torch.save(context.net.state_dict(), os.path.join(context.ckpt_dir, 'my_best.pth'))


def test_sgs_run_folder_results_and_checkpoint_ranking(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    valid_metric, saver = MulticlassAccuracy(), SaveMyBest()
    loop = make_loop(train=3, val=3, lr=0.5)
    saving = ModelCheckpoint('proj', 'sg', str(tmp_path), {}, cloud_save_mode='local')
    loop.fit(num_epochs=4, callbacks=[saving, TrainingParamsCallback(
        {'max_epochs': 4, 'train_metrics_list': [MulticlassAccuracy()], 'valid_metrics_list': [valid_metric],
         'metric_to_watch': 'MulticlassAccuracy', 'greater_metric_to_watch_is_better': True,
         'phase_callbacks': [saver]}), saver])
    history = loop.train_history
    # SG's results in the history as SG keys them: validation by name, training under SG's log tag
    assert len(history['MulticlassAccuracy']) == len(history['Train_MulticlassAccuracy']) == 4
    assert 'CrossEntropyLoss' in history.keys()
    assert any('MulticlassAccuracy=' in record.getMessage() for record in caplog.records
               if record.getMessage().startswith('Epoch 3:'))
    folder = os.path.join(loop.experiment.dir_path, 'checkpoint_model')
    assert saver.listed == [] and os.path.exists(os.path.join(folder, 'my_best.pth'))
    # metric_to_watch ranks the loop's checkpoints: the best is SG's best epoch (the highest accuracy, first)
    accuracies = history['MulticlassAccuracy']
    best_epoch = accuracies.index(max(accuracies))
    assert (saving.monitor, saving.mode) == ('MulticlassAccuracy', 'max')
    assert max(saving.scored, key=lambda entry: entry[0])[1] == best_epoch
    # listed both in phase_callbacks and in the fit's callbacks: registered once, with a warning
    assert sum(cb is saver for cb in loop.callbacks) == 1
    assert any('registered once' in r.getMessage() and 'SaveMyBest' in r.getMessage() for r in caplog.records)


def test_fit_given_training_params_names_training_params_callback():
    with pytest.raises(TypeError, match=r"TrainingParamsCallback\(training_params\)"):
        make_loop().fit(num_epochs=1, training_params=params())


def test_a_torch_scheduler_lr_mode_resumes_at_the_uninterrupted_rate(tmp_path):
    def loop_and_params(folder):
        loop = TrainLoopCheckpoint(Net(), batches(2, 1), batches(1, 2), None, None, nn.CrossEntropyLoss(),
                                   'proj', 'steps', str(folder), {}, cloud_save_mode='local', progress_bar=False)
        loop.optimizer = torch.optim.SGD(loop.model.parameters(), lr=0.1)
        return loop, TrainingParamsCallback(params(max_epochs=5, initial_lr=None, lr_mode={
            'StepLR': {'step_size': 2, 'gamma': 0.1, 'phase': Phase.TRAIN_EPOCH_END}}))

    torch.manual_seed(0)
    whole, callback = loop_and_params(tmp_path / 'whole')
    whole.fit(num_epochs=5, callbacks=[callback])

    torch.manual_seed(0)
    first, callback = loop_and_params(tmp_path / 'resumed')
    with pytest.raises(KeyboardInterrupt):
        first.fit(num_epochs=5, callbacks=[callback, StopAfter(3)])
    resumed, callback = loop_and_params(tmp_path / 'resumed')
    resumed.fit(num_epochs=5, callbacks=[callback], resume_from='latest')
    assert resumed.optimizer.param_groups[0]['lr'] == whole.optimizer.param_groups[0]['lr']
    assert all(torch.equal(a, b) for a, b in zip(resumed.model.parameters(), whole.model.parameters()))


class StopAfter(AbstractCallback):
    """The run ends (as a killed one) after ``epochs`` epochs, its checkpoint written."""

    def __init__(self, epochs):
        super().__init__('stop after', execution_order=1000)
        self.epochs = epochs

    def on_epoch_end(self):
        if self.train_loop_obj.epoch + 1 == self.epochs:
            raise KeyboardInterrupt
