"""The report of a trial after every epoch (:class:`TrialReport`) and the errors of a search's input it raises,
shared by the search (:mod:`aitoolbox_like.tuning`) and the Optuna callback (:mod:`.optuna`, which subclasses it).

They live here, below both, so that the search imports this integration and not the other way round; the search
re-exports them where they are documented (``aitoolbox_like.tuning``, ``.tuning.trial``, ``.tuning.space``). A
private module: the recipe registry offers the callbacks of this package's public modules, and a TrialReport needs
a report function that no recipe can give.
"""
import difflib
import logging
import math
from typing import Any, Callable, List, Optional, Sequence, Tuple

from ..callbacks.abstract import AbstractCallback
from ..results.reporting import as_number
from ..recipes.schema import RecipeError

# Named as before the move, so that logging set up for the search's trials still applies.
logger = logging.getLogger('aitoolbox_like.tuning.trial')

#: ``report(epoch, value) -> stop``: what a backend does with each epoch's monitored value.
ReportFn = Callable[[int, float], bool]


class TuneInputError(RecipeError):
    """Everything wrong with a search's input (parameters, monitor, mode), found before any trial runs: one
    ``'what: problem'`` line per error in ``errors``. A RecipeError, so the command line reports it the same way
    (exit status 2, no traceback)."""

    def __init__(self, errors: Sequence[str], source: Optional[str] = None) -> None:
        super().__init__(errors, source)
        count = f'{len(self.errors)} error{"s" if len(self.errors) != 1 else ""}'
        where = f' of {source}' if source else ''
        self.args = (f'tune{where}: {count}\n' + '\n'.join(f'  {e}' for e in self.errors),)


class MonitorNotRecorded(TuneInputError):
    """The end of a trial's first epoch found no value of the monitored name in the history: the search is wrong,
    not the trial (raised, not reported as a failed trial)."""


class TrialReport(AbstractCallback):
    """After every epoch, hand the epoch's value of ``monitor`` to ``report(epoch, value)``; when it returns True,
    stop training cleanly after this epoch (``stopped``), as early stopping does: the epoch's remaining callbacks run,
    then the end-of-training evaluation and every callback's ``on_train_end``.

    At the end of the first epoch, a ``monitor`` that the history has never recorded is an error
    (:class:`MonitorNotRecorded`) that lists the names it has, with the close matches. A value that is NaN or
    infinite fails the trial (ValueError). An epoch that does not record the monitor (evaluation every k epochs) is
    not reported.

    Args:
        monitor (str): the history name, e.g. ``'val_loss'``.
        report (callable or None): ``report(epoch, value) -> bool``; None: subclasses override :meth:`report_value`.
        execution_order (int): with the stopping callbacks (98), after the metrics of the epoch are recorded.
    """

    def __init__(self, monitor: str, report: Optional[ReportFn] = None, execution_order: float = 98) -> None:
        super().__init__(type(self).__name__, execution_order=execution_order)
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f'{type(self).__name__}: monitor must be the name of a history value, e.g. '
                             f'\'val_loss\', got {monitor!r}')
        self.monitor = monitor
        self.report = report
        self.reported: List[Tuple[int, float]] = []
        self.stopped = False

    @property
    def last_value(self) -> Optional[float]:
        """The last value reported (None before the first)."""
        return self.reported[-1][1] if self.reported else None

    def report_value(self, epoch: int, value: float) -> bool:
        """Hand one epoch's value on; True stops training after this epoch."""
        if self.report is None:
            raise NotImplementedError(f'{type(self).__name__}: give report= or override report_value')
        return bool(self.report(epoch, value))

    def on_epoch_end(self) -> None:
        loop = self.train_loop_obj
        history = loop.train_history
        raw = history.value_in_epoch(self.monitor, loop.epoch)
        if raw is None:
            if not self.reported and not history.get(self.monitor):
                raise MonitorNotRecorded([monitor_missing_message(self.monitor, history)])
            return
        value = as_number(raw)
        if value is None:
            raise TypeError(f'{self.monitor} is not a number in epoch {loop.epoch}: {raw!r}')
        if not math.isfinite(value):
            raise ValueError(f'{self.monitor} is {value} in epoch {loop.epoch}')
        self.reported.append((loop.epoch, value))
        if self.report_value(loop.epoch, value):
            self.stopped = True
            loop.early_stop = True
            logger.info('%s: stopping after epoch %d (%s=%.6g)', type(self).__name__, loop.epoch, self.monitor, value)


def monitor_missing_message(monitor: str, history: Any) -> str:
    """What to say when the history of a finished epoch has no ``monitor``: the names it has, close ones first."""
    names = [name for name, values in history.items() if values]
    close = difflib.get_close_matches(monitor, names, n=3, cutoff=0.5)
    hint = f'did you mean {" or ".join(close)}? ' if close else ''
    return f'--monitor {monitor}: the first epoch recorded no {monitor}; {hint}it recorded {", ".join(names)}'
