"""Saving an experiment without a TrainLoop: the final model and the results, in the experiment folder layout.

AIToolbox's savers for users who train with their own loop (``FullPyTorchExperimentLocalSaver``,
``FullPyTorchExperimentS3Saver``, ``FullPyTorchExperimentGoogleStorageSaver`` and the pieces they are made of); the
cloud savers write the local files, then upload them to the same keys in a bucket. They write the same files as the
saving callbacks and ``PyTorchModelPredictor.evaluate_model`` (all of them use :func:`write_experiment_results`)::

    <local_model_result_folder_path>/<project>/<experiment>_<timestamp>/
        model/model_<experiment>_<timestamp>.pth                     (checkpoint_model/..._E<epoch>.pth)
        results/results_hyperParams_hist_<experiment>_<timestamp>.p  (.json with file_format='json')
        results/plots/<metric>.png                                   (one per metric with 2+ values)

Model files load with ``torch.load(weights_only=True)`` (and :class:`~.model_loader.PyTorchLocalModelLoader`).
Results are AIToolbox's: a pickle of ``{'experiment_name', 'experiment_results_local_path', 'results',
'hyperparameters', 'training_history'}`` (with ``'y_true'`` / ``'y_predicted'`` first when the labels are
saved), or the same dict as JSON. Every file is written atomically.
"""
from __future__ import annotations

import abc
import datetime
import json
import logging
import os
import pickle
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple, Union

from ..checkpoint.files import atomic_torch_save, check_weights_only_safe
from ..engine.history import TrainingHistory
from ..storage.base import join_key, validate_key_part
from ..storage.local import write_atomically, write_text_atomically
from ..storage.urls import storage_for_mode
from ..experiment.folder import ExperimentFolder    # also importable from here, AIToolbox users' savers module
from ..experiment.hyperparams import hyperparams_to_json
from ..experiment.layout import CHECKPOINT_DIR, MODEL_DIR, RESULTS_DIR, model_file_name
from .reporting import TrainingHistoryPlotter, matplotlib_available

if TYPE_CHECKING:
    from .abstract import AbstractResultPackage
    from ..storage.base import Storage

logger = logging.getLogger(__name__)

DEFAULT_RESULTS_ROOT = '~/project/model_result'
REQUIRED_MODEL_KEYS = ('model_state_dict', 'optimizer_state_dict', 'epoch', 'hyperparams')
#: The results file formats of AIToolbox's results savers, and the file extension of each.
RESULTS_FILE_FORMATS = {'pickle': '.p', 'json': '.json'}
#: The folder inside ``results/`` that the results savers draw the training history plots into.
RESULTS_PLOTS_DIR = 'plots'

#: A training history as the savers accept it: a TrainingHistory, a plain ``{metric: [values]}`` dict, or None.
HistoryLike = Union[TrainingHistory, Mapping, None]


def new_experiment_timestamp() -> str:
    """The current local time in AIToolbox's experiment timestamp format, ``YYYY-mm-dd_HH-MM-SS``."""
    return datetime.datetime.now().strftime('%Y-%m-%d_%H-%M-%S')


def _json_default(value: Any) -> Any:
    if hasattr(value, 'tolist'):
        return value.tolist()
    if hasattr(value, 'item'):
        return value.item()
    return repr(value)


def check_results_file_format(file_format: str) -> str:
    """``file_format`` if it is one of AIToolbox's results formats ('pickle', 'json'); otherwise, as AIToolbox
    does, 'pickle' with a warning."""
    if file_format not in RESULTS_FILE_FORMATS:
        logger.warning("Results file format should be 'pickle' or 'json', got %r; using the default 'pickle'",
                       file_format)
        return 'pickle'
    return file_format


def write_results_file(data: Any, file_local_path_w_type: str, file_format: str = 'pickle',
                       temp_dir: Optional[str] = None) -> str:
    """Write ``data`` atomically to ``<file_local_path_w_type>.p`` (a pickle) or ``.json``; returns the path.

    JSON is AIToolbox's (``sort_keys=True, indent=4``), except that tensors and arrays become lists and other
    values JSON cannot hold their repr, instead of failing after training.
    """
    if file_format not in RESULTS_FILE_FORMATS:
        raise ValueError(f"file_format={file_format!r} is not supported: use 'pickle' or 'json'")
    path = file_local_path_w_type + RESULTS_FILE_FORMATS[file_format]
    if file_format == 'pickle':
        write_atomically(path, lambda f: pickle.dump(data, f), temp_dir=temp_dir)
    else:
        write_text_atomically(path, json.dumps(data, default=_json_default, sort_keys=True, indent=4),
                              temp_dir=temp_dir)
    return path


def plot_results_training_history(results_dir: str, training_history: HistoryLike) -> List[List[str]]:
    """Draw AIToolbox's end-of-experiment plots, ``<results_dir>/plots/<metric>.png`` (metrics with at least
    two values), and return ``[[path inside results_dir, local path], ...]``.

    Without matplotlib (the ``plots`` extra) no plots are drawn: one warning is logged and ``[]`` returned,
    so saving the results never fails for want of a plotting library.
    """
    if not matplotlib_available():
        logger.warning('matplotlib is not installed, so the training history plots are not drawn into %s '
                       '(pip install aitoolbox_like[plots])', os.path.join(results_dir, RESULTS_PLOTS_DIR))
        return []
    return TrainingHistoryPlotter(results_dir).generate_report(
        {} if training_history is None else training_history, plots_folder_name=RESULTS_PLOTS_DIR)


def _history_dict(training_history: HistoryLike) -> dict:
    if training_history is None:
        return {}
    get_train_history = getattr(training_history, 'get_train_history', None)
    if callable(get_train_history):
        return get_train_history()
    if isinstance(training_history, Mapping):
        return dict(training_history)
    raise TypeError(f'training_history must be a TrainingHistory or a dict of metric lists, got '
                    f'{type(training_history).__qualname__}')


def write_experiment_results(results_dir: str, experiment_name: str, experiment_timestamp: str,
                             result_package: AbstractResultPackage, training_history: HistoryLike = None,
                             save_true_pred_labels: bool = False, separate_files: bool = False,
                             file_format: str = 'pickle', temp_dir: Optional[str] = None) -> List[List[str]]:
    """Write the results of an evaluated ``result_package`` into ``results_dir`` (which must exist), as
    AIToolbox's ``LocalResultsSaver`` does; the one writing path of the savers, ``ModelTrainEndSave`` and
    ``PyTorchModelPredictor.evaluate_model``.

    One file ``results_hyperParams_hist_<experiment>_<timestamp>.p`` (``.json`` with file_format='json'): a
    dict with ``experiment_name``, ``experiment_results_local_path`` (``results_dir``), ``results``,
    ``hyperparameters`` and ``training_history``, preceded by ``y_true`` and ``y_predicted`` with
    ``save_true_pred_labels``. With ``separate_files`` AIToolbox's ``results_``, ``hyperparams_``,
    ``train_history_`` and (with the labels) ``true_pred_labels_<experiment>_<timestamp>`` files instead. Then
    the training history plots, ``plots/<metric>.png`` (skipped, with a warning, without matplotlib).

    Args:
        results_dir: the experiment's ``results`` folder.
        experiment_name: the experiment name in the file names.
        experiment_timestamp: the experiment timestamp in the file names.
        result_package: an evaluated result package (``prepare_result_package`` called).
        training_history: the history saved and plotted (a TrainingHistory or ``{metric: [values]}``).
        save_true_pred_labels: also save the package's ``y_true`` / ``y_predicted``.
        separate_files: AIToolbox's separate-files layout.
        file_format: 'pickle' (AIToolbox's default) or 'json'.
        temp_dir: where the temporary files of the atomic writes go (same filesystem; None: next to each file).

    Returns:
        ``[[file name or path inside results_dir, local path], ...]`` (AIToolbox's return format): the results
        file(s) first, then the package's additional result files, then the plots.
    """
    if file_format not in RESULTS_FILE_FORMATS:
        raise ValueError(f"file_format={file_format!r} is not supported: use 'pickle' or 'json'")
    if not callable(getattr(result_package, 'get_results', None)):
        raise TypeError(f'result_package must be an evaluated result package (AbstractResultPackage after '
                        f'prepare_result_package), got {type(result_package).__qualname__}')
    results = result_package.get_results()
    hyperparameters = result_package.get_hyperparameters()
    additional_paths = result_package.get_additional_results_dump_paths() \
        if callable(getattr(result_package, 'get_additional_results_dump_paths', None)) else None
    history = _history_dict(training_history)

    suffix = f'{experiment_name}_{experiment_timestamp}'
    base = {'experiment_name': experiment_name, 'experiment_results_local_path': results_dir}
    labels = {'y_true': result_package.y_true, 'y_predicted': result_package.y_predicted} \
        if save_true_pred_labels else None
    if separate_files:
        contents = [(f'results_{suffix}', {**base, 'results': results}),
                    (f'hyperparams_{suffix}', {**base, 'hyperparameters': hyperparameters}),
                    (f'train_history_{suffix}', {**base, 'training_history': history})]
        if labels is not None:
            contents.append((f'true_pred_labels_{suffix}', labels))
    else:
        single = {**base, 'results': results, 'hyperparameters': hyperparameters, 'training_history': history}
        # The labels first, as in AIToolbox's dict (a user iterating over the loaded dict sees that order).
        contents = [(f'results_hyperParams_hist_{suffix}', single if labels is None else {**labels, **single})]

    saved: List[List[str]] = []
    for name_w_type, data in contents:
        path = write_results_file(data, os.path.join(results_dir, name_w_type), file_format, temp_dir)
        saved.append([os.path.basename(path), path])
    saved += [list(entry) for entry in (additional_paths or [])]
    # The plots come after the results files (AIToolbox drew them first): a plotting error cannot lose results.
    return saved + plot_results_training_history(results_dir, training_history)


# ---------------------------------------------------------------------------------------------- models


class AbstractLocalModelSaver(abc.ABC):
    """Saves a model representation into the experiment folder."""

    @abc.abstractmethod
    def save_model(self, model: Any, project_name: str, experiment_name: str,
                   experiment_timestamp: Optional[str] = None,
                   epoch: Optional[int] = None, iteration_idx: Optional[int] = None,
                   protect_existing_folder: bool = True) -> Tuple[str, str]:
        """Save ``model``; returns ``(model file name, local path)``."""


class BaseLocalModelSaver:
    """Where a local model saver writes: ``model/`` (the final model) or ``checkpoint_model/`` (checkpoints)."""

    def __init__(self, local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT,
                 checkpoint_model: bool = False) -> None:
        self.local_model_result_folder_path = os.path.expanduser(os.fspath(local_model_result_folder_path))
        self.checkpoint_model = checkpoint_model

    def create_experiment_local_models_folder(self, project_name: str, experiment_name: str,
                                              experiment_timestamp: str) -> str:
        """Create ``<experiment folder>/model`` (or ``checkpoint_model``) if missing; returns its path."""
        experiment_dir = ExperimentFolder.create_base_folder(project_name, experiment_name, experiment_timestamp,
                                                             self.local_model_result_folder_path)
        folder = os.path.join(experiment_dir, CHECKPOINT_DIR if self.checkpoint_model else MODEL_DIR)
        os.makedirs(folder, exist_ok=True)
        return folder


def weights_only_model_dict(model: Mapping) -> dict:
    """A copy of a model representation dict that ``torch.load(weights_only=True)`` can read back.

    ``hyperparams`` is replaced by its JSON-safe copy (values JSON cannot hold become their repr; the JSON text
    is kept as ``hyperparams_json`` when the copy differs), as in the checkpoints of the TrainLoop; anything else
    that could not be loaded safely is a CheckpointError naming where it is. A dict that needs no change is saved
    with the keys it has: loading it gives back what was saved.
    """
    saved = dict(model)
    if 'hyperparams' in saved:
        text = hyperparams_to_json(saved['hyperparams'])
        safe = json.loads(text)
        if safe != saved['hyperparams']:
            saved['hyperparams'] = safe
            saved['hyperparams_json'] = text
    check_weights_only_safe(saved, where='model')
    return saved


class PyTorchLocalModelSaver(AbstractLocalModelSaver, BaseLocalModelSaver):
    """Save a PyTorch model representation dict (``model_state_dict``, ``optimizer_state_dict``, ``epoch``,
    ``hyperparams``, ...) as ``model_<experiment>_<timestamp>[_E<epoch>[_ITER<idx>]].pth`` into ``model/`` or,
    with ``checkpoint_model=True``, ``checkpoint_model/`` of the experiment folder.

    The file is written atomically and loads with ``torch.load(weights_only=True)``.

    Args:
        local_model_result_folder_path: root folder of the projects.
        checkpoint_model: a mid-training checkpoint (``checkpoint_model/``) rather than the final model.
    """

    def save_model(self, model: Mapping, project_name: str, experiment_name: str,
                   experiment_timestamp: Optional[str] = None, epoch: Optional[int] = None,
                   iteration_idx: Optional[int] = None, protect_existing_folder: bool = True) -> Tuple[str, str]:
        """Save ``model`` (a dict, see :meth:`check_model_dict_contents`); returns ``(file name, local path)``.

        ``experiment_timestamp=None`` uses the current time. ``protect_existing_folder`` is accepted for
        AIToolbox compatibility and, as there, changes nothing: a file of the same name is replaced (atomically).
        """
        self.check_model_dict_contents(model)
        saved = weights_only_model_dict(model)
        if experiment_timestamp is None:
            experiment_timestamp = new_experiment_timestamp()
        folder = self.create_experiment_local_models_folder(project_name, experiment_name, experiment_timestamp)
        name = model_file_name(experiment_name, experiment_timestamp, epoch,
                               iteration_idx if epoch is not None else None)
        path = os.path.join(folder, name)
        # The temp file goes to the experiment root: a crash mid-write leaves nothing partial among the models.
        atomic_torch_save(saved, path, temp_dir=os.path.dirname(folder))
        logger.debug('Saved model %s', path)
        return name, path

    @staticmethod
    def check_model_dict_contents(model: Mapping) -> None:
        """Raise ValueError unless ``model`` is a dict with the keys a training state needs: ``model_state_dict``,
        ``optimizer_state_dict``, ``epoch`` and ``hyperparams``."""
        if not isinstance(model, Mapping):
            raise ValueError(f'model must be a dict with the keys {list(REQUIRED_MODEL_KEYS)} (the model '
                             f'representation, e.g. {{"model_state_dict": model.state_dict(), ...}}), got '
                             f'{type(model).__qualname__}')
        missing = [key for key in REQUIRED_MODEL_KEYS if key not in model]
        if missing:
            raise ValueError(f'the model dict lacks {missing}; it has {sorted(map(str, model))}. Add them, e.g. '
                             f'"optimizer_state_dict": optimizer.state_dict(), "epoch": epoch, "hyperparams": {{}}')


class LocalSubOptimalModelRemover:
    """Delete saved models that are no longer among the ``num_best_kept`` best by ``metric_name``.

    Call :meth:`decide_if_remove_suboptimal_model` after each save with the training history and the new
    model's paths. Lower is better for metrics whose name contains 'loss', higher otherwise (AIToolbox's rule).

    Differs from AIToolbox: every model is ranked by the metric value of its own epoch (AIToolbox paired a
    non-loss metric with the previous model), and a model whose metric is missing from the history is kept,
    with a warning, rather than ranked or deleted.

    Args:
        metric_name: the history metric that ranks the models.
        num_best_kept: how many of the best models are kept (>= 1).
    """

    def __init__(self, metric_name: str, num_best_kept: int = 2) -> None:
        if not isinstance(metric_name, str) or not metric_name:
            raise ValueError(f'metric_name must be the name of a metric in the training history, got '
                             f'{metric_name!r}')
        if isinstance(num_best_kept, bool) or not isinstance(num_best_kept, int) or num_best_kept < 1:
            raise ValueError(f'num_best_kept must be an int >= 1, got {num_best_kept!r}')
        self.metric_name = metric_name
        self.decrease_metric = 'loss' in metric_name
        self.num_best_kept = num_best_kept
        self.default_metrics_list = ['loss', 'accumulated_loss', 'val_loss']
        self.is_default_metric = metric_name in self.default_metrics_list
        self.model_save_history: List[Tuple[List[str], float]] = []

    def decide_if_remove_suboptimal_model(self, history: Union[TrainingHistory, Mapping],
                                          new_model_dump_paths: Sequence[str]) -> List[str]:
        """Track the new model and delete the worst tracked one(s) beyond ``num_best_kept``; returns the
        deleted paths."""
        values = history[self.metric_name] if self.metric_name in history else []
        if not values:
            logger.warning('LocalSubOptimalModelRemover: metric %r is not in the training history (it has %s); '
                           '%s kept and not ranked', self.metric_name, sorted(history.keys()),
                           list(new_model_dump_paths))
            return []
        self.model_save_history.append((list(new_model_dump_paths), float(values[-1])))
        removed: List[str] = []
        while len(self.model_save_history) > self.num_best_kept:
            self.model_save_history.sort(key=lambda item: item[1], reverse=not self.decrease_metric)
            paths, value = self.model_save_history.pop()
            logger.info('Removing sub-optimal model(s) %s (%s = %s)', paths, self.metric_name, value)
            self.rm_suboptimal_model(paths)
            removed += paths
        return removed

    @staticmethod
    def rm_suboptimal_model(rm_model_paths: Sequence[str]) -> None:
        """Delete the files; one already gone is not an error."""
        for path in rm_model_paths:
            try:
                os.remove(path)
            except FileNotFoundError:
                logger.debug('Sub-optimal model %s was already removed', path)


# ---------------------------------------------------------------------------------------------- results


class AbstractLocalResultsSaver(abc.ABC):
    """Saves an evaluated result package and the training history into ``results/``."""

    @abc.abstractmethod
    def save_experiment_results(self, result_package: AbstractResultPackage, training_history: HistoryLike,
                                project_name: str, experiment_name: str,
                                experiment_timestamp: Optional[str] = None, save_true_pred_labels: bool = False,
                                protect_existing_folder: bool = True) -> List[List[str]]:
        """All results in one file; returns ``[[file name, local path], ...]``, the results file first."""

    @abc.abstractmethod
    def save_experiment_results_separate_files(self, result_package: AbstractResultPackage,
                                               training_history: HistoryLike, project_name: str,
                                               experiment_name: str, experiment_timestamp: Optional[str] = None,
                                               save_true_pred_labels: bool = False,
                                               protect_existing_folder: bool = True) -> List[List[str]]:
        """Results, hyperparameters and history in separate files; same return format."""


class BaseLocalResultsSaver:
    """The ``results/`` folder of an experiment and the file format of the results."""

    def __init__(self, local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT,
                 file_format: str = 'pickle') -> None:
        self.local_model_result_folder_path = os.path.expanduser(os.fspath(local_model_result_folder_path))
        # As AIToolbox: an unknown format is a warning and the default pickle, not an error after training.
        self.file_format = check_results_file_format(file_format)

    def create_experiment_local_folder_structure(self, project_name: str, experiment_name: str,
                                                 experiment_timestamp: str) -> str:
        """Create ``<experiment folder>/results`` if missing; returns its path."""
        return self.create_experiment_local_results_folder(project_name, experiment_name, experiment_timestamp,
                                                           self.local_model_result_folder_path)

    @staticmethod
    def create_experiment_local_results_folder(project_name: str, experiment_name: str, experiment_timestamp: str,
                                               local_model_result_folder_path: str) -> str:
        """Create ``<experiment folder>/results`` if missing; returns its path."""
        _, _, results_dir = BaseLocalResultsSaver.get_experiment_local_results_folder_paths(
            project_name, experiment_name, experiment_timestamp, local_model_result_folder_path)
        os.makedirs(results_dir, exist_ok=True)
        return results_dir

    @staticmethod
    def get_experiment_local_results_folder_paths(project_name: str, experiment_name: str, experiment_timestamp: str,
                                                  local_model_result_folder_path: str) -> Tuple[str, str, str]:
        """``(project folder, experiment folder, results folder)``; nothing is created."""
        project_dir, experiment_dir = ExperimentFolder.get_base_folder_paths(
            project_name, experiment_name, experiment_timestamp, local_model_result_folder_path)
        return project_dir, experiment_dir, os.path.join(experiment_dir, RESULTS_DIR)

    def save_file(self, result_dict: Any, file_name_w_type: str, file_local_path_w_type: str) -> Tuple[str, str]:
        """Write ``result_dict`` atomically in the saver's format, to ``<file_local_path_w_type>.p`` (pickle) or
        ``.json``; returns ``(file name, path)``, each with the extension added."""
        path = write_results_file(result_dict, file_local_path_w_type, self.file_format)
        return file_name_w_type + RESULTS_FILE_FORMATS[self.file_format], path


class LocalResultsSaver(AbstractLocalResultsSaver, BaseLocalResultsSaver):
    """Write an evaluated result package and the training history into ``<experiment folder>/results/``:
    AIToolbox's results files (the ones ModelTrainEndSave writes) and ``plots/``.

    Args:
        local_model_result_folder_path: root folder of the projects.
        file_format: 'pickle' (AIToolbox's default, ``.p`` files) or 'json' (``.json`` files).
    """

    def _save(self, result_package: AbstractResultPackage, training_history: HistoryLike, project_name: str,
              experiment_name: str, experiment_timestamp: Optional[str], save_true_pred_labels: bool,
              separate_files: bool) -> List[List[str]]:
        if not callable(getattr(result_package, 'get_results', None)):
            # Checked before any folder is created, so a wrong argument leaves nothing behind.
            raise TypeError(f'result_package must be an evaluated result package (AbstractResultPackage after '
                            f'prepare_result_package), got {type(result_package).__qualname__}')
        if experiment_timestamp is None:
            experiment_timestamp = new_experiment_timestamp()
        results_dir = self.create_experiment_local_folder_structure(project_name, experiment_name,
                                                                    experiment_timestamp)
        # Temp files at the experiment root: a crash mid-write leaves nothing partial among the results.
        return write_experiment_results(results_dir, experiment_name, experiment_timestamp, result_package,
                                        training_history, save_true_pred_labels=save_true_pred_labels,
                                        separate_files=separate_files, file_format=self.file_format,
                                        temp_dir=os.path.dirname(results_dir))

    def save_experiment_results(self, result_package: AbstractResultPackage, training_history: HistoryLike,
                                project_name: str, experiment_name: str,
                                experiment_timestamp: Optional[str] = None, save_true_pred_labels: bool = False,
                                protect_existing_folder: bool = True) -> List[List[str]]:
        """Write ``results_hyperParams_hist_<experiment>_<timestamp>.p`` (``.json``): results, hyperparameters
        and history, and with ``save_true_pred_labels`` ``y_true`` / ``y_predicted``; then ``plots/<metric>.png``.

        Returns ``[[file name, local path], ...]``: the results file first, then the result package's additional
        result files and the plots (``['plots/<metric>.png', path]``). ``protect_existing_folder`` changes
        nothing (as in AIToolbox).
        """
        return self._save(result_package, training_history, project_name, experiment_name, experiment_timestamp,
                          save_true_pred_labels, separate_files=False)

    def save_experiment_results_separate_files(self, result_package: AbstractResultPackage,
                                               training_history: HistoryLike, project_name: str,
                                               experiment_name: str, experiment_timestamp: Optional[str] = None,
                                               save_true_pred_labels: bool = False,
                                               protect_existing_folder: bool = True) -> List[List[str]]:
        """Like :meth:`save_experiment_results` but into ``results_``, ``hyperparams_``, ``train_history_`` and
        (with ``save_true_pred_labels``) ``true_pred_labels_<experiment>_<timestamp>.p`` (``.json``)."""
        return self._save(result_package, training_history, project_name, experiment_name, experiment_timestamp,
                          save_true_pred_labels, separate_files=True)


# ---------------------------------------------------------------------------------------------- full experiment


class AbstractExperimentSaver(abc.ABC):
    """Saves a whole experiment: the model and the evaluated results."""

    @abc.abstractmethod
    def save_experiment(self, model: Any, result_package: AbstractResultPackage, training_history: HistoryLike,
                        experiment_timestamp: Optional[str] = None, save_true_pred_labels: bool = False,
                        separate_files: bool = False, protect_existing_folder: bool = True) -> Any:
        """Save the model and the results of one experiment."""


class BaseFullExperimentSaver(AbstractExperimentSaver):
    """Save the final model with ``model_saver`` and the results with ``results_saver`` (AIToolbox's
    composition of the two).

    Args:
        model_saver: an AbstractLocalModelSaver (PyTorchLocalModelSaver for PyTorch).
        results_saver: an AbstractLocalResultsSaver (LocalResultsSaver).
        project_name: folder name (a plain name).
        experiment_name: folder name (a plain name).
    """

    def __init__(self, model_saver: AbstractLocalModelSaver, results_saver: AbstractLocalResultsSaver,
                 project_name: str, experiment_name: str) -> None:
        if not isinstance(model_saver, AbstractLocalModelSaver):
            raise TypeError(f'model_saver must be an AbstractLocalModelSaver (e.g. PyTorchLocalModelSaver), got '
                            f'{type(model_saver).__qualname__}')
        if not isinstance(results_saver, AbstractLocalResultsSaver):
            raise TypeError(f'results_saver must be an AbstractLocalResultsSaver (e.g. LocalResultsSaver), got '
                            f'{type(results_saver).__qualname__}')
        validate_key_part(project_name, 'project_name')
        validate_key_part(experiment_name, 'experiment_name')
        self.project_name = project_name
        self.experiment_name = experiment_name
        self.model_saver = model_saver
        self.results_saver = results_saver

    def save_experiment(self, model: Mapping, result_package: AbstractResultPackage, training_history: HistoryLike,
                        experiment_timestamp: Optional[str] = None, save_true_pred_labels: bool = False,
                        separate_files: bool = False, protect_existing_folder: bool = True) -> List[str]:
        """Save ``model`` (a dict with ``model_state_dict``, ``optimizer_state_dict``, ``epoch``, ``hyperparams``)
        and the evaluated ``result_package`` with the ``training_history``.

        Returns:
            The local paths written: the model file first, then the results files.
        """
        if experiment_timestamp is None:
            experiment_timestamp = new_experiment_timestamp()
        _, model_path = self.model_saver.save_model(model, self.project_name, self.experiment_name,
                                                    experiment_timestamp,
                                                    protect_existing_folder=protect_existing_folder)
        save = self.results_saver.save_experiment_results_separate_files if separate_files \
            else self.results_saver.save_experiment_results
        saved = save(result_package, training_history, self.project_name, self.experiment_name, experiment_timestamp,
                     save_true_pred_labels=save_true_pred_labels, protect_existing_folder=protect_existing_folder)
        return [model_path] + [path for _, path in saved]


class BaseFullExperimentLocalSaver(BaseFullExperimentSaver):
    """Save the final model with ``model_saver`` into ``model/`` and the results into ``results/``.

    Args:
        model_saver: an AbstractLocalModelSaver (PyTorchLocalModelSaver for PyTorch).
        project_name: folder name (a plain name).
        experiment_name: folder name (a plain name).
        local_model_result_folder_path: root folder of the projects.
    """

    def __init__(self, model_saver: AbstractLocalModelSaver, project_name: str, experiment_name: str,
                 local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT) -> None:
        super().__init__(model_saver, LocalResultsSaver(local_model_result_folder_path), project_name,
                         experiment_name)
        self.local_model_result_folder_path = os.path.expanduser(os.fspath(local_model_result_folder_path))


class FullPyTorchExperimentLocalSaver(BaseFullExperimentLocalSaver):
    """Save a PyTorch experiment (final model and results) into the local experiment folder.

    Args:
        project_name: folder name (a plain name).
        experiment_name: folder name (a plain name).
        local_model_result_folder_path: root folder of the projects.
    """

    def __init__(self, project_name: str, experiment_name: str,
                 local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT) -> None:
        super().__init__(PyTorchLocalModelSaver(local_model_result_folder_path), project_name, experiment_name,
                         local_model_result_folder_path)


# ---------------------------------------------------------------------------------------------- cloud savers


class BaseFullExperimentS3Saver(BaseFullExperimentLocalSaver):
    """Save the experiment locally, then upload the files to the same keys under
    ``s3://<bucket_name>/<cloud_dir_prefix>/<project>/<experiment>_<timestamp>/`` (the cloud of
    :attr:`cloud_save_mode`: the Google Cloud Storage savers below are this class with ``'gcs'``).

    Uploads are synchronous (``save_experiment`` returns once they are complete) and retried by the cloud's client
    on network errors; a failure raises a StorageError, and the local files stay complete.

    Args:
        model_saver: an AbstractLocalModelSaver (PyTorchLocalModelSaver for PyTorch).
        project_name: folder name (a plain name).
        experiment_name: folder name (a plain name).
        bucket_name: the S3 bucket.
        cloud_dir_prefix: key prefix in the bucket.
        local_model_result_folder_path: root folder of the projects on this machine.
        endpoint_url: S3-compatible endpoint (None: boto3's resolution, e.g. ``AWS_ENDPOINT_URL_S3``).
        storage: an existing storage to upload through (its bucket and prefix are used).
    """

    #: The cloud the files go to (see :func:`aitoolbox_like.storage.storage_for_mode`).
    cloud_save_mode = 's3'

    def __init__(self, model_saver: AbstractLocalModelSaver, project_name: str, experiment_name: str,
                 bucket_name: str = 'model-result', cloud_dir_prefix: str = '',
                 local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT, endpoint_url: Optional[str] = None,
                 storage: Optional[Storage] = None) -> None:
        super().__init__(model_saver, project_name, experiment_name, local_model_result_folder_path)
        if storage is None:
            storage = storage_for_mode(self.cloud_save_mode, bucket_name, cloud_dir_prefix or '',
                                       endpoint_url=endpoint_url)
        self.storage = storage
        self.bucket_name = getattr(storage, 'bucket_name', bucket_name)
        self.cloud_dir_prefix = getattr(storage, 'cloud_dir_prefix', cloud_dir_prefix or '')

    def _cloud_key(self, experiment_timestamp: str, local_path: str) -> str:
        _, experiment_dir = ExperimentFolder.get_base_folder_paths(
            self.project_name, self.experiment_name, experiment_timestamp, self.local_model_result_folder_path)
        rel = os.path.relpath(os.path.abspath(local_path), experiment_dir)
        if rel.startswith('..') or os.path.isabs(rel):
            raise ValueError(f'{local_path} is outside the experiment folder {experiment_dir}; it cannot be '
                             f'uploaded under the experiment key')
        return join_key(self.project_name, f'{self.experiment_name}_{experiment_timestamp}', rel.replace(os.sep, '/'))

    # AIToolbox's API: unlike the local savers (every local path), the S3 saver returns the two cloud paths.
    def save_experiment(  # type: ignore[override]
            self, model: Mapping, result_package: AbstractResultPackage, training_history: HistoryLike,
            experiment_timestamp: Optional[str] = None, save_true_pred_labels: bool = False,
            separate_files: bool = False, protect_existing_folder: bool = True) -> Tuple[str, str]:
        """Save as :meth:`BaseFullExperimentLocalSaver.save_experiment`, then upload every file written.

        Returns:
            ``(model path, results path)`` in the bucket, each ``<bucket_name>/<cloud key>`` (AIToolbox's format).
        """
        if experiment_timestamp is None:
            experiment_timestamp = new_experiment_timestamp()
        paths = super().save_experiment(model, result_package, training_history, experiment_timestamp,
                                        save_true_pred_labels, separate_files, protect_existing_folder)
        keys: List[str] = []
        for path in paths:
            try:
                key = self._cloud_key(experiment_timestamp, path)
            except ValueError:
                logger.warning('%s is outside the experiment folder; not uploaded', path)
                continue
            self.storage.save_file(path, key)
            keys.append(key)
        full = [join_key(self.bucket_name, self.cloud_dir_prefix, key) for key in keys]
        return full[0], full[1]


class FullPyTorchExperimentS3Saver(BaseFullExperimentS3Saver):
    """Save a PyTorch experiment (final model and results) locally and to S3 (``pip install
    aitoolbox_like[s3]``).

    Args:
        project_name: folder name (a plain name).
        experiment_name: folder name (a plain name).
        bucket_name: the S3 bucket.
        cloud_dir_prefix: key prefix in the bucket.
        local_model_result_folder_path: root folder of the projects on this machine.
        endpoint_url: S3-compatible endpoint (None: boto3's resolution, e.g. ``AWS_ENDPOINT_URL_S3``).
    """

    def __init__(self, project_name: str, experiment_name: str, bucket_name: str = 'model-result',
                 cloud_dir_prefix: str = '', local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT,
                 endpoint_url: Optional[str] = None) -> None:
        super().__init__(PyTorchLocalModelSaver(local_model_result_folder_path), project_name, experiment_name,
                         bucket_name, cloud_dir_prefix, local_model_result_folder_path, endpoint_url)


class BaseFullExperimentGoogleStorageSaver(BaseFullExperimentS3Saver):
    """Save the experiment locally, then upload the files to the same keys under
    ``gs://<bucket_name>/<cloud_dir_prefix>/<project>/<experiment>_<timestamp>/`` (``pip install
    aitoolbox_like[gcs]``; Google's client finds the project and credentials, ``STORAGE_EMULATOR_HOST`` an emulator).

    Args:
        model_saver: an AbstractLocalModelSaver (PyTorchLocalModelSaver for PyTorch).
        project_name: folder name (a plain name).
        experiment_name: folder name (a plain name).
        bucket_name: the Google Cloud Storage bucket.
        cloud_dir_prefix: key prefix in the bucket.
        local_model_result_folder_path: root folder of the projects on this machine.
        endpoint_url: another API endpoint than Google's (None: ``STORAGE_EMULATOR_HOST`` or Google's).
        storage: an existing storage to upload through (its bucket and prefix are used).
    """

    cloud_save_mode = 'gcs'


class FullPyTorchExperimentGoogleStorageSaver(BaseFullExperimentGoogleStorageSaver):
    """Save a PyTorch experiment (final model and results) locally and to Google Cloud Storage (``pip install
    aitoolbox_like[gcs]``). ``save_experiment`` returns ``(bucket/model key, bucket/results key)``, as AIToolbox's.

    Args:
        project_name: folder name (a plain name).
        experiment_name: folder name (a plain name).
        bucket_name: the Google Cloud Storage bucket.
        cloud_dir_prefix: key prefix in the bucket.
        local_model_result_folder_path: root folder of the projects on this machine.
        endpoint_url: another API endpoint than Google's (None: ``STORAGE_EMULATOR_HOST`` or Google's).
    """

    def __init__(self, project_name: str, experiment_name: str, bucket_name: str = 'model-result',
                 cloud_dir_prefix: str = '', local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT,
                 endpoint_url: Optional[str] = None) -> None:
        super().__init__(PyTorchLocalModelSaver(local_model_result_folder_path), project_name, experiment_name,
                         bucket_name, cloud_dir_prefix, local_model_result_folder_path, endpoint_url)
