"""Every test in this folder needs a CUDA device: without one it is skipped, with the reason, and counts for
nothing. ``make gpu-check`` (benchmarks/gpu_check.py) runs this folder on a GPU machine.

GPU_CHECK_FORCE_CPU=1 (``gpu_check.py --force-cpu``) runs the tests on the CPU instead, those that can run there:
a way to develop them without a GPU, never a GPU check passed."""
import os

import pytest
import torch

FORCE_CPU = os.environ.get('GPU_CHECK_FORCE_CPU') == '1'


@pytest.fixture
def device():
    """The device under test: the first GPU (cuda:0), or the CPU under GPU_CHECK_FORCE_CPU=1."""
    if FORCE_CPU:
        return torch.device('cpu')
    if not torch.cuda.is_available():
        pytest.skip(f'needs a CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda}); '
                    f'run `make gpu-check` on a GPU machine')
    return torch.device('cuda', 0)


@pytest.fixture(autouse=True)
def _cuda_or_skip(device):
    """Each test here asks for ``device``, so none runs (or passes) on a machine without CUDA."""
