"""Gradient clipping callbacks (aitoolbox.torchtrain.callbacks.gradient) with gradient accumulation;
a custom callback checks the clipped gradient norm right after the optimizer step.

Usage: python s11_grad_clipping.py OUT_DIR
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
from aitoolbox.torchtrain.callbacks.gradient import GradNormClip, GradValueClip

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


class GradInspector(AbstractCallback):
    def __init__(self):
        super().__init__('grad inspector')
        self.norms = []
        self.max_abs = []
        self.steps = 0

    def on_train_loop_registration(self):
        self.train_loop_obj.grad_cb_used = True

    def on_after_optimizer_step(self):
        # gradients are still there: zero_grad happens after the step
        grads = [p.grad.detach().flatten() for p in self.train_loop_obj.model.parameters() if p.grad is not None]
        g = torch.cat(grads)
        self.norms.append(float(g.norm()))
        self.max_abs.append(float(g.abs().max()))
        self.steps += 1


X, y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.long)
train_loader = DataLoader(TensorDataset(X[:512], y[:512]), batch_size=64)  # 8 batches
val_loader = DataLoader(TensorDataset(X[512:640], y[512:640]), batch_size=64)

# Norm clipping, gradient accumulation over 2 batches
model = DigitsMLP()
inspector = GradInspector()
tl = TrainLoop(model, train_loader, val_loader, None, optim.SGD(model.parameters(), lr=0.5), nn.NLLLoss())
tl.fit(num_epochs=2, callbacks=[GradNormClip(max_grad_norm=0.05), inspector], grad_accumulation=2)
assert inspector.steps == 8, inspector.steps  # 16 batches / 2
assert max(inspector.norms) <= 0.05 + 1e-5, inspector.norms
assert tl.get_num_training_steps() == 8

# Value clipping
model2 = DigitsMLP()
inspector2 = GradInspector()
tl2 = TrainLoop(model2, train_loader, val_loader, None, optim.SGD(model2.parameters(), lr=0.5), nn.NLLLoss())
tl2.fit(num_epochs=1, callbacks=[GradValueClip(max_grad_value=0.001), inspector2])
assert inspector2.steps == 8
assert max(inspector2.max_abs) <= 0.001 + 1e-9, inspector2.max_abs

print(json.dumps({
    'norm_clip_steps': inspector.steps,
    'value_clip_steps': inspector2.steps,
    'max_norm': round(max(inspector.norms), 6),
    'loss': [round(float(v), 5) for v in tl.train_history['loss']],
}, sort_keys=True))
