"""aitoolbox_like: a small, predictable PyTorch training loop extended by callbacks."""
from ._version import __version__
from .callbacks.abstract import AbstractCallback, StopTraining
from .history import TrainingHistory
from .model import AbstractModelFeedDefinition, ModelWrap, TTBasicModel, TTModel
from .multi_loss_optim import MultiLoss, MultiOptimizer
from .train_loop import TrainLoop

__all__ = ['__version__', 'AbstractCallback', 'StopTraining', 'TrainingHistory', 'AbstractModelFeedDefinition',
           'ModelWrap', 'TTBasicModel', 'TTModel', 'MultiLoss', 'MultiOptimizer', 'TrainLoop']
