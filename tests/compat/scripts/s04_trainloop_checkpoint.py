"""TrainLoopCheckpoint (docs/source/torchtrain/train_loop.rst) with local saving, per-epoch and per-iteration
checkpoints (iteration_save_freq), then the saved checkpoint dicts are read back with torch.load.

Usage: python s04_trainloop_checkpoint.py OUT_DIR
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

OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get('AITB_COMPAT_OUT', 'compat_out')
random.seed(0)
np.random.seed(0)
torch.manual_seed(0)


class CNNModel(TTModel):
    """Small conv net on the 8x8 digits images."""
    def __init__(self):
        super(CNNModel, self).__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.fc1 = nn.Linear(8 * 3 * 3, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = x.view(-1, 8 * 3 * 3)
        return F.log_softmax(self.fc1(x), dim=1)

    def get_loss(self, batch_data, criterion, device):
        data, target = batch_data
        return criterion(self(data.to(device)), target.to(device))

    def get_predictions(self, batch_data, device):
        data, y_test = batch_data
        return self(data.to(device)).argmax(dim=1).cpu(), y_test, {}


X, y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32).view(-1, 1, 8, 8)
y = torch.tensor(y, dtype=torch.long)
train_loader = DataLoader(TensorDataset(X[:512], y[:512]), batch_size=64)   # 8 batches per epoch
val_loader = DataLoader(TensorDataset(X[512:640], y[512:640]), batch_size=64)
test_loader = DataLoader(TensorDataset(X[640:768], y[640:768]), batch_size=64)

hyperparams = {
    'lr': 0.001,
    'betas': (0.9, 0.999)
}

model = CNNModel()
optimizer = optim.Adam(model.parameters(), lr=hyperparams['lr'], betas=hyperparams['betas'])
criterion = nn.NLLLoss()

tl = TrainLoopCheckpoint(
    model,
    train_loader, val_loader, test_loader,
    optimizer, criterion,
    project_name='train_loop_examples', experiment_name='TrainLoopCheckpoint_example',
    local_model_result_folder_path=OUT_DIR,
    hyperparams=hyperparams,
    cloud_save_mode=None,
    iteration_save_freq=4
)
model = tl.fit(num_epochs=2)

ts = tl.experiment_timestamp
exp_dir = os.path.join(OUT_DIR, 'train_loop_examples', f'TrainLoopCheckpoint_example_{ts}')
ckpt_dir = os.path.join(exp_dir, 'checkpoint_model')
expected = sorted([f'model_TrainLoopCheckpoint_example_{ts}_E{suffix}.pth'
                   for suffix in ['0', '1', '0_ITER4', '1_ITER8', '1_ITER12']])
found = sorted(os.listdir(ckpt_dir))
assert found == expected, found
assert not os.path.exists(os.path.join(exp_dir, 'model'))  # no EndSave part in this loop
assert os.path.isfile(os.path.join(exp_dir, 'hyperparams_list.txt'))
assert os.path.isfile(os.path.join(exp_dir, os.path.basename(__file__)))  # experiment script copied
assert hyperparams['experiment_file_path'].endswith(os.path.basename(__file__))

ckpt = torch.load(os.path.join(ckpt_dir, f'model_TrainLoopCheckpoint_example_{ts}_E1.pth'), map_location='cpu')
assert {'model_state_dict', 'optimizer_state_dict', 'schedulers_state_dict',
        'epoch', 'iteration_idx', 'hyperparams'} <= set(ckpt.keys()), ckpt.keys()
assert ckpt['epoch'] == 1 and ckpt['iteration_idx'] == 15
assert ckpt['schedulers_state_dict'] == []
assert ckpt['hyperparams']['lr'] == 0.001
for k, v in model.state_dict().items():
    assert torch.equal(ckpt['model_state_dict'][k], v), k
iter_ckpt = torch.load(os.path.join(ckpt_dir, f'model_TrainLoopCheckpoint_example_{ts}_E1_ITER12.pth'),
                       map_location='cpu')
assert iter_ckpt['epoch'] == 1 and iter_ckpt['iteration_idx'] == 12

print(json.dumps({
    'checkpoints': [f.replace(ts, 'TS') for f in found],
    'ckpt_keys': sorted(ckpt.keys()),
    'loss': [round(float(v), 5) for v in tl.train_history['loss']],
}, sort_keys=True))
