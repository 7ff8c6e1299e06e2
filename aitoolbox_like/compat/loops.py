"""AIToolbox's TrainLoop and tracking loops, as its module paths serve them: aitoolbox_like's loops with AIToolbox's
defaults where ours differ.

The one difference today is the end-of-epoch evaluation. AIToolbox's TrainLoop evaluated the loss over the whole
training set after every epoch ('loss'), on top of the validation pass: a forward pass over the training set per
epoch that aitoolbox_like's own TrainLoop leaves out by default (its training loss per epoch is 'accumulated_loss').
A script written for AIToolbox, run with ``python -m aitoolbox_like.compat`` or with ``aitoolbox`` renamed to
``aitoolbox_like`` in its imports (``aitoolbox_like.torchtrain...``), keeps the history it had: these classes set
``eval_train_set`` to True unless the script says otherwise. Each is a subclass of the loop it stands for (and the
tracking loops of this TrainLoop too), so ``isinstance`` checks against either hold.
"""
from .. import tracking
from ..engine import train_loop
from .handler import CallbacksHandler

__all__ = ['TrainLoop', 'TrainLoopCheckpoint', 'TrainLoopCheckpointEndSave', 'TrainLoopEndSave']


class TrainLoop(train_loop.TrainLoop):
    """AIToolbox 1.8.0's TrainLoop: :class:`aitoolbox_like.TrainLoop` evaluating the training set's loss ('loss') in
    every end-of-epoch evaluation unless ``eval_train_set=False`` is given, and AIToolbox's callbacks handler (its
    ``execute_*`` methods)."""

    EVAL_TRAIN_SET_DEFAULT = True
    callbacks_handler_class = CallbacksHandler


class TrainLoopCheckpoint(tracking.TrainLoopCheckpoint, TrainLoop):
    """AIToolbox 1.8.0's TrainLoopCheckpoint (:class:`aitoolbox_like.tracking.TrainLoopCheckpoint` with AIToolbox's
    end-of-epoch evaluation of the training set)."""


class TrainLoopEndSave(tracking.TrainLoopEndSave, TrainLoop):
    """AIToolbox 1.8.0's TrainLoopEndSave (:class:`aitoolbox_like.tracking.TrainLoopEndSave` with AIToolbox's
    end-of-epoch evaluation of the training set)."""


class TrainLoopCheckpointEndSave(tracking.TrainLoopCheckpointEndSave, TrainLoopEndSave):
    """AIToolbox 1.8.0's TrainLoopCheckpointEndSave (:class:`aitoolbox_like.tracking.TrainLoopCheckpointEndSave` with
    AIToolbox's end-of-epoch evaluation of the training set)."""
