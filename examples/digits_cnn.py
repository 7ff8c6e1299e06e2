"""Train a small CNN on scikit-learn's handwritten digits (8x8 images that ship with scikit-learn).

    python examples/digits_cnn.py --epochs 8 --output-dir demo_output
    python examples/digits_cnn.py --epochs 12 --output-dir demo_output --resume     # continue the last run
    python examples/digits_cnn.py --epochs 8 --mlflow sqlite:///mlflow.db           # also an MLflow run

Shows a TTModel, a custom callback, and the library's evaluation, reporting, TensorBoard and checkpointing
callbacks. Everything lands in <output-dir>/digits/cnn_<timestamp>/: checkpoint_model/ (checkpoints and
the 'latest' pointer), results/ (plots of loss and accuracy, a CSV of the history), tensorboard/.
"""
import argparse
import logging

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TTModel
from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.callbacks.basic import EarlyStopping
from aitoolbox_like.callbacks.performance_eval import (ModelPerformanceEvaluation, ModelPerformancePrintReport,
                                                       ModelTrainHistoryFileWriter, ModelTrainHistoryPlot)
from aitoolbox_like.callbacks.tensorboard import TensorboardFullTracking
from aitoolbox_like.recipes import register_callback, register_data, register_model
from aitoolbox_like.results import ClassificationResultPackage
from aitoolbox_like.tracking import TrainLoopCheckpoint


@register_model        # so that a recipe can say model: {name: DigitsCNN} (examples/recipes/digits.yaml)
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


@register_callback
class WorstClassReport(AbstractCallback):
    """A custom callback: after each epoch, log the digit the model gets wrong most often on the validation
    set (the predictions are computed once per epoch and shared with the evaluation callback)."""

    # What it adds to the history each epoch: a hyper-parameter search then checks its --monitor before any trial.
    history_names = ('val_worst_class_errors',)

    def __init__(self):
        super().__init__('worst class report', execution_order=1)

    def on_epoch_end(self):
        y_pred, y_true, _ = self.train_loop_obj.predict_on_validation_set()
        errors = torch.bincount(y_true[y_pred != y_true], minlength=10)
        worst = int(errors.argmax())
        self.train_loop_obj.insert_metric_result_into_history('val_worst_class_errors', int(errors[worst]))
        if self.train_loop_obj.is_main_process():      # every process of a DDP run has the same numbers
            logging.getLogger('digits').info('epoch %d: digit %d misclassified %d times', self.train_loop_obj.epoch,
                                             worst, int(errors[worst]))


@register_data
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
    parser.add_argument('--lr', type=float, default=3e-3)
    parser.add_argument('--mlflow', metavar='URI', default=None,
                        help='also track the run in MLflow at this tracking URI (e.g. sqlite:///mlflow.db or '
                             'http://localhost:5000); needs pip install aitoolbox_like[mlflow]')
    parser.add_argument('--ema', nargs='?', type=float, const=0.99, default=None, metavar='DECAY',
                        help='evaluate with and keep an exponential moving average of the weights (decay 0.99 when '
                             'given without a value); the final model is the average')
    parser.add_argument('--resume', nargs='?', const='latest', default=None,
                        help="continue the last run ('latest', the default when given without a value), "
                             "or from a checkpoint file, an experiment folder or an s3:// URI")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')

    hyperparams = {'lr': args.lr, 'batch_size': 64, 'seed': args.seed, 'epochs': args.epochs}
    torch.manual_seed(args.seed)
    train_loader, val_loader, test_loader = digits_loaders(batch_size=hyperparams['batch_size'], seed=args.seed)
    model = DigitsCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    # A TrainLoop that keeps a checkpoint after every epoch (and the best one by val_loss) in the experiment
    # folder; the other experiment callbacks below write into the same folder.
    train_loop = TrainLoopCheckpoint(model, train_loader, val_loader, test_loader, optimizer, nn.CrossEntropyLoss(),
                                     project_name='digits', experiment_name='cnn',
                                     local_model_result_folder_path=args.output_dir, hyperparams=hyperparams,
                                     cloud_save_mode='local')
    callbacks = [
        ModelPerformanceEvaluation(ClassificationResultPackage(), args=hyperparams, on_train_data=True),
        WorstClassReport(),
        ModelPerformancePrintReport(['val_loss', 'val_Accuracy']),
        ModelTrainHistoryPlot(epoch_end=False, train_end=True),
        ModelTrainHistoryFileWriter(file_format='csv'),
        TensorboardFullTracking(hparams=hyperparams),
        EarlyStopping(monitor='val_loss', patience=3),
    ]
    if args.mlflow:
        from aitoolbox_like.callbacks.mlflow import MLflowTracking     # imports mlflow only when asked
        callbacks.append(MLflowTracking(args.mlflow))
    if args.ema is not None:
        from aitoolbox_like.callbacks.weight_averaging import ExponentialMovingAverage
        callbacks.append(ExponentialMovingAverage(decay=args.ema))
    train_loop.fit(num_epochs=args.epochs, callbacks=callbacks, resume_from=args.resume)
    accuracies = [round(a, 4) for a in train_loop.train_history['val_Accuracy']]
    print(f'validation accuracy per epoch: {accuracies}')
    print(f'experiment folder: {callbacks[3].experiment_dir_path}')
    print(f'plots: {", ".join(callbacks[3].last_written_files)}')
    return train_loop


if __name__ == '__main__':
    main()
