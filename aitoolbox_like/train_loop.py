"""TrainLoop and the tracking loops (TrainLoopCheckpoint, TrainLoopEndSave, TrainLoopCheckpointEndSave), the names
AIToolbox's train_loop package offers together. TrainLoop is defined in aitoolbox_like/engine/train_loop.py (the
core, below the callback library), the tracking loops in aitoolbox_like/tracking.py (above it, as they register its
saving callbacks); both are importable from here and are the same objects."""
from .engine.checks import launcher_parameters  # noqa: F401  (documented beside TrainLoop)
from .engine.train_loop import TrainLoop
from .tracking import TrainLoopCheckpoint, TrainLoopCheckpointEndSave, TrainLoopEndSave

__all__ = ['TrainLoop', 'TrainLoopCheckpoint', 'TrainLoopCheckpointEndSave', 'TrainLoopEndSave']
