"""TrainLoopEndSave with val and test result packages (docs/source/experiment/result_package.rst);
the saved final model and results pickle are read back like a user would.

Usage: python s05_trainloop_endsave.py OUT_DIR
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
from aitoolbox.torchtrain.callbacks.performance_eval import \
    ModelPerformanceEvaluation, ModelPerformancePrintReport

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

    def get_loss_eval(self, batch_data, criterion, device):
        return self.get_loss(batch_data, criterion, device)

    def get_predictions(self, batch_data, device):
        data, y_test = batch_data
        return self(data.to(device)).argmax(dim=1).cpu(), y_test, {}


X, y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.long)
train_loader = DataLoader(TensorDataset(X[:480], y[:480]), batch_size=64)
val_loader = DataLoader(TensorDataset(X[480:640], y[480:640]), batch_size=64)
test_loader = DataLoader(TensorDataset(X[640:800], y[640:800]), batch_size=64)

hyperparams = {
    'lr': 0.005,
    'betas': (0.9, 0.999)
}

model = DigitsMLP()
optimizer = optim.Adam(model.parameters(), lr=hyperparams['lr'], betas=hyperparams['betas'])
criterion = nn.NLLLoss()

callbacks = [ModelPerformanceEvaluation(ClassificationResultPackage(), hyperparams,
                                        on_train_data=True, on_val_data=True),
             ModelPerformancePrintReport(['train_Accuracy', 'val_Accuracy'])]

tl = TrainLoopEndSave(
    model,
    train_loader, val_loader, test_loader,
    optimizer, criterion,
    project_name='train_loop_examples', experiment_name='TrainLoopEndSave_example',
    local_model_result_folder_path=OUT_DIR,
    hyperparams=hyperparams,
    val_result_package=ClassificationResultPackage(),
    test_result_package=ClassificationResultPackage(),
    cloud_save_mode=None
)
model = tl.fit(num_epochs=2, callbacks=callbacks)

ts = tl.experiment_timestamp
exp_dir = os.path.join(OUT_DIR, 'train_loop_examples', f'TrainLoopEndSave_example_{ts}')
assert not os.path.exists(os.path.join(exp_dir, 'checkpoint_model'))  # no per-epoch checkpoints here
final_path = os.path.join(exp_dir, 'model', f'model_TrainLoopEndSave_example_{ts}.pth')
final = torch.load(final_path, map_location='cpu')
assert final['epoch'] == 1
for k, v in model.state_dict().items():
    assert torch.equal(final['model_state_dict'][k], v), k

results_dir = os.path.join(exp_dir, 'results')
result_files = sorted(f for f in os.listdir(results_dir) if f.endswith('.p'))
assert result_files == [f'results_hyperParams_hist_TrainLoopEndSave_example_{ts}.p'], os.listdir(results_dir)
with open(os.path.join(results_dir, result_files[0]), 'rb') as f:
    results = pickle.load(f)
assert results['experiment_name'] == 'TrainLoopEndSave_example'
assert sorted(results['results'].keys()) == ['ClassificationResult_TEST', 'ClassificationResult_VAL'], results['results']
assert set(results['results']['ClassificationResult_VAL'].keys()) == {'Accuracy'}
assert abs(float(results['results']['ClassificationResult_VAL']['Accuracy'])
           - float(tl.train_history['train_end_val_Accuracy'][-1])) < 1e-9
assert 'y_true' in results and 'y_predicted' in results  # EndSave saves true/pred labels
assert 'training_history' in results and 'hyperparameters' in results
assert results['hyperparameters']['lr'] == 0.005
assert len(results['training_history']['loss']) == 2

val_acc = float(tl.train_history['val_Accuracy'][-1])
print(json.dumps({
    'result_file': result_files[0].replace(ts, 'TS'),
    'results_keys': sorted(results.keys()),
    'val_Accuracy': round(val_acc, 5),
    'train_history_keys': sorted(results['training_history'].keys()),
}, sort_keys=True))
