"""The search: :func:`tune` checks everything, runs the study on a backend (:data:`BACKENDS`) and writes the
results; :class:`TuneResult` is what it returns. Re-exported by :mod:`aitoolbox_like.tuning`, the documented path.
"""
import dataclasses
import importlib
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from .results import TrialRecord, best_trial, summary_lines, write_results
from .space import TuneInputError, check_inputs, parse_params_and_errors
from .trial import StudySettings

#: The search backends: name -> the module whose ``run_study(settings) -> (records, storage)`` runs a search.
BACKENDS: Dict[str, str] = {
    'optuna': 'aitoolbox_like.tuning.optuna_backend',
    'ray': 'aitoolbox_like.tuning.ray_backend',
}
#: The pruners the command line names (the Python API also takes a backend's pruner object).
PRUNERS = ('median', 'none')


@dataclasses.dataclass
class TuneResult:
    """What a search left: every trial of the study (this run's and earlier runs'), the best one, the files.

    Attributes:
        study_name: the study's name in the storage.
        storage: where the study lives (a URL).
        trials: one record per trial, by number (the interrupted ones included, as FAIL).
        best: the best completed trial (None when none completed).
        files: the results written, by name (``trials.csv``, ``best.yaml``, ``history.png``).
        monitor, mode: what was optimised, and which way.
    """

    study_name: str
    storage: str
    trials: List[TrialRecord]
    best: Optional[TrialRecord]
    files: Dict[str, str]
    monitor: str
    mode: str

    def summary(self) -> List[str]:
        """The lines ``aitoolbox-like tune`` prints at the end."""
        return [f'study {self.study_name!r} ({self.storage})',
                *summary_lines(self.trials, self.best, self.monitor, self.mode, self.files)]


def _argument_errors(trials: Any, concurrent: Any, backend: Any, pruner: Any, output: Any,
                     address: Any = None) -> List[str]:
    errors = []
    if address is not None and backend != 'ray':
        errors.append(f'--address {address}: a Ray cluster is used only with --backend ray')
    for flag, value in (('--trials', trials), ('--concurrent', concurrent)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append(f'{flag}: expected an int >= 1, got {value!r}')
    if backend not in BACKENDS:
        errors.append(f'--backend {backend}: expected one of {", ".join(BACKENDS)}')
    if isinstance(pruner, str) and pruner not in PRUNERS:
        errors.append(f'--pruner {pruner}: expected one of {", ".join(PRUNERS)}')
    if not isinstance(output, (str, os.PathLike)) or not os.fspath(output):
        errors.append(f'--output: expected the folder for the results, got {output!r}')
    return errors


def tune(recipe: Union[str, 'os.PathLike[str]'], overrides: Sequence[str] = (), *,
         params: Union[Mapping[str, str], Sequence[str]], trials: int, monitor: str, mode: str = 'min',
         output: Union[str, 'os.PathLike[str]'], pruner: Any = 'median', storage: Optional[str] = None,
         study_name: Optional[str] = None, backend: str = 'optuna', concurrent: int = 1, sampler: Any = None,
         command: Optional[str] = None, address: Optional[str] = None) -> TuneResult:
    """Search hyper-parameters of a recipe: what ``aitoolbox-like tune`` runs.

    Everything is checked before any trial (the recipe, each PATH and SPEC, every value the recipe will get, the
    monitor); then trials run until the study has ``trials`` finished ones, and the results are written into
    ``output``: trials.csv, best.yaml, history.png.

    Args:
        recipe: the recipe file.
        overrides: ``key.path=value`` overrides of every trial (e.g. ``['fit.num_epochs=5']``).
        params: the search space: ``{'optimizer.lr': 'loguniform(1e-4,1e-2)'}`` or ``['optimizer.lr=loguniform(1e-4,
            1e-2)', ...]`` (SPEC: ``loguniform(a,b)``, ``uniform(a,b)``, ``int(a,b)``, ``choice(v1,v2,...)``).
        trials: the number of finished trials (completed, pruned or failed) the study should have; a continued study
            runs only the ones it lacks.
        monitor: the history value reported after every epoch (``val_loss``, ``val_Accuracy``...); a trial's value
            is the one of its last epoch.
        mode: ``'min'`` or ``'max'``: which way ``monitor`` is better.
        output: the results folder; it also holds the study (``study.db``) unless ``storage`` is given.
        pruner: ``'median'`` (default), ``'none'``, or an Optuna pruner object.
        storage: the study's storage URL (default ``sqlite:///<output>/study.db``).
        study_name: the study's name in the storage (default: the recipe file's name without its extension).
        backend: ``'optuna'`` (trials in this process, or ``concurrent`` processes of this machine) or ``'ray'``
            (trials run by Ray Tune on a Ray cluster; the same study, pruning and results).
        concurrent: trials run at once (in as many processes; under Ray, each with its share of the cluster).
        sampler: an Optuna sampler object (default: Optuna's, TPE).
        command: the command line that started the search, saved with every trial (None from Python).
        address: ``backend='ray'``: the Ray cluster's address (None: the cluster this process is connected to, or a
            new local one).

    Returns:
        TuneResult: every trial of the study, the best, the files written.

    Raises:
        RecipeError: the recipe does not check.
        TuneInputError: a problem of the search (a PATH, a SPEC, the monitor, an argument), found before any trial;
            also (MonitorNotRecorded) when the first epoch of the first trial did not record the monitor.
        ImportError: the backend's package is missing (the message names the extra to install).
    """
    recipe_path = os.path.abspath(os.fspath(recipe))
    errors = _argument_errors(trials, concurrent, backend, pruner, output, address)
    parsed, param_errors = parse_params_and_errors(params)
    errors.extend(param_errors)
    try:
        check_inputs(recipe_path, overrides, parsed, monitor, mode)
    except TuneInputError as error:     # reported with the problems found above, all at once
        errors.extend(error.errors)
    if errors:
        raise TuneInputError(errors, recipe_path)
    output_dir = os.path.abspath(os.path.expanduser(os.fspath(output)))
    name = study_name or os.path.splitext(os.path.basename(recipe_path))[0]
    settings = StudySettings(recipe=recipe_path, overrides=list(overrides), params=parsed, monitor=monitor, mode=mode,
                             trials=trials, output_dir=output_dir, study_name=name, storage=storage, pruner=pruner,
                             concurrent=concurrent, sampler=sampler, command=command, address=address)
    backend_module = importlib.import_module(BACKENDS[backend])
    records, storage_url = backend_module.run_study(settings)
    best = best_trial(records, mode)
    files = write_results(output_dir, records, [p.path for p in parsed], recipe_path, overrides, monitor, mode, name)
    return TuneResult(name, storage_url, records, best, files, monitor, mode)
