"""The learning-rate range test: it leaves the loop exactly as it was (weights, optimizer state, RNG, history), its
suggestion follows the documented rule, it plots (or warns without matplotlib), and as a callback it sets the
learning rate before training."""
import copy
import logging
import os
import random

import numpy as np
import pytest
import torch
from torch import nn

from aitoolbox_like import TrainLoop
from aitoolbox_like.callbacks import lr_finder
from aitoolbox_like.callbacks.lr_finder import LRFinder, find_lr, lr_schedule, suggest_lr
from aitoolbox_like.callbacks.train_schedule import StepLRScheduler
from helpers import MLP, loaders


def make_loop(seed=0, lr=0.05):
    torch.manual_seed(seed)
    model = MLP(dropout=0.3)
    train, val, test = loaders(n=40, batch_size=6)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    return TrainLoop(model, train, val, test, optimizer, nn.CrossEntropyLoss(), progress_bar=False)


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_nested_equal(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_nested_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_nested_equal(x, y)
    else:
        assert a == b


def test_find_lr_leaves_the_loop_exactly_as_it_was(tmp_path):
    loop = make_loop()
    loop.fit(num_epochs=1)           # the optimizer has state, the history values
    weights = snapshot(loop.model)
    optimizer_state = copy.deepcopy(loop.optimizer.state_dict())
    history = copy.deepcopy(loop.train_history.train_history)
    rng = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    grads = [p.grad for p in loop.model.parameters()]

    result = find_lr(loop, num_steps=30, plot_path=str(tmp_path / 'lr.png'))

    assert len(result.lrs) == len(result.losses) == len(result.smoothed_losses) <= 30
    assert_nested_equal(snapshot(loop.model), weights)
    assert_nested_equal(loop.optimizer.state_dict(), optimizer_state)
    assert loop.train_history.train_history == history
    assert torch.equal(torch.get_rng_state(), rng[0])
    assert random.getstate() == rng[1]
    assert np.array_equal(np.random.get_state()[1], rng[2])
    assert [p.grad for p in loop.model.parameters()] == grads

    # and so training goes on exactly as without the sweep
    loop.fit(num_epochs=3)
    other = make_loop()
    other.fit(num_epochs=1)
    other.fit(num_epochs=3)
    assert_nested_equal(snapshot(loop.model), snapshot(other.model))
    assert loop.train_history.train_history == other.train_history.train_history


def test_sweep_rates_suggestion_and_plot(tmp_path):
    loop = make_loop()
    result = find_lr(loop, start_lr=1e-5, end_lr=1., num_steps=40, diverge_threshold=None,
                     plot_path=str(tmp_path / 'plots' / 'lr.png'))
    assert result.lrs == pytest.approx(lr_schedule(1e-5, 1., 40))
    assert result.lrs[0] == pytest.approx(1e-5) and result.lrs[-1] == pytest.approx(1.)
    assert result.suggestion == suggest_lr(result.lrs, result.smoothed_losses)
    assert 1e-5 <= result.suggestion <= 1.
    assert result.plot_path == str(tmp_path / 'plots' / 'lr.png') and os.path.getsize(result.plot_path) > 0
    # smoothed losses: the bias-corrected moving average
    average = 0.
    for i, loss in enumerate(result.losses):
        average = 0.98 * average + 0.02 * loss
        assert result.smoothed_losses[i] == pytest.approx(average / (1 - 0.98 ** (i + 1)))


def test_suggestion_is_the_steepest_descent_of_the_smoothed_loss():
    lrs = lr_schedule(1e-4, 1., 41)
    # a loss that falls fastest at lr = 1e-2 (index 20) and rises after it
    losses = [2. - 1.5 / (1 + np.exp(-(np.log10(lr) + 2) * 4)) for lr in lrs]
    assert suggest_lr(lrs, losses) == pytest.approx(1e-2)
    assert suggest_lr(lrs[:15], losses[:15], skip_start=10, skip_end=5) is None
    assert lr_schedule(1., 3., 3, mode='linear') == [1., 2., 3.]


def test_divergence_stops_the_sweep():
    loop = make_loop()
    result = find_lr(loop, start_lr=1e-3, end_lr=1e6, num_steps=100, plot=False)
    assert len(result.lrs) < 100
    assert result.plot_path is None


def test_without_matplotlib_there_is_no_plot_and_a_warning(tmp_path, monkeypatch, caplog):
    def missing(**kwargs):
        raise ImportError('no matplotlib')
    monkeypatch.setattr(lr_finder, 'new_figure', missing)
    with caplog.at_level(logging.WARNING, logger='aitoolbox_like.callbacks.lr_finder'):
        result = find_lr(make_loop(), num_steps=20, plot_path=str(tmp_path / 'lr.png'))
    assert result.plot_path is None and not (tmp_path / 'lr.png').exists()
    assert 'matplotlib' in caplog.text


def test_lr_finder_callback_with_defaults_sets_the_suggested_rate(tmp_path):
    loop = make_loop()
    finder = LRFinder()
    loop.fit(num_epochs=1, callbacks=[finder, StepLRScheduler(step_size=1, gamma=0.5)])
    suggestion = finder.result.suggestion
    assert suggestion is not None and 1e-7 <= suggestion <= 10
    assert finder.result.plot_path == os.path.join(os.getcwd(), 'lr_finder.png')
    assert os.path.isfile(finder.result.plot_path)
    # the epoch ran at the suggestion, and the schedule scales from it
    assert loop.train_history['lr'] == [pytest.approx(suggestion)]
    assert loop.optimizer.param_groups[0]['lr'] == pytest.approx(suggestion * 0.5)

    # a continuing fit does not sweep again
    finder.result = None
    loop.fit(num_epochs=2, callbacks=[finder])
    assert finder.result is None


def test_bad_arguments_fail_clearly():
    loop = make_loop()
    with pytest.raises(ValueError, match='start_lr'):
        find_lr(loop, start_lr=1., end_lr=0.1)
    with pytest.raises(ValueError, match='mode'):
        find_lr(loop, mode='cos')
    with pytest.raises(ValueError, match='num_steps'):
        find_lr(loop, num_steps=0)
