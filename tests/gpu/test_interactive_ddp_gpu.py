"""gpu_mode='ddp' from a program whose __main__ is not a file (a notebook, ``python -c``): the loop forks its
processes, which then have the program's own classes. On a GPU that works while CUDA is untouched in the program,
and once something has used CUDA there it is refused with an error that says why and what to do (a forked process
cannot use the CUDA of its parent). tests/docs/test_notebook.py runs the same in a real Jupyter kernel on the CPU."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from aitoolbox_like import TrainLoop, TTBasicModel


class Net(TTBasicModel):        # defined in __main__, which is no file: a spawned process could not import it
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x):
        return self.net(x)


torch.manual_seed(0)
x = torch.randn(32, 4)
model = Net()
loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
{before_fit}
loop = TrainLoop(model, loader, None, None, torch.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(),
                 gpu_mode='ddp', progress_bar=False)
loop.fit(num_epochs=2, num_gpus=1)
print('trained', len(loop.train_history['accumulated_loss']), 'epochs', flush=True)
'''


def _run(before_fit):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get('PYTHONPATH')])))
    return subprocess.run([sys.executable, '-c', PROGRAM.format(before_fit=before_fit)], capture_output=True,
                          text=True, timeout=180, env=env)


def test_ddp_from_a_program_that_is_no_file_trains_on_the_gpu_with_its_own_class(device):
    if device.type != 'cuda':
        pytest.skip('the forked processes train on the GPU here')
    done = _run('')
    assert done.returncode == 0, done.stderr[-3000:]
    assert 'trained 2 epochs' in done.stdout


def test_ddp_from_a_program_that_used_cuda_already_is_refused_with_what_to_do(device):
    if device.type != 'cuda':
        pytest.skip('needs CUDA initialised in the program')
    refused = _run("torch.zeros(1, device='cuda')       # CUDA is initialised in this process now")
    assert refused.returncode != 0
    assert 'CUDA does not survive a fork once it is initialised in this process' in refused.stderr
    assert 'Restart the kernel and run the fit before anything touches the GPU' in refused.stderr
    assert 'trained' not in refused.stdout
