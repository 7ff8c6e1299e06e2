"""DataParallel on CPU (docs/source/torchtrain/parallel.rst): TrainLoop(gpu_mode='dp') wraps the TTModel in
TTDataParallel, which passes get_loss/get_predictions, extra user methods and transfer_model_attributes through;
and a model wrapped in TTDataParallel by the user.

Usage: python s20_parallel_wrappers.py OUT_DIR
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
from aitoolbox.torchtrain.parallel import TTDataParallel

OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get('AITB_COMPAT_OUT', 'compat_out')
random.seed(0)
np.random.seed(0)
torch.manual_seed(0)


class DigitsMLP(TTModel):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)
        self.temperature = 2.0
        self.transfer_model_attributes = ['temperature']

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)

    def get_loss(self, batch_data, criterion, device):
        data, target = batch_data
        return criterion(self(data.to(device)), target.to(device))

    def get_predictions(self, batch_data, device):
        data, y_test = batch_data
        return self(data.to(device)).argmax(dim=1).cpu(), y_test, {}

    def soft_scores(self, data):
        """Extra user method; on the parallel wrappers `self` is the wrapper."""
        return (self(data) / self.temperature).exp()


X, y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.long)
train_loader = DataLoader(TensorDataset(X[:480], y[:480]), batch_size=64)
val_loader = DataLoader(TensorDataset(X[480:640], y[480:640]), batch_size=64)
batch = (X[480:544], y[480:544])
criterion = nn.NLLLoss()

# --- gpu_mode='dp': the loop wraps the TTModel in TTDataParallel (plain pass-through on CPU) ---
model = DigitsMLP()
tl = TrainLoop(model, train_loader, val_loader, None, optim.Adam(model.parameters(), lr=0.01), criterion,
               gpu_mode='dp')
trained = tl.fit(num_epochs=1)
assert isinstance(trained, TTDataParallel) and isinstance(tl.model, TTDataParallel)
assert trained.module is model
assert trained.temperature == 2.0
dp_loss = float(trained.get_loss(batch, criterion, torch.device('cpu')))
dp_pred, dp_true, _ = trained.get_predictions(batch, torch.device('cpu'))
assert torch.equal(dp_true, batch[1])
assert abs(dp_loss - float(model.get_loss(batch, criterion, torch.device('cpu')))) < 1e-6
assert torch.allclose(trained.soft_scores(batch[0]), model.soft_scores(batch[0]))

# a model wrapped by the user before it is given to the loop
user_dp = TTDataParallel(DigitsMLP())
tl_user = TrainLoop(user_dp, train_loader, None, None, optim.SGD(user_dp.parameters(), lr=0.1), criterion)
assert tl_user.fit(num_epochs=1) is user_dp

print(json.dumps({
    'dp_loss': round(dp_loss, 5),
    'dp_pred_head': dp_pred[:10].tolist(),
    'train_loss': [round(float(v), 5) for v in tl.train_history['loss']],
}, sort_keys=True))
