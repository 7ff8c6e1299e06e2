"""A restartable training script, started by tests/distributed/test_elastic.py under torchrun (and by benchmarks/goodput.py):
``python -m torch.distributed.run ... elastic_fit.py OUT_DIR [--kill worker|agent] [--epochs N] ...``.

It is what docs/distributed.md tells users to write: a plain TrainLoop(gpu_mode='ddp') script with a checkpoint
callback and ``fit(resume_from='auto')``, so a restarted worker continues from the newest checkpoint. Every rank
records which samples each of its batches trained (one file per process), so the test can check that a resumed epoch
trains every sample exactly once; rank 0 writes the final weights and history once training is done.

--kill worker   the worker of rank 1 SIGKILLs itself once, after a training step inside epoch 1
--kill agent    the worker started with KILL_MY_AGENT=1 in its environment SIGKILLs its torchrun agent and itself
                (a machine lost for good)
A marker file makes the kill happen only once (the restarted worker sees it).
"""
import argparse
import json
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from aitoolbox_like import AbstractCallback, TrainLoop, TTModel
from aitoolbox_like.callbacks.model_save import ModelIterationCheckpoint

torch.set_num_threads(1)


class IndexedRegression(Dataset):
    """x, y and the sample's own index (to record which samples a batch held)."""

    def __init__(self, size):
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(size, 4, generator=generator)
        self.y = self.x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(size, 1, generator=generator)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return index, self.x[index], self.y[index]


class Net(TTModel):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x):
        return self.layers(x)

    def get_loss(self, batch_data, criterion, device):
        _, x, y = batch_data
        return criterion(self(x.to(device)), y.to(device))

    def get_predictions(self, batch_data, device):
        _, x, y = batch_data
        return self(x.to(device)).detach().cpu(), y, {}


class RecordSamples(AbstractCallback):
    """Append (epoch, batch index in the epoch, sample indices) of every trained batch to this process's file."""

    def __init__(self, out_dir):
        super().__init__('record samples', execution_order=-50)
        self.out_dir = out_dir

    def on_batch_end(self):
        loop = self.train_loop_obj
        path = os.path.join(self.out_dir, f'samples_{os.getpid()}.jsonl')
        with open(path, 'a') as file:
            file.write(json.dumps({'epoch': loop.epoch, 'iteration': loop.iteration, 'rank': loop.global_rank,
                                   'world_size': loop.world_size, 'samples': loop.batch[0].tolist()}) + '\n')


class KillOnce(AbstractCallback):
    def __init__(self, out_dir, mode, at_epoch, at_iteration):
        super().__init__('kill once', execution_order=1000)
        self.marker = os.path.join(out_dir, 'killed')
        self.mode, self.at = mode, (at_epoch, at_iteration)

    def on_batch_end(self):
        loop = self.train_loop_obj
        if (loop.epoch, loop.iteration) != self.at or os.path.exists(self.marker):
            return
        if self.mode == 'worker' and loop.global_rank == 1 or \
                self.mode == 'agent' and os.environ.get('KILL_MY_AGENT') == '1':
            with open(self.marker, 'w') as file:
                file.write(f'{loop.total_iteration_idx}')
            if self.mode == 'agent':
                os.kill(os.getppid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('out_dir')
    parser.add_argument('--kill', choices=('worker', 'agent'), default=None)
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--samples', type=int, default=96)
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--save-every', type=int, default=4)
    parser.add_argument('--kill-at', type=int, nargs=2, default=(1, 3), metavar=('EPOCH', 'ITERATION'))
    parser.add_argument('--no-record', action='store_true')
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Net()
    train = DataLoader(IndexedRegression(args.samples), batch_size=args.batch_size, shuffle=True)
    loop = TrainLoop(model, train, None, None, torch.optim.Adam(model.parameters(), lr=1e-2), nn.MSELoss(),
                     gpu_mode='ddp')
    callbacks = [ModelIterationCheckpoint(args.save_every, 'elastic', 'run', os.path.join(args.out_dir, 'exp'), {},
                                          cloud_save_mode='local', async_save=False)]
    if not args.no_record:
        callbacks.append(RecordSamples(args.out_dir))
    if args.kill:
        callbacks.append(KillOnce(args.out_dir, args.kill, *args.kill_at))
    loop.fit(num_epochs=args.epochs, callbacks=callbacks, resume_from='auto', on_gpu=False)
    if dist.get_rank() == 0:
        torch.save({'weights': model.state_dict(), 'history': dict(loop.train_history),
                    'world_size': dist.get_world_size()}, os.path.join(args.out_dir, 'final.pt'))
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
