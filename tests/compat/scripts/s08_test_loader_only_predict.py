"""A loop with only a test loader used to predict (TrainLoop(model, None, None, test_loader, None, None)),
with the prediction collate functions from aitoolbox.torchtrain.train_loop.components.pred_collate_fns and a
user-written transform; prediction metadata batches are combined by the loop.

Usage: python s08_test_loader_only_predict.py OUT_DIR
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
from aitoolbox.torchtrain.train_loop.components.pred_collate_fns import (append_predictions, torch_cat_transf,
                                                                          append_concat_predictions)
from aitoolbox.experiment.result_package.basic_packages import ClassificationResultPackage

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
        log_probs = self(data.to(device))
        max_log_prob, y_pred = log_probs.max(dim=1)
        metadata = {'max_log_prob': max_log_prob.cpu(), 'batch_size': [len(y_test)] * len(y_test)}
        return y_pred.cpu(), y_test, metadata


def as_column_transf(predictions):
    """User-written pred_transform_fn: concatenate and make a column vector."""
    return torch.cat(predictions).view(-1, 1)


X, y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.long)
train_loader = DataLoader(TensorDataset(X[:480], y[:480]), batch_size=64)
test_loader = DataLoader(TensorDataset(X[480:680], y[480:680]), batch_size=64)  # 200 = 3*64 + 8

model = DigitsMLP()
optimizer = optim.Adam(model.parameters(), lr=0.01)
train_tl = TrainLoop(model, train_loader, None, test_loader, optimizer, nn.NLLLoss())
model = train_tl.fit(num_epochs=2)
assert 'val_loss' not in train_tl.train_history or len(train_tl.train_history['val_loss']) == 0

# Loop used only to predict on its test loader
predict_tl = TrainLoop(model, None, None, test_loader, None, None,
                       collate_batch_pred_fn=append_predictions, pred_transform_fn=torch_cat_transf)
y_pred, y_true, metadata = predict_tl.predict_on_test_set()
assert isinstance(y_pred, torch.Tensor) and y_pred.shape == (200,)
assert torch.equal(y_true, y[480:680])
assert isinstance(metadata['max_log_prob'], torch.Tensor) and metadata['max_log_prob'].shape == (200,)
assert metadata['batch_size'] == [64] * 192 + [8] * 8
assert model.training  # loop puts the model back into train mode after predicting

# cached within the same iteration index; forced recomputation gives the same answer
y_pred_cached, _, _ = predict_tl.predict_on_test_set()
y_pred_forced, _, _ = predict_tl.predict_on_test_set(force_prediction=True)
assert torch.equal(y_pred_cached, y_pred) and torch.equal(y_pred_forced, y_pred)

# Same predictions as the training loop itself
y_pred_train_tl, _, _ = train_tl.predict_on_test_set(force_prediction=True)
assert torch.equal(y_pred_train_tl, y_pred)

# Other collate / transform functions
col_tl = TrainLoop(model, None, None, test_loader, None, None,
                   collate_batch_pred_fn=append_concat_predictions, pred_transform_fn=as_column_transf)
y_pred_col, y_true_col, _ = col_tl.predict_on_test_set()
assert y_pred_col.shape == (200, 1) and torch.equal(y_pred_col.view(-1), y_pred)
assert y_true_col.shape == (200, 1)

pkg = ClassificationResultPackage()
pkg.prepare_result_package(y_true, y_pred)
acc = pkg.get_results()['Accuracy']
assert abs(acc - float((y_pred == y_true).double().mean())) < 1e-9

print(json.dumps({
    'accuracy': round(float(acc), 5),
    'n_pred': int(y_pred.shape[0]),
    'first_preds': y_pred[:10].tolist(),
    'metadata_keys': sorted(metadata.keys()),
    'train_history_keys': sorted(train_tl.train_history.keys()),
}, sort_keys=True))
