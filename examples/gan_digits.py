"""A small GAN on scikit-learn's handwritten digits (8x8 images): a custom training step with two optimizers.

    python examples/gan_digits.py --epochs 3 --output-dir demo_output
    python examples/gan_digits.py --epochs 5 --output-dir demo_output --resume     # continue the last run

The model owns the training step (``GAN.train_step(batch, loop)``): each batch updates the discriminator, then
the generator, through the loop's helpers (``loop.backward``, ``loop.step_optimizers([idx])``), so gradient
callbacks, mixed precision and schedulers keep working. The generator and discriminator optimizers are one
``MultiOptimizer([opt_g, opt_d])``; the step returns a ``MultiLoss``, so the history has
``accumulated_loss_generator`` and ``accumulated_loss_discriminator``. A TrainLoopCheckpoint saves the full state
after every epoch into <output-dir>/digits_gan/gan_<timestamp>/, and ``--resume`` continues exactly.
"""
import argparse
import contextlib
import logging

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import MultiLoss, MultiOptimizer, TTModel
from aitoolbox_like.tracking import TrainLoopCheckpoint

LATENT_DIM = 16
IMAGE_DIM = 64      # 8 x 8


@contextlib.contextmanager
def frozen(module):
    """No gradients for ``module``'s parameters inside the block (the generator's loss backpropagates through the
    discriminator, whose gradients must not pile up for its next update)."""
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


class GAN(TTModel):
    """Generator and discriminator in one module (one state_dict in checkpoints)."""

    def __init__(self, latent_dim=LATENT_DIM, hidden=64):
        super().__init__()
        self.latent_dim = latent_dim
        self.generator = nn.Sequential(nn.Linear(latent_dim, hidden), nn.ReLU(), nn.Linear(hidden, IMAGE_DIM),
                                       nn.Tanh())
        self.discriminator = nn.Sequential(nn.Linear(IMAGE_DIM, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, 1))

    def forward(self, z):
        return self.generator(z)

    def sample(self, n, device):
        return self.generator(torch.randn(n, self.latent_dim, device=device))

    def losses(self, real, fake):
        """The discriminator's loss (real -> 1, fake -> 0) and the generator's (its fakes judged real)."""
        d_real, d_fake = self.discriminator(real), self.discriminator(fake)
        d_loss = F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real)) + \
            F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake))
        return d_loss, F.binary_cross_entropy_with_logits(d_fake, torch.ones_like(d_fake))

    # ---- the custom training step --------------------------------------------------------------------------

    def train_step(self, batch, loop):
        """One discriminator update, then one generator update (optimizer 1 is the discriminator's, 0 the
        generator's). Called by the TrainLoop instead of its standard step."""
        real = batch[0].to(loop.device).flatten(1)
        update = loop.should_execute_optimizer_update()     # False only on gradient-accumulation micro-batches
        fake = self.sample(real.shape[0], loop.device)

        # Discriminator: the fakes are detached, so no gradient reaches the generator.
        d_real = self.discriminator(real)
        d_fake = self.discriminator(fake.detach())
        d_loss = F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real)) + \
            F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake))
        loop.backward(d_loss)
        if update:
            loop.step_optimizers([1])

        # Generator: judged by the updated discriminator, whose own parameters get no gradient.
        with frozen(self.discriminator):
            d_on_fake = self.discriminator(fake)
            g_loss = F.binary_cross_entropy_with_logits(d_on_fake, torch.ones_like(d_on_fake))
            loop.backward(g_loss)
        if update:
            loop.step_optimizers([0])
        return MultiLoss({'generator': g_loss, 'discriminator': d_loss})

    # ---- evaluation (end-of-epoch 'loss', predictions) -----------------------------------------------------

    def get_loss(self, batch_data, criterion, device):
        real = batch_data[0].to(device).flatten(1)
        d_loss, g_loss = self.losses(real, self.sample(real.shape[0], device))
        return MultiLoss({'generator': g_loss, 'discriminator': d_loss})

    def get_predictions(self, batch_data, device):
        """The discriminator's probability that each real image is real."""
        real = batch_data[0].to(device).flatten(1)
        return torch.sigmoid(self.discriminator(real)).squeeze(1), batch_data[1], None


def digits_loader(batch_size=64):
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0     # 0..16 -> -1..1
    labels = torch.tensor(digits.target, dtype=torch.long)
    return DataLoader(TensorDataset(images, labels), batch_size=batch_size, shuffle=True)


def build(args):
    """Model, loader, optimizers and the checkpointing loop, built the same way on every start."""
    torch.manual_seed(args.seed)
    model = GAN()
    opt_g = torch.optim.Adam(model.generator.parameters(), lr=args.lr, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(model.discriminator.parameters(), lr=args.lr, betas=(0.5, 0.999))
    hyperparams = {'lr': args.lr, 'batch_size': args.batch_size, 'seed': args.seed, 'epochs': args.epochs}
    return TrainLoopCheckpoint(model, digits_loader(args.batch_size), None, None, MultiOptimizer([opt_g, opt_d]),
                               None, project_name='digits_gan', experiment_name='gan',
                               local_model_result_folder_path=args.output_dir, hyperparams=hyperparams,
                               cloud_save_mode='local', iteration_save_freq=args.iteration_save_freq)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--output-dir', default='demo_output')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--lr', type=float, default=2e-3)
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
    loop.fit(num_epochs=args.epochs, resume_from=args.resume)
    history = loop.train_history
    for name in ('accumulated_loss_discriminator', 'accumulated_loss_generator'):
        print(f'{name} per epoch: {[round(v, 4) for v in history[name]]}')
    print(f'experiment folder: {loop.experiment.dir_path}')
    return loop


if __name__ == '__main__':
    main()
