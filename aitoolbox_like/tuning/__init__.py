"""Hyper-parameter search over recipes: every trial is the recipe with sampled values, trained as
``aitoolbox-like train`` would (docs/tuning.md).

    aitoolbox-like tune RECIPE [key.path=value ...] --trials N --param PATH=SPEC [--param ...] --monitor NAME
                        --mode min|max --output DIR

or from Python, :func:`tune`. The pieces, so that another backend (Ray Tune) reuses all but the loop over trials:

- :mod:`.search`: :func:`tune` itself, the backends by name, what a search returns (:class:`TuneResult`);
- :mod:`.space`: the ``PATH=SPEC`` parameters, checked against the recipe before any trial;
- :mod:`.trial`: :func:`run_trial`, one trial whatever runs it (report callback in, outcome out);
- :mod:`.results`: trials.csv, best.yaml and history.png from a list of :class:`TrialRecord`;
- :mod:`.optuna_backend`: the study in an Optuna storage, continued by running the same command again;
- :mod:`.ray_backend`: the same study, its trials run by Ray Tune on a Ray cluster (``--backend ray``).

:class:`OptunaPruning` (in :mod:`aitoolbox_like.adapters.optuna`) is the callback for an objective of your own
around ``TrainLoop.fit``. Nothing here imports Optuna until a search runs (``pip install 'aitoolbox_like[tune]'``).
"""
from ..adapters.optuna import OptunaPruning
from .results import TrialRecord
from .search import BACKENDS, PRUNERS, TuneResult, tune
from .space import Param, TuneInputError, parse_param, parse_params
from .trial import (COMPLETE, FAIL, PRUNED, MonitorNotRecorded, StudySettings, TrialOutcome, TrialReport,
                    run_trial)

__all__ = ['tune', 'TuneResult', 'OptunaPruning', 'run_trial', 'TrialOutcome', 'TrialReport', 'TrialRecord',
           'StudySettings', 'Param', 'parse_param', 'parse_params', 'TuneInputError', 'MonitorNotRecorded',
           'BACKENDS', 'COMPLETE', 'PRUNED', 'FAIL']
