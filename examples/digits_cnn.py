"""Train a small CNN on scikit-learn's handwritten digits (8x8 images that ship with scikit-learn).

    python examples/digits_cnn.py --epochs 8 --output-dir demo_output

Shows a TTModel, a custom callback, and the library's evaluation, reporting and saving callbacks.
"""
import argparse
import logging

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TrainLoop, TTModel
from aitoolbox_like.callbacks.abstract import AbstractCallback


class DigitsCNN(TTModel):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),     # 32 x 4 x 4
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(32 * 4 * 4, 10))

    def forward(self, x):
        return self.classifier(self.features(x))

    def get_loss(self, batch_data, criterion, device):
        images, labels = batch_data
        return criterion(self(images.to(device)), labels.to(device))

    def get_predictions(self, batch_data, device):
        images, labels = batch_data
        logits = self(images.to(device))
        return logits.argmax(dim=1), labels, None


class ValidationAccuracy(AbstractCallback):
    """A custom callback: validation accuracy into the history, and stop once it is good enough."""

    def __init__(self, stop_at=None):
        super().__init__('validation accuracy', execution_order=0)
        self.stop_at = stop_at

    def on_epoch_end(self):
        y_pred, y_true, _ = self.train_loop_obj.predict_on_validation_set()
        accuracy = (y_pred == y_true).float().mean().item()
        self.train_loop_obj.insert_metric_result_into_history('val_accuracy', accuracy)
        if self.stop_at is not None and accuracy >= self.stop_at:
            self.train_loop_obj.early_stop = True


def digits_loaders(batch_size=64, seed=0):
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0     # pixel values 0..16
    labels = torch.tensor(digits.target, dtype=torch.long)
    idx = torch.arange(len(labels)).numpy()
    train_idx, rest_idx = train_test_split(idx, test_size=0.3, random_state=seed, stratify=digits.target)
    val_idx, test_idx = train_test_split(rest_idx, test_size=0.5, random_state=seed,
                                         stratify=digits.target[rest_idx])

    def subset(indices, shuffle):
        return DataLoader(TensorDataset(images[indices], labels[indices]), batch_size=batch_size, shuffle=shuffle)
    return subset(train_idx, True), subset(val_idx, False), subset(test_idx, False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--epochs', type=int, default=8)
    parser.add_argument('--output-dir', default='demo_output')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')

    torch.manual_seed(args.seed)
    train_loader, val_loader, test_loader = digits_loaders(seed=args.seed)
    model = DigitsCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    train_loop = TrainLoop(model, train_loader, val_loader, test_loader, optimizer, nn.CrossEntropyLoss())
    train_loop.fit(num_epochs=args.epochs, callbacks=[ValidationAccuracy()])
    print(f"validation accuracy per epoch: {[round(a, 4) for a in train_loop.train_history['val_accuracy']]}")
    return train_loop


if __name__ == '__main__':
    main()
