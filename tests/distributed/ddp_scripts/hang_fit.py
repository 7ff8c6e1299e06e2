"""A fit whose rank stops in a callback, under HangWatchdog: started by tests/distributed/test_hang_watchdog.py.

``hang_fit.py OUT_DIR [--ranks N] [--hang-rank R] [--timeout-s T]``: a DDP fit of N processes (spawned, gloo; N=1:
one process) with a ModelCheckpoint into OUT_DIR/exp; on rank R, the callback StuckCallback sleeps 300 s in
on_batch_begin of batch 3. HangWatchdog(timeout_s=T) must end every process, non-zero, long before.
"""
import argparse
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader

from aitoolbox_like import AbstractCallback, TrainLoop
from aitoolbox_like.callbacks.health import HangWatchdog
from aitoolbox_like.callbacks.model_save import ModelCheckpoint
from elastic_fit import IndexedRegression, Net


class StuckCallback(AbstractCallback):
    """A user's callback that never returns (a dead NFS mount, a lock never released): 300 s in batch 3."""

    def __init__(self, rank):
        super().__init__('stuck callback')
        self.rank = rank

    def on_batch_begin(self):
        loop = self.train_loop_obj
        if loop.global_rank == self.rank and loop.total_iteration_idx == 3:
            time.sleep(300)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('out_dir')
    parser.add_argument('--ranks', type=int, default=2)
    parser.add_argument('--hang-rank', type=int, default=1)
    parser.add_argument('--timeout-s', type=float, default=4.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Net()
    train = DataLoader(IndexedRegression(64), batch_size=4, shuffle=True)
    distributed = args.ranks > 1
    loop = TrainLoop(model, train, None, None, torch.optim.Adam(model.parameters(), lr=1e-2), nn.MSELoss(),
                     gpu_mode='ddp' if distributed else 'single', progress_bar=False)
    callbacks = [ModelCheckpoint('hang', 'run', os.path.join(args.out_dir, 'exp'), {}, cloud_save_mode='local'),
                 HangWatchdog(timeout_s=args.timeout_s), StuckCallback(args.hang_rank)]
    loop.fit(num_epochs=2, callbacks=callbacks, **(dict(num_gpus=args.ranks, on_gpu=False) if distributed else {}))


if __name__ == '__main__':
    main()
