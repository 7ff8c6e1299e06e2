"""Model, loops and references shared by tests/distributed/test_fsdp.py and its kill -9 script (a module, so spawned processes
import it by name). Global batches are those of ddp_common: 32 samples, 8 per optimizer step (4 per rank on 2
ranks, 8 on 1), SGD with momentum; gradients clipped to a total norm of 0.5, so clipping must use the norm over
every shard."""
import os
import signal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader

from aitoolbox_like import AbstractCallback
from aitoolbox_like.callbacks.gradient import GradNormClip
from aitoolbox_like.callbacks.weight_averaging import ExponentialMovingAverage
from aitoolbox_like.results.basic import RegressionResultPackage
from aitoolbox_like.tracking import TrainLoopCheckpoint, TrainLoopCheckpointEndSave
from ddp_common import equivalence_setup, reference_loader, regression_data

MAX_NORM = 0.5
EMA_DECAY = 0.9


def shard_each_layer(model):
    """The user's shard policy: each Linear its own FSDP unit, then the root."""
    fully_shard(model.net[0])
    fully_shard(model.net[2])
    fully_shard(model)


def callbacks():
    # Clipping needs the norm over every rank's shard; the EMA keeps a sharded average whose state is gathered
    # into checkpoints (swap_at_end=False: the trained weights stay the model's, comparable with the reference).
    return [GradNormClip(MAX_NORM), ExponentialMovingAverage(EMA_DECAY, evaluate_with_ema=False, swap_at_end=False)]


def tracked_loop(folder, gpu_mode='fsdp', per_rank_batch=4, end_save=False):
    model, _, val, optimizer = equivalence_setup()
    train = DataLoader(regression_data(32, 1), batch_size=per_rank_batch, shuffle=False)
    if end_save:
        return TrainLoopCheckpointEndSave(model, train, val, None, optimizer, nn.MSELoss(), 'proj', 'exp', str(folder),
                                          {'lr': 0.05}, val_result_package=RegressionResultPackage(),
                                          cloud_save_mode='local', gpu_mode=gpu_mode, progress_bar=False)
    return TrainLoopCheckpoint(model, train, val, None, optimizer, nn.MSELoss(), 'proj', 'exp', str(folder),
                               {'lr': 0.05}, cloud_save_mode='local', gpu_mode=gpu_mode, progress_bar=False)


def reference(num_epochs):
    """The same training by hand in one process over the global batches: (model, EMA of its weights)."""
    model, _, _, optimizer = equivalence_setup()
    ema = {k: v.clone() for k, v in model.state_dict().items()}
    criterion = nn.MSELoss()
    for _ in range(num_epochs):
        for x, y in reference_loader():
            criterion(model(x), y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            optimizer.step()
            optimizer.zero_grad()
            for k, v in model.state_dict().items():
                ema[k].lerp_(v, 1 - EMA_DECAY)
    return model, ema


class KillAt(AbstractCallback):
    """SIGKILL the whole run (the launching script and every rank: its process group) after the backward of global
    batch ``batch_idx``: a machine that dies in the middle of a step.

    Checkpoints are written in the background: every rank first lets its last one finish (rank 0 writes the
    pointer), so the kill lands after it; a kill during a background sharded write is tested in
    test_fsdp_checkpoints.py."""

    def __init__(self, batch_idx):
        super().__init__('kill -9 the run', execution_order=0)
        self.batch_idx = batch_idx

    def on_after_backward(self):
        loop = self.train_loop_obj
        if loop.total_iteration_idx != self.batch_idx:
            return
        for callback in loop.callbacks:
            wait = getattr(callback, 'wait_for_pending_save', None)
            if wait is not None:
                wait()
        dist.barrier()
        if loop.global_rank == 1:
            os.killpg(os.getpgid(0), signal.SIGKILL)
