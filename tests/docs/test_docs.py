"""The documentation: the site builds strictly, and every ```python block of README.md and docs/ runs.

Each block runs as written, as the ``__main__`` script of its own process, with a temporary folder as working
directory and as ``HOME`` (so ``'~/results'`` and ``./experiments`` land there). To keep the file fast, the
processes are forked from one runner process that has imported torch and the libraries the callbacks use,
instead of each starting a new interpreter (tests/support/warm_python.py); nothing a block does (e.g.
``compat.install()``) reaches the test session or the next block. DDP blocks spawn their workers as any script
does (they re-import the block's file).

A block preceded by the line ``<!-- docs-test: fragment -->`` continues a training script: it runs after
PRELUDE, which defines the names such fragments use (``model``, ``train_loader``, ``val_loader``,
``test_loader``, ``optimizer``, ``criterion``, ``loop``, ``hyperparams``, and ``torch`` / ``nn``). Every other
block must be complete. A block that is not Python meant to run (program output, a layout) uses another fence.
"""
import os
import re
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
FRAGMENT_MARKER = '<!-- docs-test: fragment -->'

# What a fragment's script would have defined before it: a tiny CNN on random 8x8 "digit" images, so every
# fragment trains in well under a second per epoch. The model has the conv1 / fc layers the examples name.
PRELUDE = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TrainLoop, TTModel

torch.manual_seed(0)


class CNN(TTModel):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, kernel_size=3, padding=1)
        self.fc = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv1(x)).flatten(1))

    def get_loss(self, batch_data, criterion, device):
        x, y = batch_data
        return criterion(self(x.to(device)), y.to(device))

    def get_predictions(self, batch_data, device):
        x, y = batch_data
        return self(x.to(device)).argmax(dim=1), y, None


def _random_digits_loader(num_samples, shuffle=False):
    data = TensorDataset(torch.randn(num_samples, 1, 8, 8), torch.randint(0, 10, (num_samples,)))
    return DataLoader(data, batch_size=16, shuffle=shuffle)


model = CNN()
train_loader = _random_digits_loader(48, shuffle=True)
val_loader = _random_digits_loader(16)
test_loader = _random_digits_loader(16)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
criterion = nn.CrossEntropyLoss()
loop = TrainLoop(model, train_loader, val_loader, test_loader, optimizer, criterion)
hyperparams = {'lr': 1e-3, 'batch_size': 16}
'''

_FENCE = re.compile(r'^```python[ \t]*\n(.*?)^```[ \t]*$', re.S | re.M)


def _doc_files():
    return [ROOT / 'README.md'] + sorted((ROOT / 'docs').rglob('*.md'))


def _python_blocks():
    blocks = []
    for path in _doc_files():
        text = path.read_text()
        for match in _FENCE.finditer(text):
            line = text.count('\n', 0, match.start()) + 1
            before = text[:match.start()].rstrip('\n').rsplit('\n', 1)[-1].strip()
            name = f'{path.relative_to(ROOT).as_posix()}:{line}'
            blocks.append(pytest.param(match.group(1), before == FRAGMENT_MARKER, id=name))
    return blocks


def _sandbox_env(home):
    env = dict(os.environ)
    env.update(HOME=str(home), MPLBACKEND='Agg', OMP_NUM_THREADS='1', NO_MKDOCS_2_WARNING='1',
               WANDB_MODE='disabled', WANDB_SILENT='true', PYTHONDONTWRITEBYTECODE='1')
    env.pop('AWS_ENDPOINT_URL_S3', None)
    return env


@pytest.fixture
def block_runner(warm_python):
    """Runs a block as ``python doc_block.py``, forked from the tests' zygote (conftest's ``warm_python``)."""
    def run(script, cwd, output):
        env = dict(_sandbox_env(cwd), HOME=str(cwd))
        return warm_python.wait(warm_python.start([script], cwd, env, output, output), timeout=170)

    return run


def test_docs_have_python_blocks():
    assert len(_python_blocks()) >= 10


@pytest.mark.timeout(180)
@pytest.mark.parametrize('code, is_fragment', _python_blocks())
def test_doc_block_runs(code, is_fragment, tmp_path, block_runner):
    # A file, not exec of a string: spawned DDP processes re-import the script that started them.
    script, cwd, output = tmp_path / 'doc_block.py', tmp_path / 'cwd', tmp_path / 'output.txt'
    script.write_text((PRELUDE + '\n# ---- the documented block ----\n' if is_fragment else '') + code)
    cwd.mkdir()
    status = block_runner(str(script), str(cwd), str(output))
    assert status == 0, f'the block failed (exit status {status}):\n{code}\n--- output ---\n{output.read_text()}'


@pytest.mark.timeout(180)
@pytest.mark.xdist_group('docs_site')       # the site is built once (conftest's docs_site)
def test_mkdocs_build_strict(docs_site):
    result, site = docs_site
    assert result.returncode == 0, result.stdout + result.stderr
    assert (site / 'index.html').is_file()
    assert (site / 'reference' / 'train_loop' / 'index.html').is_file()
    # The API reference really holds the docstrings (a mkdocstrings failure would leave `::: ...` text).
    page = (site / 'reference' / 'train_loop' / 'index.html').read_text()
    assert 'TrainLoop' in page and ':::' not in page
