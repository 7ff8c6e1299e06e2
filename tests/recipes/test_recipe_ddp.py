"""gpu_mode: ddp from a recipe, on 2 CPU processes (gloo): spawned by `python -m aitoolbox_like train` (the model
class of the recipe's imported file is unpickled in the children) and started by torchrun."""
import glob
import os
import subprocess
import sys

import pytest
import torch

from aitoolbox_like.experiment import read_pointer

PARTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'recipe_parts.py')
RECIPE = f'''
imports: [{PARTS}]
seed: 0
data: {{name: tiny_loaders}}
model: {{name: TinyNet}}
optimizer: {{name: SGD, lr: 0.1}}
criterion: {{name: CrossEntropyLoss}}
loop: {{name: TrainLoopCheckpoint, project_name: tiny, experiment_name: ddp, local_model_result_folder_path: out,
       hyperparams: {{}}, cloud_save_mode: local, gpu_mode: ddp, progress_bar: false}}
fit: {{num_epochs: 2, num_gpus: 2, on_gpu: false}}
'''


def _run(command, cwd):
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONDONTWRITEBYTECODE='1')
    for name in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT'):
        env.pop(name, None)
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=150)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result


def _weights_and_files(cwd, experiment_name):
    [folder] = glob.glob(os.path.join(cwd, 'out', 'tiny', f'{experiment_name}_*'))
    checkpoint = torch.load(read_pointer(folder), weights_only=True)
    assert checkpoint['epoch'] == 1
    assert os.path.isfile(os.path.join(folder, 'recipe.yaml'))
    assert os.path.isfile(os.path.join(folder, 'command_line.txt'))
    return checkpoint['model_state_dict']


@pytest.fixture(scope='module')
def spawned(tmp_path_factory):
    cwd = tmp_path_factory.mktemp('ddp_spawn')
    (cwd / 'ddp.yaml').write_text(RECIPE)
    _run([sys.executable, '-m', 'aitoolbox_like', 'train', 'ddp.yaml', 'loop.experiment_name=spawned'], cwd)
    return _weights_and_files(cwd, 'spawned')


@pytest.mark.timeout(200)
def test_ddp_recipe_spawns_two_processes(spawned):
    sys.path.insert(0, os.path.dirname(PARTS))
    try:
        from recipe_parts import TinyNet
    finally:
        sys.path.remove(os.path.dirname(PARTS))
    torch.manual_seed(0)
    initial = TinyNet().state_dict()          # what the recipe built before training (data draws no random numbers)
    assert spawned.keys() == initial.keys()
    assert all(not torch.equal(spawned[name], initial[name]) for name in initial)   # trained


@pytest.mark.system
@pytest.mark.timeout(200)
def test_ddp_recipe_under_torchrun_trains_as_the_spawned_run(spawned, tmp_path):
    (tmp_path / 'ddp.yaml').write_text(RECIPE)
    _run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2',
          '-m', 'aitoolbox_like', 'train', 'ddp.yaml', 'loop.experiment_name=torchrun'], tmp_path)
    weights = _weights_and_files(tmp_path, 'torchrun')
    # Same seed, same data order (the samplers' shuffle seed is the seeded initial seed): the same weights.
    for name, tensor in spawned.items():
        assert torch.equal(weights[name], tensor), name
