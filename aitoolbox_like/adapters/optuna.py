"""Optuna: prune a trial whose TrainLoop is doing worse than the others (``pip install 'aitoolbox_like[tune]'``).

For an objective written around ``TrainLoop.fit``::

    def objective(trial):
        lr = trial.suggest_float('lr', 1e-4, 1e-1, log=True)
        ...
        pruning = OptunaPruning(trial, 'val_loss')
        loop.fit(num_epochs=10, callbacks=[pruning])
        pruning.check_pruned()          # raises optuna.TrialPruned when the pruner stopped the trial
        return loop.train_history['val_loss'][-1]

``aitoolbox-like tune`` (:mod:`aitoolbox_like.tuning`) runs whole searches over recipes with it. Optuna is imported
when the callback is first used, not when this module is imported.
"""
import logging
from typing import Any

from ._trial_report import TrialReport

logger = logging.getLogger(__name__)

_INSTALL_HINT = "pip install 'aitoolbox_like[tune]'"


def import_optuna() -> Any:
    """The ``optuna`` module, or an ImportError that names the install command when Optuna is missing."""
    try:
        import optuna
    except ImportError as exc:
        raise ImportError(f'this needs Optuna: {_INSTALL_HINT}') from exc
    return optuna


class OptunaPruning(TrialReport):
    """Report the monitored value to an Optuna trial after every epoch, and stop training cleanly when the study's
    pruner says the trial should be pruned.

    After each epoch that records ``monitor``, ``trial.report(value, step=epoch)``, then ``trial.should_prune()``. A
    trial to prune stops after this epoch as early stopping does: the epoch's other callbacks finish (a checkpoint is
    saved), then the end-of-training evaluation and every callback's ``on_train_end`` run, and ``fit`` returns. Call
    :meth:`check_pruned` after ``fit``: it raises ``optuna.TrialPruned``, so Optuna records the trial as pruned (with
    the last reported value). Raising it from inside ``fit`` would skip the other callbacks' ends of training.

    A ``monitor`` that the first epoch did not record is an error that lists the names the history has; a NaN or
    infinite value fails the trial (ValueError out of ``fit``). Single-process loops only (the trial object does not
    travel to DDP worker processes).

    Args:
        trial (optuna.trial.Trial): the trial of the objective.
        monitor (str): the history name to report, e.g. ``'val_loss'`` (the study's direction says which way is
            better).
        execution_order (int): with the stopping callbacks (98), after the epoch's metrics are recorded.
    """

    def __init__(self, trial: Any, monitor: str, execution_order: float = 98) -> None:
        super().__init__(monitor, execution_order=execution_order)
        if not (callable(getattr(trial, 'report', None)) and callable(getattr(trial, 'should_prune', None))):
            raise TypeError(f'OptunaPruning: trial must be an optuna Trial (with report() and should_prune()), got '
                            f'{type(trial).__qualname__}')
        self.trial = trial

    @property
    def pruned(self) -> bool:
        """Whether the pruner stopped the trial."""
        return self.stopped

    def report_value(self, epoch: int, value: float) -> bool:
        """``trial.report(value, epoch)``; True when ``trial.should_prune()``."""
        self.trial.report(value, epoch)
        return bool(self.trial.should_prune())

    def check_pruned(self) -> None:
        """Raise ``optuna.TrialPruned`` when the pruner stopped the trial (call it after ``fit``)."""
        if not self.stopped:
            return
        epoch, value = self.reported[-1]
        raise import_optuna().TrialPruned(f'pruned after epoch {epoch} ({self.monitor}={value:.6g})')
