"""The public path of the TTModel-aware parallel wrappers (AIToolbox's ``torchtrain.parallel``), defined in
:mod:`aitoolbox_like.distributed.parallel`."""
from .distributed.parallel import (DEFAULT_MODEL_METHODS, TTDataParallel,  # noqa: F401  (public path)
                                   TTDistributedDataParallel, TTParallelBase)
