"""Load a model saved by TrainLoopCheckpointEndSave with PyTorchLocalModelLoader (final model and a checkpoint,
and load_model_from_path), initialise a fresh model/optimizer from it and check the predictions match.

Usage: python s14_local_model_loader.py OUT_DIR
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

from aitoolbox import TrainLoopCheckpointEndSave, TTModel
from aitoolbox.experiment.local_load.local_model_load import PyTorchLocalModelLoader
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
        return self(data.to(device)).argmax(dim=1).cpu(), y_test, {}


X, y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.long)
train_loader = DataLoader(TensorDataset(X[:480], y[:480]), batch_size=64)
val_loader = DataLoader(TensorDataset(X[480:640], y[480:640]), batch_size=64)
test_loader = DataLoader(TensorDataset(X[640:800], y[640:800]), batch_size=64)

model = DigitsMLP()
optimizer = optim.Adam(model.parameters(), lr=0.01)
tl = TrainLoopCheckpointEndSave(model, train_loader, val_loader, test_loader, optimizer, nn.NLLLoss(),
                                project_name='loader_project', experiment_name='loader_exp',
                                local_model_result_folder_path=OUT_DIR, hyperparams={'lr': 0.01},
                                test_result_package=ClassificationResultPackage(), cloud_save_mode=None)
tl.fit(num_epochs=2)
ts = tl.experiment_timestamp
model.eval()
with torch.no_grad():
    reference = model(X[640:800]).argmax(dim=1)

loader = PyTorchLocalModelLoader(OUT_DIR)
model_representation = loader.load_model('loader_project', 'loader_exp', ts, model_save_dir='model')
assert model_representation['epoch'] == 1
assert model_representation['hyperparams']['lr'] == 0.01

fresh_model = loader.init_model(DigitsMLP())
fresh_optimizer = loader.init_optimizer(optim.Adam(fresh_model.parameters(), lr=0.5), device='cpu')
assert fresh_optimizer.param_groups[0]['lr'] == 0.01
fresh_model.eval()
with torch.no_grad():
    restored = fresh_model(X[640:800]).argmax(dim=1)
assert torch.equal(restored, reference)

# checkpoint from epoch 0 (default model_save_dir='checkpoint_model')
ckpt_repr = PyTorchLocalModelLoader(OUT_DIR).load_model('loader_project', 'loader_exp', ts, epoch_num=0,
                                                         map_location='cpu')
assert ckpt_repr['epoch'] == 0
loader_e0 = PyTorchLocalModelLoader(OUT_DIR)
loader_e0.load_model('loader_project', 'loader_exp', ts, epoch_num=0)
e0_model = loader_e0.init_model(DigitsMLP())
assert not torch.equal(e0_model.fc1.weight, fresh_model.fc1.weight)

# plain path loading
path = os.path.join(OUT_DIR, 'loader_project', f'loader_exp_{ts}', 'model', f'model_loader_exp_{ts}.pth')
by_path = PyTorchLocalModelLoader(OUT_DIR).load_model_from_path(path, map_location='cpu')
assert by_path['epoch'] == 1 and torch.equal(by_path['model_state_dict']['fc2.bias'], model.fc2.bias.detach())

# loader used before load_model() must complain
try:
    PyTorchLocalModelLoader(OUT_DIR).init_model(DigitsMLP())
    raise AssertionError('init_model without load_model should fail')
except ValueError:
    pass

print(json.dumps({
    'final_epoch': model_representation['epoch'],
    'ckpt_epoch': ckpt_repr['epoch'],
    'restored_pred_head': restored[:12].tolist(),
    'repr_keys': sorted(model_representation.keys()),
}, sort_keys=True))
