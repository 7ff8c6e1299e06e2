"""Training without the TrainLoop (examples/misc_examples/non_trainloop_training.py): a hand-written loop,
TrainingHistory + ClassificationResultPackage, saved with FullPyTorchExperimentLocalSaver (single results file and
separate result files).

Usage: python s15_non_trainloop_saver.py OUT_DIR
"""
import datetime
import json
import os
import pickle
import random
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox.experiment.training_history import TrainingHistory
from aitoolbox.experiment.result_package.basic_packages import ClassificationResultPackage
from aitoolbox.experiment.local_experiment_saver import FullPyTorchExperimentLocalSaver

OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get('AITB_COMPAT_OUT', 'compat_out')
random.seed(0)
np.random.seed(0)
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


X, y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.long)
train_loader = DataLoader(TensorDataset(X[:480], y[:480]), batch_size=64)
test_loader = DataLoader(TensorDataset(X[480:640], y[480:640]), batch_size=64)

args = {'lr': 0.05, 'momentum': 0.5, 'epochs': 2}
model = Net()
optimizer = optim.SGD(model.parameters(), lr=args['lr'], momentum=args['momentum'])
criterion = F.nll_loss

experiment_timestamp = datetime.datetime.fromtimestamp(time.time()).strftime('%Y-%m-%d_%H-%M-%S')
training_history = TrainingHistory()

for epoch in range(args['epochs']):
    model.train()
    for data, target in train_loader:
        optimizer.zero_grad()
        loss = criterion(model(data), target)
        loss.backward()
        optimizer.step()

    model.eval()
    y_pred, y_test = [], []
    with torch.no_grad():
        for data, target in test_loader:
            y_pred += model(data).argmax(dim=1).tolist()
            y_test += target.tolist()

    result_pkg = ClassificationResultPackage()
    result_pkg.prepare_result_package(y_true=y_test, y_predicted=y_pred, hyperparameters=args)
    for metric_name, metric_result in result_pkg.get_results().items():
        training_history.insert_single_result_into_history(metric_name, metric_result)
    training_history.insert_single_result_into_history('loss', float(loss))

assert len(training_history['Accuracy']) == 2
assert 'Accuracy' in training_history

experiment_saver = FullPyTorchExperimentLocalSaver(project_name='localRunDigits', experiment_name='manual_loop',
                                                   local_model_result_folder_path=OUT_DIR)
model_checkpoint = {'model_state_dict': model.state_dict(),
                    'optimizer_state_dict': optimizer.state_dict(),
                    'epoch': epoch,
                    'hyperparams': args}
saved_paths = experiment_saver.save_experiment(model_checkpoint, result_pkg, training_history,
                                               experiment_timestamp=experiment_timestamp)
assert all(os.path.isfile(p) for p in saved_paths), saved_paths
exp_dir = os.path.join(OUT_DIR, 'localRunDigits', f'manual_loop_{experiment_timestamp}')
model_file = os.path.join(exp_dir, 'model', f'model_manual_loop_{experiment_timestamp}.pth')
assert saved_paths[0] == model_file, saved_paths
assert torch.load(model_file, map_location='cpu')['epoch'] == 1

with open(os.path.join(exp_dir, 'results', f'results_hyperParams_hist_manual_loop_{experiment_timestamp}.p'),
          'rb') as f:
    single = pickle.load(f)
assert single['results'] == result_pkg.get_results()
assert single['hyperparameters'] == args
assert single['training_history']['Accuracy'] == training_history['Accuracy']

separate_ts = experiment_timestamp + '_sep'
sep_paths = experiment_saver.save_experiment(model_checkpoint, result_pkg, training_history,
                                             experiment_timestamp=separate_ts, separate_files=True)
sep_names = sorted(os.path.basename(p) for p in sep_paths if p.endswith('.p'))
assert sep_names == sorted([f'results_manual_loop_{separate_ts}.p', f'hyperparams_manual_loop_{separate_ts}.p',
                            f'train_history_manual_loop_{separate_ts}.p']), sep_names

print(json.dumps({
    'accuracy': [round(float(a), 5) for a in training_history['Accuracy']],
    'n_saved_single': len(saved_paths),
    'separate_files': [n.replace(separate_ts, 'TS') for n in sep_names],
    'single_keys': sorted(single.keys()),
}, sort_keys=True))
