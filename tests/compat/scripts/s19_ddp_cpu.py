"""DistributedDataParallel training with gpu_mode='ddp' on CPU (examples/dp_ddp_training/ddp_training.py):
fit(num_gpus=2, backend='gloo', on_gpu=False) spawns two processes; a callback in every process writes what it saw
(rank, TTDistributedDataParallel wrapping, per-rank batches, synced losses) and the parent collects it.

Usage: python s19_ddp_cpu.py OUT_DIR
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

# TrainLoop from its torchtrain path: after the rename, the package's top-level TrainLoop is the new library's own,
# without AIToolbox's training-set 'loss' by default (tests/compat/test_aliases.py, docs/migrating-from-aitoolbox.md).
from aitoolbox import TTModel
from aitoolbox.torchtrain.train_loop import TrainLoop
from aitoolbox.torchtrain.parallel import TTDistributedDataParallel
from aitoolbox.torchtrain.callbacks.abstract import AbstractCallback
from aitoolbox.torchtrain.callbacks.performance_eval import ModelPerformanceEvaluation, ModelPerformancePrintReport
from aitoolbox.experiment.result_package.basic_packages import ClassificationResultPackage


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
        return criterion(self(data), target)

    def get_predictions(self, batch_data, device):
        data, y_test = batch_data
        return self(data.to(device)).argmax(dim=1).cpu(), y_test, {}


class RankReport(AbstractCallback):
    def __init__(self, out_dir):
        super().__init__('per-process report')
        self.out_dir = out_dir
        self.batches = 0
        self.multiprocess_started = False

    def on_multiprocess_start(self):
        self.multiprocess_started = True

    def on_batch_end(self):
        self.batches += 1

    def on_train_end(self):
        tl = self.train_loop_obj
        # AIToolbox puts the DDP wrapper in tl.model; the drop-in library keeps tl.model plain and exposes the wrapper
        # as tl.ddp_model (a documented difference), so this reads whichever the library provides.
        wrapper = getattr(tl, 'ddp_model', None) or tl.model
        report = {
            'rank': tl.ddp_rank,
            'ddp_training_mode': tl.ddp_training_mode,
            'is_main_process': tl.is_main_process(),
            'wrapped_in_ttddp': isinstance(wrapper, TTDistributedDataParallel),
            'module_is_ttmodel': isinstance(wrapper.module, TTModel),
            'batches': self.batches,
            'multiprocess_started': self.multiprocess_started,
            'loss': [round(float(v), 4) for v in tl.train_history['loss']],
            'val_Accuracy': [round(float(v), 4) for v in tl.train_history['val_Accuracy']],
            'n_val_predictions': int(tl.predict_on_validation_set()[0].shape[0]),
        }
        with open(os.path.join(self.out_dir, f'ddp_rank_{tl.ddp_rank}.json'), 'w') as f:
            json.dump(report, f)


if __name__ == '__main__':
    OUT_DIR = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.environ.get('AITB_COMPAT_OUT', 'compat_out'))
    os.makedirs(OUT_DIR, exist_ok=True)
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)

    X, y = load_digits(return_X_y=True)
    X = torch.tensor(X / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.long)
    train_loader = DataLoader(TensorDataset(X[:480], y[:480]), batch_size=60, shuffle=True)
    val_loader = DataLoader(TensorDataset(X[480:640], y[480:640]), batch_size=40)
    test_loader = DataLoader(TensorDataset(X[640:800], y[640:800]), batch_size=40)

    model = Net()
    optimizer = optim.Adam(model.parameters(), lr=0.001, betas=(0.9, 0.999))
    criterion = nn.NLLLoss()

    callbacks = [ModelPerformanceEvaluation(ClassificationResultPackage(), {},
                                            on_train_data=True, on_val_data=True),
                 ModelPerformancePrintReport(['train_Accuracy', 'val_Accuracy']),
                 RankReport(OUT_DIR)]

    print('Starting train loop')
    TrainLoop(model,
              train_loader, val_loader, test_loader,
              optimizer, criterion,
              gpu_mode='ddp') \
        .fit(num_epochs=2, callbacks=callbacks,
             num_nodes=1, node_rank=0, num_gpus=2, backend='gloo', on_gpu=False)

    reports = []
    for rank in range(2):
        with open(os.path.join(OUT_DIR, f'ddp_rank_{rank}.json')) as f:
            reports.append(json.load(f))
    for rank, rep in enumerate(reports):
        assert rep['rank'] == rank and rep['ddp_training_mode'] is True
        assert rep['is_main_process'] == (rank == 0)
        assert rep['wrapped_in_ttddp'] and rep['module_is_ttmodel']
        assert rep['batches'] == 2 * 4, rep  # 240 samples per rank / 60 per batch, 2 epochs
        assert rep['n_val_predictions'] == 160, rep  # gathered from both ranks
    # losses and metrics are synchronised over the processes
    assert reports[0]['loss'] == reports[1]['loss']
    assert reports[0]['val_Accuracy'] == reports[1]['val_Accuracy']

    assert all(np.isfinite(v) for v in reports[0]['loss']) and len(reports[0]['loss']) == 2
    # gloo all-reduce order makes the last digits of the synced losses vary run to run: keep them out of the summary
    for rep in reports:
        rep['loss'] = len(rep.pop('loss'))
        rep['val_Accuracy'] = len(rep.pop('val_Accuracy'))
    print(json.dumps({'reports': reports}, sort_keys=True))
