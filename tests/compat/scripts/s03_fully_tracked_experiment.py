"""Fully tracked experiment (examples/TrainLoop_use/trainloop_fully_tracked_experiment.py), local saving only:
TrainLoopCheckpointEndSave + evaluation/print/plot/file-writer callbacks + EarlyStopping + suboptimal checkpoint
removal, and a custom callback reading the messages that the plot/file-writer callbacks post.

Usage: python s03_fully_tracked_experiment.py OUT_DIR
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
from aitoolbox.torchtrain.callbacks.abstract import AbstractCallback
from aitoolbox.torchtrain.callbacks.performance_eval import (ModelPerformanceEvaluation, ModelPerformancePrintReport,
                                                             ModelTrainHistoryPlot, ModelTrainHistoryFileWriter)
from aitoolbox.torchtrain.callbacks.basic import EarlyStopping
from aitoolbox.experiment.result_package.basic_packages import ClassificationResultPackage

OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get('AITB_COMPAT_OUT', 'compat_out')


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
        y_pred = self(data.to(device)).argmax(dim=1, keepdim=False)
        return y_pred.cpu(), y_test, {}


class ReportedFilesCollector(AbstractCallback):
    """Reads what ModelTrainHistoryPlot / ModelTrainHistoryFileWriter post on the message service."""
    def __init__(self):
        super().__init__('reported files collector', execution_order=98)
        self.seen = []

    def on_epoch_end(self):
        plots = self.message_service.read_messages('ModelTrainHistoryPlot_results_file_local_paths')
        txts = self.message_service.read_messages('ModelTrainHistoryFileWriter_results_file_local_paths')
        assert plots is not None and txts is not None, 'expected plot / file writer messages'
        plot_files = [p for msg in plots for p in msg]
        txt_files = [p for msg in txts for p in msg]
        assert all(os.path.isfile(p) for p in plot_files + txt_files)
        self.seen.append((sorted(os.path.basename(p) for p in plot_files),
                          sorted(os.path.basename(p) for p in txt_files)))


if __name__ == '__main__':
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)

    X, y = load_digits(return_X_y=True)
    X = torch.tensor(X / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.long)
    train_loader = DataLoader(TensorDataset(X[:480], y[:480]), batch_size=100)
    val_loader = DataLoader(TensorDataset(X[480:640], y[480:640]), batch_size=100)
    test_loader = DataLoader(TensorDataset(X[640:800], y[640:800]), batch_size=100)

    model = Net()
    optimizer = optim.Adam(model.parameters(), lr=0.001, betas=(0.9, 0.999))
    criterion = nn.NLLLoss()

    collector = ReportedFilesCollector()
    early_stopping = EarlyStopping(monitor='val_loss', min_delta=100.0, patience=0)
    callbacks = [ModelPerformanceEvaluation(ClassificationResultPackage(), {},
                                            on_train_data=True, on_val_data=True),
                 ModelPerformancePrintReport(['train_Accuracy', 'val_Accuracy']),
                 ModelTrainHistoryPlot(),
                 ModelTrainHistoryFileWriter(),
                 early_stopping,
                 collector]

    print('Starting train loop')
    tl = TrainLoopCheckpointEndSave(
        model,
        train_loader, val_loader, test_loader,
        optimizer, criterion,
        project_name='tl_full_experiment_tracking', experiment_name='tutorial_example',
        local_model_result_folder_path=OUT_DIR,
        hyperparams={},
        val_result_package=ClassificationResultPackage(), test_result_package=ClassificationResultPackage(),
        cloud_save_mode=None,
        rm_subopt_local_models=True, num_best_checkpoints_kept=1
    )
    tl.fit(num_epochs=6, callbacks=callbacks)

    # min_delta=100 means val_loss can never "improve" enough: epoch 0 sets the best, epoch 1 stops.
    assert tl.early_stop is True
    assert tl.epoch == 1, tl.epoch
    assert early_stopping.best_epoch == 0
    hist = tl.train_history
    assert len(hist['loss']) == 2 and len(hist['val_Accuracy']) == 2

    exp_dir = os.path.join(OUT_DIR, 'tl_full_experiment_tracking', f'tutorial_example_{tl.experiment_timestamp}')
    ckpt_files = sorted(os.listdir(os.path.join(exp_dir, 'checkpoint_model')))
    assert len(ckpt_files) == 1, ckpt_files  # num_best_checkpoints_kept=1
    results_dir = os.path.join(exp_dir, 'results')
    assert os.path.isfile(os.path.join(results_dir, 'results.txt')), os.listdir(results_dir)
    # a metric is plotted once it has more than one value: nothing to draw after the first epoch
    assert os.path.isdir(os.path.join(results_dir, 'plots_epoch_0')), os.listdir(results_dir)
    assert os.listdir(os.path.join(results_dir, 'plots_epoch_0')) == []
    assert os.path.isfile(os.path.join(results_dir, 'plots_epoch_1', 'loss.png')), os.listdir(results_dir)
    assert os.path.isfile(os.path.join(results_dir, 'plots', 'loss.png'))  # end-of-training report plots
    with open(os.path.join(results_dir, 'results.txt')) as f:
        txt = f.read()
    assert 'Epoch: 0' in txt and 'Epoch: 1' in txt
    assert len(collector.seen) == 2
    assert collector.seen[0][1] == ['results.txt']

    print(json.dumps({
        'epochs_run': tl.epoch + 1,
        'early_stop': bool(tl.early_stop),
        'history_keys': sorted(hist.keys()),
        'n_checkpoints_kept': len(ckpt_files),
        'plots_epoch_1': collector.seen[1][0],
        'val_Accuracy': [round(float(v), 5) for v in hist['val_Accuracy']],
    }, sort_keys=True))
