"""MultiLoss + MultiOptimizer (docs/source/torchtrain/multi_loss_opti.rst) in a TrainLoopCheckpoint;
the checkpoint stores one optimizer state per wrapped optimizer.

Usage: python s12_multiloss_multioptimizer.py OUT_DIR
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
from aitoolbox.torchtrain.multi_loss_optim import MultiLoss, MultiOptimizer

OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get('AITB_COMPAT_OUT', 'compat_out')
random.seed(0)
np.random.seed(0)
torch.manual_seed(0)


class TwoHeadNet(TTModel):
    """Main classification head + auxiliary head predicting whether the digit is >= 5."""
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(64, 32)
        self.main_head = nn.Linear(32, 10)
        self.aux_head = nn.Linear(32, 2)

    def forward(self, x):
        h = F.relu(self.body(x))
        return F.log_softmax(self.main_head(h), dim=1), F.log_softmax(self.aux_head(h), dim=1)

    def get_loss(self, batch_data, criterion, device):
        data, target = batch_data
        data, target = data.to(device), target.to(device)
        main_out, aux_out = self(data)
        main_loss = criterion(main_out, target)
        aux_loss = criterion(aux_out, (target >= 5).long())
        return MultiLoss({'main_loss': main_loss, 'aux_loss': aux_loss})

    def get_predictions(self, batch_data, device):
        data, y_test = batch_data
        main_out, _ = self(data.to(device))
        return main_out.argmax(dim=1).cpu(), y_test, {}


X, y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.long)
train_loader = DataLoader(TensorDataset(X[:480], y[:480]), batch_size=64)
val_loader = DataLoader(TensorDataset(X[480:640], y[480:640]), batch_size=64)

model = TwoHeadNet()
optimizer_1 = optim.Adam(list(model.body.parameters()) + list(model.main_head.parameters()), lr=0.01)
optimizer_2 = optim.SGD(model.aux_head.parameters(), lr=0.1)
aux_before = model.aux_head.weight.detach().clone()

tl = TrainLoopCheckpoint(model, train_loader, val_loader, None,
                         MultiOptimizer([optimizer_1, optimizer_2]), nn.NLLLoss(),
                         project_name='multi_loss_project', experiment_name='multi_loss_exp',
                         local_model_result_folder_path=OUT_DIR, hyperparams={'lr_main': 0.01, 'lr_aux': 0.1},
                         cloud_save_mode=None)
tl.fit(num_epochs=2)

assert tl.num_optimizers == 2
hist = tl.train_history
for key in ['loss_main_loss', 'loss_aux_loss', 'accumulated_loss_main_loss', 'accumulated_loss_aux_loss',
            'val_loss_main_loss', 'val_loss_aux_loss']:
    assert key in hist and len(hist[key]) == 2, (key, sorted(hist.keys()))
assert not torch.equal(aux_before, model.aux_head.weight.detach())

val_loss = tl.evaluate_loss_on_validation_set(float_dict_format=True)
assert isinstance(val_loss, dict) and set(val_loss) == {'main_loss', 'aux_loss'}

ts = tl.experiment_timestamp
ckpt_path = os.path.join(OUT_DIR, 'multi_loss_project', f'multi_loss_exp_{ts}', 'checkpoint_model',
                         f'model_multi_loss_exp_{ts}_E1.pth')
ckpt = torch.load(ckpt_path, map_location='cpu')
assert isinstance(ckpt['optimizer_state_dict'], list) and len(ckpt['optimizer_state_dict']) == 2
new_opts = MultiOptimizer([optim.Adam(list(model.body.parameters()) + list(model.main_head.parameters()), lr=0.01),
                           optim.SGD(model.aux_head.parameters(), lr=0.1)])
new_opts.load_state_dict(ckpt['optimizer_state_dict'])
assert len(new_opts) == 2 and isinstance(new_opts[1], optim.SGD)

print(json.dumps({
    'history_keys': sorted(hist.keys()),
    'loss_main': [round(float(v), 5) for v in hist['loss_main_loss']],
    'loss_aux': [round(float(v), 5) for v in hist['loss_aux_loss']],
    'val_loss': {k: round(float(v), 5) for k, v in val_loss.items()},
}, sort_keys=True))
