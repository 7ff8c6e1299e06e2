"""Loops, references and callbacks of tests/distributed/test_fsdp_checkpoints.py and its kill -9 script (a module, so that
spawned processes import them by name). Model, data and global batches are those of fsdp_common / ddp_common.

When the environment variable BLOCK_WRITE_ENV is ``K:FOLDER`` at import, every process's K-th write of
checkpoint shards (torch.distributed.checkpoint's file-system writer) writes its files, then creates
``FOLDER/writing_rank<r>`` and never returns: a storage that stalls in the middle of a background checkpoint write,
until the test kills the run.
"""
import os
import signal
import threading

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint import filesystem
from torch.utils.data import DataLoader

from aitoolbox_like import AbstractCallback, TrainLoop
from aitoolbox_like.callbacks.model_load import ModelLoadContinueTraining
from aitoolbox_like.tracking import TrainLoopCheckpoint
from ddp_common import equivalence_setup, reference_loader, regression_data
from fsdp_common import EMA_DECAY, MAX_NORM

BLOCK_WRITE_ENV = 'AITOOLBOX_LIKE_TEST_BLOCK_DCP_WRITE'
_blocked = threading.Event()


def rank():
    return dist.get_rank() if dist.is_initialized() else 0


def _block_the_kth_write(spec):
    k, folder = spec.split(':', 1)
    real_write_data = filesystem._FileSystemWriter.write_data
    calls = []

    def write_data(self, plan, planner):
        written = real_write_data(self, plan, planner)      # this rank's shard files are on disk
        calls.append(1)
        if len(calls) == int(k):
            _blocked.set()
            open(os.path.join(folder, f'writing_rank{rank()}'), 'w').close()
            threading.Event().wait()
        return written

    filesystem._FileSystemWriter.write_data = write_data


if os.environ.get(BLOCK_WRITE_ENV):
    _block_the_kth_write(os.environ[BLOCK_WRITE_ENV])


class TrainedWhileBlocked(AbstractCallback):
    """Creates ``trained_<epoch>_<iteration>_rank<r>`` after each batch trained while a checkpoint write is stalled:
    proof that the training thread goes on during a background write."""

    def __init__(self, out_dir):
        super().__init__('marks batches trained during the stalled write')
        self.out_dir = out_dir

    def on_epoch_begin(self):
        # The stalled write starts in a background thread that, on a busy machine, may reach the storage only after
        # the few batches of the next epoch: wait for it, so that those batches are the ones trained meanwhile.
        if self.train_loop_obj.epoch == 2:
            _blocked.wait(timeout=120)

    def on_batch_end(self):
        if _blocked.is_set():
            loop = self.train_loop_obj
            open(os.path.join(self.out_dir, f'trained_{loop.epoch}_{loop.iteration}_rank{rank()}'), 'w').close()


class SignalSelfOnRank(AbstractCallback):
    """Sends ``signum`` to its own process on one rank at the end of global batch ``batch_idx`` (a scheduler's
    SIGTERM that reached one process of the job)."""

    def __init__(self, on_rank, batch_idx, signum=signal.SIGTERM):
        super().__init__('signal one rank', execution_order=0)
        self.on_rank, self.batch_idx, self.signum = on_rank, batch_idx, signum

    def on_batch_end(self):
        if rank() == self.on_rank and self.train_loop_obj.total_iteration_idx == self.batch_idx:
            os.kill(os.getpid(), self.signum)


class RecordStop(AbstractCallback):
    """Each rank saves, at on_train_end, the last global batch it trained and what its PreemptionCheckpoint did."""

    def __init__(self, out_dir):
        super().__init__('record where training stopped')
        self.out_dir = out_dir

    def on_train_end(self):
        from aitoolbox_like.callbacks.preemption import find_preemption_callback
        loop = self.train_loop_obj
        preemption = find_preemption_callback(loop)
        torch.save({'last_batch': loop.total_iteration_idx, 'stop_reason': preemption.stop_reason,
                    'checkpoint_path': preemption.checkpoint_path},
                   os.path.join(self.out_dir, f'stop_rank{rank()}.pt'))


def checkpoint_loop(folder, gpu_mode='fsdp', per_rank_batch=4, **kwargs):
    """A TrainLoopCheckpoint of fsdp_common's run; ``kwargs`` go to it (cloud_save_mode 'local' unless given)."""
    model, _, val, optimizer = equivalence_setup()
    train = DataLoader(regression_data(32, 1), batch_size=per_rank_batch, shuffle=False)
    kwargs.setdefault('cloud_save_mode', 'local')
    return TrainLoopCheckpoint(model, train, val, None, optimizer, nn.MSELoss(), 'proj', 'exp', str(folder),
                               {'lr': 0.05}, gpu_mode=gpu_mode, progress_bar=False, **kwargs)


def continued_loop(folder, experiment_timestamp, epoch_num=None, **cloud):
    """AIToolbox's way to continue an experiment: a plain single-process TrainLoop of the same run (batches of 8)
    and a ModelLoadContinueTraining of ``experiment_timestamp`` (``cloud``: its cloud_save_mode and bucket).
    Returns (loop, the ModelLoadContinueTraining callback), to register at fit."""
    model, _, val, optimizer = equivalence_setup()
    train = DataLoader(regression_data(32, 1), batch_size=8, shuffle=False)
    loop = TrainLoop(model, train, val, None, optimizer, nn.MSELoss(), progress_bar=False)
    cloud.setdefault('cloud_save_mode', 'local')
    return loop, ModelLoadContinueTraining(experiment_timestamp, epoch_num=epoch_num, project_name='proj',
                                           experiment_name='exp', local_model_result_folder_path=str(folder),
                                           **cloud)


def reference(num_epochs, grad_accumulation=1):
    """fsdp_common's training written by hand in one process (with fsdp_common.callbacks()' clipping and EMA), with
    gradient accumulation as the loop does it: each loss divided by ``grad_accumulation``, an update every
    ``grad_accumulation`` batches and at the last batch of the epoch. Returns (model, EMA of its weights, each
    epoch's mean batch loss: the loop's 'accumulated_loss')."""
    model, _, _, optimizer = equivalence_setup()
    ema = {k: v.clone() for k, v in model.state_dict().items()}
    criterion = nn.MSELoss()
    epoch_losses = []
    for _ in range(num_epochs):
        batches = list(reference_loader())
        losses = []
        for i, (x, y) in enumerate(batches):
            loss = criterion(model(x), y)
            losses.append(loss.item())
            (loss / grad_accumulation).backward()
            if (i + 1) % grad_accumulation and i != len(batches) - 1:
                continue
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            optimizer.step()
            optimizer.zero_grad()
            for k, v in model.state_dict().items():
                ema[k].lerp_(v, 1 - EMA_DECAY)
        epoch_losses.append(sum(losses) / len(losses))
    return model, ema, epoch_losses
