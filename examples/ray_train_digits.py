"""Train a small MLP on scikit-learn's digits with Ray Train: 2 workers of a TorchTrainer, each one rank of DDP.

    python examples/ray_train_digits.py                                   # local Ray cluster, 2 CPU workers
    python examples/ray_train_digits.py --epochs 12                       # same run name: continues from epoch 8
    python examples/ray_train_digits.py --storage-path 's3://bucket/ray?endpoint_override=http://127.0.0.1:9000'

Needs ``pip install 'aitoolbox_like[ray]'`` (and scikit-learn for the data). The TrainLoop code is what it would be
without Ray; the Ray parts are: ``gpu_mode='ddp'`` (each worker trains as one rank of the process group Ray set
up), the RayTrainReport callback (each epoch's history values and checkpoint go to ``ray.train.report``) and
``fit(resume_from='auto')`` (a worker group that Ray restarts after a failure, or a later run under the same
name and storage path, continues from the newest checkpoint Ray holds). Checkpoints land in
``<storage-path>/<name>/checkpoint_<time>/train_state.pth``.
"""
import argparse
import logging
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TrainLoop, TTBasicModel
from aitoolbox_like.callbacks.performance_eval import ModelPerformanceEvaluation
from aitoolbox_like.adapters.ray import QUIET_WORKER_LOGS_HOOK, RayTrainReport
from aitoolbox_like.results import ClassificationResultPackage


class DigitsMLP(TTBasicModel):
    """8x8 images, flattened, to 10 classes; the last element of a batch is the target (TTBasicModel)."""

    def __init__(self, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x)


def digits_loaders(batch_size, seed=0):
    """Train and validation loaders over scikit-learn's digits (80 % / 20 %, the same split in every worker)."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32) / 16.0       # pixel values 0..16
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    split = int(0.8 * len(order))
    train, val = order[:split], order[split:]
    return (DataLoader(TensorDataset(images[train], labels[train]), batch_size=batch_size, shuffle=True),
            DataLoader(TensorDataset(images[val], labels[val]), batch_size=batch_size))


def train_fn(config):
    """What every Ray worker runs. The loaders are the whole data set: gpu_mode='ddp' shards them per rank."""
    torch.manual_seed(config['seed'])
    train_loader, val_loader = digits_loaders(config['batch_size'], config['seed'])
    model = DigitsMLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=config['lr'])
    loop = TrainLoop(model, train_loader, val_loader, None, optimizer, nn.CrossEntropyLoss(), gpu_mode='ddp')
    callbacks = [ModelPerformanceEvaluation(ClassificationResultPackage(), config),
                 RayTrainReport(metrics=['accumulated_loss', 'val_loss', 'val_Accuracy'], hyperparams=config)]
    loop.fit(num_epochs=config['epochs'], callbacks=callbacks, resume_from='auto')


def main(argv=None):
    """Run the example; returns Ray Train's ``Result`` (its ``metrics`` are the last epoch's report)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--epochs', type=int, default=8)
    parser.add_argument('--workers', type=int, default=2, help='Ray Train workers (DDP ranks), one CPU each')
    parser.add_argument('--batch-size', type=int, default=32, help='per worker')
    parser.add_argument('--lr', type=float, default=3e-3)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--storage-path', default=os.path.abspath(os.path.join('demo_output', 'ray')),
                        help='where Ray keeps the run and its checkpoints: a local folder or an s3:// URI')
    parser.add_argument('--name', default='digits_mlp', help="the run's name; run again with it to continue")
    parser.add_argument('--max-failures', type=int, default=2, help='worker-group restarts Ray may make')
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')

    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    started_here = not ray.is_initialized()
    if started_here:
        # A local cluster for this script; its workers leave out Ray Train's per-run chatter.
        ray.init(num_cpus=args.workers, include_dashboard=False,
                 runtime_env={'worker_process_setup_hook': QUIET_WORKER_LOGS_HOOK})
    try:
        config = {'epochs': args.epochs, 'batch_size': args.batch_size, 'lr': args.lr, 'seed': args.seed}
        trainer = TorchTrainer(train_fn, train_loop_config=config,
                               scaling_config=ScalingConfig(num_workers=args.workers),
                               run_config=RunConfig(name=args.name, storage_path=args.storage_path,
                                                    failure_config=FailureConfig(max_failures=args.max_failures)))
        result = trainer.fit()
    finally:
        if started_here:
            ray.shutdown()
    print(f"epoch {result.metrics['epoch']}: val_Accuracy {result.metrics['val_Accuracy']:.4f}")
    print(f'last checkpoint: {result.checkpoint.path}')
    return result


if __name__ == '__main__':
    main()
