"""The job that benchmarks/goodput.py runs under torchrun:
``python -m torch.distributed.run ... goodput_job.py OUT_DIR [--kill-every K] [--save-every C] ...``.

A restartable DDP script as docs/distributed.md tells users to write one (the same set-up as
tests/distributed/ddp_scripts/elastic_fit.py): a TrainLoop(gpu_mode='ddp') on CPU processes (gloo), a synchronous
ModelIterationCheckpoint every C steps and ``fit(resume_from='auto')``, on an MLP big enough that a step takes a few
milliseconds. It records, as JSON files in OUT_DIR:

- ``start_<pid>.json``, one per process start: the rank, torchrun's restart count, the wall-clock times at which the
  interpreter started this script (before torch is imported) and at which the script's imports were done, and the
  wall-clock time at which its first training step ended with that step's global index (the step the process
  started from);
- ``killed_<n>.json``, one per kill: with ``--kill-every K`` the worker of rank 1 SIGKILLs itself right after the
  training step of global index n * K (n >= 1; the convention of ModelIterationCheckpoint's save_frequency), once per
  n (the file is the marker: a restarted worker that trains step n * K again does not die again); it holds the
  wall-clock time of the kill and the step's index;
- ``final.pt`` (rank 0, once training is done): the final weights and the wall-clock time training ended.
"""
import time

# Taken before the imports: starting the interpreter and importing torch is part of what a restart costs.
SCRIPT_STARTED = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from aitoolbox_like import AbstractCallback, TrainLoop, TTBasicModel  # noqa: E402
from aitoolbox_like.callbacks.model_save import ModelIterationCheckpoint  # noqa: E402

IMPORTS_DONE = time.time()
torch.set_num_threads(1)

IN_FEATURES = 64


class MLP(TTBasicModel):
    """IN_FEATURES -> width -> width -> 1, tanh."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(IN_FEATURES, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                                    nn.Linear(width, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def regression_data(samples: int) -> TensorDataset:
    """A fixed noisy linear target, the same in every process and every restart."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(samples, IN_FEATURES, generator=generator)
    weights = torch.randn(IN_FEATURES, 1, generator=generator)
    return TensorDataset(x, x @ weights + 0.1 * torch.randn(samples, 1, generator=generator))


def write_json(path: str, record: dict) -> None:
    """Write ``record`` whole or not at all (the reader runs after the job, but a kill may come at any time)."""
    with open(path + '.tmp', 'w') as file:
        json.dump(record, file)
    os.replace(path + '.tmp', path)


class RecordStart(AbstractCallback):
    """Write this process's start record once its first training step has ended (before KillEvery may kill it)."""

    def __init__(self, out_dir: str) -> None:
        super().__init__('record start', execution_order=-50)
        self.out_dir = out_dir
        self.recorded = False

    def on_batch_end(self) -> None:
        if self.recorded:
            return
        self.recorded = True
        loop = self.train_loop_obj
        write_json(os.path.join(self.out_dir, f'start_{os.getpid()}.json'),
                   {'rank': loop.global_rank, 'restart': int(os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')),
                    'script_started': SCRIPT_STARTED, 'imports_done': IMPORTS_DONE, 'first_step_end': time.time(),
                    'first_step': loop.total_iteration_idx})


class KillEvery(AbstractCallback):
    """Rank 1 SIGKILLs itself after the step of global index n * every (n >= 1), once per n. Runs after the
    checkpoint callback's on_batch_end, so a checkpoint due at the same step is written first."""

    def __init__(self, out_dir: str, every: int) -> None:
        super().__init__('kill every', execution_order=1000)
        self.out_dir = out_dir
        self.every = every

    def on_batch_end(self) -> None:
        loop = self.train_loop_obj
        step = loop.total_iteration_idx
        if loop.global_rank != 1 or step == 0 or step % self.every:
            return
        marker = os.path.join(self.out_dir, f'killed_{step // self.every}.json')
        if os.path.exists(marker):
            return
        write_json(marker, {'time': time.time(), 'step': step})
        os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('out_dir')
    parser.add_argument('--epochs', type=int, default=4)
    parser.add_argument('--steps-per-epoch', type=int, default=100)
    parser.add_argument('--batch-size', type=int, default=32, help='per process')
    parser.add_argument('--width', type=int, default=256)
    parser.add_argument('--save-every', type=int, default=25)
    parser.add_argument('--kill-every', type=int, default=0, help='0: no kill')
    args = parser.parse_args()

    torch.manual_seed(0)
    model = MLP(args.width)
    world_size = int(os.environ['WORLD_SIZE'])
    data = regression_data(args.steps_per_epoch * args.batch_size * world_size)
    train = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    loop = TrainLoop(model, train, None, None, torch.optim.Adam(model.parameters(), lr=1e-3), nn.MSELoss(),
                     gpu_mode='ddp', end_auto_eval=False, progress_bar=False)
    callbacks = [ModelIterationCheckpoint(args.save_every, 'goodput', 'job', os.path.join(args.out_dir, 'exp'), {},
                                          cloud_save_mode='local', async_save=False),
                 RecordStart(args.out_dir)]
    if args.kill_every:
        callbacks.append(KillEvery(args.out_dir, args.kill_every))
    loop.fit(num_epochs=args.epochs, callbacks=callbacks, resume_from='auto', on_gpu=False)
    if dist.get_rank() == 0:
        torch.save({'weights': model.state_dict(), 'end': time.time()}, os.path.join(args.out_dir, 'final.pt'))
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
