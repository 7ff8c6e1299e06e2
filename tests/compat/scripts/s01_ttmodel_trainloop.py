"""TTModel + plain TrainLoop with val/test loaders, performance evaluation and print report.

Written the way an AIToolbox 1.8.0 user writes it (docs/source/torchtrain/train_loop.rst, mlp_batchnorm.py).
Usage: python s01_ttmodel_trainloop.py OUT_DIR
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
from aitoolbox.torchtrain.callbacks.performance_eval import ModelPerformanceEvaluation, ModelPerformancePrintReport
from aitoolbox.experiment.result_package.basic_packages import ClassificationResultPackage

OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get('AITB_COMPAT_OUT', 'compat_out')
random.seed(0)
np.random.seed(0)
torch.manual_seed(0)


class DigitsMLP(TTModel):
    def __init__(self, hidden=32):
        super(DigitsMLP, self).__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)

    def get_loss(self, batch_data, criterion, device):
        data, target = batch_data
        data, target = data.to(device), target.to(device)
        output = self(data)
        return criterion(output, target)

    def get_predictions(self, batch_data, device):
        data, y_test = batch_data
        output = self(data.to(device))
        y_pred = output.argmax(dim=1, keepdim=False)
        return y_pred.cpu(), y_test, {}


X, y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.long)
train_loader = DataLoader(TensorDataset(X[:480], y[:480]), batch_size=64)
val_loader = DataLoader(TensorDataset(X[480:640], y[480:640]), batch_size=64)
test_loader = DataLoader(TensorDataset(X[640:800], y[640:800]), batch_size=64)

hyperparams = {'lr': 0.01, 'betas': (0.9, 0.999)}
model = DigitsMLP()
optimizer = optim.Adam(model.parameters(), lr=hyperparams['lr'], betas=hyperparams['betas'])
criterion = nn.NLLLoss()

callbacks = [ModelPerformanceEvaluation(ClassificationResultPackage(), hyperparams,
                                        on_train_data=True, on_val_data=True),
             ModelPerformancePrintReport(['train_Accuracy', 'val_Accuracy'], strict_metric_reporting=True)]

tl = TrainLoop(model,
               train_loader, val_loader, test_loader,
               optimizer, criterion)
trained_model = tl.fit(num_epochs=3, callbacks=callbacks)

hist = tl.train_history
assert trained_model is model
assert len(hist['loss']) == 3 and len(hist['val_loss']) == 3 and len(hist['accumulated_loss']) == 3
assert len(hist['train_Accuracy']) == 3 and len(hist['val_Accuracy']) == 3
assert len(hist['train_end_test_loss']) == 1
assert len(hist['train_end_val_Accuracy']) == 1
assert hist['loss'][-1] < hist['loss'][0], hist['loss']
assert hist['val_Accuracy'][-1] > 0.5, hist['val_Accuracy']
assert tl.epoch == 2

print(json.dumps({
    'history_keys': sorted(hist.keys()),
    'loss': [round(float(v), 5) for v in hist['loss']],
    'val_Accuracy': [round(float(v), 5) for v in hist['val_Accuracy']],
    'test_loss': round(float(hist['train_end_test_loss'][-1]), 5),
    'epoch': tl.epoch,
}, sort_keys=True))
