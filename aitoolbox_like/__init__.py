"""aitoolbox_like: a small, predictable PyTorch training loop extended by callbacks.

The names AIToolbox's top-level package exports (its callbacks, tracking loops, result packages, ...) are
available here too, imported on first use so that ``import aitoolbox_like`` stays cheap.
"""
from typing import Any, List

from . import compat as _compat       # also makes aitoolbox_like.torchtrain / .experiment.* paths importable
from ._version import __version__
from .engine.callback import AbstractCallback, StopTraining
from .engine.history import TrainingHistory
from .model.feeds import AbstractModelFeedDefinition, ModelWrap, TTBasicModel, TTModel
from .model.multi_loss_optim import MultiLoss, MultiOptimizer
from .engine.train_loop import TrainLoop

_OWN_NAMES = ['__version__', 'AbstractCallback', 'StopTraining', 'TrainingHistory', 'AbstractModelFeedDefinition',
              'ModelWrap', 'TTBasicModel', 'TTModel', 'MultiLoss', 'MultiOptimizer', 'TrainLoop']
__all__ = sorted(set(_OWN_NAMES) | set(_compat.extra_names(__name__)))


def __getattr__(name: str) -> Any:
    value = _compat.extra_attribute(__name__, name)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))
