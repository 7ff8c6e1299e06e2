"""A TrainLoop created without an optimizer (None) whose optimizer is created by a callback when the callback is
registered; a scheduler callback listed after it then wraps that optimizer.

Usage: python s09_optimizer_set_by_callback.py OUT_DIR
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

from aitoolbox.torchtrain.train_loop import TrainLoop
from aitoolbox.torchtrain.model import TTModel
from aitoolbox.torchtrain.callbacks.abstract import AbstractCallback
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


class OptimizerFromCallback(AbstractCallback):
    def __init__(self, lr):
        super().__init__('Optimizer created at registration')
        self.lr = lr

    def on_train_loop_registration(self):
        self.train_loop_obj.optimizer = optim.SGD(self.train_loop_obj.model.parameters(), lr=self.lr, momentum=0.9)


class LRRecorder(AbstractCallback):
    def __init__(self):
        super().__init__('lr recorder', execution_order=50)
        self.lrs = []

    def on_epoch_end(self):
        # runs after the scheduler (execution_order 0) has stepped
        self.lrs.append(self.train_loop_obj.optimizer.param_groups[0]['lr'])


X, y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.long)
train_loader = DataLoader(TensorDataset(X[:480], y[:480]), batch_size=64)
val_loader = DataLoader(TensorDataset(X[480:640], y[480:640]), batch_size=64)

model = DigitsMLP()
tl = TrainLoop(model, train_loader, val_loader, None, None, nn.NLLLoss())
assert tl.optimizer is None

recorder = LRRecorder()
tl.fit(num_epochs=3, callbacks=[OptimizerFromCallback(lr=0.1),
                                StepLRScheduler(step_size=1, gamma=0.5),
                                recorder])

assert isinstance(tl.optimizer, optim.SGD)
assert [round(lr, 6) for lr in recorder.lrs] == [0.05, 0.025, 0.0125], recorder.lrs
assert len(tl.get_schedulers()) == 1
hist = tl.train_history
assert hist['loss'][-1] < hist['loss'][0]

print(json.dumps({
    'lrs': [round(lr, 6) for lr in recorder.lrs],
    'loss': [round(float(v), 5) for v in hist['loss']],
    'val_loss': [round(float(v), 5) for v in hist['val_loss']],
}, sort_keys=True))
