"""A SuperGradients callback, written as SG's documentation writes it, trained by aitoolbox_like's TrainLoop.

    python examples/supergradients_style_callback.py --epochs 2 --output-dir sg_demo

``SaveFirstBatchCallback`` is the example of SG's "Phase Callbacks" page with only its imports changed
(``super_gradients...`` -> ``aitoolbox_like.adapters.supergradients``; ``save_image`` from there too, which is
torchvision's when torchvision imports) and one fix of the page's own bug: its ``on_training_start`` computes
``outputs_path`` but never stores it, so ``self.outputs_path`` stayed None. It writes the first training batch of
every epoch and the first validation batch as PNGs into ``<experiment>/checkpoint_model/batch_images/`` (SG's
``context.ckpt_dir``). A ``PhaseCallback`` reports each epoch whose validation loss is the best so far.
"""
import argparse
import os

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TTModel
from aitoolbox_like.tracking import TrainLoopCheckpoint

# ---- the SG page's example; only these imports differ from SuperGradients' ----
from aitoolbox_like.adapters.supergradients import Callback, PhaseContext
from aitoolbox_like.adapters.supergradients import multi_process_safe
from aitoolbox_like.adapters.supergradients import save_image
from aitoolbox_like.adapters.supergradients import Phase, PhaseCallback


class SaveFirstBatchCallback(Callback):
    def __init__(self):
        self.outputs_path = None
        self.saved_first_validation_batch = False

    @multi_process_safe
    def on_training_start(self, context: PhaseContext) -> None:
        outputs_path = os.path.join(context.ckpt_dir, "batch_images")
        os.makedirs(outputs_path, exist_ok=True)
        self.outputs_path = outputs_path    # the fix: the SG page never stores the folder it creates

    @multi_process_safe
    def on_train_batch_start(self, context: PhaseContext) -> None:
        if context.batch_idx == 0:
            save_image(context.inputs, os.path.join(self.outputs_path, f"first_train_batch_epoch_{context.epoch}.png"))

    @multi_process_safe
    def on_validation_batch_start(self, context: PhaseContext) -> None:
        if context.batch_idx == 0 and not self.saved_first_validation_batch:
            save_image(context.inputs, os.path.join(self.outputs_path, f"first_validation_batch_epoch_{context.epoch}.png"))
            self.saved_first_validation_batch = True
# ---- end of the SG page's example ----


class ReportBestEpoch(PhaseCallback):
    """An SG phase callback: runs after an epoch whose validation loss is the best so far (SG's metric_to_watch,
    here 'val_loss', lower is better)."""

    def __init__(self):
        super().__init__(Phase.VALIDATION_END_BEST_EPOCH)
        self.best_epochs = []

    @multi_process_safe
    def __call__(self, context: PhaseContext) -> None:
        self.best_epochs.append(context.epoch)
        print(f'epoch {context.epoch}: best val_loss so far, {context.metrics_dict["val_loss"]:.4f}')


class DigitsNet(TTModel):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 10))

    def forward(self, x):
        return self.net(x)

    def get_loss(self, batch_data, criterion, device):
        images, labels = batch_data
        return criterion(self(images.to(device)), labels.to(device))

    def get_predictions(self, batch_data, device):
        images, labels = batch_data
        return self(images.to(device)).argmax(dim=1), labels, None


def digits_loaders(batch_size=64):
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0     # values in [0, 1]
    labels = torch.tensor(digits.target)
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(len(labels), generator=generator)
    train, val = order[:1400], order[1400:]
    train_loader = DataLoader(TensorDataset(images[train], labels[train]), batch_size=batch_size, shuffle=True,
                              generator=generator)
    val_loader = DataLoader(TensorDataset(images[val], labels[val]), batch_size=batch_size)
    return train_loader, val_loader


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--epochs', type=int, default=2)
    parser.add_argument('--output-dir', default='sg_demo')
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    train_loader, val_loader = digits_loaders()
    model = DigitsNet()
    loop = TrainLoopCheckpoint(model, train_loader, val_loader, None, torch.optim.Adam(model.parameters(), lr=1e-2),
                               nn.CrossEntropyLoss(), project_name='digits', experiment_name='sg_callbacks',
                               local_model_result_folder_path=args.output_dir, hyperparams={'lr': 1e-2},
                               cloud_save_mode=None)
    # SG callbacks sit in the same list as any aitoolbox_like callback.
    loop.fit(num_epochs=args.epochs, callbacks=[SaveFirstBatchCallback(), ReportBestEpoch()])
    return loop


if __name__ == '__main__':
    main()
