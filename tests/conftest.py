import importlib.util
import os
import sys

import pytest
import torch

# Tests import their shared helpers (helpers.py, s3_server.py) from this folder.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# One SLURM cluster per session for every test that asks for it (started on first use).
from slurm_cluster import slurm_cluster  # noqa: E402,F401  (pytest fixture)

# The suite may itself run inside a SLURM job: its fits would then act as SLURM tasks (signals end the process,
# srun's tasks form groups). The SLURM tests start jobs of their own, which get their variables from SLURM.
for _name in [name for name in os.environ if name.startswith('SLURM_')]:
    del os.environ[_name]


def _let_cuda_torchvision_import_on_cpu_torch():
    """The PyPI torchvision wheel is a CUDA build: with CPU-only torch its import (and torchmetrics', which
    imports it) fails with 'operator torchvision::nms does not exist'. Declaring the two op schemas first is
    enough for transforms, datasets, models and utils. Test set-up only: the library never does this."""
    if torch.version.cuda is not None or importlib.util.find_spec('torchvision') is None:
        return None
    lib = torch.library.Library('torchvision', 'DEF')
    lib.define('nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')
    lib.define('qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')
    return lib


_TORCHVISION_SCHEMAS = _let_cuda_torchvision_import_on_cpu_torch()

# Tiny models: extra threads only add contention on the CI's two cores.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _work_in_tmp_dir(tmp_path, monkeypatch):
    """Callbacks that default to ./experiments must not litter the checkout."""
    monkeypatch.chdir(tmp_path)


# The files of the longest tests (the SLURM and Ray groups, the multi-process runs) start first: pytest-xdist hands
# out work in collection order, and a long test collected last leaves one worker finishing it while the other
# idles. The rest keeps its order.
_LONGEST_FIRST = ('test_slurm.py', 'test_examples.py', 'test_ray.py', 'tuning/test_ray_backend.py', 'test_elastic.py',
                  'test_fsdp_checkpoints.py', 'test_fsdp.py', 'test_fsdp_defects.py', 'test_fsdp_callbacks.py',
                  'recipes/test_cli.py', 'test_ddp.py', 'callbacks/test_preemption.py', 'tuning/test_tune.py',
                  'compat/test_scripts.py', 'test_docs.py')


def pytest_collection_modifyitems(items):
    def rank(item):
        path = item.nodeid.split('::', 1)[0]
        return next((i for i, name in enumerate(_LONGEST_FIRST) if path == f'tests/{name}'), len(_LONGEST_FIRST))
    items.sort(key=rank)
