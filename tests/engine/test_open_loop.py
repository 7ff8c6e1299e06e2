"""The loop opened up: evaluation hooks, the batch and loss in view, replacing the loss, stopping from anywhere."""
import torch
from torch import nn

from aitoolbox_like import AbstractCallback, StopTraining, TrainLoop
from helpers import MLP, loaders, state_equal


class EvalRecorder(AbstractCallback):
    def __init__(self):
        super().__init__('eval recorder')
        self.events = []
        self.batch_losses = []

    def on_epoch_begin(self):
        self.events.append(('epoch_begin', self.train_loop_obj.epoch))

    def on_train_epoch_end(self):
        self.events.append(('train_epoch_end', self.train_loop_obj.epoch))

    def on_eval_begin(self, dataset_info):
        self.events.append(('eval_begin', dataset_info['type'], dataset_info['kind']))

    def on_eval_batch_end(self, batch, outputs, dataset_info):
        if dataset_info['kind'] == 'loss' and dataset_info['type'] == 'validation':
            self.batch_losses.append((batch, outputs))

    def on_eval_end(self, dataset_info):
        self.events.append(('eval_end', dataset_info['type'], dataset_info['kind']))

    def on_epoch_end(self):
        self.events.append(('epoch_end', self.train_loop_obj.epoch))

    def on_train_end(self):
        self.events.append(('train_end',))


def test_evaluation_passes_are_announced_with_their_dataset_and_outputs():
    torch.manual_seed(0)
    model = MLP()
    train, val, test = loaders()
    loop = TrainLoop(model, train, val, test, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    recorder = EvalRecorder()
    loop.fit(num_epochs=1, callbacks=[recorder])
    assert recorder.events == [
        ('epoch_begin', 0), ('train_epoch_end', 0),
        ('eval_begin', 'validation', 'loss'), ('eval_end', 'validation', 'loss'),
        ('epoch_end', 0),
        ('eval_begin', 'test', 'loss'), ('eval_end', 'test', 'loss'),
        ('train_end',)]
    # each validation batch with the model's loss on it
    model.eval()
    with torch.no_grad():
        for (x, y), (batch, loss) in zip(val, recorder.batch_losses):
            assert torch.equal(batch[0], x) and torch.equal(loss, nn.CrossEntropyLoss()(model(x), y))
    assert len(recorder.batch_losses) == len(val)

    recorder.events.clear()
    y_pred, _, _ = loop.predict_on_validation_set()
    assert recorder.events == [('eval_begin', 'validation', 'predictions'), ('eval_end', 'validation', 'predictions')]
    recorder.events.clear()
    assert torch.equal(loop.predict_on_validation_set()[0], y_pred)
    assert recorder.events == []          # served from the cache: no pass, no hooks


class L2OnTheLoss(AbstractCallback):
    """Adds a weight penalty to the loss before backward and checks the batch it sees."""

    def __init__(self, weight):
        super().__init__('l2')
        self.weight = weight
        self.batches_seen = []

    def on_after_loss(self):
        loop = self.train_loop_obj
        self.batches_seen.append(loop.batch)
        assert loop.loss.requires_grad
        loop.loss = loop.loss + self.weight * sum((p ** 2).sum() for p in loop.model.parameters())


def test_a_callback_replaces_the_loss_like_a_hand_written_regulariser():
    weight = 0.01
    train, _, _ = loaders(shuffle=False)
    torch.manual_seed(3)
    reference = MLP()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference_losses = []
    for x, y in train:
        loss = nn.CrossEntropyLoss()(reference(x), y) + weight * sum((p ** 2).sum() for p in reference.parameters())
        reference_losses.append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    torch.manual_seed(3)
    model = MLP()
    penalty = L2OnTheLoss(weight)
    loop = TrainLoop(model, train, None, None, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                     end_auto_eval=False)
    loop.fit(num_epochs=1, callbacks=[penalty])
    assert state_equal(model.state_dict(), reference.state_dict())
    assert all(torch.equal(seen[0], x) for seen, (x, _) in zip(penalty.batches_seen, train))
    # the recorded epoch loss is the loss that was optimised, regulariser included
    assert loop.train_history['accumulated_loss'][0] == torch.tensor(reference_losses, dtype=torch.float64).mean().item()


class StopDuringValidation(AbstractCallback):
    def __init__(self):
        super().__init__('stop in validation')
        self.stopped_with = None
        self.train_end_called = False

    def on_eval_batch_end(self, batch, outputs, dataset_info):
        if dataset_info['type'] == 'validation' and self.train_loop_obj.epoch == 1:
            raise StopTraining('validation says stop')

    def on_train_stopped(self, reason):
        self.stopped_with = reason

    def on_train_end(self):
        self.train_end_called = True


def test_stop_training_from_an_evaluation_hook_ends_training_cleanly():
    model = MLP()
    train, val, _ = loaders()
    loop = TrainLoop(model, train, val, None, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    stopper = StopDuringValidation()
    loop.fit(num_epochs=5, callbacks=[stopper])
    assert str(stopper.stopped_with) == 'validation says stop' and stopper.train_end_called
    assert loop.epoch == 1 and loop.epochs_completed == 2
