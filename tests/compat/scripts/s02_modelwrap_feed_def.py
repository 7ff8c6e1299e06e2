"""nn.Module + AbstractModelFeedDefinition wrapped in ModelWrap, trained with TrainLoopCheckpointEndSave
called through __call__ (examples/TrainLoop_use/model_definition_examples/trainloop_model_wrap.py).

Usage: python s02_modelwrap_feed_def.py OUT_DIR [--epochs N] [--lr LR]
"""
import argparse
import json
import os
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox.torchtrain.train_loop import TrainLoop, TrainLoopCheckpointEndSave
from aitoolbox.torchtrain.model import ModelWrap
from aitoolbox.torchtrain.data.batch_model_feed_defs import AbstractModelFeedDefinition
from aitoolbox.torchtrain.callbacks.performance_eval import ModelPerformanceEvaluation, ModelPerformancePrintReport
from aitoolbox.experiment.result_package.basic_packages import ClassificationResultPackage


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


class DigitsModelFeedDefinition(AbstractModelFeedDefinition):
    def get_loss(self, model, batch_data, criterion, device):
        data, target = batch_data
        data, target = data.to(device), target.to(device)
        output = model(data)
        loss = criterion(output, target)
        return loss

    def get_loss_eval(self, model, batch_data, criterion, device):
        return self.get_loss(model, batch_data, criterion, device)

    def get_predictions(self, model, batch_data, device):
        data, y_test = batch_data
        data = data.to(device)
        output = model(data)
        y_pred = output.argmax(dim=1, keepdim=False)
        return y_pred.cpu(), y_test, {}


parser = argparse.ArgumentParser(description='Digits ModelWrap example')
parser.add_argument('out_dir')
parser.add_argument('--epochs', type=int, default=2)
parser.add_argument('--lr', type=float, default=0.05)
parser.add_argument('--momentum', type=float, default=0.5)
parser.add_argument('--seed', type=int, default=1)
args = parser.parse_args()

random.seed(args.seed)
np.random.seed(args.seed)
torch.manual_seed(args.seed)

X, y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32)
y = torch.tensor(y, dtype=torch.long)
train_loader = DataLoader(TensorDataset(X[:480], y[:480]), batch_size=64, shuffle=True,
                          generator=torch.Generator().manual_seed(args.seed))
test_loader = DataLoader(TensorDataset(X[480:640], y[480:640]), batch_size=100)

model = Net()
optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
criterion = nn.NLLLoss()

callbacks = [ModelPerformanceEvaluation(ClassificationResultPackage(), args.__dict__,
                                        on_train_data=True, on_val_data=True),
             ModelPerformancePrintReport(['train_Accuracy', 'val_Accuracy'], strict_metric_reporting=True)]

tl = TrainLoopCheckpointEndSave(ModelWrap(model, DigitsModelFeedDefinition()),
                                train_loader, test_loader, test_loader,
                                optimizer, criterion,
                                project_name='localRunDigitsTest',
                                experiment_name='digits_model_wrap',
                                local_model_result_folder_path=args.out_dir,
                                hyperparams=args.__dict__,
                                test_result_package=ClassificationResultPackage(),
                                cloud_save_mode=None)
trained = tl(num_epochs=args.epochs, callbacks=callbacks)

assert isinstance(trained, Net)
assert tl.model is model
assert tl.batch_model_feed_def is not None
hist = tl.train_history
assert len(hist['val_Accuracy']) == args.epochs

exp_dir = os.path.join(args.out_dir, 'localRunDigitsTest', f'digits_model_wrap_{tl.experiment_timestamp}')
assert os.path.isdir(exp_dir), os.listdir(os.path.join(args.out_dir, 'localRunDigitsTest'))
ckpts = sorted(os.listdir(os.path.join(exp_dir, 'checkpoint_model')))
assert ckpts == [f'model_digits_model_wrap_{tl.experiment_timestamp}_E{e}.pth' for e in range(args.epochs)], ckpts
final_models = os.listdir(os.path.join(exp_dir, 'model'))
assert final_models == [f'model_digits_model_wrap_{tl.experiment_timestamp}.pth'], final_models

print(json.dumps({
    'history_keys': sorted(hist.keys()),
    'val_Accuracy': [round(float(v), 5) for v in hist['val_Accuracy']],
    'n_checkpoints': len(ckpts),
    'subdirs': sorted(d for d in os.listdir(exp_dir) if os.path.isdir(os.path.join(exp_dir, d))),
}, sort_keys=True))
