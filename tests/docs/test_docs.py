"""The documentation: the site builds strictly, and every ```python block of README.md and docs/ runs.

Each block runs as written, as the ``__main__`` script of its own process, with a temporary folder as working
directory and as ``HOME`` (so ``'~/results'`` and ``./experiments`` land there). To keep the file fast, most
processes are forked from one runner process that has imported torch and the libraries the callbacks use,
instead of each starting a new interpreter (tests/support/warm_python.py); nothing a block does (e.g.
``compat.install()``) reaches the test session or the next block. A block that starts processes (a
``gpu_mode='ddp'``/``'fsdp'`` fit in spawn mode, torch.multiprocessing) runs as a reader runs it instead:
``python doc_block.py`` in a fresh interpreter, whose ranks are fresh interpreters that re-import the block's file
(spawn), so a block that only works when its ranks are forked (no ``if __name__ == '__main__':`` guard, a class
defined under the guard) fails here as it would for the reader. A block written for torchrun (it reads torchrun's
``RANK``) also runs under ``torchrun`` with two ranks.

A block preceded by the line ``<!-- docs-test: fragment -->`` continues a training script: it runs after
PRELUDE, which defines the names such fragments use (``model``, ``train_loader``, ``val_loader``,
``test_loader``, ``optimizer``, ``criterion``, ``loop``, ``hyperparams``, and ``torch`` / ``nn``). Every other
block must be complete. A block that is not Python meant to run (program output, a layout) uses another fence.
"""
import os
import re
import subprocess
import sys
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
# A block that starts processes when run as `python file.py`: a fit with gpu_mode='ddp'/'fsdp' written as such
# (not `'ddp' if under_torchrun else 'single'`, which trains in one process when run directly), or
# torch.multiprocessing's own spawn.
_STARTS_PROCESSES = re.compile(r"""gpu_mode\s*=\s*['"](?:ddp|fsdp)['"]\s*[,)]|torch\.multiprocessing|\bmp\.spawn\b""")
# A block meant to be started by torchrun: it asks whether torchrun's RANK is set.
_FOR_TORCHRUN = re.compile(r"""['"]RANK['"]\s+in\s+os\.environ""")
_TORCHRUN = os.path.join(os.path.dirname(sys.executable), 'torchrun')


def _doc_files():
    return [ROOT / 'README.md'] + sorted((ROOT / 'docs').rglob('*.md'))


def _python_blocks(pattern=None):
    """Every block (those whose code matches ``pattern``) as ``pytest.param(code, is_fragment, id='FILE:LINE')``."""
    blocks = []
    for path in _doc_files():
        text = path.read_text()
        for match in _FENCE.finditer(text):
            line = text.count('\n', 0, match.start()) + 1
            before = text[:match.start()].rstrip('\n').rsplit('\n', 1)[-1].strip()
            name = f'{path.relative_to(ROOT).as_posix()}:{line}'
            if pattern is None or pattern.search(match.group(1)):
                blocks.append(pytest.param(match.group(1), before == FRAGMENT_MARKER, id=name))
    return blocks


def _sandbox_env(home):
    env = dict(os.environ)
    env.update(HOME=str(home), MPLBACKEND='Agg', OMP_NUM_THREADS='1', NO_MKDOCS_2_WARNING='1',
               WANDB_MODE='disabled', WANDB_SILENT='true', PYTHONDONTWRITEBYTECODE='1')
    env.pop('AWS_ENDPOINT_URL_S3', None)
    return env


def _run_fresh(command, cwd, output):
    """``command`` as a shell starts it: a fresh interpreter, with the reader's hash seed (none forced)."""
    env = dict(_sandbox_env(cwd), HOME=str(cwd))
    env.pop('PYTHONHASHSEED', None)
    with open(output, 'w') as out:
        return subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=170).returncode


@pytest.fixture
def block_runner(warm_python):
    """Runs a block as ``python doc_block.py``: a fresh interpreter when the block starts processes, else forked from
    the tests' zygote (conftest's ``warm_python``), which runs the rest of the blocks as a fresh one would."""
    def run(script, cwd, output, code):
        if _STARTS_PROCESSES.search(code):
            return _run_fresh([sys.executable, script], cwd, output)
        env = dict(_sandbox_env(cwd), HOME=str(cwd))
        return warm_python.wait(warm_python.start([script], cwd, env, output, output), timeout=170)

    return run


def _write_block(tmp_path, code, is_fragment):
    # A file, not exec of a string: spawned ranks re-import the script that started them.
    script, cwd, output = tmp_path / 'doc_block.py', tmp_path / 'cwd', tmp_path / 'output.txt'
    script.write_text((PRELUDE + '\n# ---- the documented block ----\n' if is_fragment else '') + code)
    cwd.mkdir()
    return script, cwd, output


def test_docs_have_python_blocks():
    assert len(_python_blocks()) >= 10


def test_the_blocks_that_start_processes_are_recognised():
    """Every block with a DDP/FSDP fit is either run fresh (spawn mode), run under torchrun, or a SLURM block (run
    directly it trains in one process; examples/slurm/train_ddp.py, the same script, runs under a real srun in
    tests/distributed/test_slurm.py): a new way of writing such a block cannot slip back onto the forked path."""
    spawned = {block.id for block in _python_blocks(_STARTS_PROCESSES)}
    torchrun = {block.id for block in _python_blocks(_FOR_TORCHRUN)}
    assert len(spawned) >= 3 and len(torchrun) >= 1, (spawned, torchrun)
    for block in _python_blocks(re.compile(r'ddp|fsdp')):
        code = block.values[0]
        if re.search(r'gpu_mode|fit\(', code) and block.id not in spawned | torchrun:
            assert 'SLURM_NTASKS' in code, f'{block.id} trains with DDP/FSDP but is neither run fresh nor under ' \
                                           f'torchrun:\n{code}'


@pytest.mark.timeout(180)
@pytest.mark.parametrize('code, is_fragment', _python_blocks())
def test_doc_block_runs(code, is_fragment, tmp_path, block_runner):
    script, cwd, output = _write_block(tmp_path, code, is_fragment)
    status = block_runner(str(script), str(cwd), str(output), code)
    assert status == 0, f'the block failed (exit status {status}):\n{code}\n--- output ---\n{output.read_text()}'


@pytest.mark.system
@pytest.mark.timeout(180)
@pytest.mark.parametrize('code, is_fragment', _python_blocks(_FOR_TORCHRUN))
def test_torchrun_doc_block_runs_under_torchrun(code, is_fragment, tmp_path):
    """The block as the page starts it (``torchrun --nproc-per-node=2 train.py``; standalone: a free port)."""
    script, cwd, output = _write_block(tmp_path, code, is_fragment)
    status = _run_fresh([_TORCHRUN, '--standalone', '--nproc-per-node=2', str(script)], str(cwd), str(output))
    printed = output.read_text()
    assert status == 0, f'the block failed under torchrun (exit status {status}):\n{code}\n--- output ---\n{printed}'


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


def test_the_table_of_hooks_of_event_order_is_made_from_abstract_callback():
    sys.path.insert(0, str(ROOT))
    try:
        from mkdocs_hooks import EVENT_ORDER, event_order_page
    finally:
        sys.path.remove(str(ROOT))
    assert EVENT_ORDER.read_text() == event_order_page(), \
        'docs/event-order.md\'s table of hooks is out of date: run `python mkdocs_hooks.py` and commit the file'
