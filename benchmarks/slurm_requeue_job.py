"""The job that benchmarks/slurm_requeue.py runs with ``srun`` in a SLURM batch job:
``srun python slurm_requeue_job.py OUT_DIR [--epochs N] [--steps-per-epoch S] ...``.

The script docs/distributed.md tells SLURM users to write: a DDP TrainLoop over srun's tasks (CPU processes, gloo),
a checkpoint callback (a ModelCheckpoint: one checkpoint per epoch; the default PreemptionCheckpoint writes the one
at a signal) and ``fit(resume_from='auto')``, on goodput_job.py's MLP. It records, in OUT_DIR:

- ``start_<pid>.json``, one per process start: the rank, SLURM's restart count, the wall-clock times at which the
  interpreter started this script (before torch is imported), at which its imports were done and at which its first
  training step ended, with that step's global index;
- ``steps_<pid>.txt``: ``<global step index> <wall-clock time>`` after every training step;
- ``final.pt`` (rank 0, once training is done): the final weights and the wall-clock time training ended.
"""
import time

# Taken before the imports: starting the interpreter and importing torch is part of what a requeue costs.
SCRIPT_STARTED = time.time()

import argparse  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from aitoolbox_like import AbstractCallback, TrainLoop  # noqa: E402
from aitoolbox_like.callbacks.model_save import ModelCheckpoint  # noqa: E402
from goodput_job import MLP, regression_data, write_json  # noqa: E402

IMPORTS_DONE = time.time()
torch.set_num_threads(1)


class RecordSteps(AbstractCallback):
    """The start record after the first step of this process, and every step's index and end time."""

    def __init__(self, out_dir: str) -> None:
        super().__init__('record steps', execution_order=-50)
        self.out_dir = out_dir
        self.steps = None

    def on_batch_end(self) -> None:
        loop = self.train_loop_obj
        now = time.time()
        if self.steps is None:
            write_json(os.path.join(self.out_dir, f'start_{os.getpid()}.json'),
                       {'rank': loop.global_rank, 'restart': int(os.environ.get('SLURM_RESTART_COUNT') or 0),
                        'script_started': SCRIPT_STARTED, 'imports_done': IMPORTS_DONE, 'first_step_end': now,
                        'first_step': loop.total_iteration_idx})
            self.steps = open(os.path.join(self.out_dir, f'steps_{os.getpid()}.txt'), 'a', buffering=1)
        self.steps.write(f'{loop.total_iteration_idx} {now}\n')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('out_dir')
    parser.add_argument('--epochs', type=int, default=4)
    parser.add_argument('--steps-per-epoch', type=int, default=500)
    parser.add_argument('--batch-size', type=int, default=32, help='per process')
    parser.add_argument('--width', type=int, default=256)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = MLP(args.width)
    data = regression_data(args.steps_per_epoch * args.batch_size * int(os.environ['SLURM_NTASKS']))
    train = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    loop = TrainLoop(model, train, None, None, torch.optim.Adam(model.parameters(), lr=1e-3), nn.MSELoss(),
                     gpu_mode='ddp', end_auto_eval=False, progress_bar=False)
    callbacks = [ModelCheckpoint('requeue', 'job', os.path.join(args.out_dir, 'exp'), {}, cloud_save_mode='local',
                                 async_save=False),
                 RecordSteps(args.out_dir)]
    loop.fit(num_epochs=args.epochs, callbacks=callbacks, resume_from='auto', on_gpu=False)
    if dist.get_rank() == 0:
        torch.save({'weights': model.state_dict(), 'end': time.time()}, os.path.join(args.out_dir, 'final.pt'))
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
