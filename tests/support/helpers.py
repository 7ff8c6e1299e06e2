"""Small models and data shared by the tests, and the shipped examples loaded as modules."""
import ast
import importlib.util
import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import AbstractCallback, StopTraining, TTBasicModel, TTModel


class MLP(TTBasicModel):
    def __init__(self, in_features=6, hidden=16, out_features=3, dropout=0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, out_features))

    def forward(self, x):
        return self.net(x)


class PlainMLP(nn.Module):
    def __init__(self, in_features=6, hidden=16, out_features=3):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, out_features))

    def forward(self, x):
        return self.net(x)


class ImageClassifier(TTModel):
    """A linear classifier over flattened images; its get_loss / get_predictions take ``(images, labels)``
    batches."""

    def __init__(self, in_features=64, classes=10):
        super().__init__()
        self.fc = nn.Linear(in_features, classes)

    def forward(self, x):
        return self.fc(x.flatten(1))

    def get_loss(self, batch_data, criterion, device):
        x, y = batch_data
        return criterion(self(x.to(device)), y.to(device))

    def get_predictions(self, batch_data, device):
        x, y = batch_data
        return self(x.to(device)), y, None


def image_batches(num_batches, seed, batch_size=4, image_shape=(1, 8, 8), classes=10):
    """A list of (images, labels) batches: a loader whose tensors the test can compare by identity."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(batch_size, *image_shape, generator=g), torch.randint(0, classes, (batch_size,), generator=g))
            for _ in range(num_batches)]


def classification_data(n=53, in_features=6, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_features, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return TensorDataset(x, y.clamp(max=classes - 1))


def loaders(n=53, batch_size=8, shuffle=True, seed=0):
    train = DataLoader(classification_data(n, seed=seed), batch_size=batch_size, shuffle=shuffle)
    val = DataLoader(classification_data(29, seed=seed + 1), batch_size=batch_size)
    test = DataLoader(classification_data(17, seed=seed + 2), batch_size=batch_size)
    return train, val, test


class Interrupt(AbstractCallback):
    """Ends the run before global batch ``batch`` (as a kill would, without its checkpoint): the newest checkpoint is
    then the one written before that batch."""

    def __init__(self, batch):
        super().__init__('interrupt')
        self.batch = batch

    def on_batch_begin(self):
        if self.train_loop_obj.total_iteration_idx == self.batch:
            raise StopTraining('interrupted')


def state_equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---- multi-process (FSDP) tests

#: Sharded runs reduce in another order than one process: weights agree within this tolerance.
SHARDED_TOLERANCE = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(autouse=True)
def one_thread_per_worker(monkeypatch):
    """One intra-op thread per spawned process (inherited through the environment): 2 processes on 2 cores.
    Autouse in the test modules that import it by name (the multi-process ones), nowhere else."""
    monkeypatch.setenv('OMP_NUM_THREADS', '1')


def assert_close_states(a, b):
    """Two state dicts with the same keys and values equal within SHARDED_TOLERANCE."""
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], **SHARDED_TOLERANCE)


def experiment_dir(root, project='proj'):
    """The one experiment folder of ``project`` under the results folder ``root``."""
    [name] = os.listdir(os.path.join(root, project))
    return os.path.join(root, project, name)


EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'examples')


def load_example(name):
    """examples/<name>.py as a module (its ``main`` not run)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES_DIR, f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_only_import_lines_changed(source, rewritten):
    """A library's module rewritten by a check's Rewriter (tools/sg_check, tools/orca_check): as many lines as the
    original, so tracebacks point at the library's own lines, and no line changed but those of its imports."""
    before, after = source.splitlines(), rewritten.splitlines()
    assert len(before) == len(after)
    changed = [i + 1 for i, (old, new) in enumerate(zip(before, after)) if old != new]
    import_lines = {line for node in ast.walk(ast.parse(source)) if isinstance(node, (ast.Import, ast.ImportFrom))
                    for line in range(node.lineno, node.end_lineno + 1)}
    assert set(changed) <= import_lines
    return after
