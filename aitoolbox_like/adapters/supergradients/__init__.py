"""SuperGradients-style callbacks on the TrainLoop: SG's ``Callback`` (its method names, each taking a
``PhaseContext``), ``PhaseCallback(phase)`` with the ``Phase`` enum, the ``multi_process_safe`` decorator, and the
run objects SG callbacks read (``TrainingParams``, ``AverageMeter``, ``SGMetricCollection``).

This is an adapter, not a second dispatch system: every SG-style callback is an :class:`AbstractCallback` whose
loop hooks call its SG methods, and whose ``hooks_in_use()`` lists only the hooks behind the SG methods it
overrides, so the others cost nothing. Register them in the same ``callbacks=[...]`` list as any other callback.

Which SG method runs on which hook (docs/callbacks/supergradients.md has the full table):

    on_training_start                  on_train_begin
    on_train_loader_start              on_epoch_begin
    on_train_batch_start               on_batch_begin
    on_train_batch_loss_end            on_after_loss (a custom train_step: on_batch_end, before on_train_batch_end)
    on_train_batch_backward_end        on_after_backward
    on_train_batch_gradient_step_start on_after_gradient_update (per optimizer)
    on_train_batch_gradient_step_end   on_after_optimizer_step (per optimizer)
    on_train_batch_end                 on_batch_end
    on_train_loader_end                on_train_epoch_end
    on_validation_loader_start / _batch_start / _batch_end / _loader_end
                                       on_eval_begin / _batch_begin / _batch_end / _end of passes of type 'validation'
    on_validation_end_best_epoch       on_epoch_end, when ``metric_to_watch`` improved in this epoch
    on_test_loader_start / ... / on_test_loader_end     the same eval hooks, passes of type 'test'
    on_average_best_models_validation_start / _end      never (the loop does not average best models)
    on_training_end                    on_train_end (or on_exception when fit fails), once

``TrainingParamsCallback(training_params)`` does what SG's ``Trainer.train`` does with an SG run's training params
(warm-up, ``lr_mode``, the metrics lists and their updates, ``phase_callbacks``, ``metric_to_watch``, ...): put it in
the same list, with ``fit(num_epochs=training_params['max_epochs'])``.

The modules, one idea each: ``phases`` (Phase, which method runs on which hook, multi_process_safe), ``params``
(TrainingParams, AverageMeter, SGMetricCollection), ``context`` (PhaseContext), ``callback`` (the adapter:
Callback, PhaseCallback), ``lr`` (SG's learning-rate callbacks), ``trainer`` (TrainingParamsCallback,
MetricsUpdateCallback), ``sg_logger`` (``context.sg_logger``), ``images`` (save_image). Import from this package.
"""
from .callback import Callback, PhaseCallback
from .context import PhaseContext, UnavailableFieldError
from .images import save_image
from .lr import (CosineLRScheduler, ExponentialLRScheduler, FunctionLRScheduler, LinearBatchLRWarmup,
                 LinearEpochLRWarmup, LRCallbackBase, LRSchedulerCallback, PolyLRScheduler, StepLRScheduler)
from .params import AverageMeter, EpochLossMeter, SGMetricCollection, TrainingParams
from .phases import PHASE_METHODS, SG_METHOD_HOOKS, Phase, multi_process_safe
from .sg_logger import NoExperimentFolderError, SGLogger
from .trainer import MetricsUpdateCallback, TrainingParamsCallback

__all__ = ['Phase', 'PhaseContext', 'Callback', 'PhaseCallback', 'multi_process_safe', 'save_image',
           'SG_METHOD_HOOKS', 'PHASE_METHODS', 'TrainingParams', 'AverageMeter', 'EpochLossMeter',
           'SGMetricCollection', 'UnavailableFieldError', 'NoExperimentFolderError', 'TrainingParamsCallback',
           'MetricsUpdateCallback', 'LRCallbackBase', 'LinearEpochLRWarmup', 'LinearBatchLRWarmup', 'StepLRScheduler',
           'ExponentialLRScheduler', 'PolyLRScheduler', 'CosineLRScheduler', 'FunctionLRScheduler',
           'LRSchedulerCallback', 'SGLogger']
