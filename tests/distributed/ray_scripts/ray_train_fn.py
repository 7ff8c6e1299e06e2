"""The training function Ray Train's workers run in tests/distributed/test_ray.py, and the loop it trains. A module (not the test
file) so that Ray's worker processes import it by name (the test puts this folder on their PYTHONPATH)."""
import os
import signal

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import AbstractCallback, TrainLoop, TTBasicModel
from aitoolbox_like.adapters.ray import RayTrainReport

NUM_EPOCHS = 3
#: The epoch and the batch (of this rank's shard) after which rank 1 kills its own process, once.
KILL_AT = (1, 1)


class Classifier(TTBasicModel):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)


def build_loop(seed=0, gpu_mode='ddp'):
    """The same TrainLoop in every process: seeded model, 64 samples in batches of 8 (per rank under DDP)."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    train = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    val = DataLoader(TensorDataset(x[:24], y[:24]), batch_size=8)
    model = Classifier()
    return TrainLoop(model, train, val, None, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                     nn.CrossEntropyLoss(), gpu_mode=gpu_mode)


class KillOnce(AbstractCallback):
    """Rank 1 SIGKILLs its own process inside epoch KILL_AT[0], once (``marker`` records it).

    The checkpoint of the epoch before is registered by Ray by then: RayTrainReport(wait_for_commit=True) keeps rank 0
    waiting for that after its report, and rank 1 cannot finish a batch of the next epoch before rank 0 joins that
    batch's gradient all-reduce. (Without the wait, a kill inside Ray's ~2 s collection interval would restart from
    the start: the same weights, but no resume to test.)"""

    def __init__(self, marker):
        super().__init__('kill once', device_idx_execution=1)
        self.marker = marker

    def on_batch_end(self):
        loop = self.train_loop_obj
        if (loop.epoch, loop.iteration) != KILL_AT or os.path.exists(self.marker):
            return
        with open(self.marker, 'w') as f:
            f.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)


class RecordStart(AbstractCallback):
    """Rank 0 appends the number of epochs already done when training starts (after any resume): one line per
    attempt Ray made."""

    def __init__(self, path):
        super().__init__('record start', device_idx_execution=0)
        self.path = path

    def on_train_begin(self):
        with open(self.path, 'a') as f:
            f.write(f'{self.train_loop_obj.epochs_completed}\n')


def train_fn(config):
    """What each Ray worker runs: the loop code is the same as outside Ray, plus RayTrainReport and 'auto'."""
    torch.set_num_threads(1)
    loop = build_loop()
    callbacks = [RayTrainReport(wait_for_commit=True), RecordStart(config['starts_file']),
                 KillOnce(config['kill_marker'])]
    loop.fit(num_epochs=NUM_EPOCHS, callbacks=callbacks, resume_from='auto')
