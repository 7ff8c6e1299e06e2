"""Gradient callbacks inside real fits, compared with the same clipping / statistics done by hand."""
import contextlib
import os

import pytest
import torch
from torch import nn

from aitoolbox_like import MultiOptimizer, TrainLoop
from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.callbacks.gradient import (
    GradDistributionPlot, GradientStatsPrint, GradNormClip, GradNormLogger, GradValueClip)
from helpers import MLP, loaders, state_equal

EPOCHS = 2


def data():
    train, val, _ = loaders(n=32, batch_size=8, shuffle=False)
    return train, val


def single(model):
    return torch.optim.SGD(model.parameters(), lr=0.5)


def two_optimizers(model):
    return MultiOptimizer([torch.optim.SGD(model.net[0].parameters(), lr=0.5),
                           torch.optim.SGD(model.net[3].parameters(), lr=0.5)])


def fit(callbacks, optimizer_fn=single, fake_fp16=False, **fit_kwargs):
    torch.manual_seed(0)
    model = MLP()
    train, val = data()
    loop = TrainLoop(model, train, val, None, optimizer_fn(model), nn.CrossEntropyLoss(), progress_bar=False)
    if fake_fp16:
        # A real GradScaler on CPU, driven by the loop as under use_amp='fp16' on CUDA.
        loop._amp.mode, loop._amp.uses_scaler = 'fp16', True
        loop._amp.autocast = contextlib.nullcontext
        loop.amp_scaler = loop._amp.scaler = torch.amp.GradScaler('cpu', init_scale=2. ** 10)
    loop.fit(num_epochs=EPOCHS, callbacks=callbacks, **fit_kwargs)
    return loop


def fit_by_hand(clip, optimizer_fn=single, scaler=None):
    """The same training written as a plain PyTorch loop; clip(optimizers) runs before the steps."""
    torch.manual_seed(0)
    model = MLP()
    train, _ = data()
    optimizer = optimizer_fn(model)
    optimizers = list(optimizer) if isinstance(optimizer, MultiOptimizer) else [optimizer]
    criterion = nn.CrossEntropyLoss()
    for _ in range(EPOCHS):
        for x, y in train:
            loss = criterion(model(x), y)
            (scaler.scale(loss) if scaler else loss).backward()
            if scaler:
                for opt in optimizers:
                    scaler.unscale_(opt)
            clip(optimizers)
            for opt in optimizers:
                scaler.step(opt) if scaler else opt.step()
                opt.zero_grad()
            if scaler:
                scaler.update()
    return model


def params_of(opt):
    return [p for g in opt.param_groups for p in g['params']]


class GradRecorder(AbstractCallback):
    """Total gradient norm and max |grad| that each optimizer step applies (runs after the clipping callbacks)."""

    def __init__(self):
        super().__init__('grad recorder', execution_order=50)
        self.norms, self.max_abs, self.last_grads = [], [], None

    def on_after_gradient_update(self, optimizer_idx):
        loop = self.train_loop_obj
        opt = loop.optimizer[optimizer_idx] if isinstance(loop.optimizer, MultiOptimizer) else loop.optimizer
        grads = [p.grad for p in params_of(opt)]
        self.norms.append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item())
        self.max_abs.append(max(g.abs().max().item() for g in grads))
        if loop.iteration == len(loop.train_loader) - 1 and optimizer_idx == 0:
            self.last_grads = [p.grad.detach().clone() for p in loop.model.parameters()]


def test_grad_norm_clip_matches_hand_written_loop():
    recorder = GradRecorder()
    loop = fit([GradNormClip(0.05), recorder])
    by_hand = fit_by_hand(lambda opts: torch.nn.utils.clip_grad_norm_(params_of(opts[0]), 0.05))
    assert state_equal(loop.model.state_dict(), by_hand.state_dict())
    assert max(recorder.norms) == pytest.approx(0.05, rel=1e-5)


def test_grad_value_clip_matches_hand_written_loop():
    recorder = GradRecorder()
    loop = fit([GradValueClip(0.01), recorder])
    by_hand = fit_by_hand(lambda opts: torch.nn.utils.clip_grad_value_(params_of(opts[0]), 0.01))
    assert state_equal(loop.model.state_dict(), by_hand.state_dict())
    assert max(recorder.max_abs) == pytest.approx(0.01)


def test_with_two_optimizers_each_clips_only_its_own_parameters():
    recorder = GradRecorder()
    loop = fit([GradNormClip(0.02), recorder], optimizer_fn=two_optimizers)

    def per_optimizer(opts):
        for opt in opts:
            torch.nn.utils.clip_grad_norm_(params_of(opt), 0.02)
    assert state_equal(loop.model.state_dict(), fit_by_hand(per_optimizer, two_optimizers).state_dict())
    # Each optimizer's update has norm 0.02; clipping all parameters together (AIToolbox) would give less.
    assert recorder.norms == pytest.approx([0.02] * len(recorder.norms), rel=1e-5)
    together = fit_by_hand(lambda opts: torch.nn.utils.clip_grad_norm_(
        params_of(opts[0]) + params_of(opts[1]), 0.02), two_optimizers)
    assert not state_equal(loop.model.state_dict(), together.state_dict())


def test_two_clipping_callbacks_with_fp16_grad_scaler():
    recorder = GradRecorder()
    loop = fit([GradValueClip(0.02), GradNormClip(0.03), recorder], fake_fp16=True)

    def both(opts):
        torch.nn.utils.clip_grad_value_(params_of(opts[0]), 0.02)
        torch.nn.utils.clip_grad_norm_(params_of(opts[0]), 0.03)
    by_hand = fit_by_hand(both, scaler=torch.amp.GradScaler('cpu', init_scale=2. ** 10))
    assert state_equal(loop.model.state_dict(), by_hand.state_dict())
    # The recorded norms are of real (unscaled) gradients: at most the clip value, not 2**10 times it.
    assert max(recorder.norms) <= 0.03 * (1 + 1e-5)


def test_gradient_stats_are_of_the_last_update_before_zero_grad(capsys):
    recorder = GradRecorder()
    stats = GradientStatsPrint(lambda model: [model.net[0], model.net[3].bias])
    fit([stats, recorder])
    first_weight_grad, last_bias_grad = recorder.last_grads[0].reshape(-1), recorder.last_grads[3]
    for got, grad in zip(stats.last_stats, (first_weight_grad, last_bias_grad)):
        assert got['mean'] == pytest.approx(grad.mean().item(), abs=1e-7)
        assert got['std'] == pytest.approx(grad.std(unbiased=False).item(), rel=1e-5)
        assert got['norm'] == pytest.approx(torch.linalg.vector_norm(grad).item(), rel=1e-5)
        assert got['zero_fraction'] == pytest.approx((grad == 0).float().mean().item())
    assert stats.last_stats[0]['norm'] > 0
    out = capsys.readouterr().out
    assert out.count('Layer 0 grads') == EPOCHS and 'Layer 1 grads' in out and 'no gradient' not in out


def test_gradient_stats_every_k_epochs_and_every_update(capsys):
    fit([GradientStatsPrint(lambda model: [model.net[0]], stats_eval_freq=2)])
    assert capsys.readouterr().out.count('end of epoch') == 1        # epoch 0 of 2
    fit([GradientStatsPrint(lambda model: [model.net[0]], on_every_grad_update=True)])
    assert capsys.readouterr().out.count('batch') == EPOCHS * 4


def test_gradient_stats_print_sets_grad_cb_used_only_for_every_update_reports():
    # AIToolbox code reads the flag as "a callback works on every gradient update"
    for on_every_grad_update in (False, True):
        model = MLP()
        loop = TrainLoop(model, None, None, None, torch.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss())
        loop.callbacks_handler.register_callbacks(
            [GradientStatsPrint(lambda m: [m.net[0]], on_every_grad_update=on_every_grad_update)])
        assert loop.grad_cb_used is on_every_grad_update


def test_grad_distribution_plot_writes_readable_images():
    import matplotlib.image

    plot, recorder = GradDistributionPlot(lambda model: [model.net[0], model.net[3]]), GradRecorder()
    fit([plot, recorder])
    # The gradients of the epoch's last update (AIToolbox read them after zero_grad: None on torch 2).
    assert torch.equal(torch.from_numpy(plot.last_gradients[0]), recorder.last_grads[0].reshape(-1))
    assert torch.equal(torch.from_numpy(plot.last_gradients[1]), recorder.last_grads[2].reshape(-1))
    assert len(plot.saved_plot_paths) == 2 * EPOCHS
    root = os.path.join(plot.experiment_dir_path, 'results', 'grad_distribution')
    assert plot.experiment_dir_path.startswith(os.path.abspath('experiments'))
    for epoch in range(EPOCHS):
        for layer in range(2):
            path = os.path.join(root, f'epoch_{epoch}', f'layer_{layer}.png')
            image = matplotlib.image.imread(path)
            assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
            assert image[..., :3].std() > 0          # not a blank canvas

    pdf = GradDistributionPlot(lambda model: [model.net[0]], grad_plots_dir_name='grads', file_format='pdf')
    fit([pdf])
    with open(os.path.join(pdf.experiment_dir_path, 'results', 'grads', 'epoch_1', 'gradients.pdf'), 'rb') as f:
        assert f.read(5) == b'%PDF-'
    with pytest.raises(ValueError, match='file_format'):
        GradDistributionPlot(lambda model: [], file_format='jpg')


def test_grad_norm_logger_epoch_means_per_model_and_layer():
    loop = fit([GradNormLogger(per_layer=True), GradNormClip(0.05)])
    assert loop.train_history['grad_norm'][0] > 0.05      # measured before the clipping callback

    norms = {'all': [], 'net.0': [], 'net.3': []}

    class Norms(AbstractCallback):
        def __init__(self):
            super().__init__('norms', execution_order=-10)

        def on_after_gradient_update(self, optimizer_idx):
            model = self.train_loop_obj.model
            for key, params in (('all', model.parameters()), ('net.0', model.net[0].parameters()),
                                ('net.3', model.net[3].parameters())):
                norms[key].append(torch.linalg.vector_norm(torch.stack(
                    [torch.linalg.vector_norm(p.grad) for p in params])).item())
    loop = fit([GradNormLogger(per_layer=True), Norms()])
    history = loop.train_history
    for key, name in (('all', 'grad_norm'), ('net.0', 'grad_norm_net.0'), ('net.3', 'grad_norm_net.3')):
        expected = [sum(norms[key][e * 4:(e + 1) * 4]) / 4 for e in range(EPOCHS)]
        assert history[name] == pytest.approx(expected, rel=1e-5)
