"""SuperGradients' phases and methods, and the loop hooks each needs: what runs when.

``SG_METHOD_HOOKS`` maps every SG callback method, in SG's order, to the loop hooks the adapter needs for it;
``PHASE_METHODS`` maps each :class:`Phase` to the SG method a ``PhaseCallback`` of that phase runs on. Also
``multi_process_safe``, SG's decorator for code that runs in one process only.
"""
import enum
import functools
from typing import Any, Callable, Dict, FrozenSet, Tuple, TypeVar, cast

from ... import distributed

F = TypeVar('F', bound=Callable[..., Any])


def multi_process_safe(func: F) -> F:
    """Run the decorated function only in the main process (global rank 0; always in a single process); in the
    other processes of a DDP fit it returns None without running. SuperGradients checks the *local* rank (one
    process per node); here it is the global rank, the process that logs and saves (``loop.is_main_process()``)."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not distributed.is_main_process():
            return None
        return func(*args, **kwargs)
    return cast(F, wrapper)


class Phase(enum.Enum):
    """SuperGradients' phases; a ``PhaseCallback`` runs at one of them. Each is the SG method noted."""
    PRE_TRAINING = 'PRE_TRAINING'                              #: on_training_start
    TRAIN_EPOCH_START = 'TRAIN_EPOCH_START'                    #: on_train_loader_start
    TRAIN_BATCH_END = 'TRAIN_BATCH_END'                        #: on_train_batch_loss_end (as SG's PhaseCallback)
    TRAIN_BATCH_STEP = 'TRAIN_BATCH_STEP'                      #: on_train_batch_gradient_step_end
    TRAIN_EPOCH_END = 'TRAIN_EPOCH_END'                        #: on_train_loader_end
    VALIDATION_BATCH_END = 'VALIDATION_BATCH_END'              #: on_validation_batch_end
    VALIDATION_EPOCH_END = 'VALIDATION_EPOCH_END'              #: on_validation_loader_end
    VALIDATION_END_BEST_EPOCH = 'VALIDATION_END_BEST_EPOCH'    #: on_validation_end_best_epoch
    TEST_BATCH_END = 'TEST_BATCH_END'                          #: on_test_batch_end
    TEST_END = 'TEST_END'                                      #: on_test_loader_end
    #: on_average_best_models_validation_start: never reached here (the loop does not average best models)
    AVERAGE_BEST_MODELS_VALIDATION_START = 'AVERAGE_BEST_MODELS_VALIDATION_START'
    #: on_average_best_models_validation_end: never reached here (SG's value, spelt as SG spells it)
    AVERAGE_BEST_MODELS_VALIDATION_END = 'AVERAGE_MODEL_VALIDATION_END'
    POST_TRAINING = 'POST_TRAINING'                            #: on_training_end

    @staticmethod
    def from_string(phase_str: str) -> 'Phase':
        """The phase named ``phase_str`` (``'TRAIN_EPOCH_END'``, as SG's YAML recipes write phases)."""
        try:
            return Phase[phase_str]
        except KeyError:
            raise ValueError(f"Invalid phase string: {phase_str!r}. Must be one of: "
                             f"{[phase.name for phase in Phase]}") from None


# The SG method each phase runs on (SG's PhaseCallback).
PHASE_METHODS: Dict[Phase, str] = {
    Phase.PRE_TRAINING: 'on_training_start',
    Phase.TRAIN_EPOCH_START: 'on_train_loader_start',
    Phase.TRAIN_BATCH_END: 'on_train_batch_loss_end',
    Phase.TRAIN_BATCH_STEP: 'on_train_batch_gradient_step_end',
    Phase.TRAIN_EPOCH_END: 'on_train_loader_end',
    Phase.VALIDATION_BATCH_END: 'on_validation_batch_end',
    Phase.VALIDATION_EPOCH_END: 'on_validation_loader_end',
    Phase.VALIDATION_END_BEST_EPOCH: 'on_validation_end_best_epoch',
    Phase.TEST_BATCH_END: 'on_test_batch_end',
    Phase.TEST_END: 'on_test_loader_end',
    Phase.AVERAGE_BEST_MODELS_VALIDATION_START: 'on_average_best_models_validation_start',
    Phase.AVERAGE_BEST_MODELS_VALIDATION_END: 'on_average_best_models_validation_end',
    Phase.POST_TRAINING: 'on_training_end',
}

# Every SG method, in SG's order, and the loop hooks the adapter needs for it.
SG_METHOD_HOOKS: Dict[str, Tuple[str, ...]] = {
    'on_training_start': ('on_train_begin',),
    'on_train_loader_start': ('on_epoch_begin',),
    'on_train_batch_start': ('on_batch_begin',),
    'on_train_batch_loss_end': ('on_after_loss', 'on_batch_end'),    # on_batch_end: under a custom train_step
    'on_train_batch_backward_end': ('on_after_backward',),
    'on_train_batch_gradient_step_start': ('on_after_gradient_update',),
    'on_train_batch_gradient_step_end': ('on_after_optimizer_step',),
    'on_train_batch_end': ('on_batch_end',),
    'on_train_loader_end': ('on_train_epoch_end',),
    'on_validation_loader_start': ('on_eval_begin',),
    'on_validation_batch_start': ('on_eval_begin', 'on_eval_batch_begin'),     # on_eval_begin, on_eval_batch_begin:
    'on_validation_batch_end': ('on_eval_begin', 'on_eval_batch_begin', 'on_eval_batch_end'),    # batch_idx
    'on_validation_loader_end': ('on_eval_end',),
    'on_validation_end_best_epoch': ('on_epoch_end',),
    'on_test_loader_start': ('on_eval_begin',),
    'on_test_batch_start': ('on_eval_begin', 'on_eval_batch_begin'),
    'on_test_batch_end': ('on_eval_begin', 'on_eval_batch_begin', 'on_eval_batch_end'),
    'on_test_loader_end': ('on_eval_end',),
    'on_average_best_models_validation_start': (),     # the loop never averages best models: never called
    'on_average_best_models_validation_end': (),
    'on_training_end': ('on_train_end', 'on_exception'),
}
# SG methods no loop hook reaches: a callback using one is warned once at registration.
NEVER_CALLED: FrozenSet[str] = frozenset(name for name, hooks in SG_METHOD_HOOKS.items() if not hooks)
# Methods after the training forward pass: the adapter keeps the model's output for them (context.preds).
TRAIN_BATCH_METHODS: FrozenSet[str] = frozenset({
    'on_train_batch_loss_end', 'on_train_batch_backward_end', 'on_train_batch_gradient_step_start',
    'on_train_batch_gradient_step_end', 'on_train_batch_end'})
# dataset_info['type'] of an evaluation pass -> (loader start, batch start, batch end, loader end)
EVAL_METHODS: Dict[str, Tuple[str, str, str, str]] = {
    'validation': ('on_validation_loader_start', 'on_validation_batch_start', 'on_validation_batch_end',
                   'on_validation_loader_end'),
    'test': ('on_test_loader_start', 'on_test_batch_start', 'on_test_batch_end', 'on_test_loader_end'),
}
# Evaluation batch methods: in a loss pass the adapter keeps the model's output for them too.
EVAL_BATCH_METHODS: FrozenSet[str] = frozenset({'on_validation_batch_end', 'on_test_batch_end'})
