"""Reports written into the experiment folder: hyperparameter and source files, history plots and tables,
gradient distributions (AIToolbox's ``result_reporting`` classes).

Plots need matplotlib (``pip install aitoolbox_like[plots]``), not seaborn; they are drawn on standalone
figures, so the global pyplot state (style, backend, open figures) is left alone and no display is needed.

Besides AIToolbox's one chart per metric, :class:`TrainingHistoryPlotter` draws training against validation on one
chart (:meth:`TrainingHistoryPlotter.generate_train_val_report`, pairs found by :func:`train_val_pairs`), in a
folder of its own so that AIToolbox's folders keep exactly their files.
"""
from __future__ import annotations

import csv
import logging
import math
import numbers
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ..storage.base import join_key
from ..storage.local import write_atomically
from ..experiment.folder import ExperimentFolder
from ..experiment.hyperparams import copy_experiment_script, write_hyperparams_text, zip_source_dirs
from ..experiment.layout import HYPERPARAMS_TXT, SOURCE_ZIP

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..engine.history import TrainingHistory
    from ..storage.base import Storage
    from .savers import BaseFullExperimentS3Saver

logger = logging.getLogger(__name__)

#: A training history as the reporters accept it: a TrainingHistory or a plain ``{metric: [values]}`` dict.
HistoryMapping = Union['TrainingHistory', Mapping[str, Any]]


def matplotlib_available() -> bool:
    """Whether matplotlib (the ``plots`` extra) can be imported."""
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError:
        return False
    return True


def import_matplotlib(who: str) -> None:
    """Fail early, with the install hint, when the ``plots`` extra is missing."""
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError as exc:
        raise ImportError(f'{who} needs matplotlib: pip install aitoolbox_like[plots]') from exc


def new_figure(**kwargs: Any) -> Figure:
    """A standalone matplotlib Figure with its own Agg canvas: no pyplot global state (style, backend, open
    figures), no display needed, freed with the object."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def is_number(value: object) -> bool:
    """A real number, not a bool (the values a metric plot can draw)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def as_number(value: object) -> Optional[float]:
    """A history value as a plain float (a one-element tensor's value included), for the trackers and searches that
    take numbers only; None when it is not a number."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return None
        value = value.item()
    return float(value) if is_number(value) else None    # type: ignore[arg-type]  # a real number here


def lower_is_better(metric_name: str) -> bool:
    """Losses and errors improve downwards, everything else upwards."""
    name = metric_name.lower()
    return 'loss' in name or 'error' in name


def history_series(training_history: HistoryMapping,
                   metric_names: Optional[Sequence[str]] = None) -> Dict[str, Tuple[List, List]]:
    """``{name: (epochs, values)}`` of the history (of ``metric_names`` only, when given), dict-valued metrics
    expanded to ``<name>_<key>`` as AIToolbox's flattened history.

    Each value keeps the epoch it was recorded in when the history knows it, so metrics computed every k epochs
    line up with the others (AIToolbox used the list index as the epoch).
    """
    series: Dict[str, Tuple[List, List]] = {}
    names = list(training_history.keys()) if metric_names is None \
        else [m for m in metric_names if m in training_history]
    for name in names:
        values = list(training_history[name])
        epochs = training_history.get_epochs(name) if hasattr(training_history, 'get_epochs') else []
        if len(epochs) != len(values):
            epochs = list(range(len(values)))
        if values and all(isinstance(v, Mapping) for v in values):
            for key in dict.fromkeys(k for v in values for k in v):
                pairs = [(e, v[key]) for e, v in zip(epochs, values) if key in v]
                series[f'{name}_{key}'] = ([e for e, _ in pairs], [v for _, v in pairs])
        else:
            series[name] = (epochs, values)
    return series


#: What the folder (or PDF) of the training-vs-validation charts adds to the name of the per-metric one
#: (``plots_epoch_3`` -> ``plots_epoch_3_train_val``), and each chart's file to the metric's (``loss_train_val.png``).
TRAIN_VAL_SUFFIX = '_train_val'
# val_<stem>, with the end-of-training prefix ModelPerformanceEvaluation gives (train_end_val_<stem>).
_VALIDATION_NAME = re.compile(r'^(?P<prefix>(?:train_end_)?)val_(?P<stem>.+)$')


def train_val_pairs(metric_names: Iterable[str]) -> Dict[str, Tuple[List[str], str]]:
    """``{chart name: ([training metric names], validation metric name)}`` for every validation metric of
    ``metric_names`` that has a training counterpart there.

    ``val_<m>`` pairs with ``train_<m>`` (ModelPerformanceEvaluation's names; ``train_end_val_<m>`` with
    ``train_end_train_<m>``), the chart named ``<m>`` (``train_end_<m>``). ``val_loss`` pairs with the loop's
    training losses, ``loss`` (the model at the epoch's end, on the training set) and ``accumulated_loss`` (the mean
    over the epoch's batches), and ``train_loss`` when a metric has that name.
    """
    names = list(metric_names)
    present = set(names)
    pairs: Dict[str, Tuple[List[str], str]] = {}
    for name in names:
        match = _VALIDATION_NAME.match(name)
        if match is None:
            continue
        prefix, stem = match.group('prefix'), match.group('stem')
        candidates = [f'{prefix}train_{stem}']
        if not prefix and stem == 'loss':
            candidates = ['loss', 'accumulated_loss'] + candidates
        training = [candidate for candidate in candidates if candidate in present]
        if training:
            pairs[f'{prefix}{stem}'] = (training, name)
    return pairs


def _best_point(metric_name: str, epochs: Sequence, values: Sequence) -> Optional[Tuple[Any, float]]:
    """The (epoch, value) of the best finite value: the lowest for losses and errors, the highest otherwise."""
    finite = [(e, float(v)) for e, v in zip(epochs, values) if is_number(v) and math.isfinite(float(v))]
    if not finite:
        return None
    pick = min if lower_is_better(metric_name) else max
    return pick(finite, key=lambda p: p[1])


def _safe_file_name(name: object) -> str:
    return ''.join(c if c.isalnum() or c in '-_.' else '_' for c in str(name))


def _check_format(file_format: str, allowed: Sequence[str], argument: str = 'file_format') -> None:
    if file_format not in allowed:
        raise ValueError(f'{argument}={file_format!r} is not supported; use one of {", ".join(map(repr, allowed))}')


def _png_writer(fig: Figure) -> Callable[[IO[bytes]], None]:
    def write(f: IO[bytes]) -> None:
        fig.savefig(f, format='png')
    return write


def _write_figures(figures: Sequence[Tuple[str, Figure]], base_dir: str, folder_name: str,
                   file_format: str) -> List[List[str]]:
    """``<base_dir>/<folder_name>/<name>.png`` per figure, or all of them in ``<base_dir>/<folder_name>.pdf``;
    returns ``[[path inside base_dir, local path], ...]``.

    Each file is written through a temp file and a rename, as every other file of the experiment folder: a
    crash mid-write, or a reader such as the uploader, never sees a truncated image.
    """
    os.makedirs(base_dir, exist_ok=True)
    if file_format == 'png':
        folder = os.path.join(base_dir, folder_name)
        os.makedirs(folder, exist_ok=True)
        paths: List[List[str]] = []
        for file_stem, fig in figures:
            file_name = f'{file_stem}.png'
            path = os.path.join(folder, file_name)
            write_atomically(path, _png_writer(fig))
            paths.append([os.path.join(folder_name, file_name), path])
        return paths

    def write_pdf(f: IO[bytes]) -> None:
        from matplotlib.backends.backend_pdf import PdfPages
        with PdfPages(f) as pdf:
            for _, fig in figures:
                pdf.savefig(fig)

    file_name = f'{folder_name}.pdf'
    path = os.path.join(base_dir, file_name)
    write_atomically(path, write_pdf)
    return [[file_name, path]]


class HyperParamSourceReporter:
    """Write the hyperparameters, the training script and the source folders into the experiment folder
    (``hyperparams_list.txt``, ``<script>.py``, ``source_code.zip``); creates the folder.

    Args:
        project_name: which experiment folder (plain names; with experiment_name and experiment_timestamp).
        experiment_name: see project_name.
        experiment_timestamp: see project_name.
        local_model_result_folder_path: root folder of the projects.
    """

    def __init__(self, project_name: str, experiment_name: str, experiment_timestamp: str,
                 local_model_result_folder_path: str) -> None:
        self.project_name = project_name
        self.experiment_name = experiment_name
        self.experiment_timestamp = experiment_timestamp
        self.local_model_result_folder_path = os.path.expanduser(os.fspath(local_model_result_folder_path))
        self.experiment_dir_path = ExperimentFolder.create_base_folder(project_name, experiment_name,
                                                                       experiment_timestamp,
                                                                       self.local_model_result_folder_path)
        self.file_name = HYPERPARAMS_TXT
        self.local_hyperparams_file_path = os.path.join(self.experiment_dir_path, self.file_name)

    def save_hyperparams_to_text_file(self, hyperparams: Dict[str, Any], sort_names: bool = False) -> str:
        """Write ``hyperparams_list.txt`` (one ``name:<TAB>value`` line each); returns its path."""
        if not isinstance(hyperparams, Mapping):
            raise TypeError(f'hyperparams must be a dict, got {type(hyperparams).__qualname__}')
        return write_hyperparams_text(self.local_hyperparams_file_path, dict(hyperparams), sort_names)

    def copy_to_cloud_storage(self, local_hyperparams_file_path: str,
                              cloud_saver: Union[Storage, BaseFullExperimentS3Saver],
                              file_name: Optional[str] = None) -> str:
        """Upload a file of the experiment folder to ``<project>/<experiment>_<timestamp>/<file_name>`` in the
        cloud; returns the key (relative to the storage's prefix).

        Args:
            local_hyperparams_file_path: the local file to upload.
            cloud_saver: where to: a Storage (S3, Google Cloud Storage, Azure, a folder), a
                FullPyTorchExperimentS3Saver / FullPyTorchExperimentGoogleStorageSaver, or an aitoolbox.cloud saver.
            file_name: the name in the cloud; None: ``hyperparams_list.txt``.
        """
        storage: Any = getattr(cloud_saver, 'storage', cloud_saver)
        if not callable(getattr(storage, 'save_file', None)):
            raise TypeError(f'cloud_saver must be a Storage (e.g. S3Storage) or a cloud saver (e.g. '
                            f'FullPyTorchExperimentS3Saver), got '
                            f'{type(cloud_saver).__qualname__}')
        key = join_key(self.project_name, f'{self.experiment_name}_{self.experiment_timestamp}',
                       self.file_name if file_name is None else file_name)
        storage.save_file(local_hyperparams_file_path, key)
        return key

    def save_experiment_python_file(self, hyperparams: Dict[str, Any]) -> Optional[str]:
        """Copy ``hyperparams['experiment_file_path']`` into the experiment folder; its new path, or None (with
        a warning) when the key is missing or not a file."""
        return copy_experiment_script(self.experiment_dir_path, hyperparams)

    def save_experiment_source_files(self, hyperparams: Dict[str, Any]) -> Optional[str]:
        """Zip the folders of ``hyperparams['source_dirs_paths']`` into ``source_code.zip``; its path, or None
        when no folders are listed."""
        source_dirs = hyperparams.get('source_dirs_paths') if isinstance(hyperparams, Mapping) else None
        if isinstance(source_dirs, (str, os.PathLike)):
            source_dirs = [source_dirs]
        if not source_dirs:
            return None
        return zip_source_dirs([os.path.expanduser(os.fspath(d)) for d in source_dirs],
                               os.path.join(self.experiment_dir_path, SOURCE_ZIP))


class TrainingHistoryPlotter:
    """Plot every numeric metric of a training history against the epochs.

    Args:
        experiment_results_local_path: the folder the plots go into (usually ``<experiment>/results``).
    """

    def __init__(self, experiment_results_local_path: str) -> None:
        self.experiment_results_local_path = experiment_results_local_path

    def generate_report(self, training_history: HistoryMapping, plots_folder_name: str = 'plots',
                        file_format: str = 'png') -> List[List[str]]:
        """One ``<plots_folder_name>/<metric>.png`` per metric with at least two numeric values (AIToolbox's
        file names; dict-valued metrics as ``<metric>_<key>``), or all of them in ``<plots_folder_name>.pdf``
        (file_format='pdf'). The folder is created even when no metric has two values yet. Returns ``[[path
        inside the results folder, local path], ...]``."""
        _check_format(file_format, ('png', 'pdf'))
        import_matplotlib('TrainingHistoryPlotter')
        figures = [(_safe_file_name(name), self.plot_performance_curve(name, values, epochs))
                   for name, (epochs, values) in history_series(training_history).items()
                   if sum(is_number(v) for v in values) > 1]
        return _write_figures(figures, self.experiment_results_local_path, plots_folder_name, file_format)

    @staticmethod
    def plot_performance_curve(metric_name: str, result_history: Sequence,
                               epochs: Optional[Sequence] = None) -> Figure:
        """A matplotlib Figure of one metric over the epochs (list indices when ``epochs`` is None), titled with
        its best value and that value's epoch: the lowest for losses and errors, the highest otherwise."""
        epochs = list(range(len(result_history))) if epochs is None else list(epochs)
        points = [(e, float(v)) for e, v in zip(epochs, result_history) if is_number(v)]
        fig = new_figure(figsize=(8, 5), dpi=100)
        ax = fig.add_subplot()
        ax.plot([e for e, _ in points], [v for _, v in points], marker='o')
        ax.set_xlabel('Epoch')
        ax.set_ylabel(str(metric_name))
        ax.grid(True, alpha=0.3)
        best = _best_point(str(metric_name), [e for e, _ in points], [v for _, v in points])
        if best is not None:
            ax.set_title(f'{metric_name}\nbest: {best[1]:.5g} at epoch {best[0]}')
        else:
            ax.set_title(f'{metric_name}\n(no finite values)')
        fig.tight_layout()
        return fig

    def generate_train_val_plots(self, training_history: HistoryMapping) -> Iterator[Tuple[str, Figure]]:
        """Yield ``(chart name, Figure)`` for every pair of :func:`train_val_pairs` whose validation metric and at
        least one training metric have two numeric values or more (a training metric with fewer is left out)."""
        series = history_series(training_history)
        for chart_name, (training, validation) in train_val_pairs(series).items():
            drawn = {name: series[name] for name in training + [validation]
                     if sum(is_number(v) for v in series[name][1]) > 1}
            if validation in drawn and len(drawn) > 1:
                yield chart_name, self.plot_train_val_curves(chart_name, drawn, validation)

    def generate_train_val_report(self, training_history: HistoryMapping,
                                  plots_folder_name: str = f'plots{TRAIN_VAL_SUFFIX}',
                                  file_format: str = 'png') -> List[List[str]]:
        """One ``<plots_folder_name>/<chart>_train_val.png`` per training/validation pair
        (:meth:`generate_train_val_plots`: ``loss_train_val.png`` for ``loss``, ``accumulated_loss`` and ``val_loss``,
        ``<m>_train_val.png`` for ``train_<m>`` and ``val_<m>``), or all of them in ``<plots_folder_name>.pdf``.
        Nothing is written, not even the folder, while no pair has two values. Returns ``[[path inside the results
        folder, local path], ...]``."""
        _check_format(file_format, ('png', 'pdf'))
        import_matplotlib('TrainingHistoryPlotter')
        # The suffix in the file name too: a file attached or downloaded alone still says what it is.
        figures = [(_safe_file_name(name) + TRAIN_VAL_SUFFIX, fig)
                   for name, fig in self.generate_train_val_plots(training_history)]
        if not figures:
            return []
        return _write_figures(figures, self.experiment_results_local_path, plots_folder_name, file_format)

    @staticmethod
    def plot_train_val_curves(chart_name: str, series: Mapping[str, Tuple[Sequence, Sequence]],
                              validation_name: str) -> Figure:
        """A matplotlib Figure of several metrics on one chart, one line each labelled with its history name:
        ``series`` is ``{name: (epochs, values)}`` (non-numeric values skipped). The validation metric's best value
        (lowest for losses and errors, highest otherwise, as in the per-metric charts) is named in the title with
        its epoch and marked by a dotted vertical line at that epoch."""
        fig = new_figure(figsize=(8, 5), dpi=100)
        ax = fig.add_subplot()
        for name, (epochs, values) in series.items():
            points = [(e, float(v)) for e, v in zip(epochs, values) if is_number(v)]
            # The validation line solid, the training ones dashed: which is which reads without the legend.
            ax.plot([e for e, _ in points], [v for _, v in points], marker='o', label=str(name),
                    linestyle='-' if name == validation_name else '--')
        ax.set_xlabel('Epoch')
        ax.set_ylabel(str(chart_name))
        ax.grid(True, alpha=0.3)
        epochs, values = series[validation_name]
        best = _best_point(str(validation_name), epochs, values)
        if best is not None:
            ax.axvline(best[0], color='grey', linestyle=':', label=f'best {validation_name}')
            ax.set_title(f'{chart_name}: training and validation\n'
                         f'best {validation_name}: {best[1]:.5g} at epoch {best[0]}')
        else:
            ax.set_title(f'{chart_name}: training and validation\n({validation_name}: no finite values)')
        ax.legend()
        fig.tight_layout()
        return fig


class TrainingHistoryWriter:
    """Append the latest value of every metric to a text, TSV or CSV file.

    Args:
        experiment_results_local_path: the folder the file goes into (usually ``<experiment>/results``).
    """

    def __init__(self, experiment_results_local_path: str) -> None:
        self.experiment_results_local_path = experiment_results_local_path
        self.metric_name_cols: Optional[List[str]] = None

    def generate_report(self, training_history: HistoryMapping, epoch: int, file_name: str,
                        results_folder_name: str = '',
                        file_format: str = 'txt') -> Tuple[str, str]:
        """Append the metrics of ``epoch`` to ``<results_folder_name>/<file_name>``.

        'txt' writes a human-readable block; 'tsv' / 'csv' a row under an ``Epoch`` + metric names header (a new
        header after a ``NEW_METRICS_DETECTED`` row when the metrics change). Returns ``(path inside the results
        folder, local path)``.
        """
        _check_format(file_format, ('txt', 'tsv', 'csv'))
        folder = os.path.join(self.experiment_results_local_path, results_folder_name or '')
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, file_name)
        latest = {name: values[-1] for name, (_, values) in history_series(training_history).items() if values}
        if file_format == 'txt':
            append_epoch_text_block(path, epoch, latest)
        else:
            with open(path, 'a', newline='') as f:
                writer = csv.writer(f, delimiter='\t' if file_format == 'tsv' else ',')
                names = list(latest)
                if self.metric_name_cols is None:
                    self.metric_name_cols = names
                    writer.writerow(['Epoch'] + names)
                elif sorted(names) != sorted(self.metric_name_cols):
                    self.metric_name_cols = names
                    writer.writerow(['NEW_METRICS_DETECTED'])
                    writer.writerow(['Epoch'] + names)
                writer.writerow([epoch] + [latest.get(name, '') for name in self.metric_name_cols])
        return os.path.join(results_folder_name or '', file_name), path


def append_epoch_text_block(path: str, epoch: int, values: Mapping[str, Any]) -> None:
    """Append AIToolbox's human-readable block of one epoch's metrics ('txt' history files)."""
    with open(path, 'a') as f:
        f.write(f'============================\nEpoch: {epoch}\n============================\n')
        for name, value in values.items():
            f.write(f'{name}:\t{value}\n')
        f.write('\n\n')


class GradientPlotter:
    """Plot the distribution of each layer's gradients.

    Args:
        experiment_grad_results_local_path: the folder the plots go into.
    """

    def __init__(self, experiment_grad_results_local_path: str) -> None:
        self.experiment_grad_results_local_path = experiment_grad_results_local_path

    def generate_report(self, model_layer_gradients: Sequence, grad_plots_folder_name: str = 'grad_plots',
                        file_format: str = 'png') -> List[List[str]]:
        """One ``<grad_plots_folder_name>/layer_<i>.png`` per layer with gradients, or all of them in
        ``<grad_plots_folder_name>.pdf``. Layers whose gradient is None are skipped (logged). Returns
        ``[[path inside the folder, local path], ...]``."""
        _check_format(file_format, ('png', 'pdf'))
        import_matplotlib('GradientPlotter')
        figures = [(f'layer_{_safe_file_name(layer_name)}', fig)
                   for layer_name, fig in self.generate_dist_plots(model_layer_gradients)]
        return _write_figures(figures, self.experiment_grad_results_local_path, grad_plots_folder_name, file_format)

    @staticmethod
    def generate_dist_plots(model_layer_gradients: Sequence, layer_names: Optional[Sequence] = None
                            ) -> Iterator[Tuple[Any, Figure]]:
        """Yield ``(layer name, Figure)`` for every layer with gradients."""
        for i, gradients in enumerate(model_layer_gradients):
            layer_name = i if layer_names is None else layer_names[i]
            if gradients is None:
                logger.info('GradientPlotter: layer %s has no gradients; not plotted', layer_name)
                continue
            yield layer_name, GradientPlotter.plot_gradient_distribution(gradients, layer_name)

    @staticmethod
    def plot_gradient_distribution(gradients: Any, layer_name: Any, bins: int = 100) -> Figure:
        """A histogram Figure of one layer's (flattened) gradients, titled with their mean and std."""
        import numpy as np
        if hasattr(gradients, 'detach'):
            gradients = gradients.detach().float().cpu().numpy()
        values = np.asarray(gradients, dtype=np.float64).reshape(-1)
        fig = new_figure(figsize=(8, 5), dpi=100)
        ax = fig.add_subplot()
        ax.hist(values, bins=bins)
        ax.set_xlabel('Gradient magnitude')
        ax.set_ylabel('count')
        ax.set_title(f'Gradient distribution for layer {layer_name}\n'
                     f'mean: {values.mean():.5g}   std: {values.std():.5g}')
        fig.tight_layout()
        return fig
