"""Models, data and callbacks shared by tests/distributed/test_ddp.py and the torchrun script. They live in a module
(not in the test file) so spawned and torchrun processes can import them by name."""
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import AbstractCallback, TTBasicModel


class Regressor(TTBasicModel):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x):
        return self.net(x)


def regression_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def equivalence_setup():
    """Model, per-rank loader (batches of 4) and optimizer; two ranks reading it with a DistributedSampler see
    the same global batches of 8 as ``reference_loader``."""
    torch.manual_seed(0)
    model = Regressor()
    train = DataLoader(regression_data(32, 1), batch_size=4, shuffle=False)
    val = DataLoader(regression_data(7, 2), batch_size=4)
    return model, train, val, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def build_validation_loader():
    return DataLoader(regression_data(7, 2), batch_size=3)


def reference_loader():
    return DataLoader(regression_data(32, 1), batch_size=8, shuffle=False)


def rank():
    import torch.distributed as dist
    return dist.get_rank() if dist.is_initialized() else 0


class MarkRun(AbstractCallback):
    """Appends the number of epochs trained to the file <name>_rank<k> in ``out_dir`` each time on_train_end
    runs."""

    def __init__(self, name, out_dir, device_idx_execution=None):
        super().__init__(name, device_idx_execution=device_idx_execution)
        self.out_dir = out_dir

    def on_train_end(self):
        path = os.path.join(self.out_dir, f'{self.callback_name}_rank{rank()}')
        with open(path, 'a') as f:
            f.write(str(len(self.train_loop_obj.train_history['accumulated_loss'])))


class SaveFinalWeights(AbstractCallback):
    def __init__(self, out_dir):
        super().__init__('save final weights of each rank')
        self.out_dir = out_dir

    def on_train_end(self):
        torch.save(self.train_loop_obj.model.state_dict(), os.path.join(self.out_dir, f'weights_rank{rank()}.pt'))


class SavePredictions(AbstractCallback):
    """Every rank predicts (a collective); each saves what it got."""

    def __init__(self, out_dir):
        super().__init__('save gathered predictions')
        self.out_dir = out_dir

    def on_train_end(self):
        loop = self.train_loop_obj
        torch.save({'train': loop.predict_on_train_set(), 'val': loop.predict_on_validation_set()},
                   os.path.join(self.out_dir, f'predictions_rank{rank()}.pt'))


class StopOnRank(AbstractCallback):
    """Runs on one rank only and asks for early stopping there after the first epoch."""

    def __init__(self, stop_rank):
        super().__init__('early stop on one rank', device_idx_execution=stop_rank)

    def on_epoch_end(self):
        self.train_loop_obj.early_stop = True


class PredictOnRankZero(AbstractCallback):
    """Wrong on purpose: a rank-0-only callback calling a collective."""

    def __init__(self):
        super().__init__('rank-0 predictor', device_idx_execution=0)

    def on_epoch_end(self):
        self.train_loop_obj.predict_on_validation_set()


class SaveMicroBatchGradients(AbstractCallback):
    """Saves this rank's first-layer gradient after each backward of the first epoch."""

    def __init__(self, out_dir):
        super().__init__('save gradients after backward')
        self.out_dir = out_dir
        self.gradients = []

    def on_after_backward(self):
        if self.train_loop_obj.epoch == 0:
            self.gradients.append(self.train_loop_obj.model.net[0].weight.grad.clone())

    def on_train_end(self):
        torch.save(self.gradients, os.path.join(self.out_dir, f'gradients_rank{rank()}.pt'))


class SkipAndEndOnRanks(AbstractCallback):
    """Calls skip_update() in on_after_backward of the batches ``skip_at`` and end_epoch() in on_after_backward of
    ``end_at`` ({epoch: batch index}), on the ranks ``ranks`` (None: every rank it runs on)."""
    may_skip_updates = True
    may_end_epochs = True

    def __init__(self, skip_at, end_at, ranks=None, device_idx_execution=None):
        super().__init__('skip and end on ranks', device_idx_execution=device_idx_execution)
        self.skip_at, self.end_at, self.ranks = set(skip_at), dict(end_at), ranks

    def on_after_backward(self):
        loop = self.train_loop_obj
        if self.ranks is not None and rank() not in self.ranks:
            return
        if loop.total_iteration_idx in self.skip_at:
            loop.skip_update()
        if self.end_at.get(loop.epoch) == loop.iteration:
            loop.end_epoch()


def spiking_setup():
    """equivalence_setup's run with one sample whose target is 1000 times too large: read by rank 0 alone, in the
    third batch of every epoch (two ranks, batches of 4, no shuffling)."""
    model, train, val, optimizer = equivalence_setup()
    x, y = train.dataset.tensors
    y = y.clone()
    y[18] *= 1000
    return model, DataLoader(TensorDataset(x, y), batch_size=4, shuffle=False), val, optimizer
