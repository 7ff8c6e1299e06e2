"""Whether CUDA is there, asked without starting it.

``torch.cuda.is_available()`` starts CUDA's driver in the calling process (``cudaGetDeviceCount``), and a process
forked after that cannot use CUDA. A fit started from a notebook forks its processes (distributed/launch.py), so the
loop asks through NVML instead, as ``torch.cuda.device_count()`` does first: the process stays forkable.
"""
import torch


def cuda_is_available() -> bool:
    """``torch.cuda.is_available()``, leaving the process forkable: the number of GPUs NVML sees (honouring
    ``CUDA_VISIBLE_DEVICES``) is not 0. Where NVML is missing torch counts through CUDA itself, as before."""
    return torch.cuda.device_count() > 0
