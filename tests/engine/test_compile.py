"""torch.compile: a compiled model passed to the TrainLoop, and TrainLoop(..., compile=...).

Most tests use the 'aot_eager' backend (dynamo + AOT autograd, no code generation: seconds instead of a C++ build);
one runs the default 'inductor' backend, which works on this machine with its gcc.
"""
import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from aitoolbox_like import ModelWrap, TrainLoop
from aitoolbox_like.callbacks.abstract import AbstractCallback, StopTraining
from aitoolbox_like.callbacks.model_save import ModelIterationCheckpoint
from aitoolbox_like.model import AbstractModelFeedDefinition
from helpers import Interrupt, MLP, PlainMLP, classification_data, state_equal

FAST = {'backend': 'aot_eager'}


def data():
    # 48 / 16 samples in batches of 8: one batch shape, so each graph compiles once.
    train = DataLoader(classification_data(48, seed=0), batch_size=8, shuffle=True)
    val = DataLoader(classification_data(16, seed=1), batch_size=8)
    return train, val


def make_loop(model=None, compile=False, **kwargs):
    torch.manual_seed(0)
    model = MLP() if model is None else model
    train, val = data()
    params = (model.model if isinstance(model, ModelWrap) else model).parameters()
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return TrainLoop(model, train, val, None, optimizer, nn.CrossEntropyLoss(), progress_bar=False,
                     compile=compile, **kwargs)


class CountForward(AbstractCallback):
    """Records whether the loop's hooks run, and what each batch's loss was."""

    def __init__(self):
        super().__init__('count')
        self.batches = 0
        self.epochs = 0

    def on_batch_end(self):
        self.batches += 1

    def on_epoch_end(self):
        self.epochs += 1


def test_a_compiled_model_is_unwrapped_and_its_forward_is_compiled():
    graph_calls = []

    def counting_backend(graph_module, example_inputs):     # runs the captured graph, counting its calls
        def run(*args):
            graph_calls.append(torch.is_grad_enabled())
            return graph_module.forward(*args)
        return run

    torch.manual_seed(0)
    plain = MLP()
    compiled = torch.compile(plain, backend=counting_backend)
    loop = make_loop(compiled)
    assert loop.model is plain and loop.compiled_model is compiled
    counter = CountForward()
    loop.fit(num_epochs=1, callbacks=[counter])
    assert counter.batches == 6 and counter.epochs == 1
    # 6 training steps with gradients, then the end-of-epoch 'val_loss' pass (2 batches) without.
    assert graph_calls == [True] * 6 + [False] * 2
    assert not any(k.startswith('_orig_mod') for k in loop.model.state_dict())


def test_compile_option_matches_eager_training():
    eager = make_loop()
    eager.fit(num_epochs=2)
    compiled = make_loop(compile=FAST)
    compiled.fit(num_epochs=2)
    assert compiled.compiled_model is not None and compiled.model is not compiled.compiled_model
    for key, value in eager.model.state_dict().items():
        torch.testing.assert_close(compiled.model.state_dict()[key], value)
    for name in ('accumulated_loss', 'loss', 'val_loss'):
        assert compiled.train_history[name] == pytest.approx(eager.train_history[name], rel=1e-5)


def test_compile_option_validation_and_default():
    assert make_loop().compiled_model is None
    with pytest.raises(TypeError, match='compile must be'):
        make_loop(compile='yes')


class Feed(AbstractModelFeedDefinition):
    def get_loss(self, model, batch_data, criterion, device):
        x, y = batch_data
        return criterion(model(x.to(device)), y.to(device))

    def get_predictions(self, model, batch_data, device):
        x, y = batch_data
        return model(x.to(device)), y, None


def test_model_wrap_with_a_compiled_module_and_compile_option():
    torch.manual_seed(0)
    net = PlainMLP()
    loop = make_loop(ModelWrap(torch.compile(net, **FAST), Feed()))
    assert loop.model is net and loop.compiled_model is not None
    loop.fit(num_epochs=1)
    y_pred, y_true, _ = loop.predict_on_validation_set()
    assert y_pred.shape == (16, 3) and y_true.shape == (16,)

    torch.manual_seed(0)
    net = PlainMLP()
    loop = make_loop(ModelWrap(net, Feed()), compile=FAST)
    assert loop.model is net and loop.compiled_model is not None
    loop.fit(num_epochs=1)
    assert list(loop.model.state_dict()) == list(PlainMLP().state_dict())


def checkpoint_callbacks(tmp_path, name):
    return [ModelIterationCheckpoint(4, 'compile', name, str(tmp_path), hyperparams={}, cloud_save_mode=None,
                                     async_save=False)]


def test_compiled_run_resumed_mid_epoch_equals_the_uninterrupted_compiled_run(tmp_path):
    reference = make_loop(compile=FAST)
    reference.fit(num_epochs=2)

    first = make_loop(compile=FAST)
    first.fit(num_epochs=2, callbacks=checkpoint_callbacks(tmp_path, 'run') + [Interrupt(batch=10)])
    with open(os.path.join(first.experiment.work_dir, 'latest_checkpoint.txt')) as f:
        latest = f.read()
    assert latest.endswith('_E1_ITER8.pth')
    saved = torch.load(os.path.join(first.experiment.dir_path, latest), weights_only=True)
    assert not any('_orig_mod' in key for key in saved['model_state_dict'])

    torch.manual_seed(123)
    resumed = make_loop(MLP(hidden=16), compile=FAST)
    torch.manual_seed(7)
    resumed.fit(num_epochs=2, callbacks=checkpoint_callbacks(tmp_path, 'run'), resume_from='latest')
    assert state_equal(resumed.model.state_dict(), reference.model.state_dict())     # bit-exact
    assert resumed.train_history.train_history == reference.train_history.train_history


def test_inductor_backend():
    loop = make_loop(compile=True)
    loop.fit(num_epochs=1)
    eager = make_loop()
    eager.fit(num_epochs=1)
    for key, value in eager.model.state_dict().items():
        torch.testing.assert_close(loop.model.state_dict()[key], value, rtol=1e-4, atol=1e-5)
