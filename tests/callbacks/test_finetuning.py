"""BackboneFinetuning and StageSwitch: freeze / unfreeze, the backbone group's learning rate, equality with a
hand-written loop, schedulers following the new group, and exact resume after the switch."""
import os

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler

from aitoolbox_like import StopTraining, TrainLoop, TTBasicModel
from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.callbacks.finetuning import BackboneFinetuning, StageSwitch, extend_scheduler_for_new_group
from aitoolbox_like.callbacks.gradient import GradValueClip
from aitoolbox_like.callbacks.train_schedule import (CosineScheduler, GeneralLRSchedulerCallback, LambdaLRScheduler,
                                                     ReduceLROnPlateauScheduler, StepLRScheduler)
from aitoolbox_like.tracking import TrainLoopCheckpoint
from helpers import Interrupt, loaders, state_equal

LR, FACTOR = 0.01, 0.1


class Net(TTBasicModel):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 16), nn.ReLU())
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.backbone(x))


def make(seed=0):
    torch.manual_seed(seed)
    model = Net()
    return model, torch.optim.Adam(model.head.parameters(), lr=LR)


def weights(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


class Snapshots(AbstractCallback):
    """The backbone's and head's weights after every epoch."""

    def __init__(self):
        super().__init__('snapshots')
        self.backbone, self.head = [], []

    def on_epoch_end(self):
        model = self.train_loop_obj.model
        self.backbone.append(weights(model.backbone))
        self.head.append(weights(model.head))


def fit(num_epochs=4, at=2, callbacks=(), seed=0, **kwargs):
    model, optimizer = make(seed)
    torch.manual_seed(7)
    train, val, _ = loaders()            # 7 batches per epoch
    loop = TrainLoop(model, train, val, None, optimizer, nn.CrossEntropyLoss(), progress_bar=False)
    finetuning = BackboneFinetuning(unfreeze_backbone_at_epoch=at, backbone='backbone', backbone_lr_factor=FACTOR,
                                    **kwargs)
    loop.fit(num_epochs=num_epochs, callbacks=[finetuning, *callbacks])
    return loop, finetuning


def test_backbone_frozen_until_the_epoch_then_trained_with_the_factor_lr():
    model, _ = make()
    initial = weights(model.backbone)
    snapshots = Snapshots()
    loop, finetuning = fit(callbacks=[snapshots])
    assert state_equal(snapshots.backbone[0], initial) and state_equal(snapshots.backbone[1], initial)
    assert not state_equal(snapshots.backbone[2], initial)
    assert not state_equal(snapshots.backbone[3], snapshots.backbone[2])
    assert not state_equal(snapshots.head[1], snapshots.head[0])
    groups = loop.optimizer.param_groups
    assert len(groups) == 2 and groups[1]['lr'] == LR * FACTOR
    assert [id(p) for p in groups[1]['params']] == [id(p) for p in loop.model.backbone.parameters()]
    assert all(p.requires_grad for p in loop.model.parameters())
    assert finetuning.state_dict() == {'unfrozen': True}


def hand_written(num_epochs, at, scheduler_fn=None):
    """Freeze, train the head, unfreeze at ``at`` with a new param group at FACTOR x the head's lr."""
    model, optimizer = make()
    torch.manual_seed(7)
    train, _, _ = loaders()
    criterion = nn.CrossEntropyLoss()
    scheduler = scheduler_fn(optimizer) if scheduler_fn else None
    for p in model.backbone.parameters():
        p.requires_grad_(False)
    model.train()
    for epoch in range(num_epochs):
        if epoch == at:
            for p in model.backbone.parameters():
                p.requires_grad_(True)
            optimizer.add_param_group({'params': list(model.backbone.parameters()),
                                       'lr': optimizer.param_groups[0]['lr'] * FACTOR})
            if scheduler is not None:
                optimizer.param_groups[1]['initial_lr'] = optimizer.param_groups[0]['initial_lr'] * FACTOR
                scheduler.base_lrs.append(scheduler.base_lrs[0] * FACTOR)
                scheduler._last_lr.append(optimizer.param_groups[1]['lr'])
        for x, y in train:
            criterion(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()
    return model, optimizer


def test_equals_a_hand_written_freeze_unfreeze_loop_to_the_bit():
    reference, reference_optimizer = hand_written(num_epochs=4, at=2)
    loop, _ = fit(num_epochs=4, at=2)
    assert state_equal(weights(loop.model), weights(reference))
    ours, theirs = loop.optimizer.state_dict(), reference_optimizer.state_dict()
    assert ours['param_groups'] == theirs['param_groups']
    assert all(state_equal(ours['state'][i], theirs['state'][i]) for i in theirs['state'])


def test_equals_a_hand_written_loop_with_a_step_schedule_to_the_bit():
    reference, reference_optimizer = hand_written(
        num_epochs=4, at=1, scheduler_fn=lambda o: lr_scheduler.StepLR(o, step_size=1, gamma=0.5))
    loop, _ = fit(num_epochs=4, at=1, callbacks=[StepLRScheduler(step_size=1, gamma=0.5)])
    assert state_equal(weights(loop.model), weights(reference))
    assert [g['lr'] for g in loop.optimizer.param_groups] == [g['lr'] for g in reference_optimizer.param_groups]


@pytest.mark.parametrize('make_scheduler', [
    lambda: StepLRScheduler(step_size=1, gamma=0.5),
    lambda: GeneralLRSchedulerCallback(lr_scheduler.ExponentialLR, gamma=0.7),
    lambda: LambdaLRScheduler(lambda epoch: 1.0 / (1 + epoch)),
    lambda: CosineScheduler(min_lr_factor=0.1),          # a LambdaLR stepped after every update
    lambda: GeneralLRSchedulerCallback(lr_scheduler.CosineAnnealingLR, T_max=4),
    lambda: ReduceLROnPlateauScheduler(factor=0.5, patience=0, threshold=10.0),   # reduces every epoch
], ids=['StepLR', 'ExponentialLR', 'LambdaLR', 'Cosine-per-step', 'CosineAnnealingLR', 'ReduceLROnPlateau'])
def test_a_scheduler_keeps_stepping_both_groups(make_scheduler):
    scheduler_callback = make_scheduler()
    lrs = []

    class LRs(AbstractCallback):
        def __init__(self):
            super().__init__('lrs', execution_order=50)

        def on_epoch_end(self):
            lrs.append([g['lr'] for g in self.train_loop_obj.optimizer.param_groups])

    loop, _ = fit(num_epochs=4, at=1, callbacks=[scheduler_callback, LRs()])
    assert [len(epoch) for epoch in lrs] == [1, 2, 2, 2]
    for head, backbone in lrs[1:]:
        assert backbone == pytest.approx(head * FACTOR, rel=1e-9)
    assert lrs[3][0] < lrs[1][0]                      # the schedule went on for the head ...
    assert lrs[3][1] < lrs[1][1]                      # ... and for the backbone
    last_lr = getattr(scheduler_callback.scheduler, '_last_lr', None)
    assert last_lr is None or len(last_lr) == 2
    # LRMonitor writes both groups from the unfreeze epoch on.
    history = loop.train_history
    assert history.get_epochs('lr') == [0]
    assert history.get_epochs('lr_0_1') == [1, 2, 3]


def test_gradient_callbacks_see_the_backbone_after_the_unfreeze():
    grads = []

    class Probe(AbstractCallback):
        def __init__(self):
            super().__init__('probe', execution_order=1)       # after the clipping (order 0)

        def on_after_gradient_update(self, optimizer_idx):
            backbone = list(self.train_loop_obj.model.backbone.parameters())
            grads.append(None if backbone[0].grad is None else float(backbone[0].grad.abs().max()))

    fit(num_epochs=2, at=1, callbacks=[GradValueClip(1e-4), Probe()])
    assert grads[:7] == [None] * 7
    assert all(g is not None and 0 < g <= 1e-4 for g in grads[7:])


def test_load_state_dict_is_idempotent_and_refuses_an_optimizer_holding_the_backbone():
    model, optimizer = make()
    loop = TrainLoop(model, *loaders(), optimizer, nn.CrossEntropyLoss(), progress_bar=False)
    finetuning = BackboneFinetuning(unfreeze_backbone_at_epoch=3, backbone=lambda m: m.backbone)
    loop.callbacks_handler.register_callbacks([finetuning])
    finetuning.load_state_dict({'unfrozen': True})
    finetuning.load_state_dict({'unfrozen': True})
    assert len(optimizer.param_groups) == 2

    model, _ = make()
    everything = torch.optim.Adam(model.parameters(), lr=LR)
    loop = TrainLoop(model, *loaders(), everything, nn.CrossEntropyLoss(), progress_bar=False)
    with pytest.raises(ValueError, match='head only'):
        loop.fit(num_epochs=1, callbacks=[BackboneFinetuning(1)])
    with pytest.raises(AttributeError, match='no attribute'):
        TrainLoop(model, *loaders(), torch.optim.Adam(model.head.parameters()), nn.CrossEntropyLoss(),
                  progress_bar=False).fit(num_epochs=1, callbacks=[BackboneFinetuning(1, backbone='encoder')])


def test_train_bn_false_keeps_batch_norm_frozen():
    class BNNet(Net):
        def __init__(self):
            super().__init__()
            self.backbone = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU())

    torch.manual_seed(0)
    model = BNNet()
    loop = TrainLoop(model, *loaders(), torch.optim.SGD(model.head.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                     progress_bar=False)
    loop.fit(num_epochs=2, callbacks=[BackboneFinetuning(1, train_bn=False)])
    assert len(loop.optimizer.param_groups[1]['params']) == 2          # the Linear's weight and bias
    assert not any(p.requires_grad for p in model.backbone[1].parameters())


def test_extend_scheduler_is_idempotent_and_skips_other_optimizers():
    params = [nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))]
    optimizer = torch.optim.SGD([params[0]], lr=1.0)
    other = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    other_scheduler = lr_scheduler.LambdaLR(other, lambda step: 0.5)
    optimizer.add_param_group({'params': [params[1]], 'lr': 0.05})
    for _ in range(2):
        extend_scheduler_for_new_group(scheduler, optimizer, lr_factor=0.1)
        extend_scheduler_for_new_group(other_scheduler, optimizer, lr_factor=0.1)
    assert scheduler.base_lrs == [1.0, 0.1] and len(scheduler.lr_lambdas) == 2
    assert other_scheduler.base_lrs == [1.0]
    optimizer.step()
    scheduler.step()
    assert [g['lr'] for g in optimizer.param_groups] == [0.5, 0.05]


# ---------------------------------------------------------------------------------------------------------- resume


def checkpoint_loop(path, seed=0, iteration_save_freq=0):
    model, optimizer = make(seed)
    torch.manual_seed(7)
    train, val, _ = loaders()
    return TrainLoopCheckpoint(model, train, val, None, optimizer, nn.CrossEntropyLoss(), 'proj', 'run', str(path),
                               {'lr': LR}, cloud_save_mode='local', iteration_save_freq=iteration_save_freq,
                               progress_bar=False)


def callbacks():
    return [BackboneFinetuning(unfreeze_backbone_at_epoch=1, backbone_lr_factor=FACTOR),
            StepLRScheduler(step_size=1, gamma=0.5)]


@pytest.mark.parametrize('stop_before_batch, latest_suffix', [
    (14, '_E1.pth'),                 # stopped between epochs, after the unfreeze epoch
    (10, '_E1_ITER9.pth'),           # inside the unfreeze epoch
    (17, '_E2_ITER15.pth'),          # inside a later epoch
], ids=['after-epoch', 'inside-unfreeze-epoch', 'inside-later-epoch'])
def test_resume_after_the_unfreeze_equals_the_uninterrupted_run(tmp_path, stop_before_batch, latest_suffix):
    reference = checkpoint_loop(tmp_path / 'reference')
    reference.fit(num_epochs=4, callbacks=callbacks())

    first = checkpoint_loop(tmp_path / 'run', iteration_save_freq=3)
    first.fit(num_epochs=4, callbacks=callbacks() + [Interrupt(stop_before_batch)])
    with open(os.path.join(first.experiment.work_dir, 'latest_checkpoint.txt')) as f:
        assert f.read().endswith(latest_suffix)

    resumed = checkpoint_loop(tmp_path / 'run', seed=3, iteration_save_freq=3)
    torch.manual_seed(99)
    resumed.fit(num_epochs=4, callbacks=callbacks(), resume_from='latest')

    assert state_equal(weights(resumed.model), weights(reference.model))
    ours, theirs = resumed.optimizer.state_dict(), reference.optimizer.state_dict()
    assert ours['param_groups'] == theirs['param_groups']
    assert all(state_equal(ours['state'][i], theirs['state'][i]) for i in theirs['state'])
    assert resumed.train_history.train_history == reference.train_history.train_history


# ---------------------------------------------------------------------------------------------------------- StageSwitch


def test_stage_switch_runs_once_at_its_epoch_and_again_on_resume(tmp_path):
    calls = []

    def lower_lr_and_unfreeze(loop):
        calls.append(loop.epoch)
        for group in loop.optimizer.param_groups:
            group['lr'] = LR / 10
        for p in loop.model.backbone.parameters():
            p.requires_grad_(True)
        if len(loop.optimizer.param_groups) == 1:
            loop.optimizer.add_param_group({'params': list(loop.model.backbone.parameters()), 'lr': LR / 100})

    def freeze(loop):
        for p in loop.model.backbone.parameters():
            p.requires_grad_(False)

    def stages():
        return [StageSwitch(0, freeze, name='freeze'), StageSwitch(2, lower_lr_and_unfreeze, name='finetune')]

    reference = checkpoint_loop(tmp_path / 'reference')
    reference.fit(num_epochs=4, callbacks=stages())
    assert calls == [2]
    assert [g['lr'] for g in reference.optimizer.param_groups] == [LR / 10, LR / 100]

    first = checkpoint_loop(tmp_path / 'run')
    first.fit(num_epochs=4, callbacks=stages() + [Interrupt(7 * 3)])
    assert calls == [2, 2]
    resumed = checkpoint_loop(tmp_path / 'run', seed=4)
    resumed.fit(num_epochs=4, callbacks=stages(), resume_from='latest')
    assert len(calls) == 3          # re-applied when the checkpoint (taken after the switch) was loaded
    assert state_equal(weights(resumed.model), weights(reference.model))
    assert resumed.train_history.train_history == reference.train_history.train_history


def test_stage_switch_arguments_are_checked():
    with pytest.raises(ValueError, match='epoch'):
        StageSwitch(-1, lambda loop: None)
    with pytest.raises(TypeError, match='fn'):
        StageSwitch(1, 'not callable')
    with pytest.raises(ValueError, match='backbone_lr_factor'):
        BackboneFinetuning(1, backbone_lr_factor=-1)
