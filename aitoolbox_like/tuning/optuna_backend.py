"""The Optuna backend of ``aitoolbox-like tune``: the study lives in a storage (default ``sqlite:///DIR/study.db``)
and each trial is :func:`~aitoolbox_like.tuning.trial.run_trial` in this process.

Nothing is lost:

- the same command with the same DIR continues the study: ``--trials N`` is the number of finished trials the study
  should have (completed, pruned or failed), so a search that was stopped runs only the trials it still lacks, and a
  larger N runs more;
- a trial that was running when its process died is marked FAIL (interrupted) and does not count: at the start, when
  no other search process works in DIR (a lock file there tells), and otherwise by Optuna's heartbeat, once a
  trial has not beaten for a minute (workers on other machines sharing ``--storage``);
- a trial that fails (an exception, a NaN value) is recorded as FAIL with its error (the trial's user attribute
  ``error``) and the search goes on.

``--concurrent K`` runs K trials at once, in K processes (this one and K-1 started for it) sharing the storage, as
do the tasks of a SLURM job array running the same command. On a SQLite storage a new trial is added under the
database folder's lock after counting the study's trials, so the study ends with exactly N; on a database server up
to K-1 more are possible. A trial whose process leaves in its middle (SystemExit: a SLURM job requeued after a
signal) is marked FAIL (interrupted) on the way out.
"""
import contextlib
import functools
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple

from ..adapters.optuna import import_optuna
from ..storage.local import exclusive_lock
from .results import TrialRecord
from .space import Param, TuneInputError
from .trial import COMPLETE, FAIL, PRUNED, StudySettings, TrialFailed, outcome_line, run_trial

if TYPE_CHECKING:
    import optuna

logger = logging.getLogger(__name__)

STORAGE_FILE = 'study.db'
LOCK_FILE = '.tune.lock'
#: The study's user attribute that records what it searches (checked when a search continues it).
SEARCH_ATTRIBUTE = 'aitoolbox_like_search'
#: Seconds between a running trial's heartbeats, and without one before another worker marks it FAIL.
HEARTBEAT_INTERVAL_S = 20
HEARTBEAT_GRACE_S = 60


def default_storage(output_dir: str) -> str:
    """The storage URL of a search whose ``--storage`` is not given: ``sqlite:///<DIR>/study.db``."""
    return 'sqlite:///' + os.path.join(os.path.abspath(output_dir), STORAGE_FILE)


def storage_url(settings: StudySettings) -> str:
    """The search's storage URL: ``--storage``, or the default inside the results folder."""
    return settings.storage or default_storage(settings.output_dir)


#: The folder of the results folder where a trial's log is written while it runs (then it moves into the trial's
#: experiment folder).
LOGS_FOLDER = 'logs'


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna's own messages off (errors kept) while a search runs: the search prints one line per trial itself, and
    Optuna's would repeat it ("Trial 3 finished with value...") or add a traceback the trial's log already holds."""
    optuna = import_optuna()
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(before)


def trial_log_path(settings: StudySettings, number: int) -> str:
    """Where trial ``number`` writes its output while it runs."""
    return os.path.join(settings.output_dir, LOGS_FOLDER, f'trial_{number}.log')


def make_pruner(pruner: Any) -> Any:
    """``'median'`` (Optuna's MedianPruner with its defaults), ``'none'`` (no pruning), or a pruner object as it is.
    """
    optuna = import_optuna()
    if pruner == 'median':
        return optuna.pruners.MedianPruner()
    if pruner == 'none' or pruner is None:
        return optuna.pruners.NopPruner()
    if isinstance(pruner, optuna.pruners.BasePruner):
        return pruner
    raise ValueError(f"pruner: expected 'median', 'none' or an optuna pruner, got {pruner!r}")


class StudyFull(Exception):
    """A new trial was refused: the study has its ``--trials`` trials (finished ones and the ones running)."""


def _storage(url: str, trials: Optional[int] = None) -> Any:
    """The study's storage; for SQLite, trial claims and (with ``trials``) new trials are made under the database
    folder's lock."""
    optuna = import_optuna()
    claim_lock = _sqlite_folder(url)
    options = {'heartbeat_interval': HEARTBEAT_INTERVAL_S, 'grace_period': HEARTBEAT_GRACE_S}
    with warnings.catch_warnings():
        # Optuna calls heartbeats experimental; the search relies on them only for workers on other machines.
        warnings.simplefilter('ignore', optuna.exceptions.ExperimentalWarning)
        if claim_lock is None:
            return optuna.storages.RDBStorage(url, **options)
        return _sqlite_storage_class()(url, claim_lock, trials, **options)


def _sqlite_folder(url: str) -> Optional[str]:
    """The folder of a SQLite storage's database file (None for another database, or one in memory)."""
    import sqlalchemy.engine
    parsed = sqlalchemy.engine.make_url(url)
    if parsed.get_backend_name() != 'sqlite' or parsed.database in (None, '', ':memory:'):
        return None
    return os.path.dirname(os.path.abspath(parsed.database))


@functools.lru_cache(maxsize=None)
def _sqlite_storage_class() -> Any:
    """Optuna's RDBStorage, claiming a waiting trial under an exclusive lock on the database's folder.

    Optuna hands an enqueued (WAITING) trial to the first worker that sets it RUNNING: it reads the trial's state
    and writes the new one in one transaction, made exclusive by ``SELECT ... FOR UPDATE``, which SQLite ignores.
    Two processes sharing a SQLite study (``--concurrent``, Ray's trials) then both read WAITING, and both train the
    same trial (measured: 2 to 6 of 40 enqueued trials claimed twice by two processes). The lock makes the
    read-and-write one step across processes; the other storages lock the row themselves. The folder is locked,
    not the database file, whose own locks are SQLite's."""
    optuna = import_optuna()

    class SQLiteStorage(optuna.storages.RDBStorage):  # type: ignore[name-defined]
        def __init__(self, url: str, claim_lock: str, trials: Optional[int], **options: Any) -> None:
            super().__init__(url, **options)
            self.claim_lock = claim_lock
            self.trials = trials

        def _create_new_trial(self, study_id: int, template_trial: Any = None) -> Any:
            # Counting the study's trials and adding one is one step across processes (the tasks of a SLURM job
            # array, --concurrent workers): the study ends with exactly its --trials trials, none twice. Optuna's
            # private method, because its cache in front of every RDBStorage calls this one, not create_new_trial.
            if self.trials is None or template_trial is not None:
                return super()._create_new_trial(study_id, template_trial)
            with exclusive_lock(self.claim_lock):
                finished, running = count_trials(self.get_all_trials(study_id, deepcopy=False))
                if finished + running >= self.trials:
                    raise StudyFull(f'the study has its {self.trials} trials')
                return super()._create_new_trial(study_id, template_trial)

        def set_trial_state_values(self, trial_id: int, state: Any, values: Any = None) -> bool:
            if state != optuna.trial.TrialState.RUNNING:
                return bool(super().set_trial_state_values(trial_id, state, values))
            with exclusive_lock(self.claim_lock):
                return bool(super().set_trial_state_values(trial_id, state, values))

    return SQLiteStorage


def _search_record(settings: StudySettings) -> Dict[str, Any]:
    """What the study records about its search: a continued study must search the same space the same way."""
    return {'monitor': settings.monitor, 'mode': settings.mode,
            'params': {p.path: [p.kind, p.low, p.high, list(p.choices)] for p in settings.params},
            'recipe': settings.recipe, 'overrides': list(settings.overrides)}


def _check_same_search(study: 'optuna.Study', settings: StudySettings) -> None:
    """Refuse to continue a study that searched another space, monitor or direction (its trials would not compare);
    a different recipe file or overrides is only warned about (a moved file, a changed output folder). A study none
    of whose trials has reported a value yet (a first try stopped by a misspelt monitor, or interrupted before its
    first epoch ended) is not bound to anything: the search it records is replaced."""
    previous = study.user_attrs.get(SEARCH_ATTRIBUTE)
    reported = [t for t in study.get_trials(deepcopy=False) if t.value is not None or t.intermediate_values]
    current = _search_record(settings)
    if isinstance(previous, dict) and reported:
        errors = []
        for key, flag in (('monitor', '--monitor'), ('mode', '--mode'), ('params', '--param')):
            if previous.get(key) != current[key]:
                errors.append(f'{flag}: the study {settings.study_name!r} searched {previous.get(key)!r}, not '
                              f'{current[key]!r}; continue it with the same {flag}, or start another study '
                              f'(another --output or --study-name)')
        if errors:
            raise TuneInputError(errors)
        for key in ('recipe', 'overrides'):
            if previous.get(key) != current[key]:
                logger.warning('The study %r was run with %s %r; this run uses %r', settings.study_name, key,
                               previous.get(key), current[key])
    study.set_user_attr(SEARCH_ATTRIBUTE, current)


def open_study(settings: StudySettings) -> 'optuna.Study':
    """Create the study, or load it to continue (checking that it searches the same space, monitor and mode)."""
    optuna = import_optuna()
    url = storage_url(settings)
    direction = 'minimize' if settings.mode == 'min' else 'maximize'
    study = optuna.create_study(storage=_storage(url, settings.trials), study_name=settings.study_name,
                                direction=direction, load_if_exists=True, pruner=make_pruner(settings.pruner),
                                sampler=settings.sampler)
    expected = optuna.study.StudyDirection.MINIMIZE if settings.mode == 'min' else \
        optuna.study.StudyDirection.MAXIMIZE
    if study.direction != expected:
        raise TuneInputError([f'--mode {settings.mode}: the study {settings.study_name!r} in {url} is '
                              f'{study.direction.name.lower()}d; start another study (another --output or '
                              f'--study-name)'])
    _check_same_search(study, settings)
    return study


def load_study(settings: StudySettings) -> 'optuna.Study':
    """The study that :func:`open_study` opened, loaded in another process that runs some of its trials (with the
    search's pruner and sampler)."""
    optuna = import_optuna()
    url = storage_url(settings)
    return optuna.load_study(study_name=settings.study_name, storage=_storage(url, settings.trials),
                             pruner=make_pruner(settings.pruner), sampler=settings.sampler)


# ---------------------------------------------------------------------------------------------- interrupted trials


class FolderLock:
    """A lock file in the results folder: every search process holds it shared; one that gets it exclusively knows
    that no other search process works in the folder, so the trials its storage shows running were interrupted."""

    def __init__(self, output_dir: str) -> None:
        self.path = os.path.join(output_dir, LOCK_FILE)
        self.file: Any = None

    def acquire(self) -> bool:
        """Take the lock; True when no other process holds it (the lock is then exclusive until :meth:`share`)."""
        try:
            import fcntl
        except ImportError:          # no flock (Windows): only the heartbeat finds interrupted trials
            return False
        self.file = open(self.path, 'a')
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            fcntl.flock(self.file, fcntl.LOCK_SH)
            return False

    def share(self) -> None:
        """Let other search processes in (after the interrupted trials are marked)."""
        if self.file is not None:
            import fcntl
            fcntl.flock(self.file, fcntl.LOCK_SH)

    def release(self) -> None:
        if self.file is not None:
            self.file.close()       # closing the file releases the lock
            self.file = None


def mark_interrupted(study: 'optuna.Study') -> List[int]:
    """Mark every trial of ``study`` still RUNNING as FAIL (call it only when no process can be running them);
    returns their numbers."""
    optuna = import_optuna()
    running = [t.number for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))]
    for number in running:
        study.tell(number, state=optuna.trial.TrialState.FAIL)
    if running:
        logger.warning('Trial%s %s of study %r %s running when its process stopped: marked FAIL (interrupted), not '
                       'counted', 's' if len(running) > 1 else '', ', '.join(map(str, running)), study.study_name,
                       'were' if len(running) > 1 else 'was')
    return running


# ---------------------------------------------------------------------------------------------- trials


def counts(study: 'optuna.Study') -> Tuple[int, int]:
    """``(finished, running)``: trials that count towards ``--trials`` (completed, pruned, or failed with an error
    of their own, not interrupted) and trials running now."""
    return count_trials(study.get_trials(deepcopy=False))


def count_trials(trials: Any) -> Tuple[int, int]:
    """:func:`counts` of a list of Optuna's frozen trials."""
    optuna = import_optuna()
    state = optuna.trial.TrialState
    finished = running = 0
    for trial in trials:
        if trial.state in (state.COMPLETE, state.PRUNED) or (trial.state == state.FAIL and 'error' in trial.user_attrs):
            finished += 1
        elif trial.state == state.RUNNING:
            running += 1
    return finished, running


def suggest(trial: 'optuna.trial.Trial', param: Param) -> Any:
    """Sample one parameter in an Optuna trial (its PATH names it in the study)."""
    if param.kind == 'loguniform':
        return trial.suggest_float(param.path, float(param.low or 0.0), float(param.high or 0.0), log=True)
    if param.kind == 'uniform':
        return trial.suggest_float(param.path, float(param.low or 0.0), float(param.high or 0.0))
    if param.kind == 'int':
        return trial.suggest_int(param.path, int(param.low or 0), int(param.high or 0))
    return trial.suggest_categorical(param.path, list(param.choices))


def objective(settings: StudySettings, also_report: Optional[Callable[[int, float, int], None]] = None) -> Any:
    """The Optuna objective of a search: sample, :func:`run_trial`, hand the outcome to Optuna (a pruned trial raises
    ``optuna.TrialPruned``, a failed one records its error and raises :class:`TrialFailed`).

    ``also_report(epoch, value, trial_number)``: called with every epoch's value before the pruner decides (Ray Tune's
    report, under ``--backend ray``)."""
    pruned = import_optuna().TrialPruned

    def run(trial: 'optuna.trial.Trial') -> float:
        # Which process ran it (the one that died, for an interrupted trial).
        trial.set_user_attr('worker', f'{socket.gethostname()}:{os.getpid()}')
        values = {param.path: suggest(trial, param) for param in settings.params}

        def report(epoch: int, value: float) -> bool:
            if also_report is not None:
                also_report(epoch, value, trial.number)
            trial.report(value, epoch)
            return bool(trial.should_prune())

        label = f'trial {trial.number} of study {settings.study_name!r} (results in {settings.output_dir})'
        if settings.command:
            label += f', searched by: {settings.command}'
        try:
            outcome = run_trial(settings.recipe, settings.overrides, values, settings.monitor, report, label=label,
                                hyperparams={'tune_study': settings.study_name, 'tune_trial': trial.number},
                                log_path=trial_log_path(settings, trial.number))
        except SystemExit:
            # The process leaves in the middle of the trial (inside a SLURM job a scheduler's signal ends it once the
            # trial's checkpoint is written, and the job is requeued). Optuna records nothing for a SystemExit: the
            # trial is FAIL (interrupted, not counted) now, not once its heartbeat has been missed for a minute.
            trial.study.tell(trial.number, state=import_optuna().trial.TrialState.FAIL)
            raise
        print(outcome_line(trial.number, outcome, settings.monitor, values), flush=True)
        if outcome.experiment_dir:
            trial.set_user_attr('experiment_dir', outcome.experiment_dir)
        if outcome.state == FAIL:
            trial.set_user_attr('error', outcome.error)
            raise TrialFailed(outcome.error)
        if outcome.state == PRUNED:
            raise pruned(f'{settings.monitor}={outcome.value!r} after epoch {outcome.epochs_reported - 1}')
        assert outcome.value is not None
        return outcome.value

    return run


def work(settings: StudySettings, study: Optional['optuna.Study'] = None) -> None:
    """Run trials until the study has ``settings.trials`` finished ones (counting the ones running elsewhere);
    ``study``: the study already opened in this process (None: open it)."""
    study = study if study is not None else open_study(settings)
    run = objective(settings)
    while True:
        finished, running = counts(study)
        if finished + running >= settings.trials:
            break
        # gc after each trial: the loop and its callbacks refer to each other, and a cycle holding a model's
        # (GPU) memory must not wait for Python's next collection while the next trial builds its own.
        try:
            study.optimize(run, n_trials=1, catch=(TrialFailed,), gc_after_trial=True)
        except StudyFull:       # another process took the last trial between the count above and this one's start
            break


_worker_interrupted: List[int] = []


def _interrupt_worker(signum: int, frame: Any) -> None:
    """A worker's SIGINT and SIGTERM where its trial's fit has no handler of its own (and a fit's second SIGINT): the
    trial ends as on Ctrl-C, once. A second signal while that stop is under way (the terminal's Ctrl-C reached the
    worker, then the search's SIGTERM) must not cut it short."""
    if _worker_interrupted:
        return
    _worker_interrupted.append(signum)
    raise KeyboardInterrupt(f'received {signal.Signals(signum).name}')


def _work_in_child(settings: StudySettings, log_level: int, threads: int, ready: Any, start: Any) -> None:
    """A worker process of ``--concurrent``: logging as in the parent, its share of the CPU threads; it opens the
    study, says it is ready, and starts trials when every worker is."""
    import torch
    logging.basicConfig(level=log_level, format='%(levelname)s %(name)s: %(message)s')
    torch.set_num_threads(threads)
    # SIGTERM too: the search stops its workers with it (_work_concurrently), which a trial's fit takes as Ctrl-C.
    signal.signal(signal.SIGINT, _interrupt_worker)
    signal.signal(signal.SIGTERM, _interrupt_worker)
    try:
        with quiet_optuna():
            study = open_study(settings)
            ready.set()
            start.wait()
            work(settings, study)
    except KeyboardInterrupt:
        # Ctrl-C (the terminal's) or the parent's SIGTERM: this worker's trial is FAIL (interrupted), as the parent says.
        # The worker is ending: a later signal must not raise in its last steps (the interpreter's exit handlers).
        for stop_signal in (signal.SIGINT, signal.SIGTERM):
            signal.signal(stop_signal, signal.SIG_IGN)
        sys.exit(130)


def _start_together(children: List[Any], ready: List[Any], start: Any) -> None:
    """Let every worker start once all have opened the study (or died): K trials begin at once, instead of this
    process running short trials alone while the others are still importing."""
    while any(child.is_alive() and not event.is_set() for child, event in zip(children, ready)):
        time.sleep(0.05)
    start.set()


def _work_concurrently(settings: StudySettings, study: 'optuna.Study', workers: int) -> None:
    """Run trials in ``workers`` processes: this one and ``workers - 1`` started for it."""
    import torch
    threads = max(1, (os.cpu_count() or 1) // workers)
    context = multiprocessing.get_context('spawn')      # no fork of a process that holds torch threads and a DB
    start = context.Event()
    ready = [context.Event() for _ in range(workers - 1)]
    level = logging.getLogger().getEffectiveLevel()
    children = [context.Process(target=_work_in_child, args=(settings, level, threads, event, start),
                                name=f'tune-worker-{i + 1}') for i, event in enumerate(ready)]
    for child in children:
        child.start()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    previous_sigint = None
    try:
        _start_together(children, ready, start)
        work(settings, study)
    except KeyboardInterrupt:
        # The search is stopping: a second Ctrl-C must not cut short the wait for the workers' checkpoints below.
        previous_sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)
        # Only this process may have got it (kill -INT): every worker stops its trial the same way (checkpoint, FAIL).
        # SIGTERM, not SIGINT: after a terminal's Ctrl-C, which reached the workers too, a SIGINT would be their
        # second one, which ends a trial at once, its checkpoint unwritten.
        for child in children:
            if child.is_alive() and child.pid is not None:
                os.kill(child.pid, signal.SIGTERM)
        raise
    finally:
        start.set()
        torch.set_num_threads(previous_threads)
        for child in children:
            child.join()
        if previous_sigint is not None:
            signal.signal(signal.SIGINT, previous_sigint)
    failed = [child for child in children if child.exitcode != 0]
    if failed:
        raise RuntimeError(f'{", ".join(c.name for c in failed)} of the search failed (exit status '
                           f'{", ".join(str(c.exitcode) for c in failed)}); see its log above')


def records(study: 'optuna.Study', settings: StudySettings) -> List[TrialRecord]:
    """The study's trials as :class:`TrialRecord` (every state; the results keep the finished ones)."""
    records = []
    for trial in study.get_trials(deepcopy=False):
        params = {p.path: trial.params[p.path] for p in settings.params if p.path in trial.params}
        state = trial.state.name
        error = trial.user_attrs.get('error') if state == FAIL else None
        if state == FAIL and error is None:
            error = 'interrupted: the process running it stopped'
        value = trial.value if state in (COMPLETE, PRUNED) else None
        records.append(TrialRecord(trial.number, state, value, params, trial.user_attrs.get('experiment_dir'),
                                   error))
    return records


@contextlib.contextmanager
def opened_study(settings: StudySettings) -> Iterator[Tuple['optuna.Study', bool]]:
    """Open the search's study for the duration of a search (any backend): with the results folder's lock held
    shared, and the trials an earlier search left running marked FAIL when no other search works in the folder.
    Yields ``(study, alone)``: ``alone`` says that this process may mark interrupted trials again later."""
    os.makedirs(settings.output_dir, exist_ok=True)
    url = storage_url(settings)
    lock = FolderLock(settings.output_dir)
    with quiet_optuna():
        try:
            alone = lock.acquire() and settings.storage is None
            study = open_study(settings)
            if alone:
                mark_interrupted(study)
            lock.share()
            finished, _ = counts(study)
            if finished:
                logger.info('Study %r in %s has %d finished trials; running until it has %d', settings.study_name,
                            url, finished, settings.trials)
            yield study, alone
        finally:
            lock.release()


def run_study(settings: StudySettings) -> Tuple[List[TrialRecord], str]:
    """Run the search (see the module's documentation); returns every trial of the study and the storage URL."""
    url = storage_url(settings)
    with opened_study(settings) as (study, _):
        finished, running = counts(study)
        # No more processes than trials left to run.
        workers = min(settings.concurrent, settings.trials - finished - running)
        if workers > 1:
            _work_concurrently(settings, study, workers)
        else:
            work(settings, study)
    finished, running = counts(study)
    if finished < settings.trials and running:
        logger.warning('The study has %d finished trials of %d; %d are running in other processes (or were '
                       'interrupted less than %d s ago: run the command again to replace them)', finished,
                       settings.trials, running, HEARTBEAT_GRACE_S)
    return records(study, settings), url
