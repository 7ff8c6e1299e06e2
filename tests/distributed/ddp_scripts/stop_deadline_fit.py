"""Slow training steps and a stop that must meet a deadline: started by tests/distributed/test_slurm.py with ``srun``
in a batch job and by tests/distributed/test_elastic.py under torchrun; its callbacks are also used by
tests/callbacks/test_preemption.py (the ranks of a fit import this module by name).

``stop_deadline_fit.py OUT_DIR [--step-s S] [--mark-at IDX] [--samples N] [--batch-size B] [--epochs E]``

It is the script users are told to write (TrainLoop(gpu_mode='ddp'), a checkpoint callback, so the default
PreemptionCheckpoint, and ``fit(resume_from='auto')``) with a model whose forward sleeps ``--step-s`` seconds in the
first run of the job (a large model's step; a requeued or restarted run trains at full speed). Every rank records
the end time of each trained batch in ``steps_run<RUN>_rank<R>.jsonl`` (one line per batch: total_iteration_idx,
time, samples), writes ``begun_run<RUN>_rank<R>`` (time, pid) when batch ``--mark-at`` begins (the test sends its
signal then) and, at the end of the fit, ``stopped_run<RUN>_rank<R>.json`` (the last batch, the stop reason, the
checkpoint).
RUN is SLURM_RESTART_COUNT or TORCHELASTIC_RESTART_COUNT (0 in the first run).
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

RUN = int(os.environ.get('SLURM_RESTART_COUNT') or os.environ.get('TORCHELASTIC_RESTART_COUNT') or 0)


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
                       'checkpoint_path': preemption.checkpoint_path if preemption else None}, file)


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
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = SlowNet(args.step_s if RUN == 0 else 0.0)
    train = DataLoader(IndexedRegression(args.samples), batch_size=args.batch_size, shuffle=True)
    loop = TrainLoop(model, train, None, None, torch.optim.Adam(model.parameters(), lr=1e-2), nn.MSELoss(),
                     gpu_mode='ddp')
    callbacks = [ModelCheckpoint('deadline', 'run', os.path.join(args.out_dir, 'exp'), {}, cloud_save_mode='local',
                                 async_save=False),
                 RecordSteps(args.out_dir, args.mark_at)]
    loop.fit(num_epochs=args.epochs, callbacks=callbacks, resume_from='auto', on_gpu=False)
    if dist.get_rank() == 0 and loop.interrupted is None:
        torch.save({'weights': model.state_dict(), 'world_size': dist.get_world_size()},
                   os.path.join(args.out_dir, 'final.pt'))
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
