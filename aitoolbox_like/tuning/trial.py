"""One trial of a search, whatever runs the search (Optuna or Ray Tune): the recipe trained with the
sampled values, as ``aitoolbox-like train`` would, reporting the monitored value after every epoch.

:func:`run_trial` is the whole contract a backend needs::

    outcome = run_trial(recipe_path, overrides, {'optimizer.lr': 3e-3}, 'val_loss', report)
    # report(epoch, value) -> bool: called after every epoch that records the monitored value; True stops the
    # trial cleanly (pruned): the epoch's callbacks finish, then the end of training runs as usual.
    outcome.state            # 'COMPLETE', 'PRUNED' or 'FAIL'
    outcome.value            # the monitored value at the last epoch that recorded it (None when none did)
    outcome.experiment_dir   # the trial's experiment folder (None for a loop without one)
    outcome.error            # what failed, for 'FAIL'

A trial that raises while training (or records a NaN / infinite monitored value) comes back as ``'FAIL'``; only a
mistake of the search itself (:class:`MonitorNotRecorded`: no epoch records the monitor) and interruptions
(KeyboardInterrupt, SystemExit, and :class:`TrialInterrupted` when the trial's fit stopped on Ctrl-C or SIGTERM with
its checkpoint) propagate: an interrupted trial is not a finished one.

With ``log_path``, everything the trial says (every logger's records, what it prints, Python's warnings) goes to
that file instead of the console, and the file moves into the trial's experiment folder (``train.log``) when the
trial ends: a search prints one line per trial (:func:`outcome_line`).
"""
import contextlib
import dataclasses
import logging
import os
import shutil
import threading
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from ..callbacks.preemption import PreemptionCheckpoint
# The per-epoch report and its error live below the Optuna callback that subclasses them; documented here too.
from ..adapters._trial_report import MonitorNotRecorded, ReportFn, TrialReport
from ..recipes.run_files import PROG, attach_run_files, command_line_text
from ..recipes.recipe import Recipe
from .space import Param, override

logger = logging.getLogger(__name__)

#: The states of a finished trial.
COMPLETE, PRUNED, FAIL = 'COMPLETE', 'PRUNED', 'FAIL'


class TrialFailed(Exception):
    """A trial that failed (its error is the message); raised by backends that need an exception for it."""


class TrialInterrupted(KeyboardInterrupt):
    """The trial's fit stopped before its end on Ctrl-C or a scheduler's SIGTERM (its checkpoint written): the search
    stops too, and the trial is not recorded as finished (a KeyboardInterrupt, so that the search's caller and
    Optuna treat it as the user's interruption)."""


@dataclasses.dataclass
class StudySettings:
    """Everything a backend needs to run a search (what ``aitoolbox-like tune`` was given, checked).

    Attributes:
        recipe: the recipe file (absolute path).
        overrides: ``key.path=value`` overrides applied to every trial.
        params: the searched parameters.
        monitor: the history name whose value is reported after every epoch and optimised.
        mode: ``'min'`` or ``'max'``.
        trials: how many finished trials the study should have (completed, pruned or failed; an interrupted trial
            does not count).
        output_dir: the results folder (absolute path).
        study_name: the study's name in the storage.
        storage: the storage URL (None: the backend's default inside ``output_dir``).
        pruner: ``'median'``, ``'none'``, or a backend's own pruner object.
        concurrent: how many trials run at once.
        sampler: a backend's own sampler object (None: its default).
        command: the command line that started the search, for the trials' command_line.txt (None: from Python).
        address: the Ray cluster of ``--backend ray`` (None: a local one, or the one this process is connected to).
    """

    recipe: str
    overrides: List[str]
    params: List[Param]
    monitor: str
    mode: str
    trials: int
    output_dir: str
    study_name: str
    storage: Optional[str] = None
    pruner: Any = 'median'
    concurrent: int = 1
    sampler: Any = None
    command: Optional[str] = None
    address: Optional[str] = None


@dataclasses.dataclass
class TrialOutcome:
    """How one trial ended (see the module's documentation)."""

    state: str
    value: Optional[float]
    experiment_dir: Optional[str]
    error: Optional[str] = None
    epochs_reported: int = 0
    seconds: float = 0.0
    log_path: Optional[str] = None


# ---------------------------------------------------------------------------------------------- one trial


def command_text(argv: Sequence[str], note: str) -> str:
    """A command_line.txt block: ``note`` and when and where, as comments, then ``aitoolbox-like <argv>``."""
    return f'# {note}\n' + command_line_text(argv, program=PROG)


def trial_overrides(overrides: Sequence[str], values: Mapping[str, Any]) -> List[str]:
    """The overrides of one trial: the search's, then each sampled value (PATH -> value)."""
    return [*overrides, *(override(path, value) for path, value in values.items())]


def experiment_dir_of(loop: Any) -> Optional[str]:
    """The experiment folder a loop wrote (None: it has none, or it was removed because nothing trained)."""
    experiment = getattr(loop, 'experiment', None)
    if experiment is None or not getattr(experiment, 'claimed', False):
        return None
    return str(experiment.dir_path)


#: The name of a trial's log in its experiment folder.
TRIAL_LOG = 'train.log'


@contextlib.contextmanager
def captured_output(path: str) -> Iterator[None]:
    """While inside, everything this process says goes to the file ``path`` (appended), not to the console: the
    records of every logger at INFO and above (whatever the console's level), what is printed to stdout or stderr
    (reports, Python's warnings, a progress bar), so a search's console shows one line per trial."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    with open(path, 'a', encoding='utf-8', buffering=1) as stream:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter('%(asctime)s %(levelname)s %(name)s: %(message)s'))
        root.handlers = [handler]
        root.setLevel(logging.INFO)
        try:
            with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
                yield
        finally:
            root.handlers, root.level = saved_handlers, saved_level


def _move_log(log_path: str, folder: Optional[str]) -> str:
    """The trial's log into its experiment folder (when it has one here); returns where the log is."""
    if not folder or not os.path.isdir(folder):
        return log_path
    target = os.path.join(folder, TRIAL_LOG)
    try:
        shutil.move(log_path, target)
    except OSError as error:
        logger.warning('The log of the trial stays at %s (not moved into %s: %s)', log_path, folder, error)
        return log_path
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(log_path))        # the logs folder, when no other trial is running
    return target


def outcome_line(number: int, outcome: TrialOutcome, monitor: str, values: Mapping[str, Any]) -> str:
    """The one line a search prints per trial: its state and value, its values, epochs and time, where its log is."""
    parts = [f'trial {number}: {outcome.state}']
    if outcome.value is not None:
        parts.append(f'{monitor}={outcome.value:.6g}')
    if outcome.error:
        parts.append(outcome.error)
    parts.append(', '.join(f'{path}={value!r}' if isinstance(value, str) else f'{path}={value:.6g}'
                           if isinstance(value, float) else f'{path}={value}' for path, value in values.items()))
    parts.append(f'({outcome.epochs_reported} epoch{"s" if outcome.epochs_reported != 1 else ""}, '
                 f'{outcome.seconds:.1f} s)')
    if outcome.log_path:
        parts.append(f'log: {outcome.log_path}')
    return '  '.join(parts)


def run_trial(recipe_path: Union[str, 'os.PathLike[str]'], overrides: Sequence[str], values: Mapping[str, Any],
              monitor: str, report: ReportFn, *, label: str = 'trial',
              hyperparams: Optional[Dict[str, Any]] = None, log_path: Optional[str] = None) -> TrialOutcome:
    """Train the recipe with ``overrides`` and the sampled ``values`` (PATH -> value) as ``aitoolbox-like train``
    would: its own experiment folder, with the resolved recipe, the command line (the ``train`` command that repeats
    this trial) and the hyperparameters saved in it. ``report(epoch, value) -> stop`` gets the value of ``monitor``
    after every epoch.

    Args:
        recipe_path: the recipe file.
        overrides: ``key.path=value`` overrides of every trial.
        values: the sampled value of each searched PATH.
        monitor: the history name to report.
        report: ``report(epoch, value) -> bool``; True stops the trial after this epoch (pruned).
        label: names the trial in messages and in its command_line.txt (e.g. ``trial 3 of study 'digits'``).
        hyperparams: more keys for a tracking loop's ``hyperparams`` (saved in hyperparams_list.txt); the sampled
            values are added under their PATHs.
        log_path: where the trial's output goes while it runs (None: the console); at the end it moves into the
            trial's experiment folder as ``train.log`` (``outcome.log_path`` says where it is).

    Returns:
        TrialOutcome: ``COMPLETE`` with the last reported value, ``PRUNED`` (``report`` said stop) with the value it
        stopped at, or ``FAIL`` with the error.

    Raises:
        MonitorNotRecorded: the first epoch recorded no ``monitor``.
        TrialInterrupted: the trial's fit was interrupted (Ctrl-C, SIGTERM) before its end.
    """
    start = time.monotonic()
    output = captured_output(log_path) if log_path else contextlib.nullcontext()
    built: Dict[str, Any] = {}      # the trial's loop, once built (its folder receives the log, however it ends)
    try:
        with output:
            outcome = _train_trial(os.path.abspath(os.fspath(recipe_path)), overrides, values, monitor, report,
                                   label, hyperparams, built)
    finally:
        where = _move_log(log_path, experiment_dir_of(built.get('loop'))) if log_path else None
    outcome.seconds, outcome.log_path = time.monotonic() - start, where
    return outcome


def _train_trial(recipe_path: str, overrides: Sequence[str], values: Mapping[str, Any], monitor: str,
                 report: ReportFn, label: str, hyperparams: Optional[Dict[str, Any]],
                 built: Dict[str, Any]) -> TrialOutcome:
    every_override = trial_overrides(overrides, values)
    reporter = TrialReport(monitor, report)
    loop = None
    try:
        recipe = Recipe.load(recipe_path, every_override)
        # As `train` does: the recipe file is copied into the experiment folder (AIToolbox's script copy).
        defaults: Dict[str, Any] = {'experiment_file_path': recipe_path, **(hyperparams or {}), **values}
        run = recipe.build(hyperparams_defaults=defaults)
        loop = built['loop'] = run.loop
        command = command_text(['train', recipe_path, *every_override], label)
        attach_run_files(run, recipe, command, program=PROG)
        run.callbacks.append(reporter)
        if threading.current_thread() is not threading.main_thread():
            # Signal handlers exist only in the main thread (a Ray Tune trial runs in a worker's thread): the search
            # that runs this trial handles Ctrl-C; the trial keeps its stop-on-request without handlers, no warning.
            run.callbacks.append(PreemptionCheckpoint(signals=()))
        run.fit()
    except MonitorNotRecorded:
        raise
    except Exception as error:
        logger.warning('%s failed', label, exc_info=True)
        return TrialOutcome(FAIL, reporter.last_value, experiment_dir_of(loop), f'{type(error).__name__}: {error}',
                            len(reporter.reported))
    if getattr(loop, 'interrupted', None):
        raise TrialInterrupted(loop.interrupted)
    folder = experiment_dir_of(loop)
    if reporter.last_value is None:
        return TrialOutcome(FAIL, None, folder, f'no epoch recorded {monitor} (no epoch was trained)')
    state = PRUNED if reporter.stopped else COMPLETE
    return TrialOutcome(state, reporter.last_value, folder, None, len(reporter.reported))
