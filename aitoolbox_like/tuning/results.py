"""The results of a search, written from a list of :class:`TrialRecord` (any backend's trials):

- ``trials.csv``: ``number, state, value``, one column per searched PATH, ``experiment_dir``; one row per finished
  trial (state COMPLETE, PRUNED or FAIL);
- ``best.yaml``: the recipe with the best completed trial's values filled in (resolved, as a run's recipe.yaml),
  runnable with ``aitoolbox-like train``;
- ``history.png``: each trial's value and the running best (needs matplotlib, the ``plots`` extra).

Every file is written to a temporary name first and then renamed, so a reader (or a second search process
writing the same folder) never sees half a file.
"""
import csv
import dataclasses
import io
import logging
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..results.reporting import matplotlib_available, new_figure
from ..recipes.recipe import Recipe
from ..storage.local import write_atomically
from .space import override
from .trial import COMPLETE, FAIL, PRUNED, PROG, trial_overrides

logger = logging.getLogger(__name__)

TRIALS_FILE = 'trials.csv'
BEST_FILE = 'best.yaml'
HISTORY_FILE = 'history.png'
#: The states a row of trials.csv can have.
FINISHED_STATES = (COMPLETE, PRUNED, FAIL)


@dataclasses.dataclass
class TrialRecord:
    """One finished trial of a study.

    Attributes:
        number: the trial's number in the study (0, 1, ...).
        state: ``'COMPLETE'``, ``'PRUNED'`` or ``'FAIL'``.
        value: the monitored value at the trial's last epoch (a pruned trial's at the epoch it stopped at); None
            when it has none.
        params: the sampled value of each searched PATH.
        experiment_dir: the trial's experiment folder, when it has one.
        error: why it failed (``'FAIL'`` only).
    """

    number: int
    state: str
    value: Optional[float]
    params: Dict[str, Any]
    experiment_dir: Optional[str] = None
    error: Optional[str] = None


def best_trial(records: Sequence[TrialRecord], mode: str) -> Optional[TrialRecord]:
    """The completed trial with the smallest (``mode='min'``) or largest (``'max'``) value; the earliest on a tie.
    None when no trial completed."""
    completed = [r for r in records if r.state == COMPLETE and r.value is not None and math.isfinite(r.value)]
    if not completed:
        return None
    sign = 1.0 if mode == 'min' else -1.0
    return min(completed, key=lambda r: (sign * float(r.value or 0.0), r.number))


def _write_atomically(path: str, data: bytes) -> None:
    write_atomically(path, lambda f: f.write(data))


def _cell(value: Any) -> str:
    if value is None:
        return ''
    if isinstance(value, bool):
        return 'true' if value else 'false'
    return str(value)


def trials_csv_text(records: Sequence[TrialRecord], paths: Sequence[str]) -> str:
    """The text of trials.csv (rows by trial number)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator='\n')
    writer.writerow(['number', 'state', 'value', *paths, 'experiment_dir'])
    for record in sorted(records, key=lambda r: r.number):
        writer.writerow([record.number, record.state, _cell(record.value),
                         *(_cell(record.params.get(path)) for path in paths), _cell(record.experiment_dir)])
    return out.getvalue()


def best_recipe_text(recipe_path: str, overrides: Sequence[str], best: TrialRecord, monitor: str, mode: str,
                     study_name: str) -> str:
    """best.yaml: the recipe with the search's overrides and ``best``'s values, resolved, under a header saying where
    it comes from."""
    recipe = Recipe.load(recipe_path, trial_overrides(overrides, best.params))
    values = ', '.join(override(path, value) for path, value in best.params.items())
    header = [f'# The best trial of study {study_name!r}: trial {best.number}, {monitor}={best.value!r} ({mode}),',
              f'# with {values}.',
              f'# Recipe {recipe_path} with these values filled in; train it: {PROG} train <this file>']
    if best.experiment_dir:
        header.append(f'# The trial\'s own run: {best.experiment_dir}')
    return '\n'.join(header) + '\n' + recipe.to_yaml()


def plot_history(path: str, records: Sequence[TrialRecord], monitor: str, mode: str) -> bool:
    """Draw history.png: the value of each completed and pruned trial, and the running best of the completed ones.
    Returns False (with a warning) when matplotlib is missing."""
    if not matplotlib_available():
        logger.warning("%s is not drawn: it needs matplotlib (pip install 'aitoolbox_like[plots]')", path)
        return False
    from matplotlib.ticker import MaxNLocator
    ordered = sorted(records, key=lambda r: r.number)
    figure = new_figure(figsize=(7, 4.5))
    axes = figure.subplots()
    for state, marker, color, label in ((COMPLETE, 'o', 'tab:blue', 'completed trials'),
                                        (PRUNED, 'x', 'tab:gray', 'pruned trials (value where they stopped)')):
        points = [(r.number, r.value) for r in ordered if r.state == state and r.value is not None]
        if points:
            axes.scatter([p[0] for p in points], [p[1] for p in points], marker=marker, color=color, label=label)
    best_x, best_y = [], []
    best: Optional[float] = None
    for record in ordered:
        if record.state == COMPLETE and record.value is not None and math.isfinite(record.value):
            if best is None or (record.value < best if mode == 'min' else record.value > best):
                best = record.value
        if best is not None:
            best_x.append(record.number)
            best_y.append(best)
    if best_x:
        axes.step(best_x, best_y, where='post', color='tab:red', label='best so far')
    failed = sum(1 for r in ordered if r.state == FAIL)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel('trial')
    axes.set_ylabel(monitor)
    axes.set_title(f'{monitor} per trial ({mode})' + (f'; {failed} failed trials not shown' if failed else ''))
    if best_x or any(r.value is not None for r in ordered):
        axes.legend()
    buffer = io.BytesIO()
    figure.savefig(buffer, format='png', dpi=100)
    _write_atomically(path, buffer.getvalue())
    return True


def write_results(output_dir: str, records: Sequence[TrialRecord], paths: Sequence[str], recipe_path: str,
                  overrides: Sequence[str], monitor: str, mode: str, study_name: str) -> Dict[str, str]:
    """Write trials.csv, best.yaml (when a trial completed) and history.png into ``output_dir``; returns the files
    written, by name. Records of trials not finished (another state than COMPLETE, PRUNED, FAIL) are left out."""
    os.makedirs(output_dir, exist_ok=True)
    finished = [r for r in records if r.state in FINISHED_STATES]
    written: Dict[str, str] = {}
    path = os.path.join(output_dir, TRIALS_FILE)
    _write_atomically(path, trials_csv_text(finished, paths).encode('utf-8'))
    written[TRIALS_FILE] = path
    best = best_trial(finished, mode)
    if best is not None:
        path = os.path.join(output_dir, BEST_FILE)
        text = best_recipe_text(recipe_path, overrides, best, monitor, mode, study_name)
        _write_atomically(path, text.encode('utf-8'))
        written[BEST_FILE] = path
    else:
        logger.warning('No trial completed: %s is not written', BEST_FILE)
    path = os.path.join(output_dir, HISTORY_FILE)
    if plot_history(path, finished, monitor, mode):
        written[HISTORY_FILE] = path
    return written


def summary_lines(records: Sequence[TrialRecord], best: Optional[TrialRecord], monitor: str, mode: str,
                  files: Mapping[str, str]) -> List[str]:
    """What the command line prints at the end: the counts, the best value and values, failures, the files."""
    counts = {state: sum(1 for r in records if r.state == state) for state in FINISHED_STATES}
    lines = [f'{len(records)} trials: {counts[COMPLETE]} complete, {counts[PRUNED]} pruned, {counts[FAIL]} failed']
    for record in records:
        if record.state == FAIL:
            lines.append(f'  trial {record.number} failed: {record.error or "interrupted"}')
    if best is None:
        lines.append('no trial completed')
    else:
        lines.append(f'best trial {best.number}: {monitor}={best.value!r} ({mode})')
        lines.extend(f'  {override(path, value)}' for path, value in best.params.items())
        if best.experiment_dir:
            lines.append(f'  experiment folder: {best.experiment_dir}')
    lines.extend(f'{name}: {path}' for name, path in files.items())
    if BEST_FILE in files:
        lines.append(f'train the best: {PROG} train {files[BEST_FILE]}')
    return lines
