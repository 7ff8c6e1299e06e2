"""use_amp=True on a CPU-only machine (examples/amp_training/single_GPU_training.py): AIToolbox's GradScaler /
autocast are CUDA ones, so on CPU they warn and the model trains in full precision. Also the dict form of use_amp
and a TrainLoopCheckpoint whose checkpoints carry the 'amp' scaler state.

Usage: python s18_amp_on_cpu.py OUT_DIR
"""
import json
import os
import random
import sys
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

# TrainLoop from its torchtrain path: after the rename, the package's top-level TrainLoop is the new library's own,
# without AIToolbox's training-set 'loss' by default (tests/compat/test_aliases.py, docs/migrating-from-aitoolbox.md).
from aitoolbox import TTModel
from aitoolbox.torchtrain.train_loop import TrainLoop
from aitoolbox.torchtrain.train_loop import TrainLoopCheckpoint
from aitoolbox.torchtrain.callbacks.abstract import AbstractCallback
from aitoolbox.torchtrain.callbacks.performance_eval import ModelPerformanceEvaluation, ModelPerformancePrintReport
from aitoolbox.experiment.result_package.basic_packages import ClassificationResultPackage

OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get('AITB_COMPAT_OUT', 'compat_out')
random.seed(0)
np.random.seed(0)
torch.manual_seed(0)


class Net(TTModel):
    def __init__(self):
        super(Net, self).__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)

    def get_loss(self, batch_data, criterion, device):
        data, target = batch_data
        data, target = data.to(device), target.to(device)
        output = self(data)
        LossDtype.seen.add(str(output.dtype))
        return criterion(output, target)

    def get_predictions(self, batch_data, device):
        data, y_test = batch_data
        return self(data.to(device)).argmax(dim=1).cpu(), y_test, {}


class LossDtype(AbstractCallback):
    seen = set()

    def __init__(self):
        super().__init__('dtype check')


if __name__ == '__main__':
    assert not torch.cuda.is_available(), 'this script checks the CPU fallback'
    X, y = load_digits(return_X_y=True)
    X = torch.tensor(X / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.long)
    train_loader = DataLoader(TensorDataset(X[:480], y[:480]), batch_size=100)
    val_loader = DataLoader(TensorDataset(X[480:640], y[480:640]), batch_size=100)
    test_loader = DataLoader(TensorDataset(X[640:800], y[640:800]), batch_size=100)

    model = Net()
    optimizer = optim.Adam(model.parameters(), lr=0.001, betas=(0.9, 0.999))
    criterion = nn.NLLLoss()
    callbacks = [ModelPerformanceEvaluation(ClassificationResultPackage(), {},
                                            on_train_data=True, on_val_data=True),
                 ModelPerformancePrintReport(['train_Accuracy', 'val_Accuracy'])]

    print('Starting train loop')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        tl = TrainLoop(model,
                       train_loader, val_loader, test_loader,
                       optimizer, criterion,
                       use_amp=True)
        tl.fit(num_epochs=2, callbacks=callbacks)
    assert any('cuda' in str(w.message).lower() or 'amp' in str(w.message).lower() for w in caught), \
        [str(w.message) for w in caught]
    assert LossDtype.seen == {'torch.float32'}, LossDtype.seen
    assert all(p.dtype == torch.float32 for p in model.parameters())
    hist = tl.train_history
    assert all(np.isfinite(v) for v in hist['loss'])

    # dict form: GradScaler init arguments
    model2 = Net()
    tl2 = TrainLoopCheckpoint(model2, train_loader, val_loader, None, optim.Adam(model2.parameters(), lr=0.001),
                              nn.NLLLoss(), project_name='amp_project', experiment_name='amp_exp',
                              local_model_result_folder_path=OUT_DIR, hyperparams={},
                              cloud_save_mode=None, use_amp={'init_scale': 2. ** 10, 'growth_interval': 100})
    tl2.fit(num_epochs=1)
    ts = tl2.experiment_timestamp
    ckpt = torch.load(os.path.join(OUT_DIR, 'amp_project', f'amp_exp_{ts}', 'checkpoint_model',
                                   f'model_amp_exp_{ts}_E0.pth'), map_location='cpu')
    assert 'amp' in ckpt, sorted(ckpt.keys())

    print(json.dumps({
        'history_keys': sorted(hist.keys()),
        'loss': [round(float(v), 5) for v in hist['loss']],
        'val_Accuracy': [round(float(v), 5) for v in hist['val_Accuracy']],
        'amp_ckpt_keys': sorted(ckpt.keys()),
    }, sort_keys=True))
