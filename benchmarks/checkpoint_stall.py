"""Checkpoint stall: how long the training loop stops for one checkpoint, synchronous vs asynchronous saving.

For models of 25, 100 and 400 MB (a stack of bias-free nn.Linear(1024, 1024) layers, fp32, plain SGD so the
checkpoint is about the model's size) it trains a TrainLoop with a ModelIterationCheckpoint, once with
``async_save=False`` and once with ``async_save=True``, in the same process, and times every save from the call
(``save_checkpoint``) to the loop continuing. Saves are spaced (every N steps) so that the training between two
saves is longer than one synchronous write, as in a real run; an async save that still had to wait for the
previous write would show up in its stall (nothing is left out).

Printed per size and mode: the first save's stall (the async writer allocates its host buffers then; later saves
reuse them), the median and the max over all saves, and the whole fit's time. An asynchronous write's ``torch.save``
holds the interpreter lock while it pickles, so a training step that runs Python meanwhile waits for it: the fit's
time shows what the stall alone does not, how much of the write the steps beside it hid (a fit the length of the
synchronous one hid none). The last lines are ``async/sync stall at 100 MB: R``, the ratio of the medians, and
``async/sync fit time at 100 MB: R``.

``--fsdp`` measures sharded checkpoints instead: the same models trained with ``gpu_mode='fsdp'`` on 2 CPU processes
(gloo; each layer its own FSDP unit), every rank writing its shards with torch.distributed.checkpoint, synchronously
or in the background (over a checkpoint process group); the stall is rank 0's, the spacing of saves the same as
without it. An asynchronous mid-epoch save may leave the copy of the shards to host memory running into the next
step, whose optimizer step waits for it: that wait counts in the save's stall too
(``sharded_checkpoint.step_wait_seconds``). The last line is then ``fsdp async/sync stall at 100 MB: R``.

Usage: python benchmarks/checkpoint_stall.py [--sizes 25 100 400] [--saves 6] [--dir FOLDER] [--fsdp]
"""
import argparse
import json
import math
import os
import shutil
import statistics
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TrainLoop, TTBasicModel
from aitoolbox_like.checkpoint import sharded as sharded_checkpoint
from aitoolbox_like.callbacks.model_save import ModelIterationCheckpoint
from aitoolbox_like.checkpoint import atomic_torch_save

WIDTH = 1024
BATCH_SIZE = 4


class LinearStack(TTBasicModel):
    def __init__(self, n_layers):
        super().__init__()
        self.layers = nn.Sequential(*(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(n_layers)))

    def forward(self, x):
        return self.layers(x)


class TimedCheckpoint(ModelIterationCheckpoint):
    """Records how long each save held the training loop: the save_checkpoint call, plus the time optimizer steps
    after it waited for its copy of the shards (sharded saves); with ``stall_file``, the main process writes them
    there at the end of fit (an FSDP fit trains in other processes)."""

    def __init__(self, *args, stall_file=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.stalls = []
        self.stall_file = stall_file
        self.step_waits_seen = 0.0

    def save_checkpoint(self, iteration_idx=None, wait=False):
        self.count_step_waits()
        start = time.perf_counter()
        path = super().save_checkpoint(iteration_idx, wait)
        self.stalls.append(time.perf_counter() - start)
        return path

    def count_step_waits(self):
        # Steps wait only for the copy of the latest save (the next save waits for it to be complete).
        waited = sharded_checkpoint.step_wait_seconds()
        if self.stalls:
            self.stalls[-1] += waited - self.step_waits_seen
        self.step_waits_seen = waited

    def on_train_end(self):
        self.count_step_waits()
        super().on_train_end()
        if self.stall_file is not None and self.train_loop_obj.is_main_process():
            with open(self.stall_file, 'w') as f:
                json.dump(self.stalls, f)


def n_layers_for(megabytes):
    return max(1, round(megabytes * 1e6 / (WIDTH * WIDTH * 4)))


def estimate(model, folder):
    """(seconds per training step, seconds for one synchronous write of the model's state)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(BATCH_SIZE, WIDTH)
    times = []
    for _ in range(4):
        start = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), x).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    writes = []
    for _ in range(2):
        start = time.perf_counter()
        atomic_torch_save(model.state_dict(), os.path.join(folder, 'estimate.pth'))
        writes.append(time.perf_counter() - start)
        os.remove(os.path.join(folder, 'estimate.pth'))
    return statistics.median(times[1:]), max(writes)


def run(megabytes, async_save, save_every, saves, folder, fsdp=False):
    torch.manual_seed(0)
    model = LinearStack(n_layers_for(megabytes))
    # One batch more than the saves span: the last save is then at the last batch, and the epoch-end save that
    # follows (no training in between) is the one left out below.
    steps = save_every * saves + 1
    processes = 2 if fsdp else 1
    samples = steps * BATCH_SIZE * processes     # each process trains `steps` batches
    data = TensorDataset(torch.randn(samples, WIDTH), torch.randn(samples, WIDTH))
    loader = DataLoader(data, batch_size=BATCH_SIZE)
    stall_file = os.path.join(folder, 'stalls.json') if fsdp else None
    saver = TimedCheckpoint(save_every, 'bench', f'{megabytes}mb_{"async" if async_save else "sync"}', folder,
                            {'size_mb': megabytes}, cloud_save_mode='local', monitor='not_tracked',
                            async_save=async_save, stall_file=stall_file)
    loop = TrainLoop(model, loader, None, None, torch.optim.SGD(model.parameters(), lr=1e-4), nn.MSELoss(),
                     end_auto_eval=False, progress_bar=False, gpu_mode='fsdp' if fsdp else 'single')
    start = time.perf_counter()
    if fsdp:
        loop.fit(num_epochs=1, callbacks=[saver], num_gpus=processes, on_gpu=False)
        with open(stall_file) as f:
            all_stalls = json.load(f)
        os.remove(stall_file)
    else:
        loop.fit(num_epochs=1, callbacks=[saver])
        all_stalls = saver.stalls
    fit_seconds = time.perf_counter() - start
    # The epoch-end save comes right after the last iteration save (no training in between): left out.
    stalls = all_stalls[:saves]
    shutil.rmtree(os.path.join(folder, 'bench'), ignore_errors=True)
    return stalls, fit_seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--sizes', type=int, nargs='+', default=[25, 100, 400])
    parser.add_argument('--saves', type=int, default=6)
    parser.add_argument('--dir', default=None, help='where checkpoints are written (default: a temp folder)')
    parser.add_argument('--fsdp', action='store_true',
                        help="sharded checkpoints of gpu_mode='fsdp' on 2 CPU processes instead of one process")
    args = parser.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    folder = tempfile.mkdtemp(prefix='checkpoint_stall_', dir=args.dir)
    rows = []
    medians, fits = {}, {}
    try:
        for megabytes in args.sizes:
            step_s, write_s = estimate(LinearStack(n_layers_for(megabytes)), folder)
            save_every = max(2, math.ceil(3.0 * write_s / step_s))
            for async_save in (False, True):
                stalls, fit_seconds = run(megabytes, async_save, save_every, args.saves, folder, args.fsdp)
                mode = 'async' if async_save else 'sync'
                medians[megabytes, mode] = statistics.median(stalls)
                fits[megabytes, mode] = fit_seconds
                rows.append((megabytes, mode, save_every, len(stalls), stalls[0], statistics.median(stalls),
                             max(stalls), fit_seconds))
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    print(f'{"model":>7} {"mode":>6} {"every":>6} {"saves":>6} {"first ms":>9} {"median ms":>10} {"max ms":>8} '
          f'{"fit s":>7}')
    for megabytes, mode, every, count, first, median, worst, fit_seconds in rows:
        print(f'{megabytes:>5}MB {mode:>6} {every:>6} {count:>6} {first * 1e3:>9.1f} {median * 1e3:>10.1f} '
              f'{worst * 1e3:>8.1f} {fit_seconds:>7.2f}')
    label = 'fsdp ' if args.fsdp else ''
    for megabytes in args.sizes:
        print(f'{label}{megabytes} MB: async/sync median stall '
              f'{medians[megabytes, "async"] / medians[megabytes, "sync"]:.3f}')
    if 100 in args.sizes:
        print(f'{label}async/sync stall at 100 MB: {medians[100, "async"] / medians[100, "sync"]:.3f}')
        print(f'{label}async/sync fit time at 100 MB: {fits[100, "async"] / fits[100, "sync"]:.3f}')


if __name__ == '__main__':
    main()
