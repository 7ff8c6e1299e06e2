"""The example callbacks of pytorch-accelerated's, BigDL Orca's and AIToolbox's callback documentation, written for
aitoolbox_like (docs/hooks-from-other-libraries.md maps their hooks to ours; tests/engine/test_hook_maps.py tests these).

    python examples/callbacks_from_other_libraries.py

pytorch-accelerated
    ClassificationMetricsCallback   torchmetrics-style accuracy / confusion matrix from the evaluation batches
    VerifyBatchCallback + CustomEventStep   a custom event raised from the training step (call_event)
Orca
    OrcaMainCallback                Orca's default MainCallback: forward, zero_grad / backward / step, scheduler
    LossDictMainCallback            Usage 1: a model that returns a dict of losses (Mask-RCNN style)
    ManualLRAdjust                  Usage 2: the learning rate set by hand after every training epoch
AIToolbox
    MyDemoTrainingReportCallback, DemoFirstGPUCallback   as written in AIToolbox's documentation (same API)
"""
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TrainLoop, TTModel
from aitoolbox_like.callbacks.abstract import AbstractCallback


# ---------------------------------------------------------------------------------------------- pytorch-accelerated

class ClassificationMetricsCallback(AbstractCallback):
    """pytorch-accelerated's metrics example: per-batch updates in the evaluation steps, computed and recorded at
    the end of the evaluation. PA's ``on_eval_step_end`` reads ``batch_output['model_outputs']``; here the
    model's outputs come with the batches of a predictions pass (``outputs = (y_pred, y_true, metadata)``), which
    ``on_epoch_end`` requests (the end-of-epoch loss pass gives only the loss). ``trainer.run_history.update_metric``
    is ``insert_metric_result_into_history``."""

    def __init__(self, num_classes):
        super().__init__('classification metrics')
        self.num_classes = num_classes
        self.confusion = torch.zeros(num_classes, num_classes, dtype=torch.long)

    def _move_to_device(self):                      # PA: on_training_run_start / on_evaluation_run_start
        self.confusion = self.confusion.to(self.train_loop_obj.device)

    def on_train_begin(self):
        self._move_to_device()

    def on_eval_begin(self, dataset_info):
        if dataset_info['type'] == 'validation' and dataset_info['kind'] == 'predictions':
            self._move_to_device()

    def on_eval_batch_end(self, batch, outputs, dataset_info):       # PA: on_eval_step_end
        if dataset_info['type'] != 'validation' or dataset_info['kind'] != 'predictions':
            return
        preds, _, _ = outputs                     # get_predictions already took the argmax
        targets = batch[1].to(preds.device)
        self.confusion += torch.bincount(targets * self.num_classes + preds,
                                         minlength=self.num_classes ** 2).reshape(self.num_classes, -1)

    def on_eval_end(self, dataset_info):                              # PA: on_eval_epoch_end
        if dataset_info['type'] != 'validation' or dataset_info['kind'] != 'predictions':
            return
        loop = self.train_loop_obj
        loop.insert_metric_result_into_history('confusion_matrix', self.confusion.cpu().clone())
        loop.insert_metric_result_into_history('accuracy', (self.confusion.trace() / self.confusion.sum()).item())
        self.confusion.zero_()

    def on_epoch_end(self):
        self.train_loop_obj.predict_on_validation_set()     # the evaluation pass whose batches are counted


class VerifyBatchCallback(AbstractCallback):
    """pytorch-accelerated's custom-event example: any registered callback defining ``verify_train_batch`` is called
    by ``callbacks_handler.call_event('verify_train_batch', ...)``. PA's ``run_config['train_per_device_batch_size']``
    is the train loader's ``batch_size``; the images here are 1 x 8 x 8 digits instead of 1 x 28 x 28."""

    def __init__(self):
        super().__init__('verify batch')
        self.verified = 0

    def verify_train_batch(self, trainer, xb, yb):
        assert xb.shape[0] == trainer.train_loader.batch_size
        assert xb.shape[1] == 1
        assert xb.shape[2] == 8
        assert xb.shape[3] == 8
        assert yb.shape[0] == trainer.train_loader.batch_size
        self.verified += 1


class CustomEventStep(AbstractCallback):
    """PA's ``TrainerWithCustomCallbackEvent`` overrides the trainer's ``calculate_train_batch_loss`` to raise the
    event; here a callback owns the training step (``train_step``) and does the same, then the standard
    forward / backward / update through the loop's helpers."""

    def __init__(self):
        super().__init__('step with a custom event')

    def train_step(self, batch):
        loop = self.train_loop_obj
        xb, yb = batch
        loop.callbacks_handler.call_event('verify_train_batch', trainer=loop, xb=xb, yb=yb)
        loss = loop.forward_loss(batch)
        loop.backward(loss)
        if loop.should_execute_optimizer_update():
            loop.step_optimizers()
        return loss


# ---------------------------------------------------------------------------------------------- BigDL Orca

class OrcaMainCallback(AbstractCallback):
    """Orca's default ``MainCallback`` as one training step: ``on_iter_forward`` (outputs, loss),
    ``on_iter_backward`` (zero_grad, backward, step); ``on_lr_adjust`` (the scheduler once per epoch) runs at the
    end of the training batches. ``runner.outputs`` / ``runner.loss`` are kept on the callback / ``loop.loss``."""

    def __init__(self, lr_scheduler=None):
        super().__init__('orca main callback')
        self.lr_scheduler = lr_scheduler
        self.outputs = None

    def on_iter_forward(self, loop):
        inputs, targets = loop.batch
        self.outputs = loop.model(inputs.to(loop.device))
        loop.loss = loop.criterion(self.outputs, targets.to(loop.device))

    def on_iter_backward(self, loop):
        # Orca's zero_grad / backward / step; loop.backward and step_optimizers keep our gradient hooks, AMP and
        # gradient accumulation working (step_optimizers ends with zero_grad).
        loop.backward(loop.loss)
        if loop.should_execute_optimizer_update():
            loop.step_optimizers()

    def train_step(self, batch):
        loop = self.train_loop_obj
        self.on_iter_forward(loop)
        self.on_iter_backward(loop)
        return loop.loss

    def on_lr_adjust(self, loop):
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()

    def on_train_epoch_end(self):
        self.on_lr_adjust(self.train_loop_obj)


class LossDictMainCallback(OrcaMainCallback):
    """Orca's Usage 1: the model computes its losses itself (``model(images, targets)`` returns a dict of losses,
    as Mask-RCNN does) and the loss is their sum."""

    def on_iter_forward(self, loop):
        image, target = loop.batch
        self.outputs = loop.model(image.to(loop.device), target.to(loop.device))
        loop.loss = sum(loss for loss in self.outputs.values())


class ManualLRAdjust(AbstractCallback):
    """Orca's Usage 2: set the learning rate by hand once per epoch (after the training batches, where Orca calls
    ``on_lr_adjust``). The page's free names (initial_lr, gamma, step_index, epoch_size) are arguments here, and
    ``runner.epochs`` (1-based) is ``loop.epoch + 1``; ``runner.batch_idx`` is the last batch's ``loop.iteration``
    (Orca deletes it before ``on_lr_adjust``, a bug of the page)."""

    def __init__(self, initial_lr, gamma, step_index, epoch_size, warmup_epoch=5):
        super().__init__('manual lr adjust')
        self.initial_lr, self.gamma, self.step_index = initial_lr, gamma, step_index
        self.epoch_size, self.warmup_epoch = epoch_size, warmup_epoch
        self.lrs = []

    def on_train_epoch_end(self):
        loop = self.train_loop_obj
        epochs = loop.epoch + 1
        if epochs <= self.warmup_epoch:
            lr = 1e-6 + (self.initial_lr - 1e-6) * loop.iteration / (self.epoch_size * self.warmup_epoch)
        else:
            lr = self.initial_lr * (self.gamma ** self.step_index)
        for param_group in loop.optimizer.param_groups:
            param_group['lr'] = lr
        self.lrs.append(lr)
        return lr


# ---------------------------------------------------------------------------------------------- AIToolbox

class MyDemoTrainingReportCallback(AbstractCallback):
    """AIToolbox's documented example, unchanged but for printing less."""

    def __init__(self):
        super().__init__('simple callback example')
        self.lines = []

    def on_train_begin(self):
        experiment_start_time = self.train_loop_obj.experiment_timestamp
        self.lines.append(f'Starting the training! Experiment started at: {experiment_start_time}')

    def on_epoch_begin(self):
        current_epoch = self.train_loop_obj.epoch
        self.lines.append(f'Starting new epoch num {current_epoch}')

    def on_epoch_end(self):
        val_predictions = self.train_loop_obj.predict_on_validation_set()
        self.lines.append(f'Model predictions: {len(val_predictions[0])}')

    def on_train_end(self):
        self.lines.append(f'End of training! Stopped at epoch {self.train_loop_obj.epoch}')
        test_predictions = self.train_loop_obj.predict_on_test_set()
        self.lines.append(f'Model predictions: {len(test_predictions[0])}')


class DemoFirstGPUCallback(AbstractCallback):
    """AIToolbox's example of a callback that runs only in the process of global rank 0."""

    def __init__(self):
        super().__init__('first GPU callback example', device_idx_execution=0)
        self.ran = False

    def on_train_begin(self):
        self.ran = True


# ---------------------------------------------------------------------------------------------- a small run

class DigitsNet(TTModel):
    """A linear classifier of the 8x8 digits; called with targets it returns a dict of losses (Orca's Usage 1)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x, targets=None):
        logits = self.fc(x.flatten(1))
        if targets is None:
            return logits
        return {'classification': nn.functional.cross_entropy(logits, targets),
                'l2': 1e-4 * (self.fc.weight ** 2).sum()}

    def get_loss(self, batch_data, criterion, device):
        x, y = batch_data
        return criterion(self(x.to(device)), y.to(device))

    def get_predictions(self, batch_data, device):
        x, y = batch_data
        return self(x.to(device)).argmax(dim=1), y, None


def digits_loaders(batch_size=50, num_train=1500):
    """Train / validation / test loaders of scikit-learn's digits (the train set a multiple of batch_size)."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    train, val, test = order[:num_train], order[num_train:num_train + 150], order[num_train + 150:]

    def loader(idx, shuffle=False):
        return DataLoader(TensorDataset(images[idx], labels[idx]), batch_size=batch_size, shuffle=shuffle)
    return loader(train, shuffle=True), loader(val), loader(test)


def make_loop(lr=0.5, **loop_kwargs):
    torch.manual_seed(0)
    model = DigitsNet()
    train_loader, val_loader, test_loader = digits_loaders()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    return TrainLoop(model, train_loader, val_loader, test_loader, optimizer, nn.CrossEntropyLoss(), **loop_kwargs)


def main():
    loop = make_loop()
    metrics, verify = ClassificationMetricsCallback(10), VerifyBatchCallback()
    loop.fit(num_epochs=2, callbacks=[metrics, verify, CustomEventStep(), MyDemoTrainingReportCallback()])
    print(f'pytorch-accelerated: accuracy {loop.train_history["accuracy"]}, {verify.verified} batches verified')

    loop = make_loop()
    scheduler = torch.optim.lr_scheduler.StepLR(loop.optimizer, step_size=1, gamma=0.5)
    loop.fit(num_epochs=2, callbacks=[LossDictMainCallback(scheduler)])
    print(f'Orca: val_loss {loop.train_history["val_loss"]}, lr now {loop.optimizer.param_groups[0]["lr"]}')
    return loop


if __name__ == '__main__':
    main()
