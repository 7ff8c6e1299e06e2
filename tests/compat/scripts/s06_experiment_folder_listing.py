"""Train with TrainLoopCheckpointEndSave, then walk the saved experiment folder the way AIToolbox users do:
list checkpoint_model/, model/, results/ and open every file (torch.load for .pth, pickle for .p).

Usage: python s06_experiment_folder_listing.py OUT_DIR
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
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox.torchtrain.train_loop import *
from aitoolbox.torchtrain.model import TTModel
from aitoolbox.experiment.result_package.basic_packages import ClassificationResultPackage

OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get('AITB_COMPAT_OUT', 'compat_out')
random.seed(0)
np.random.seed(0)
torch.manual_seed(0)


class DigitsMLP(TTModel):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 24)
        self.fc2 = nn.Linear(24, 10)

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
train_loader = DataLoader(TensorDataset(X[:400], y[:400]), batch_size=50)
val_loader = DataLoader(TensorDataset(X[400:500], y[400:500]), batch_size=50)
test_loader = DataLoader(TensorDataset(X[500:600], y[500:600]), batch_size=50)

hyperparams = {'lr': 0.01, 'batch_size': 50, 'hidden': 24}
model = DigitsMLP()
optimizer = optim.SGD(model.parameters(), lr=hyperparams['lr'], momentum=0.9)
criterion = nn.NLLLoss()

tl = TrainLoopCheckpointEndSave(
    model,
    train_loader, val_loader, test_loader,
    optimizer, criterion,
    project_name='listing_project', experiment_name='listing_exp',
    local_model_result_folder_path=OUT_DIR,
    hyperparams=hyperparams,
    val_result_package=ClassificationResultPackage(),
    test_result_package=ClassificationResultPackage(),
    cloud_save_mode=None
)
tl.fit(num_epochs=2)

# ----- user-side inspection of the experiment folder -----
project_dir = os.path.join(OUT_DIR, 'listing_project')
experiments = sorted(os.listdir(project_dir))
assert len(experiments) == 1, experiments
exp_name = experiments[0]
assert exp_name.startswith('listing_exp_')
timestamp = exp_name[len('listing_exp_'):]
assert timestamp == tl.experiment_timestamp
exp_dir = os.path.join(project_dir, exp_name)

top_files = sorted(f for f in os.listdir(exp_dir) if os.path.isfile(os.path.join(exp_dir, f)))
top_dirs = sorted(d for d in os.listdir(exp_dir) if os.path.isdir(os.path.join(exp_dir, d)))
assert top_dirs == ['checkpoint_model', 'model', 'results'], top_dirs
assert 'hyperparams_list.txt' in top_files and os.path.basename(__file__) in top_files, top_files
with open(os.path.join(exp_dir, 'hyperparams_list.txt')) as f:
    hp_txt = f.read()
assert 'lr:\t0.01' in hp_txt and 'batch_size:\t50' in hp_txt, hp_txt

loaded = {}
for sub in top_dirs:
    for root, _, files in os.walk(os.path.join(exp_dir, sub)):
        for fname in sorted(files):
            path = os.path.join(root, fname)
            rel = os.path.relpath(path, exp_dir).replace(timestamp, 'TS').replace(os.sep, '/')
            if fname.endswith('.pth'):
                obj = torch.load(path, map_location='cpu')
                assert set(obj) >= {'model_state_dict', 'optimizer_state_dict', 'epoch', 'hyperparams'}, obj.keys()
                probe = DigitsMLP()
                probe.load_state_dict(obj['model_state_dict'])
                opt = optim.SGD(probe.parameters(), lr=0.01, momentum=0.9)
                opt.load_state_dict(obj['optimizer_state_dict'])
                loaded[rel] = {'epoch': obj['epoch'], 'keys': sorted(obj.keys())}
            elif fname.endswith('.p'):
                with open(path, 'rb') as f:
                    obj = pickle.load(f)
                loaded[rel] = {'keys': sorted(obj.keys())}
            elif fname.endswith('.png'):
                with open(path, 'rb') as f:
                    assert f.read(8) == b'\x89PNG\r\n\x1a\n', path
                loaded[rel] = 'png'
            else:
                loaded[rel] = 'other'

assert loaded['checkpoint_model/model_listing_exp_TS_E0.pth']['epoch'] == 0
assert loaded['checkpoint_model/model_listing_exp_TS_E1.pth']['epoch'] == 1
assert loaded['model/model_listing_exp_TS.pth']['epoch'] == 1
assert 'results/results_hyperParams_hist_listing_exp_TS.p' in loaded, sorted(loaded)
final = torch.load(os.path.join(exp_dir, 'model', f'model_listing_exp_{timestamp}.pth'), map_location='cpu')
for k, v in model.state_dict().items():
    assert torch.equal(final['model_state_dict'][k], v)

print(json.dumps({
    'top_dirs': top_dirs,
    'files': {k: v for k, v in sorted(loaded.items()) if not k.startswith('results/plots')},
    'n_plots': sum(1 for k in loaded if k.startswith('results/plots')),
}, sort_keys=True))
