"""PyTorchModelPredictor (examples/misc_examples/model_predict_example.py) over a BasicDataset:
model_predict, model_get_loss, evaluate_result_package, evaluate_metric with a duck-typed metric class,
evaluate_metric_list, and evaluate_model saving a local experiment folder.

Usage: python s16_model_predictor.py OUT_DIR
"""
import json
import os
import pickle
import random
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader

from aitoolbox.torchtrain.data.dataset import BasicDataset
from aitoolbox.torchtrain.model import TTModel
from aitoolbox.torchtrain.train_loop import TrainLoop
from aitoolbox.torchtrain.model_predict import PyTorchModelPredictor
from aitoolbox.experiment.result_package.basic_packages import ClassificationResultPackage
from aitoolbox.experiment.core_metrics.classification import AccuracyMetric

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


class ErrorRate:
    """Duck-typed metric: not derived from AbstractBaseMetric, just the interface the predictor calls."""
    def __init__(self, y_true, y_predicted):
        self.metric_name = 'ErrorRate'
        self.metric_result = float((np.array(y_true) != np.array(y_predicted)).mean())

    def get_metric_dict(self):
        return {self.metric_name: self.metric_result}

    def __add__(self, other):
        return {**self.get_metric_dict(), **other.get_metric_dict()}

    def __radd__(self, other):
        return {**other, **self.get_metric_dict()} if isinstance(other, dict) else self.__add__(other)


X, y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.long)
train_ds = BasicDataset([(X[i], y[i]) for i in range(480)])
test_ds = BasicDataset([(X[i], y[i]) for i in range(480, 680)])
assert len(test_ds) == 200 and torch.equal(test_ds[0][0], X[480])
train_loader = DataLoader(train_ds, batch_size=64)
test_loader = DataLoader(test_ds, batch_size=100)

model = DigitsMLP()
TrainLoop(model, train_loader, None, None, optim.Adam(model.parameters(), lr=0.01), nn.NLLLoss()).fit(num_epochs=2)

predictor = PyTorchModelPredictor(model, test_loader)
y_pred, y_true, metadata = predictor.model_predict()
assert y_pred.shape == (200,) and torch.equal(y_true, y[480:680]) and metadata == {}

loss = predictor.model_get_loss(nn.NLLLoss())
with torch.no_grad():
    model.eval()
    expected_loss = float(np.mean([F.nll_loss(model(X[s:s + 100]), y[s:s + 100]).item() for s in (480, 580)]))
    model.train()
assert abs(float(loss) - expected_loss) < 1e-5, (float(loss), expected_loss)

pkg = predictor.evaluate_result_package(ClassificationResultPackage(), return_result_package=True)
accuracy = pkg.get_results()['Accuracy']
results_only = predictor.evaluate_result_package(ClassificationResultPackage(), return_result_package=False)
assert results_only == {'Accuracy': accuracy}

err = predictor.evaluate_metric(ErrorRate, return_metric=False)
assert abs(err['ErrorRate'] - (1 - accuracy)) < 1e-9
acc_metric = predictor.evaluate_metric(AccuracyMetric, return_metric=True)
assert abs(acc_metric.get_metric_dict()['Accuracy'] - accuracy) < 1e-9
both = predictor.evaluate_metric_list([AccuracyMetric, ErrorRate], return_metric_list=False)
assert set(both) == {'Accuracy', 'ErrorRate'}, both

predictor.evaluate_model(ClassificationResultPackage(),
                         project_name='model_predictor_example', experiment_name='DigitsPredictor',
                         local_model_result_folder_path=OUT_DIR, cloud_save_mode=None)
proj = os.path.join(OUT_DIR, 'model_predictor_example')
(exp,) = os.listdir(proj)
results_dir = os.path.join(proj, exp, 'results')
(res_file,) = [f for f in os.listdir(results_dir) if f.endswith('.p')]
with open(os.path.join(results_dir, res_file), 'rb') as f:
    saved = pickle.load(f)
assert abs(saved['results']['Accuracy'] - accuracy) < 1e-9

print(json.dumps({
    'accuracy': round(float(accuracy), 5),
    'error_rate': round(err['ErrorRate'], 5),
    'loss': round(float(loss), 5),
    'saved_keys': sorted(saved.keys()),
}, sort_keys=True))
