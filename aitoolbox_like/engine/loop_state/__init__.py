"""The full state of a TrainLoop as one weights_only-loadable checkpoint dict, and resuming from it.

Layout of a checkpoint (``format_version`` 1)::

    format_version, kind='aitoolbox_like.train_state'
    model_state_dict                     the model's weights (plain module, never the DDP wrapper)
    optimizer_state_dict                 dict, or a list of dicts for a MultiOptimizer, or None
    schedulers_state_dict                list, one per scheduler callback (AIToolbox's key; also in 'callbacks')
    amp                                  GradScaler state ({} when not using fp16)
    epoch, iteration_idx                 AIToolbox's keys: the epoch and the global batch index
    hyperparams, hyperparams_json        the hyperparameters (JSON-safe copy, and the JSON text)
    loop                                 {'epochs_completed', 'epoch', 'iteration', 'total_iteration_idx',
                                          'grad_accumulation'}
    train_history                        TrainingHistory.state_dict()
    callbacks                            {callback.state_key: callback.state_dict()}
    rng                                  {'torch', 'cuda', 'python', 'numpy', 'loader_generators'} now
    data_position                        {'epoch', 'batches_done' (None: the epoch is complete),
                                          'epoch_start_rng', 'loss_batch_accum', 'grads'}
    experiment                           {'project_name', 'experiment_name', 'experiment_timestamp'}

Exactness: the data order of an epoch comes from the global RNG when the train loader's iterator is
created. A checkpoint taken inside an epoch therefore also keeps the RNG state from the start of that
epoch; a resumed run rebuilds the same permutation from it, skips the batches already trained, then
restores the RNG state of the checkpoint. Evaluation runs under fork_rng in the loop, so it never moves
the training RNG.

One idea per module: ``build`` (the loop -> a checkpoint dict), ``restore`` (a checkpoint dict -> the loop),
``resume`` (the ResumePlan a fit follows, and the start of a fit that sets it going), ``auto_resume``
(``resume_from='auto'``), ``locate`` (finding and loading the checkpoint to resume from), ``rng`` (RNG capture).
Their public names are all importable from here, and from ``aitoolbox_like.engine.loop_state``.
"""

from .auto_resume import AUTO, check_auto_resume, find_auto_checkpoint
from .build import CHECKPOINT_KIND, LossesOverRanks, begin_checkpoint, build_checkpoint, optimizer_class_names
from .build import build_snapshot, copy_tree, samples_done_in_epoch
from .locate import find_checkpoint_in_dir, find_latest_local, load_resume_checkpoint
from .locate import remove_unfinished_writes_of_dead_runs
from .restore import apply_checkpoint, validate_checkpoint
from .resume import ResumePlan, adopt_experiment, prepare_fit, remaining_epoch_loader
from .rng import capture_rng_state, restore_rng_state

__all__ = ['AUTO', 'CHECKPOINT_KIND', 'LossesOverRanks', 'ResumePlan', 'adopt_experiment', 'apply_checkpoint',
           'begin_checkpoint', 'build_checkpoint', 'build_snapshot', 'capture_rng_state', 'copy_tree', 'check_auto_resume', 'find_auto_checkpoint',
           'find_checkpoint_in_dir', 'find_latest_local', 'load_resume_checkpoint', 'optimizer_class_names',
           'prepare_fit', 'remaining_epoch_loader', 'remove_unfinished_writes_of_dead_runs', 'restore_rng_state',
           'samples_done_in_epoch', 'validate_checkpoint']
