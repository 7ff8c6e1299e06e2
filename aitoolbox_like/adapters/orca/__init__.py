"""BigDL Orca on the TrainLoop: Orca's callbacks (its ``Callback``, ``MainCallback`` and the ``runner`` they receive;
its built-in callbacks; Orca 2.2's Keras-style methods), its validation metrics and an Estimator shaped like Orca's
``Estimator.from_torch``. Change ``bigdl.orca.learn.pytorch.callbacks...`` (and ``bigdl.orca.learn.metrics``,
``bigdl.orca.learn.pytorch.Estimator``) imports to ``aitoolbox_like.adapters.orca``; docs/callbacks/orca.md."""
from .builtin_callbacks import MaxstepsCallback, ModelCheckpoint, TensorBoardCallback, TqdmCallback, WandbLoggerCallback
from .callback import (KERAS_HOOKS, MAIN_CALLBACK_HOOKS, MAIN_CALLBACK_ORDER, ORCA_HOOKS, TUTORIAL_HOOKS, Callback,
                       MainCallBack, MainCallback, MainCallbackFeed, Runner, runner_for)
from .estimator import Estimator, TorchEstimator, make_only_main_callback
from .metrics import (MAE, MSE, Accuracy, BinaryAccuracy, CategoricalAccuracy, CustomizedMetric, Metric,
                      SparseCategoricalAccuracy, Top5Accuracy)

__all__ = ['Callback', 'MainCallback', 'MainCallBack', 'Runner', 'runner_for', 'ORCA_HOOKS', 'TUTORIAL_HOOKS',
           'MAIN_CALLBACK_HOOKS', 'KERAS_HOOKS', 'MAIN_CALLBACK_ORDER', 'MainCallbackFeed', 'ModelCheckpoint',
           'TensorBoardCallback', 'TqdmCallback', 'MaxstepsCallback', 'WandbLoggerCallback', 'Estimator',
           'TorchEstimator', 'make_only_main_callback', 'Metric', 'Accuracy', 'SparseCategoricalAccuracy',
           'CategoricalAccuracy', 'BinaryAccuracy', 'Top5Accuracy', 'MSE', 'MAE', 'CustomizedMetric']
