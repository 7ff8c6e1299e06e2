"""Data, loop and callbacks of tests/distributed/test_fsdp_defects.py (a module, so that spawned processes import them by name).
Model, data and global batches are those of fsdp_common / ddp_common: 32 samples, 4 global batches of 8 per epoch
(4 per rank on 2 ranks).

When the environment variable SLOW_COPY_ENV holds a number of seconds at import, every copy of shards that an
asynchronous sharded save leaves to the stager's thread first sleeps that long: a copy that outlasts the next
step's forward and backward, so that the step's optimizer must wait for it.
"""
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from aitoolbox_like import AbstractCallback
from aitoolbox_like.checkpoint import sharded as sharded_checkpoint
from aitoolbox_like.tracking import TrainLoopCheckpoint
from ddp_common import equivalence_setup, regression_data

SLOW_COPY_ENV = 'AITOOLBOX_LIKE_TEST_SLOW_SHARD_COPY'


def _sleep_before_copy():
    time.sleep(float(os.environ[SLOW_COPY_ENV]))


if os.environ.get(SLOW_COPY_ENV):
    sharded_checkpoint.HostStager.before_copy = _sleep_before_copy


def rank():
    return dist.get_rank() if dist.is_initialized() else 0


class FailingData(Dataset):
    """ddp_common's training data; once armed (``armed = True``, by :class:`FailNextFetch`), fetching any sample
    raises OSError: a data source that goes away between two training steps."""

    def __init__(self):
        self.data = regression_data(32, 1)
        self.armed = False

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        if self.armed:
            raise OSError('the data storage went away')
        return self.data[index]


class FailNextFetch(AbstractCallback):
    """Arms the loop's FailingData at the end of global batch ``batch_idx`` on the ranks ``on_ranks``: the fetch of
    the next batch fails there."""

    def __init__(self, batch_idx, on_ranks=(0, 1)):
        super().__init__('fail the next fetch')
        self.batch_idx, self.on_ranks = batch_idx, tuple(on_ranks)

    def on_batch_end(self):
        loop = self.train_loop_obj
        if loop.total_iteration_idx == self.batch_idx and rank() in self.on_ranks:
            loop.train_loader.dataset.armed = True


class SaveWholeWeightsAfter(AbstractCallback):
    """Rank 0 saves the whole model state (gathered from every rank's shards: a collective of every rank) after
    global batch ``batch_idx`` into ``OUT/weights_after_<batch_idx>.pt``."""

    def __init__(self, batch_idx, out_dir):
        super().__init__('save whole weights after a batch')
        self.batch_idx, self.out_dir = batch_idx, out_dir

    def on_batch_end(self):
        loop = self.train_loop_obj
        if loop.total_iteration_idx == self.batch_idx:
            model_state, _ = sharded_checkpoint.full_state(loop)
            if rank() == 0:
                torch.save(model_state, os.path.join(self.out_dir, f'weights_after_{self.batch_idx}.pt'))


class RecordStepWaits(AbstractCallback):
    """Each rank saves, after global batch ``batch_idx``, how long its optimizer steps have waited for copies of
    checkpoint shards so far (``OUT/step_waits_rank<r>.pt``)."""

    def __init__(self, batch_idx, out_dir):
        super().__init__('record step waits')
        self.batch_idx, self.out_dir = batch_idx, out_dir

    def on_batch_end(self):
        if self.train_loop_obj.total_iteration_idx == self.batch_idx:
            path = os.path.join(self.out_dir, f'step_waits_rank{rank()}.pt')
            torch.save(sharded_checkpoint.step_wait_seconds(), path)


def failing_data_loop(folder, iteration_save_freq=0):
    """fsdp_checkpoint_common.checkpoint_loop's run over FailingData (the same samples, in the same order)."""
    model, _, val, optimizer = equivalence_setup()
    train = DataLoader(FailingData(), batch_size=4, shuffle=False)
    return TrainLoopCheckpoint(model, train, val, None, optimizer, nn.MSELoss(), 'proj', 'exp', str(folder),
                               {'lr': 0.05}, cloud_save_mode='local', gpu_mode='fsdp', progress_bar=False,
                               iteration_save_freq=iteration_save_freq)
