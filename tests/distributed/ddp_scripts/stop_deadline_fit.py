"""Slow training steps and a stop that must meet a deadline: started by tests/distributed/test_slurm.py with ``srun``
in a batch job and by tests/distributed/test_elastic.py under torchrun; its callbacks are also used by
tests/callbacks/test_preemption.py (the ranks of a fit import this module by name).

``stop_deadline_fit.py OUT_DIR [--step-s S] [--mark-at IDX] [--samples N] [--batch-size B] [--epochs E]
[--sleep-loader-at IDX] [--slow-save-epoch E] [--slow-validation-epoch E] [--phase-s S]``

It is the script users are told to write (TrainLoop(gpu_mode='ddp'), a checkpoint callback, so the default
PreemptionCheckpoint, and ``fit(resume_from='auto')``) with a model whose forward sleeps ``--step-s`` seconds in the
first run of the job (a large model's step; a requeued or restarted run trains at full speed). Every rank records
the end time of each trained batch in ``steps_run<RUN>_rank<R>.jsonl`` (one line per batch: total_iteration_idx,
time, samples), writes ``begun_run<RUN>_rank<R>`` (time, pid) when batch ``--mark-at`` begins (the test sends its
signal then) and, at the end of the fit, ``stopped_run<RUN>_rank<R>.json`` (the last batch, the stop reason, the
checkpoint).
RUN is DEADLINE_RUN, else SLURM_RESTART_COUNT or TORCHELASTIC_RESTART_COUNT (0 in the first run).

A slow phase, unless the launcher restarted the job (SLURM_RESTART_COUNT, TORCHELASTIC_RESTART_COUNT), ``--phase-s``
seconds long, after which every rank writes
``phase_run<RUN>_rank<R>`` (time, pid) when it begins: ``--sleep-loader-at IDX``, the wait for batch IDX (the
dataset's read of its first sample sleeps); ``--slow-save-epoch E``, the checkpoint write at the end of epoch E
(the storage is slow); ``--slow-validation-epoch E``, the validation pass of epoch E (each of its batches sleeps).
"""
import argparse
import json
import os
import signal
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from aitoolbox_like import AbstractCallback, TrainLoop
from aitoolbox_like.callbacks.model_save import ModelCheckpoint
from aitoolbox_like.callbacks.preemption import PreemptionCheckpoint, find_preemption_callback
from elastic_fit import IndexedRegression, Net

RESTARTS = int(os.environ.get('SLURM_RESTART_COUNT') or os.environ.get('TORCHELASTIC_RESTART_COUNT') or 0)
RUN = int(os.environ.get('DEADLINE_RUN') or RESTARTS)


def mark_phase(out_dir):
    """Write ``phase_run<RUN>_rank<R>`` (the time and this process's pid): a slow phase begins."""
    with open(os.path.join(out_dir, f'phase_run{RUN}_rank{dist.get_rank()}'), 'w') as file:
        json.dump({'time': time.time(), 'pid': os.getpid()}, file)


class SleepyReads(torch.utils.data.Dataset):
    """``dataset`` whose read of sample number ``at`` (in reading order, 0-based) first sleeps ``seconds``."""

    def __init__(self, dataset, at, seconds, out_dir):
        self.dataset, self.at, self.seconds, self.out_dir, self.reads = dataset, at, seconds, out_dir, 0

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        if self.reads == self.at:
            mark_phase(self.out_dir)
            time.sleep(self.seconds)
        self.reads += 1
        return self.dataset[index]


class SlowCheckpoint(ModelCheckpoint):
    """ModelCheckpoint on slow storage: its write at the end of epoch ``epoch`` takes ``seconds`` more."""

    def __init__(self, epoch, seconds, out_dir, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.slow_epoch, self.seconds, self.out_dir = epoch, seconds, out_dir

    def save_checkpoint(self, iteration_idx=None, wait=False, all_ranks=None):
        if iteration_idx is None and self.train_loop_obj.epoch == self.slow_epoch:
            mark_phase(self.out_dir)
            time.sleep(self.seconds)
        return super().save_checkpoint(iteration_idx, wait, all_ranks)


class SlowValidation(AbstractCallback):
    """Each batch of the validation pass of epoch ``epoch`` sleeps ``seconds``; records the batches evaluated."""

    def __init__(self, epoch, seconds, out_dir):
        super().__init__('slow validation')
        self.epoch, self.seconds, self.out_dir = epoch, seconds, out_dir

    def on_eval_begin(self, dataset_info):
        if self.train_loop_obj.epoch == self.epoch and self.seconds:
            mark_phase(self.out_dir)

    def on_eval_batch_begin(self, batch, dataset_info):
        if self.train_loop_obj.epoch == self.epoch:
            time.sleep(self.seconds)


class SlowNet(Net):
    """elastic_fit.py's model; its forward sleeps ``step_s`` seconds (a step of a large model)."""

    def __init__(self, step_s=0.0):
        super().__init__()
        self.step_s = step_s

    def forward(self, x):
        if self.step_s:
            time.sleep(self.step_s)
        return super().forward(x)


class RecordSteps(AbstractCallback):
    """The files named in the module's docstring, in ``out_dir``."""

    def __init__(self, out_dir, mark_at=None):
        super().__init__('record steps', execution_order=-50)
        self.out_dir, self.mark_at = out_dir, mark_at

    def _path(self, name):
        return os.path.join(self.out_dir, f'{name}_run{RUN}_rank{self.train_loop_obj.global_rank}')

    def on_batch_begin(self):
        if self.train_loop_obj.total_iteration_idx == self.mark_at:
            with open(self._path('begun'), 'w') as file:
                json.dump({'time': time.time(), 'pid': os.getpid()}, file)

    def on_batch_end(self):
        loop = self.train_loop_obj
        with open(self._path('steps') + '.jsonl', 'a') as file:
            file.write(json.dumps({'idx': loop.total_iteration_idx, 'epoch': loop.epoch, 'time': time.time(),
                                   'samples': loop.batch[0].tolist()}) + '\n')

    def on_train_end(self):        # before PreemptionCheckpoint's (which ends the process in a SLURM job)
        loop = self.train_loop_obj
        preemption = find_preemption_callback(loop)
        with open(self._path('stopped') + '.json', 'w') as file:
            json.dump({'last': loop.total_iteration_idx, 'time': time.time(),
                       'stop_reason': preemption.stop_reason if preemption else None,
                       'checkpoint_path': preemption.checkpoint_path if preemption else None,
                       'stop_latency_s': preemption.stop_latency_s if preemption else None,
                       'epochs_completed': loop.epochs_completed,
                       'val_loss': list(loop.train_history.get('val_loss', []))}, file)


# ---- for the in-process DDP test (tests/callbacks/test_preemption.py)


class SleepInSteps(AbstractCallback):
    """Sleeps ``seconds`` in every training step whose total_iteration_idx is in ``steps`` (slow steps)."""

    def __init__(self, steps, seconds):
        super().__init__('sleep in steps')
        self.steps, self.seconds = set(steps), seconds

    def on_batch_begin(self):
        if self.train_loop_obj.total_iteration_idx in self.steps:
            time.sleep(self.seconds)


class SignalOnRank(AbstractCallback):
    """Sends ``signum`` to this process (a real signal, handled between two bytecodes) in step ``batch_idx`` on rank
    ``rank`` only, as a signal reaching one process of the group."""

    def __init__(self, rank, batch_idx, signum=signal.SIGTERM):
        super().__init__('signal one rank')
        self.rank, self.batch_idx, self.signum = rank, batch_idx, signum

    def on_batch_begin(self):
        loop = self.train_loop_obj
        if loop.global_rank == self.rank and loop.total_iteration_idx == self.batch_idx:
            os.kill(os.getpid(), self.signum)


class RecordAgreements(PreemptionCheckpoint):
    """PreemptionCheckpoint that writes, per rank, each agreement step and the stride it chose, and how it ended, to
    ``<out_dir>/agreements_rank<R>.json``."""

    def __init__(self, out_dir, **kwargs):
        super().__init__(**kwargs)
        self.out_dir, self.agreements = out_dir, []

    def _agreed_stop(self):
        stop = super()._agreed_stop()
        self.agreements.append([self.train_loop_obj.total_iteration_idx, self._stride, stop])
        return stop

    def on_train_end(self):
        loop = self.train_loop_obj
        with open(os.path.join(self.out_dir, f'agreements_rank{loop.global_rank}.json'), 'w') as file:
            json.dump({'agreements': self.agreements, 'last': loop.total_iteration_idx,
                       'stop_reason': self.stop_reason, 'received_signal': self.received_signal,
                       'checkpoint_path': self.checkpoint_path}, file)
        super().on_train_end()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('out_dir')
    parser.add_argument('--step-s', type=float, default=0.0, help='seconds each step sleeps in the first run')
    parser.add_argument('--mark-at', type=int, default=None)
    parser.add_argument('--samples', type=int, default=64)
    parser.add_argument('--batch-size', type=int, default=4)
    parser.add_argument('--epochs', type=int, default=1)
    parser.add_argument('--sleep-loader-at', type=int, default=None)
    parser.add_argument('--slow-save-epoch', type=int, default=None)
    parser.add_argument('--slow-validation-epoch', type=int, default=None)
    parser.add_argument('--phase-s', type=float, default=60.0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    first = RESTARTS == 0
    model = SlowNet(args.step_s if RUN == 0 else 0.0)
    data = IndexedRegression(args.samples)
    if first and args.sleep_loader_at is not None:
        data = SleepyReads(data, args.sleep_loader_at * args.batch_size, args.phase_s, args.out_dir)
    train = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    validation = None
    if args.slow_validation_epoch is not None:
        validation = DataLoader(IndexedRegression(8 * args.batch_size), batch_size=args.batch_size)
    loop = TrainLoop(model, train, validation, None, torch.optim.Adam(model.parameters(), lr=1e-2), nn.MSELoss(),
                     gpu_mode='ddp')
    saver_args = ('deadline', 'run', os.path.join(args.out_dir, 'exp'), {})
    saver_kwargs = dict(cloud_save_mode='local', async_save=False)
    if first and args.slow_save_epoch is not None:
        saver = SlowCheckpoint(args.slow_save_epoch, args.phase_s, args.out_dir, *saver_args, **saver_kwargs)
    else:
        saver = ModelCheckpoint(*saver_args, **saver_kwargs)
    callbacks = [saver, RecordSteps(args.out_dir, args.mark_at)]
    if validation is not None:
        # Each of the pass's 4 batches per rank sleeps: 4 * phase_s seconds.
        callbacks.append(SlowValidation(args.slow_validation_epoch, args.phase_s / 4 if first else 0.0,
                                        args.out_dir))
    loop.fit(num_epochs=args.epochs, callbacks=callbacks, resume_from='auto', on_gpu=False)
    if dist.get_rank() == 0 and loop.interrupted is None:
        torch.save({'weights': model.state_dict(), 'world_size': dist.get_world_size()},
                   os.path.join(args.out_dir, 'final.pt'))
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
