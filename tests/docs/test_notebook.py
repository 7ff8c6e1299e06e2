"""A Jupyter notebook is a place to train, as a terminal is: a notebook run in a real kernel (nbclient drives
ipykernel as Jupyter does) shows tqdm's notebook progress bar with the epoch's results, and trains with
gpu_mode='ddp' and 'fsdp' a model whose class is defined in one of its cells (spawned processes could not import it:
the loop forks them), as the same fit in one process would."""
import os
import sys

import nbformat
import pytest
import torch
from nbclient import NotebookClient
from torch import nn

from helpers import assert_close_states

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'distributed',
                                'ddp_scripts'))
from ddp_common import equivalence_setup, reference_loader  # noqa: E402

SETUP = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from aitoolbox_like import TrainLoop, TTBasicModel


class Net(TTBasicModel):            # defined in the notebook: a spawned process has no such class
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x):
        return self.net(x)


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g))


def parts():
    torch.manual_seed(0)
    model = Net()
    train = DataLoader(data(32, 1), batch_size=4, shuffle=False)
    val = DataLoader(data(7, 2), batch_size=4)
    return model, train, val, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
'''

PROGRESS = '''
model, train, val, optimizer = parts()
TrainLoop(model, train, val, None, optimizer, nn.MSELoss()).fit(num_epochs=2)
'''

DISTRIBUTED = '''
model, train, val, optimizer = parts()
loop = TrainLoop(model, train, val, None, optimizer, nn.MSELoss(), gpu_mode={mode!r}, progress_bar=False)
loop.fit(num_epochs=2, grad_accumulation=2, num_gpus=2, on_gpu=False)
torch.save(loop.model.state_dict(), {path!r})
'''


def _reference_weights():
    """The model trained by hand in one process on the global batches both ranks' batches of 4 make."""
    model, _, _, optimizer = equivalence_setup()
    loader = reference_loader()
    for _ in range(2):
        for i, (x, y) in enumerate(loader):
            (nn.functional.mse_loss(model(x), y) / 2).backward()
            if i % 2 == 1 or i == len(loader) - 1:
                optimizer.step()
                optimizer.zero_grad()
    return model.state_dict()


@pytest.mark.timeout(240)
def test_a_notebook_shows_the_progress_bar_and_trains_with_ddp_and_fsdp_from_its_own_classes(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(SETUP), nbformat.v4.new_code_cell(PROGRESS)] + [
        nbformat.v4.new_code_cell(DISTRIBUTED.format(mode=mode, path=str(tmp_path / f'{mode}.pt')))
        for mode in ('ddp', 'fsdp')]
    client = NotebookClient(notebook, timeout=180, kernel_name='python3', store_widget_state=True,
                            resources={'metadata': {'path': str(tmp_path)}})
    client.execute(env=dict(os.environ, OMP_NUM_THREADS='1'))

    # The progress bar: tqdm's notebook widget, one per epoch, ending with the epoch's results.
    progress = notebook.cells[1].outputs
    bars = [out for out in progress if 'application/vnd.jupyter.widget-view+json' in out.get('data', {})]
    assert len(bars) == 2, progress
    states = notebook.metadata['widgets']['application/vnd.jupyter.widget-state+json']['state'].values()
    shown = ' '.join(str(state['state'].get('value', '')) for state in states).replace('\u2007', ' ')
    assert 'Epoch 1/2: 100%' in shown and 'Epoch 2/2: 100%' in shown, shown
    assert shown.count('val_loss=') == 2, shown

    # DDP and FSDP from the notebook's own class, as one process trains on the global batches.
    reference = _reference_weights()
    for mode in ('ddp', 'fsdp'):
        errors = [out for out in notebook.cells[2 if mode == 'ddp' else 3].outputs if out.output_type == 'error']
        assert not errors, errors
        assert_close_states(torch.load(tmp_path / f'{mode}.pt'), reference)
