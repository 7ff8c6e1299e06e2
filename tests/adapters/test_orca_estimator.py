"""Orca's Estimator over a TrainLoop (aitoolbox_like.adapters.orca.Estimator), against Orca's TorchRunner written
as a plain PyTorch loop: its creators, its data handling (each worker's batch_size, its shuffling DistributedSampler
and the sampler's epoch), its statistics, callbacks per fit, evaluate, predict, save / load. Under torchrun with 2
CPU ranks: docs/callbacks/orca.md's Estimator script (tests/docs)."""
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from aitoolbox_like.adapters.orca import Accuracy, Callback, Estimator

X = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
Y = (X[:, 0] > 0).long()
VAL_X, VAL_Y = X[:12] + 0.1, Y[:12]


def train_creator(config, batch_size):
    return DataLoader(TensorDataset(X, Y), batch_size=batch_size, shuffle=True)


def val_creator(config, batch_size):
    return DataLoader(TensorDataset(VAL_X, VAL_Y), batch_size=batch_size)


def model_creator(config):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def optimizer_creator(model, config):
    return torch.optim.SGD(model.parameters(), lr=config['lr'])


def estimator(**kwargs):
    return Estimator.from_torch(model=model_creator, optimizer=optimizer_creator, loss=nn.CrossEntropyLoss(),
                                config={'lr': 0.2}, backend='ray', **kwargs)


def orcas_runner(epochs, batch_size):
    """Orca's TorchRunner, by hand: the creator's data behind a shuffling DistributedSampler of one worker, its epoch
    set before each epoch; per batch forward, zero_grad, backward, step; validation weighted by samples over the
    validation data behind a DistributedSampler left at epoch 0."""
    model = model_creator({})
    optimizer = optimizer_creator(model, {'lr': 0.2})
    criterion = nn.CrossEntropyLoss()
    train = TensorDataset(X, Y)
    sampler = DistributedSampler(train, num_replicas=1, rank=0, shuffle=True)
    val = TensorDataset(VAL_X, VAL_Y)
    val_loader = DataLoader(val, batch_size=batch_size, sampler=DistributedSampler(val, 1, 0, shuffle=True))
    val_losses = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(train, batch_size=batch_size, sampler=sampler):
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            total, weighted = 0, 0.0
            for x, y in val_loader:
                weighted += criterion(model(x), y).item() * len(x)
                total += len(x)
        val_losses.append(weighted / total)
    return model, val_losses


def test_fit_trains_as_orcas_runner_with_its_data_handling_and_returns_its_statistics():
    est = estimator(metrics=[Accuracy()])
    stats = est.fit(data=train_creator, epochs=2, batch_size=8, validation_data=val_creator)
    model, val_losses = orcas_runner(2, 8)
    trained = est.get_model()
    assert all(torch.equal(a, b) for a, b in zip(trained.state_dict().values(), model.state_dict().values()))
    assert [s['epoch'] for s in stats] == [1, 2] and [s['val_loss'] for s in stats] == val_losses
    assert stats[-1]['num_samples'] == 40 and stats[-1]['val_num_samples'] == 12 and 'val_accuracy' in stats[-1]
    # the loop's history has them under Orca's names, and its val_loss is Orca's
    history = est.loop.train_history
    assert history['val_loss'] == val_losses and history['val_accuracy'] == [s['val_accuracy'] for s in stats]
    assert history['train_loss'] == [s['train_loss'] for s in stats]


def test_callbacks_are_given_per_fit_and_each_fit_trains_more_epochs():
    seen = []

    class Epochs(Callback):
        def after_train_epoch(self, runner):
            seen.append(runner.epochs)

    est = estimator()
    est.fit(data=train_creator, epochs=1, batch_size=8, callbacks=[Epochs()])
    stats = est.fit(data=train_creator, epochs=2, batch_size=8, max_steps=None)
    assert seen == [1] and [s['epoch'] for s in stats] == [2, 3]


def test_save_load_evaluate_and_predict(tmp_path):
    est = estimator(metrics=[Accuracy()])
    est.fit(data=train_creator, epochs=2, batch_size=8)
    path = est.save(str(tmp_path / 'orca.pt'))
    assert set(torch.load(path, weights_only=True)) == {'epoch', 'models', 'optimizers'}
    again = estimator(metrics=[Accuracy()])
    again.load(path)
    assert again.evaluate(val_creator, batch_size=4) == est.evaluate(val_creator, batch_size=4)
    result = est.evaluate(val_creator, batch_size=4)
    assert set(result) == {'Accuracy', 'val_loss', 'num_samples'} and result['num_samples'] == 12
    # after loading, the next fit's epochs count on from the saved one (Orca's)
    assert [s['epoch'] for s in again.fit(data=train_creator, epochs=1, batch_size=8)] == [3]
    predictions = est.predict(VAL_X.numpy(), batch_size=5)
    expected = est.get_model()(VAL_X).detach().numpy()
    assert predictions.shape == (12, 2) and np.allclose(predictions, expected)


def test_orca_data_it_cannot_take_is_refused_naming_the_creator():
    with pytest.raises(TypeError, match='creator function'):
        estimator().fit(data=DataLoader(TensorDataset(X, Y)), epochs=1)
    with pytest.raises(ValueError, match='batch_size should be a positive integer'):
        estimator().fit(data=train_creator, epochs=1, batch_size=0)
