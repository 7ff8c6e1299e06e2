"""Learning-rate schedulers from aitoolbox.torchtrain.schedulers.warmup and .basic given to fit() as callbacks
(docs/source/torchtrain/schedulers.rst); the LR seen after each step is checked against the formulas.

Usage: python s10_schedulers.py OUT_DIR
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

from aitoolbox.torchtrain.train_loop import *
from aitoolbox.torchtrain.model import TTModel
from aitoolbox.torchtrain.callbacks.abstract import AbstractCallback
from aitoolbox.torchtrain.schedulers.warmup import LinearWithWarmupScheduler
from aitoolbox.torchtrain.schedulers.basic import LambdaLRScheduler, ReduceLROnPlateauMetricScheduler

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


class LRTracker(AbstractCallback):
    def __init__(self, per_batch):
        super().__init__('lr tracker', execution_order=10)
        self.per_batch = per_batch
        self.lrs = []

    def on_batch_end(self):
        if self.per_batch:
            self.lrs.append(self.train_loop_obj.optimizer.param_groups[0]['lr'])

    def on_epoch_end(self):
        if not self.per_batch:
            self.lrs.append(self.train_loop_obj.optimizer.param_groups[0]['lr'])


class ConstantMetric(AbstractCallback):
    """Puts a metric that never improves into the history before the plateau scheduler reads it."""
    def __init__(self):
        super().__init__('constant metric', execution_order=-1)

    def on_epoch_end(self):
        self.train_loop_obj.insert_metric_result_into_history('val_Fake', 0.5)


X, y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.long)
train_loader = DataLoader(TensorDataset(X[:512], y[:512]), batch_size=64)  # 8 batches
val_loader = DataLoader(TensorDataset(X[512:640], y[512:640]), batch_size=64)

# 1) Linear warmup then linear decay, stepped after every batch
num_epochs = 2
num_training_steps = len(train_loader) * num_epochs
model = DigitsMLP()
optimizer = optim.AdamW(model.parameters(), lr=0.01)
tracker = LRTracker(per_batch=True)
warmup = LinearWithWarmupScheduler(num_warmup_steps=4, num_training_steps=num_training_steps)
tl = TrainLoop(model, train_loader, val_loader, None, optimizer, nn.NLLLoss())
tl.fit(num_epochs=num_epochs, callbacks=[warmup, tracker])
assert tl.get_num_training_steps() == num_training_steps


def linear_warmup(step, warm=4, total=num_training_steps):
    if step < warm:
        return step / max(1, warm)
    return max(0.0, (total - step) / max(1, total - warm))


expected = [0.01 * linear_warmup(k) for k in range(1, num_training_steps + 1)]
assert np.allclose(tracker.lrs, expected), (tracker.lrs, expected)
assert tl.get_schedulers() == [warmup]
sched_state = warmup.state_dict()
assert sched_state['last_epoch'] == num_training_steps

# 2) Epoch-level LambdaLR
model2 = DigitsMLP()
optimizer2 = optim.SGD(model2.parameters(), lr=0.1)
tracker2 = LRTracker(per_batch=False)
TrainLoop(model2, train_loader, val_loader, None, optimizer2, nn.NLLLoss()).fit(
    num_epochs=3, callbacks=[LambdaLRScheduler(lambda epoch: 0.5 ** epoch), tracker2])
assert np.allclose(tracker2.lrs, [0.05, 0.025, 0.0125]), tracker2.lrs

# 3) Plateau on a metric from the training history
model3 = DigitsMLP()
optimizer3 = optim.SGD(model3.parameters(), lr=0.01)
tracker3 = LRTracker(per_batch=False)
TrainLoop(model3, train_loader, val_loader, None, optimizer3, nn.NLLLoss()).fit(
    num_epochs=3, callbacks=[ConstantMetric(),
                             ReduceLROnPlateauMetricScheduler('val_Fake', mode='max', patience=0, factor=0.1),
                             tracker3])
assert np.allclose(tracker3.lrs, [0.01, 0.001, 0.0001]), tracker3.lrs

print(json.dumps({
    'warmup_lrs': [round(v, 8) for v in tracker.lrs],
    'lambda_lrs': [round(v, 8) for v in tracker2.lrs],
    'plateau_lrs': [round(v, 8) for v in tracker3.lrs],
    'warmup_final_loss': round(float(tl.train_history['loss'][-1]), 5),
}, sort_keys=True))
