"""TTDistributedDataParallel pass-through of the TTModel interface (get_loss, get_loss_eval, get_predictions,
extra user methods and transfer_model_attributes) in a single-process gloo group on CPU, after TrainLoop training.

Usage: python s20_parallel_wrappers.py OUT_DIR
"""
import json
import os
import random
import socket
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox.torchtrain.train_loop import TrainLoop
from aitoolbox.torchtrain.model import TTModel
from aitoolbox.torchtrain.parallel import TTDistributedDataParallel

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

model = DigitsMLP()
tl = TrainLoop(model, train_loader, val_loader, None, optim.Adam(model.parameters(), lr=0.01), criterion)
tl.fit(num_epochs=1)
with torch.no_grad():
    dp_loss = float(model.get_loss(batch, criterion, torch.device('cpu')))
    dp_pred, _, _ = model.get_predictions(batch, torch.device('cpu'))

# --- TTDistributedDataParallel in a one-process gloo group ---
with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', world_size=1, rank=0)
try:
    ddp_base = DigitsMLP()
    ddp_base.load_state_dict(model.state_dict())
    ddp_model = TTDistributedDataParallel(ddp_base)
    assert ddp_model.module is ddp_base and ddp_model.temperature == 2.0
    ddp_loss = ddp_model.get_loss(batch, criterion, torch.device('cpu'))
    ddp_loss.backward()
    assert ddp_base.fc1.weight.grad is not None
    with torch.no_grad():  # as the TrainLoop evaluates: no grad, so no pending DDP reduction
        ddp_eval_loss = float(ddp_model.get_loss_eval(batch, criterion, torch.device('cpu')))
        ddp_pred, _, _ = ddp_model.get_predictions(batch, torch.device('cpu'))
        ddp_scores = ddp_model.soft_scores(batch[0])
    assert abs(float(ddp_loss) - dp_loss) < 1e-6 and abs(ddp_eval_loss - dp_loss) < 1e-6
    assert torch.equal(ddp_pred, dp_pred)
    assert torch.allclose(ddp_scores, model.soft_scores(batch[0]).detach())
finally:
    dist.destroy_process_group()

print(json.dumps({
    'loss': round(dp_loss, 5),
    'pred_head': dp_pred[:10].tolist(),
    'train_loss': [round(float(v), 5) for v in tl.train_history['loss']],
}, sort_keys=True))
