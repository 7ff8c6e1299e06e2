"""Duck-typed losses and metrics: a criterion that is not an nn.Module (AIToolbox 1.8.0 only needs it to be
callable and to have .to(device)), a loop with criterion=None whose TTModel calls a plain loss function itself,
and a result package built on a user metric (AbstractBaseMetric subclass from docs/source/experiment/metrics.rst).

Usage: python s21_duck_typed_criterion.py OUT_DIR
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
from sklearn.metrics import accuracy_score
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox.torchtrain.train_loop import *
from aitoolbox.torchtrain.model import TTModel
from aitoolbox.torchtrain.callbacks.performance_eval import ModelPerformanceEvaluation
from aitoolbox.experiment.core_metrics.abstract_metric import AbstractBaseMetric
from aitoolbox.experiment.result_package.abstract_result_packages import AbstractResultPackage

OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get('AITB_COMPAT_OUT', 'compat_out')
random.seed(0)
np.random.seed(0)
torch.manual_seed(0)


def smoothed_nll(log_probs, target, eps=0.1):
    """Plain-function loss: label-smoothed negative log likelihood."""
    nll = F.nll_loss(log_probs, target)
    return (1 - eps) * nll + eps * (-log_probs.mean())


class FunctionCriterion:
    """Wraps a plain loss function into the duck type the TrainLoop expects from a criterion."""
    def __init__(self, fn, **kwargs):
        self.fn = fn
        self.kwargs = kwargs
        self.calls = 0
        self.devices = []

    def __call__(self, output, target):
        self.calls += 1
        return self.fn(output, target, **self.kwargs)

    def to(self, device):
        self.devices.append(str(device))
        return self


class DigitsMLP(TTModel):
    def __init__(self, own_loss=None):
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)
        self.own_loss = own_loss

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)

    def get_loss(self, batch_data, criterion, device):
        data, target = batch_data
        output = self(data.to(device))
        if criterion is None:
            return self.own_loss(output, target.to(device))
        return criterion(output, target.to(device))

    def get_predictions(self, batch_data, device):
        data, y_test = batch_data
        return self(data.to(device)).argmax(dim=1).cpu(), y_test, {}


class ExampleAccuracyMetric(AbstractBaseMetric):
    def __init__(self, y_true, y_predicted, positive_class_thresh=None):
        self.positive_class_thresh = positive_class_thresh
        AbstractBaseMetric.__init__(self, y_true, y_predicted, metric_name='MyAccuracy')

    def calculate_metric(self):
        if self.positive_class_thresh is not None:
            self.y_predicted = self.y_predicted >= self.positive_class_thresh
        return accuracy_score(self.y_true, self.y_predicted)


class EvenOddResultPackage(AbstractResultPackage):
    def __init__(self):
        AbstractResultPackage.__init__(self, pkg_name='EvenOdd')

    def prepare_results_dict(self):
        parity = float(np.mean((self.y_true % 2) == (self.y_predicted % 2)))
        return {**ExampleAccuracyMetric(self.y_true, self.y_predicted).get_metric_dict(), 'ParityAcc': parity}


X, y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.long)
train_loader = DataLoader(TensorDataset(X[:480], y[:480]), batch_size=64)
val_loader = DataLoader(TensorDataset(X[480:640], y[480:640]), batch_size=64)

# 1) duck-typed criterion object
criterion = FunctionCriterion(smoothed_nll, eps=0.1)
model = DigitsMLP()
tl = TrainLoop(model, train_loader, val_loader, None, optim.Adam(model.parameters(), lr=0.01), criterion)
tl.fit(num_epochs=2, callbacks=[ModelPerformanceEvaluation(EvenOddResultPackage(), {'eps': 0.1},
                                                           on_train_data=False, on_val_data=True)])
assert criterion.calls >= 2 * 8, criterion.calls
assert set(criterion.devices) <= {'cpu'}
hist = tl.train_history
assert len(hist['val_MyAccuracy']) == 2 and len(hist['val_ParityAcc']) == 2
assert hist['val_ParityAcc'][-1] >= hist['val_MyAccuracy'][-1]

# 2) criterion=None, the model applies a plain function itself
model2 = DigitsMLP(own_loss=smoothed_nll)
tl2 = TrainLoop(model2, train_loader, val_loader, None, optim.Adam(model2.parameters(), lr=0.01), None)
tl2.fit(num_epochs=2)
assert tl2.criterion is None
assert tl2.train_history['loss'][-1] < tl2.train_history['loss'][0]

print(json.dumps({
    'history_keys': sorted(hist.keys()),
    'val_MyAccuracy': [round(float(v), 5) for v in hist['val_MyAccuracy']],
    'val_ParityAcc': [round(float(v), 5) for v in hist['val_ParityAcc']],
    'none_criterion_loss': [round(float(v), 5) for v in tl2.train_history['loss']],
}, sort_keys=True))
