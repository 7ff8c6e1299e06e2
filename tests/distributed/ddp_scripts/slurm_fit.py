"""A SLURM job's training script, started by tests/distributed/test_slurm.py with ``srun`` in a batch job (and, for the
comparison, under torchrun): ``slurm_fit.py OUT_DIR [--wait-for-signal RUN EPOCH ITERATION ...] [--bucket NAME]``.

It is what docs/distributed.md tells SLURM users to write: a TrainLoop(gpu_mode='ddp') script with a checkpoint
callback (ModelCheckpoint: one checkpoint per epoch; the default PreemptionCheckpoint writes the mid-epoch one)
and ``fit(resume_from='auto')``, so a requeued job continues from the newest checkpoint. The model and data are
elastic_fit.py's. Every rank records which samples each of its batches trained, and in which run of the job (one
file per process); rank 0 writes the final weights and history once training is done.

--wait-for-signal RUN EPOCH ITERATION   in the job's run RUN (0: the first, 1: after one requeue, ...), after that
    batch every rank writes ``waiting_run<RUN>_rank<R>`` and waits (up to 5 minutes) until a signal has asked its
    PreemptionCheckpoint to stop: the test sends the signal then, so it arrives in the middle of an epoch.
    Repeatable.
--bucket NAME   checkpoints also go to this S3 bucket (cloud_save_mode='s3').
--fsdp          gpu_mode='fsdp' instead of 'ddp'.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from aitoolbox_like import AbstractCallback, TrainLoop
from aitoolbox_like.checkpoint import sharded as sharded_checkpoint
from aitoolbox_like.callbacks.model_save import ModelCheckpoint
from aitoolbox_like.callbacks.preemption import find_preemption_callback
from elastic_fit import IndexedRegression, Net

torch.set_num_threads(1)
RUN = int(os.environ.get('SLURM_RESTART_COUNT') or 0)      # 0 in the job's first run, 1 after one requeue


class RecordSamples(AbstractCallback):
    """Append (run, epoch, batch index, rank, sample indices, time) of every trained batch to this process's file."""

    def __init__(self, out_dir):
        super().__init__('record samples', execution_order=-50)
        self.out_dir = out_dir

    def on_batch_end(self):
        loop = self.train_loop_obj
        with open(os.path.join(self.out_dir, f'samples_{os.getpid()}.jsonl'), 'a') as file:
            file.write(json.dumps({'run': RUN, 'epoch': loop.epoch, 'iteration': loop.iteration,
                                   'rank': loop.global_rank, 'world_size': loop.world_size,
                                   'samples': loop.batch[0].tolist(), 'time': time.time()}) + '\n')


class WaitForSignal(AbstractCallback):
    def __init__(self, out_dir, points):
        super().__init__('wait for a signal', execution_order=1000)
        self.out_dir, self.points = out_dir, {tuple(point) for point in points}

    def on_batch_end(self):
        loop = self.train_loop_obj
        if (RUN, loop.epoch, loop.iteration) not in self.points:
            return
        preemption = find_preemption_callback(loop)
        with open(os.path.join(self.out_dir, f'waiting_run{RUN}_rank{loop.global_rank}'), 'w') as file:
            file.write(str(time.time()))
        deadline = time.monotonic() + 300
        while not preemption.stop_requested:
            if time.monotonic() > deadline:
                raise TimeoutError('no signal came')
            time.sleep(0.01)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('out_dir')
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--samples', type=int, default=640)
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--wait-for-signal', type=int, nargs=3, action='append', default=[],
                        metavar=('RUN', 'EPOCH', 'ITERATION'))
    parser.add_argument('--bucket', default=None)
    parser.add_argument('--fsdp', action='store_true')
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Net()
    train = DataLoader(IndexedRegression(args.samples), batch_size=args.batch_size, shuffle=True)
    loop = TrainLoop(model, train, None, None, torch.optim.Adam(model.parameters(), lr=1e-2), nn.MSELoss(),
                     gpu_mode='fsdp' if args.fsdp else 'ddp')
    cloud = dict(cloud_save_mode='s3', bucket_name=args.bucket) if args.bucket else dict(cloud_save_mode='local')
    callbacks = [ModelCheckpoint('slurm', 'run', os.path.join(args.out_dir, 'exp'), {}, async_save=False, **cloud),
                 RecordSamples(args.out_dir)]
    if args.wait_for_signal:
        callbacks.append(WaitForSignal(args.out_dir, args.wait_for_signal))
    loop.fit(num_epochs=args.epochs, callbacks=callbacks, resume_from='auto', on_gpu=False)
    weights = sharded_checkpoint.full_state(loop)[0] if args.fsdp else model.state_dict()
    if dist.get_rank() == 0:
        torch.save({'weights': weights, 'history': dict(loop.train_history),
                    'world_size': dist.get_world_size()}, os.path.join(args.out_dir, 'final.pt'))
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
