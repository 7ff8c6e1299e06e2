"""The Ray Tune backend of ``aitoolbox-like tune`` (``--backend ray``): Ray Tune runs the trials, ``--concurrent K`` at
a time, on a Ray cluster (a local one started for the search, or ``--address``'s); the study is the same Optuna
study as under ``--backend optuna``, in the same storage.

Why the study stays Optuna's (and not Ray Tune's own search and schedulers):

- **The same pruning.** Each trial reports every epoch's value to its Optuna trial and asks the study's pruner
  (median by default) whether to stop, exactly as under ``--backend optuna``: ``--pruner median`` means one rule
  whichever backend runs it. A pruned trial stops cleanly, after its epoch (its checkpoint, the end-of-training
  evaluation and every callback's ``on_train_end`` run), which a Ray Tune scheduler cannot do: it stops a trial by
  ending its process, between two reports. Ray's ASHA scheduler would also be another rule (it compares trials only
  at rungs 1, 2, 4... epochs).
- **The same sampler** (Optuna's TPE, or ``sampler=``), fed with every earlier trial of the study, this run's
  concurrent ones included.
- **Nothing lost, the same way.** The study lives in ``--storage``; the same command continues it; a trial whose
  worker or machine died is FAIL (interrupted) and not counted; trials.csv and best.yaml come from the study, so
  they are the same files with the same meaning. The study can even be continued by the other backend.

Ray Tune contributes what it is good at: placing ``K`` trials at once on the cluster's machines, each with its share
of the CPUs and GPUs, and its own record of the trials (under ``DIR/ray``). Every trial's epoch values are reported
to Ray Tune too (``tune.report``), so its console and logs follow the search.

On a cluster of several machines every worker must reach the storage: give ``--storage`` a database server URL
(``postgresql://...``, ``mysql://...``); the default SQLite file in DIR works only where every machine sees DIR
(a shared file system). The recipe, its data and the experiment folders must be reachable from every machine as
well (a shared file system, or an S3 results folder).
"""
import contextlib
import functools
import logging
import os
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .optuna_backend import (counts, load_study, mark_interrupted, objective, opened_study, quiet_optuna, records,
                             storage_url)
from ..adapters.ray import QUIET_WORKER_LOGS_HOOK
from .results import TrialRecord
from .trial import MonitorNotRecorded, StudySettings, TrialFailed

logger = logging.getLogger(__name__)

_INSTALL_HINT = "pip install 'aitoolbox_like[ray,tune]'"
#: Ray Tune's own record of the search's trials, inside the results folder.
RAY_FOLDER = 'ray'


def import_ray_tune() -> Any:
    """The ``ray.tune`` module, or an ImportError that names the install command when Ray Tune is missing."""
    try:
        import ray.tune
    except ImportError as exc:
        raise ImportError(f'--backend ray needs Ray Tune: {_INSTALL_HINT}') from exc
    return ray.tune


def trial_resources(cluster: Dict[str, float], concurrent: int) -> Dict[str, float]:
    """Each trial's share of the cluster when ``concurrent`` trials run at once: its CPUs split evenly (at least one
    each), and its GPUs too when it has some (a fraction of one when trials outnumber them), so that trials use the
    cluster's GPUs instead of Ray's default of none."""
    cpus = max(1, int(cluster.get('CPU', 1) // concurrent))
    resources: Dict[str, float] = {'cpu': cpus}
    gpus = float(cluster.get('GPU', 0))
    if gpus >= 1:
        resources['gpu'] = float(gpus // concurrent) if gpus >= concurrent else 1.0 / -(-concurrent // int(gpus))
    return resources


def run_one_trial(config: Dict[str, Any], settings: StudySettings, cwd: str) -> None:
    """What each Ray Tune trial runs, in a Ray worker: one trial of the Optuna study (sampled, trained, told), every
    epoch's value reported to Ray Tune as well. ``config`` is Ray's (empty: the study samples); ``cwd``: the search's
    working folder, where the recipe's relative paths point (Ray starts a trial in a folder of its own)."""
    import torch

    tune = import_ray_tune()
    if os.path.isdir(cwd):
        os.chdir(cwd)
    cpus = tune.get_context().get_trial_resources().required_resources.get('CPU')
    if cpus:
        torch.set_num_threads(max(1, int(cpus)))

    def report_to_ray(epoch: int, value: float, number: int) -> None:
        tune.report({settings.monitor: value, 'epoch': epoch, 'optuna_trial': number})

    with quiet_optuna():
        study = load_study(settings)
        # Exactly one trial: Ray Tune decides how many run, and where.
        study.optimize(objective(settings, also_report=report_to_ray), n_trials=1, catch=(TrialFailed,),
                       gc_after_trial=True)


def _connect(settings: StudySettings) -> bool:
    """Connect to the Ray cluster (``settings.address``, or a new local one); True when this call started Ray (so the
    search shuts it down at its end)."""
    import ray
    if ray.is_initialized():
        if settings.address:
            logger.warning('--address %s is not used: this process is already connected to a Ray cluster',
                           settings.address)
        return False
    if settings.address and settings.storage is None:
        logger.warning('--address %s with the default storage (%s): every machine of the cluster must see that '
                       'file (a shared file system); otherwise give --storage a database URL', settings.address,
                       storage_url(settings))
    ray.init(address=settings.address, include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=True, runtime_env={'worker_process_setup_hook': QUIET_WORKER_LOGS_HOOK})
    return True


def _run_trials(settings: StudySettings, number: int) -> None:
    """Run ``number`` trials with Ray Tune, ``settings.concurrent`` at a time."""
    import ray
    tune = import_ray_tune()
    resources = trial_resources(ray.cluster_resources(), settings.concurrent)
    trainable = tune.with_resources(functools.partial(run_one_trial, settings=settings, cwd=os.getcwd()), resources)
    logger.info('Ray Tune: %d trials, %d at a time, each with %s', number, settings.concurrent,
                describe_resources(resources))
    tuner = tune.Tuner(trainable,
                       tune_config=tune.TuneConfig(num_samples=number, max_concurrent_trials=settings.concurrent,
                                                   # a worker process (torch imported) serves trial after trial
                                                   reuse_actors=True),
                       run_config=tune.RunConfig(name=settings.study_name, verbose=0,
                                                 storage_path=os.path.join(settings.output_dir, RAY_FOLDER)))
    # TUNE_DISABLE_SIGINT_HANDLER: Ctrl-C raises KeyboardInterrupt here, as under --backend optuna, instead of Ray
    # Tune's own handler ending the experiment quietly (the search would then start the missing trials again).
    # RAY_AIR_NEW_OUTPUT=0: Ray Tune's older console output, which verbose=0 silences (the newer one prints its
    # configuration table and result paths whatever the verbosity); the search prints one line per trial itself.
    with _environment(TUNE_DISABLE_SIGINT_HANDLER='1', RAY_AIR_NEW_OUTPUT='0'):
        results = tuner.fit()
    for error in results.errors:
        # Failures of a trial's own training are FAIL trials of the study (caught in the trial); what reaches Ray is
        # a mistake of the search (the monitor) or a worker that died. Ray wraps the first (its ``cause``).
        cause = getattr(error, 'cause', None) or error
        if isinstance(cause, MonitorNotRecorded):
            raise cause
        logger.warning('A Ray Tune trial ended with an error (its Optuna trial is marked FAIL, interrupted): %s',
                       error)


def run_study(settings: StudySettings) -> Tuple[List[TrialRecord], str]:
    """Run the search with Ray Tune (see the module's documentation); returns every trial of the study and the
    storage URL."""
    import_ray_tune()
    url = storage_url(settings)
    started = False
    try:
        with opened_study(settings) as (study, alone):
            finished, running = counts(study)
            # A trial whose worker died leaves a FAIL (interrupted) trial that does not count: run the missing ones
            # again, as long as each round finishes some.
            while finished + running < settings.trials:
                started = _connect(settings) or started
                try:
                    _run_trials(settings, settings.trials - finished - running)
                except KeyboardInterrupt:
                    if started:         # the trials' workers end first, so none tells its trial after this
                        _shutdown()
                        started = False
                    if alone:
                        mark_interrupted(study)
                    raise
                if alone:
                    mark_interrupted(study)     # no trial of this search runs any more
                before = finished
                finished, running = counts(study)
                if finished == before:
                    break
    finally:
        if started:
            _shutdown()
    return records(study, settings), url


@contextlib.contextmanager
def _environment(**variables: str) -> Iterator[None]:
    """Environment variables set while inside, then as they were."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _shutdown() -> None:
    import ray
    ray.shutdown()


def describe_resources(resources: Optional[Dict[str, float]]) -> str:
    """``'2 CPU, 0.5 GPU'``: a trial's resources, for messages."""
    return ', '.join(f'{v:g} {k.upper()}' for k, v in (resources or {}).items())
