"""torchvision (and torchmetrics, which imports it) beside the CPU build of torch, for the tests and the checks.

The torchvision wheel these machines reach is a CUDA build: with CPU-only torch its import fails with 'operator
torchvision::nms does not exist'. Declaring the two op schemas first is enough for transforms, datasets, models and
utils. Set-up of the tests (tests/conftest.py) and of make pta-check only: the library never does this.
"""
import importlib.util
from typing import Any

import torch


def declare_torchvision_ops() -> Any:
    """The library object holding the two schemas (keep it alive), or None where nothing is needed."""
    if torch.version.cuda is not None or importlib.util.find_spec('torchvision') is None:
        return None
    try:
        lib = torch.library.Library('torchvision', 'DEF')
    except RuntimeError:        # declared already in this process
        return None
    lib.define('nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')
    lib.define('qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')
    return lib
