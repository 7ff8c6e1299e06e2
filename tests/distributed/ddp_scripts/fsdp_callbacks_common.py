"""Models, loops and recording callbacks of tests/distributed/test_fsdp_callbacks.py (a module, so that spawned and torchrun
processes import it by name). The data and global batches are ddp_common's: 32 samples, 8 per optimizer step (4 per
rank on 2 ranks, 8 in one process)."""
import json
import os

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.utils.data import DataLoader

from aitoolbox_like import AbstractCallback, TTBasicModel
from aitoolbox_like.callbacks.gradient import GradDistributionPlot, GradientStatsPrint
from aitoolbox_like.callbacks.tensorboard import TensorboardFullTracking, TensorboardParameterHistograms
from aitoolbox_like.callbacks.weight_averaging import StochasticWeightAveraging
from aitoolbox_like.tracking import TrainLoopCheckpoint
from ddp_common import rank, regression_data

#: The default shard policy's threshold in these tests: only ``BigChildRegressor.body`` (272 parameters) reaches it.
MIN_NUM_PARAMS = 200


class BigChildRegressor(TTBasicModel):
    """One big child (``body``, 272 parameters) between two small ones (80 and 17)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 16)
        self.body = nn.Linear(16, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(torch.tanh(self.body(torch.tanh(self.inp(x)))))


class BatchNormRegressor(TTBasicModel):
    """A model with BatchNorm statistics for SWA's update_bn."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.norm = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(torch.tanh(self.norm(self.inp(x))))


def inspected_layers(model):
    """What the gradient callbacks inspect: modules (their weight) and a parameter."""
    return [model.inp, model.body.weight, model.head]


def swa():
    return StochasticWeightAveraging(swa_start_epoch=1, swa_lr=0.02, anneal_epochs=1)


def tracked_loop(folder, model_cls=BigChildRegressor, gpu_mode='fsdp', per_rank_batch=4):
    torch.manual_seed(0)
    model = model_cls()
    train = DataLoader(regression_data(32, 1), batch_size=per_rank_batch, shuffle=False)
    val = DataLoader(regression_data(7, 2), batch_size=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return TrainLoopCheckpoint(model, train, val, None, optimizer, nn.MSELoss(), 'proj', 'exp', str(folder),
                               {'lr': 0.05}, cloud_save_mode='local', gpu_mode=gpu_mode, progress_bar=False)


def _save(out_dir, name, value):
    torch.save(value, os.path.join(out_dir, f'{name}_rank{rank()}.pt'))


class RecordFSDPUnits(AbstractCallback):
    """Writes the names of the modules that are FSDP units (``fully_shard`` applied) in each process."""

    def __init__(self, out_dir):
        super().__init__('record FSDP units')
        self.out_dir = out_dir

    def on_train_begin(self):
        units = [name for name, module in self.train_loop_obj.model.named_modules() if isinstance(module, FSDPModule)]
        with open(os.path.join(self.out_dir, f'fsdp_units_rank{rank()}.json'), 'w') as f:
            json.dump(units, f)


class RecordedGradientStats(GradientStatsPrint):
    """GradientStatsPrint that also keeps every epoch's ``last_stats`` and saves them per rank at the end."""

    def __init__(self, out_dir):
        super().__init__(inspected_layers)
        self.out_dir = out_dir
        self.per_epoch = []

    def on_epoch_end(self):
        self.last_stats = None
        super().on_epoch_end()
        self.per_epoch.append(self.last_stats)

    def on_train_end(self):
        _save(self.out_dir, 'grad_stats', self.per_epoch)


class RecordedGradPlot(GradDistributionPlot):
    """GradDistributionPlot that also keeps every epoch's plotted gradients and saves them (and the paths it wrote)
    per rank at the end."""

    def __init__(self, out_dir):
        super().__init__(inspected_layers, bins=10)
        self.out_dir = out_dir
        self.per_epoch = []

    def on_epoch_end(self):
        self.last_gradients = None
        super().on_epoch_end()
        self.per_epoch.append(self.last_gradients)

    def on_train_end(self):
        _save(self.out_dir, 'grad_plot', {'gradients': self.per_epoch, 'paths': self.saved_plot_paths})


def reporting_callbacks(out_dir, tb_dir):
    """Every callback that reads whole parameters or gradients, and SWA."""
    return [RecordFSDPUnits(out_dir), RecordedGradientStats(out_dir), RecordedGradPlot(out_dir),
            TensorboardParameterHistograms(log_dir=os.path.join(tb_dir, 'histograms'), is_project=False),
            TensorboardFullTracking(histogram_frequency=2, log_dir=os.path.join(tb_dir, 'full'), is_project=False),
            swa()]


class SaveWholeWeightsAtEpochEnd(AbstractCallback):
    """After each epoch (SWA averages there, at order 2), every rank gathers the whole weights; rank 0 keeps them. At
    the end (after SWA's on_train_end) each rank saves those and its model's BatchNorm statistics."""

    def __init__(self, out_dir):
        super().__init__('save whole weights', execution_order=50)
        self.out_dir = out_dir
        self.weights = []

    def whole_parameters(self):
        from aitoolbox_like.distributed import full_tensor
        return {name: full_tensor(p.detach()).clone() for name, p in self.train_loop_obj.model.named_parameters()}

    def on_epoch_end(self):
        self.weights.append(self.whole_parameters())

    def on_train_end(self):
        norm = self.train_loop_obj.model.norm
        _save(self.out_dir, 'weights', {'epoch_end': self.weights, 'final': self.whole_parameters(),
                                        'running_mean': norm.running_mean.clone(),
                                        'running_var': norm.running_var.clone()})
