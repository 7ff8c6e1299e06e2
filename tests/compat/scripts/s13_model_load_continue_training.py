"""Resume training from a saved checkpoint with ModelLoadContinueTraining: first a TrainLoopCheckpoint run with
a scheduler, then a fresh model/optimizer/scheduler continues from the epoch-1 checkpoint of that experiment.

Usage: python s13_model_load_continue_training.py OUT_DIR
"""
import json
import os
import random
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox.torchtrain.train_loop import TrainLoop, TrainLoopCheckpoint
from aitoolbox.torchtrain.model import TTModel
from aitoolbox.torchtrain.callbacks.abstract import AbstractCallback
from aitoolbox.torchtrain.callbacks.model_load import ModelLoadContinueTraining
from aitoolbox.torchtrain.schedulers.basic import StepLRScheduler

OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get('AITB_COMPAT_OUT', 'compat_out')
random.seed(0)
np.random.seed(0)
torch.manual_seed(0)


class DigitsMLP(TTModel):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)

    def get_loss(self, batch_data, criterion, device):
        data, target = batch_data
        return criterion(self(data.to(device)), target.to(device))

    def get_predictions(self, batch_data, device):
        data, y_test = batch_data
        return self(data.to(device)).argmax(dim=1).cpu(), y_test, {}


class StartSnapshot(AbstractCallback):
    """Records the state the loop starts training from."""
    def __init__(self):
        super().__init__('start snapshot')
        self.epochs_seen = []

    def on_train_begin(self):
        self.start_epoch = self.train_loop_obj.epoch
        self.start_weights = {k: v.detach().clone() for k, v in self.train_loop_obj.model.state_dict().items()}
        self.start_lr = self.train_loop_obj.optimizer.param_groups[0]['lr']

    def on_epoch_begin(self):
        self.epochs_seen.append(self.train_loop_obj.epoch)


X, y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.long)
train_loader = DataLoader(TensorDataset(X[:480], y[:480]), batch_size=64)
val_loader = DataLoader(TensorDataset(X[480:640], y[480:640]), batch_size=64)

PROJECT, EXPERIMENT = 'resume_project', 'resume_exp'

model = DigitsMLP()
optimizer = optim.Adam(model.parameters(), lr=0.01)
tl = TrainLoopCheckpoint(model, train_loader, val_loader, None, optimizer, nn.NLLLoss(),
                         project_name=PROJECT, experiment_name=EXPERIMENT,
                         local_model_result_folder_path=OUT_DIR, hyperparams={'lr': 0.01},
                         cloud_save_mode=None)
tl.fit(num_epochs=2, callbacks=[StepLRScheduler(step_size=1, gamma=0.5)])
saved_ts = tl.experiment_timestamp
first_run_weights = {k: v.detach().clone() for k, v in model.state_dict().items()}

# ---- continue in a new loop, as in a new process: fresh objects, load the E1 checkpoint ----
model2 = DigitsMLP()
optimizer2 = optim.Adam(model2.parameters(), lr=0.01)
snapshot = StartSnapshot()
tl2 = TrainLoop(model2, train_loader, val_loader, None, optimizer2, nn.NLLLoss())
tl2.fit(num_epochs=4, callbacks=[
    ModelLoadContinueTraining(saved_experiment_timestamp=saved_ts, saved_model_dir='checkpoint_model', epoch_num=1,
                              project_name=PROJECT, experiment_name=EXPERIMENT,
                              local_model_result_folder_path=OUT_DIR, cloud_save_mode='local'),
    StepLRScheduler(step_size=1, gamma=0.5),
    snapshot,
])

assert snapshot.start_epoch == 2, snapshot.start_epoch
assert snapshot.epochs_seen == [2, 3], snapshot.epochs_seen
for k, v in first_run_weights.items():
    assert torch.equal(snapshot.start_weights[k], v), k
# scheduler state restored: 0.01 * 0.5 * 0.5
assert abs(snapshot.start_lr - 0.0025) < 1e-12, snapshot.start_lr
assert abs(optimizer2.param_groups[0]['lr'] - 0.000625) < 1e-12
# AIToolbox's resume restores weights, optimizer, schedulers and the epoch, so the new loop's history holds the
# 2 resumed epochs.
assert len(tl2.train_history['loss']) == 2, tl2.train_history['loss']

# the same checkpoint can also be resumed inside a TrainLoopCheckpoint of the same experiment
model3 = DigitsMLP()
tl3 = TrainLoopCheckpoint(model3, train_loader, val_loader, None, optim.Adam(model3.parameters(), lr=0.01),
                          nn.NLLLoss(), project_name=PROJECT, experiment_name=EXPERIMENT + '_cont',
                          local_model_result_folder_path=OUT_DIR, hyperparams={'lr': 0.01}, cloud_save_mode=None)
tl3.fit(num_epochs=3, callbacks=[
    ModelLoadContinueTraining(saved_ts, epoch_num=0, experiment_name=EXPERIMENT, ignore_saved_schedulers=True)])
ckpts3 = sorted(os.listdir(os.path.join(OUT_DIR, PROJECT, f'{EXPERIMENT}_cont_{tl3.experiment_timestamp}',
                                        'checkpoint_model')))
assert [c.rsplit('_', 1)[-1] for c in ckpts3] == ['E1.pth', 'E2.pth'], ckpts3

print(json.dumps({
    'start_epoch': snapshot.start_epoch,
    'epochs_seen': snapshot.epochs_seen,
    'start_lr': snapshot.start_lr,
    'resumed_loss': [round(float(v), 5) for v in tl2.train_history['loss']],
    'cont_checkpoints': [c.rsplit('_', 1)[-1] for c in ckpts3],
}, sort_keys=True))
