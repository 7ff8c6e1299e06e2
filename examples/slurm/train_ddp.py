"""Train a small MLP on scikit-learn's digits with DDP over the tasks of a SLURM job, one task per GPU (or per CPU
process): submit ``examples/slurm/train_ddp.sbatch`` from the repository root, whose ``srun`` starts this script in
every task.

    sbatch examples/slurm/train_ddp.sbatch                        # 2 nodes x 4 GPUs, see the script's #SBATCH lines
    sbatch --nodes=1 --ntasks-per-node=2 examples/slurm/train_ddp.sbatch     # override them on the command line
    python examples/slurm/train_ddp.py --epochs 2                 # outside SLURM: one process

The TrainLoop code is what it would be on one machine; the SLURM parts are: ``gpu_mode='ddp'`` (each srun task
trains as one rank: its rank, the group's size and the rendezvous come from SLURM's variables), a checkpoint
callback, and ``fit(resume_from='auto')``. With them, SLURM's warning before the time limit
(``#SBATCH --signal=USR1@90``) makes every rank stop at the same step, write a checkpoint and requeue the job,
and a preemption (SIGTERM) makes them checkpoint and exit; the requeued job continues from the checkpoint, exactly
where the run stopped. A job submitted again with the same ``--name`` and ``--output-dir`` continues too.
Everything lands in ``<output-dir>/digits_slurm/<name>_<timestamp>/`` (a folder every node sees).
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TrainLoop, TTBasicModel
from aitoolbox_like.callbacks.model_save import ModelIterationCheckpoint
from aitoolbox_like.callbacks.performance_eval import ModelPerformanceEvaluation, ModelPerformancePrintReport
from aitoolbox_like.results import ClassificationResultPackage


class DigitsMLP(TTBasicModel):
    """8x8 images, flattened, to 10 classes; the last element of a batch is the target (TTBasicModel)."""

    def __init__(self, hidden=128):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x)


def digits_loaders(batch_size, seed=0):
    """Train and validation loaders over the whole of scikit-learn's digits (80 % / 20 %, the same split in every
    task): gpu_mode='ddp' gives each rank its share."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32) / 16.0       # pixel values 0..16
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    split = int(0.8 * len(order))
    train, val = order[:split], order[split:]
    return (DataLoader(TensorDataset(images[train], labels[train]), batch_size=batch_size, shuffle=True),
            DataLoader(TensorDataset(images[val], labels[val]), batch_size=batch_size))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--epochs', type=int, default=20)
    parser.add_argument('--batch-size', type=int, default=32, help='per task')
    parser.add_argument('--lr', type=float, default=3e-3)
    parser.add_argument('--output-dir', default='demo_output', help='on a file system every node sees')
    parser.add_argument('--name', default='mlp', help="the run's name: a job with the same name continues it")
    parser.add_argument('--save-every', type=int, default=100, help='a mid-epoch checkpoint every N steps')
    parser.add_argument('--bucket', default=None, help='also upload the checkpoints to this S3 bucket')
    args = parser.parse_args(argv)

    several_tasks = int(os.environ.get('SLURM_NTASKS', '1')) > 1 or 'RANK' in os.environ
    torch.manual_seed(0)
    train_loader, val_loader = digits_loaders(args.batch_size)
    model = DigitsMLP()
    loop = TrainLoop(model, train_loader, val_loader, None, torch.optim.Adam(model.parameters(), lr=args.lr),
                     nn.CrossEntropyLoss(), gpu_mode='ddp' if several_tasks else 'single')
    hyperparams = vars(args)
    cloud = dict(cloud_save_mode='s3', bucket_name=args.bucket) if args.bucket else dict(cloud_save_mode='local')
    callbacks = [ModelPerformanceEvaluation(ClassificationResultPackage(), hyperparams),
                 ModelPerformancePrintReport(['val_loss', 'val_Accuracy']),
                 ModelIterationCheckpoint(args.save_every, 'digits_slurm', args.name, args.output_dir, hyperparams,
                                          **cloud)]
    loop.fit(num_epochs=args.epochs, callbacks=callbacks, resume_from='auto')
    if several_tasks:
        dist.destroy_process_group()
    return loop


if __name__ == '__main__':
    main()
