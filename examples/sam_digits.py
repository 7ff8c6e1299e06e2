"""Sharpness-Aware Minimization (SAM, Foret et al. 2021) on scikit-learn's handwritten digits: a custom training
step with two forward/backward passes per update.

    python examples/sam_digits.py --epochs 3 --output-dir demo_output
    python examples/sam_digits.py --epochs 5 --output-dir demo_output --resume     # continue the last run

Each update: the loss's gradient g at the weights w; move to w + rho * g / ||g|| (the worst case nearby); the
gradient there; back to w; the base optimizer steps with that second gradient. ``SAM`` is a torch optimizer
wrapping the base optimizer (SGD with momentum here): the TrainLoop, the scheduler callbacks and checkpoints see
one optimizer whose ``state_dict()`` is the base optimizer's (momentum buffers included), so a resumed run continues
exactly. ``SAMStep`` is the callback owning the training step; it uses the loop's helpers (``forward_loss``,
``backward``, ``step_optimizers``), so gradient callbacks and schedulers work as with the standard step.
"""
import argparse
import logging

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TTBasicModel
from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.callbacks.train_schedule import CosineScheduler
from aitoolbox_like.tracking import TrainLoopCheckpoint


class SAM(torch.optim.Optimizer):
    """SAM around a base optimizer: ``first_step()`` perturbs the weights by ``rho * grad / ||grad||`` (keeping the
    original weights), ``step()`` restores them and steps the base optimizer with the current gradients (those
    computed at the perturbed point).

    The param groups are the base optimizer's (one list of dicts), so schedulers changing ``lr`` drive the base
    optimizer, and ``state_dict()`` / ``load_state_dict()`` are the base optimizer's: checkpoints keep its state.
    The perturbation lives only between ``first_step`` and ``step``.

    Args:
        params: the parameters (or param group dicts).
        base_optimizer: the base optimizer class, built as ``base_optimizer(self.param_groups, **kwargs)``.
        rho (float): the radius of the neighbourhood (a per-group hyperparameter).
        **kwargs: the base optimizer's arguments (lr, momentum, ...).
    """

    def __init__(self, params, base_optimizer=torch.optim.SGD, rho=0.05, **kwargs):
        if rho < 0:
            raise ValueError(f'rho must be >= 0, got {rho}')
        super().__init__(params, dict(rho=rho, **kwargs))
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups      # the same dicts: one set of hyperparameters
        self.defaults.update(self.base_optimizer.defaults)
        self._original = {}

    @torch.no_grad()
    def grad_norm(self):
        grads = [p.grad.norm(p=2) for group in self.param_groups for p in group['params'] if p.grad is not None]
        return torch.norm(torch.stack(grads), p=2)

    @torch.no_grad()
    def first_step(self, zero_grad=True):
        """Move every parameter to w + rho * grad / ||grad|| (the original weights are kept for ``step``)."""
        norm = self.grad_norm()
        for group in self.param_groups:
            scale = group['rho'] / (norm + 1e-12)
            for p in group['params']:
                if p.grad is None:
                    continue
                self._original[p] = p.detach().clone()
                p.add_(p.grad * scale.to(p))
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def step(self, closure=None):
        """Restore the weights of ``first_step`` and step the base optimizer with the current gradients."""
        if closure is not None:
            raise ValueError('SAM.step() takes no closure here: call first_step(), compute the loss and its '
                             'gradient again, then step()')
        for p, original in self._original.items():
            p.copy_(original)
        self._original = {}
        self.base_optimizer.step()

    def zero_grad(self, set_to_none=True):
        self.base_optimizer.zero_grad(set_to_none)

    def state_dict(self):
        return self.base_optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self.base_optimizer.load_state_dict(state_dict)
        self.param_groups = self.base_optimizer.param_groups


class SAMStep(AbstractCallback):
    """The SAM training step: loss and gradient at w, ``first_step`` (perturb), loss and gradient at the perturbed
    weights, ``step_optimizers`` (restore and base step, with the loop's gradient hooks). The loop's optimizer must be
    a :class:`SAM`. Returns the first loss (at the unperturbed weights) for the history."""

    def __init__(self):
        super().__init__('SAM training step')

    def on_train_begin(self):
        loop = self.train_loop_obj
        if not isinstance(loop.optimizer, SAM):
            raise TypeError(f'SAMStep needs a SAM optimizer, got {type(loop.optimizer).__qualname__}')
        if loop.grad_accumulation != 1:
            raise ValueError('SAMStep updates on every batch: use grad_accumulation=1')

    def train_step(self, batch):
        loop = self.train_loop_obj
        loss = loop.forward_loss(batch)
        loop.backward(loss)
        loop.optimizer.first_step(zero_grad=True)
        loop.backward(loop.forward_loss(batch))
        loop.step_optimizers()
        return loss


class DigitsMLP(TTBasicModel):
    def __init__(self, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x)


def digits_loaders(batch_size=64, split_seed=0):
    """Train and validation loaders (a fixed stratified split, whatever the training seed)."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    train_idx, val_idx = train_test_split(range(len(labels)), test_size=0.25, random_state=split_seed,
                                          stratify=digits.target)

    def subset(indices, shuffle):
        return DataLoader(TensorDataset(images[indices], labels[indices]), batch_size=batch_size, shuffle=shuffle)
    return subset(train_idx, True), subset(val_idx, False)


def build(args):
    """Model, loaders, the SAM optimizer and the checkpointing loop, built the same way on every start."""
    torch.manual_seed(args.seed)
    train_loader, val_loader = digits_loaders(args.batch_size)
    model = DigitsMLP()
    optimizer = SAM(model.parameters(), torch.optim.SGD, rho=args.rho, lr=args.lr, momentum=0.9)
    hyperparams = {'lr': args.lr, 'rho': args.rho, 'batch_size': args.batch_size, 'seed': args.seed,
                   'epochs': args.epochs}
    return TrainLoopCheckpoint(model, train_loader, val_loader, None, optimizer, nn.CrossEntropyLoss(),
                               project_name='digits_sam', experiment_name='sam',
                               local_model_result_folder_path=args.output_dir, hyperparams=hyperparams,
                               cloud_save_mode='local', iteration_save_freq=args.iteration_save_freq)


def callbacks():
    return [SAMStep(), CosineScheduler(min_lr_factor=0.1)]


def accuracy(loop):
    y_pred, y_true, _ = loop.predict_on_validation_set()
    return float((y_pred.argmax(dim=1) == y_true).float().mean())


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--output-dir', default='demo_output')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--lr', type=float, default=0.1)
    parser.add_argument('--rho', type=float, default=0.05)
    parser.add_argument('--batch-size', type=int, default=64)
    parser.add_argument('--iteration-save-freq', type=int, default=0,
                        help='also checkpoint every N batches (resume inside an epoch)')
    parser.add_argument('--resume', nargs='?', const='latest', default=None,
                        help="continue the last run ('latest' when given without a value), or from a checkpoint "
                             "file or an experiment folder")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')
    loop = build(args)
    loop.fit(num_epochs=args.epochs, callbacks=callbacks(), resume_from=args.resume)
    print(f'val_loss per epoch: {[round(v, 4) for v in loop.train_history["val_loss"]]}')
    print(f'validation accuracy: {accuracy(loop):.4f}')
    print(f'experiment folder: {loop.experiment.dir_path}')
    return loop


if __name__ == '__main__':
    main()
