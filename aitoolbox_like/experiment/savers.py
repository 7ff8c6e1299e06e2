"""Saving an experiment without a TrainLoop: the final model and the results, in the experiment folder layout.

AIToolbox's savers for users who train with their own loop (``FullPyTorchExperimentLocalSaver``,
``FullPyTorchExperimentS3Saver`` and the pieces they are made of). They write the same files as the
saving callbacks (``ModelTrainEndSave`` uses :func:`write_experiment_results` too)::

    <local_model_result_folder_path>/<project>/<experiment>_<timestamp>/
        model/model_<experiment>_<timestamp>.pth                     (checkpoint_model/..._E<epoch>.pth)
        results/results_hyperParams_hist_<experiment>_<timestamp>.json
        results/true_pred_labels_<experiment>_<timestamp>.pt          (save_true_pred_labels=True)

Model files load with ``torch.load(weights_only=True)`` (and :class:`~.model_loader.PyTorchLocalModelLoader`);
results are JSON, targets and predictions a tensor file. Every file is written atomically.
"""
import abc
import datetime
import json
import logging
import os
from collections.abc import Mapping
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ..checkpoint import atomic_torch_save, check_weights_only_safe
from ..storage.base import join_key, validate_key_part
from ..storage.local import write_text_atomically
from . import CHECKPOINT_DIR, MODEL_DIR, RESULTS_DIR, hyperparams_to_json, model_file_name

logger = logging.getLogger(__name__)

DEFAULT_RESULTS_ROOT = '~/project/model_result'
REQUIRED_MODEL_KEYS = ('model_state_dict', 'optimizer_state_dict', 'epoch', 'hyperparams')


def new_experiment_timestamp() -> str:
    """The current local time in AIToolbox's experiment timestamp format, ``YYYY-mm-dd_HH-MM-SS``."""
    return datetime.datetime.now().strftime('%Y-%m-%d_%H-%M-%S')


def _json_default(value):
    if hasattr(value, 'tolist'):
        return value.tolist()
    if hasattr(value, 'item'):
        return value.item()
    return repr(value)


def write_json_atomically(path: str, data: Any, temp_dir: Optional[str] = None) -> str:
    """Write ``data`` as indented JSON; tensors and arrays become lists, other objects their repr."""
    write_text_atomically(path, json.dumps(data, default=_json_default, indent=2), temp_dir=temp_dir)
    return path


def result_package_labels(name: str, y_true: Any, y_predicted: Any) -> Dict[str, Dict[str, torch.Tensor]]:
    """``{name: {'y_true': tensor, 'y_predicted': tensor}}`` for the labels file, or ``{}`` (with a warning)
    when the targets or predictions are not tensor-like (strings, ragged lists)."""
    try:
        return {name: {'y_true': torch.as_tensor(y_true), 'y_predicted': torch.as_tensor(y_predicted)}}
    except (TypeError, ValueError, RuntimeError) as error:
        logger.warning('%s: targets / predictions are not tensor-like (%s); they are not saved in the '
                       'true_pred_labels file', name, error)
        return {}


def _history_dict(training_history) -> dict:
    if training_history is None:
        return {}
    if callable(getattr(training_history, 'get_train_history', None)):
        return training_history.get_train_history()
    if isinstance(training_history, Mapping):
        return dict(training_history)
    raise TypeError(f'training_history must be a TrainingHistory or a dict of metric lists, got '
                    f'{type(training_history).__qualname__}')


def write_experiment_results(results_dir: str, experiment_name: str, experiment_timestamp: str, results: Any,
                             hyperparameters: Any, training_history: Any = None,
                             labels: Optional[Dict[str, Dict[str, torch.Tensor]]] = None,
                             separate_files: bool = False, temp_dir: Optional[str] = None) -> List[List[str]]:
    """Write the results files of an experiment into ``results_dir`` (which must exist).

    One file ``results_hyperParams_hist_<experiment>_<timestamp>.json`` with the keys ``experiment_name``,
    ``experiment_results_local_path``, ``results``, ``hyperparameters`` and ``training_history``; with
    ``separate_files`` three (``results_``, ``hyperparams_``, ``train_history_<experiment>_<timestamp>.json``),
    as AIToolbox. Non-empty ``labels`` go to ``true_pred_labels_<experiment>_<timestamp>.pt``.

    Returns:
        ``[[file name, local path], ...]``, the main results file first (AIToolbox's return format).
    """
    suffix = f'{experiment_name}_{experiment_timestamp}'
    history = _history_dict(training_history)
    base = {'experiment_name': experiment_name, 'experiment_results_local_path': results_dir}
    if separate_files:
        contents = [(f'results_{suffix}.json', {**base, 'results': results}),
                    (f'hyperparams_{suffix}.json', {**base, 'hyperparameters': hyperparameters}),
                    (f'train_history_{suffix}.json', {**base, 'training_history': history})]
    else:
        contents = [(f'results_hyperParams_hist_{suffix}.json',
                     {**base, 'results': results, 'hyperparameters': hyperparameters, 'training_history': history})]
    saved = []
    for name, data in contents:
        saved.append([name, write_json_atomically(os.path.join(results_dir, name), data, temp_dir)])
    if labels:
        name = f'true_pred_labels_{suffix}.pt'
        path = os.path.join(results_dir, name)
        atomic_torch_save(labels, path, temp_dir=temp_dir)
        saved.append([name, path])
    return saved


# ---------------------------------------------------------------------------------------------- folders


class ExperimentFolder:
    """Paths of the experiment folder ``<local_model_result_folder_path>/<project>/<experiment>_<timestamp>``."""

    @staticmethod
    def get_base_folder_paths(project_name: str, experiment_name: str, experiment_timestamp: str,
                              local_model_result_folder_path: str) -> Tuple[str, str]:
        """``(project folder, experiment folder)`` paths; nothing is created. The names must be plain names
        (no path separators, not '..'), so the folders stay inside ``local_model_result_folder_path``."""
        validate_key_part(project_name, 'project_name')
        validate_key_part(experiment_name, 'experiment_name')
        validate_key_part(f'{experiment_name}_{experiment_timestamp}', 'experiment_timestamp')
        root = os.path.abspath(os.path.expanduser(os.fspath(local_model_result_folder_path)))
        project_dir = os.path.join(root, project_name)
        return project_dir, os.path.join(project_dir, f'{experiment_name}_{experiment_timestamp}')

    @staticmethod
    def create_base_folder(project_name: str, experiment_name: str, experiment_timestamp: str,
                           local_model_result_folder_path: str) -> str:
        """Create the experiment folder (and its parents) if missing; returns its path."""
        _, experiment_dir = ExperimentFolder.get_base_folder_paths(project_name, experiment_name,
                                                                    experiment_timestamp,
                                                                    local_model_result_folder_path)
        os.makedirs(experiment_dir, exist_ok=True)
        return experiment_dir


# ---------------------------------------------------------------------------------------------- models


class AbstractLocalModelSaver(abc.ABC):
    """Saves a model representation into the experiment folder."""

    @abc.abstractmethod
    def save_model(self, model, project_name: str, experiment_name: str, experiment_timestamp: Optional[str] = None,
                   epoch: Optional[int] = None, iteration_idx: Optional[int] = None,
                   protect_existing_folder: bool = True) -> Tuple[str, str]:
        """Save ``model``; returns ``(model file name, local path)``."""


class BaseLocalModelSaver:
    """Where a local model saver writes: ``model/`` (the final model) or ``checkpoint_model/`` (checkpoints)."""

    def __init__(self, local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT, checkpoint_model: bool = False):
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
    is kept as ``hyperparams_json``), as in the checkpoints of the TrainLoop; anything else that could not be
    loaded safely is a CheckpointError naming where it is.
    """
    saved = dict(model)
    if 'hyperparams' in saved:
        text = hyperparams_to_json(saved['hyperparams'])
        saved['hyperparams'] = json.loads(text)
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

    def __init__(self, metric_name: str, num_best_kept: int = 2):
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

    def decide_if_remove_suboptimal_model(self, history, new_model_dump_paths: Sequence[str]) -> List[str]:
        """Track the new model and delete the worst tracked one(s) beyond ``num_best_kept``; returns the
        deleted paths."""
        values = history[self.metric_name] if self.metric_name in history else []
        if not values:
            logger.warning('LocalSubOptimalModelRemover: metric %r is not in the training history (it has %s); '
                           '%s kept and not ranked', self.metric_name, sorted(history.keys()),
                           list(new_model_dump_paths))
            return []
        self.model_save_history.append((list(new_model_dump_paths), float(values[-1])))
        removed = []
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
    def save_experiment_results(self, result_package, training_history, project_name: str, experiment_name: str,
                                experiment_timestamp: Optional[str] = None, save_true_pred_labels: bool = False,
                                protect_existing_folder: bool = True) -> List[List[str]]:
        """All results in one file; returns ``[[file name, local path], ...]``, the results file first."""

    @abc.abstractmethod
    def save_experiment_results_separate_files(self, result_package, training_history, project_name: str,
                                               experiment_name: str, experiment_timestamp: Optional[str] = None,
                                               save_true_pred_labels: bool = False,
                                               protect_existing_folder: bool = True) -> List[List[str]]:
        """Results, hyperparameters and history in separate files; same return format."""


class BaseLocalResultsSaver:
    """The ``results/`` folder of an experiment and the file format of the results."""

    def __init__(self, local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT, file_format: str = 'json'):
        if file_format != 'json':
            raise ValueError(f"file_format={file_format!r} is not supported: results are written as JSON (targets "
                             f"and predictions as a .pt tensor file), which needs no unpickling to read; pass "
                             f"file_format='json'")
        self.local_model_result_folder_path = os.path.expanduser(os.fspath(local_model_result_folder_path))
        self.file_format = file_format

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
        """Write ``result_dict`` to ``<file_local_path_w_type>.json``; returns ``(file name, path)``."""
        write_json_atomically(file_local_path_w_type + '.json', result_dict)
        return file_name_w_type + '.json', file_local_path_w_type + '.json'


class LocalResultsSaver(AbstractLocalResultsSaver, BaseLocalResultsSaver):
    """Write an evaluated result package and the training history into ``<experiment folder>/results/``,
    the files ModelTrainEndSave writes.

    Args:
        local_model_result_folder_path: root folder of the projects.
        file_format: 'json' (the only format; AIToolbox's default was a pickle).
    """

    def _save(self, result_package, training_history, project_name, experiment_name, experiment_timestamp,
              save_true_pred_labels, separate_files):
        if not callable(getattr(result_package, 'get_results', None)):
            raise TypeError(f'result_package must be an evaluated result package (AbstractResultPackage after '
                            f'prepare_result_package), got {type(result_package).__qualname__}')
        if experiment_timestamp is None:
            experiment_timestamp = new_experiment_timestamp()
        results_dir = self.create_experiment_local_folder_structure(project_name, experiment_name,
                                                                    experiment_timestamp)
        labels = None
        if save_true_pred_labels:
            name = getattr(result_package, 'pkg_name', None) or type(result_package).__name__
            labels = result_package_labels(name, result_package.y_true, result_package.y_predicted)
        saved = write_experiment_results(results_dir, experiment_name, experiment_timestamp,
                                         results=result_package.get_results(),
                                         hyperparameters=result_package.get_hyperparameters(),
                                         training_history=training_history, labels=labels,
                                         separate_files=separate_files, temp_dir=os.path.dirname(results_dir))
        additional = result_package.get_additional_results_dump_paths() \
            if callable(getattr(result_package, 'get_additional_results_dump_paths', None)) else None
        return saved + [list(entry) for entry in (additional or [])]

    def save_experiment_results(self, result_package, training_history, project_name: str, experiment_name: str,
                                experiment_timestamp: Optional[str] = None, save_true_pred_labels: bool = False,
                                protect_existing_folder: bool = True) -> List[List[str]]:
        """Write ``results_hyperParams_hist_<experiment>_<timestamp>.json`` (results, hyperparameters, history)
        and, with ``save_true_pred_labels``, ``true_pred_labels_<experiment>_<timestamp>.pt``.

        Returns ``[[file name, local path], ...]``: the results file first, then the labels file and the result
        package's additional result files. ``protect_existing_folder`` changes nothing (as in AIToolbox).
        """
        return self._save(result_package, training_history, project_name, experiment_name, experiment_timestamp,
                          save_true_pred_labels, separate_files=False)

    def save_experiment_results_separate_files(self, result_package, training_history, project_name: str,
                                               experiment_name: str, experiment_timestamp: Optional[str] = None,
                                               save_true_pred_labels: bool = False,
                                               protect_existing_folder: bool = True) -> List[List[str]]:
        """Like :meth:`save_experiment_results` but into ``results_``, ``hyperparams_`` and
        ``train_history_<experiment>_<timestamp>.json``."""
        return self._save(result_package, training_history, project_name, experiment_name, experiment_timestamp,
                          save_true_pred_labels, separate_files=True)


# ---------------------------------------------------------------------------------------------- full experiment


class AbstractExperimentSaver(abc.ABC):
    """Saves a whole experiment: the model and the evaluated results."""

    @abc.abstractmethod
    def save_experiment(self, model, result_package, training_history, experiment_timestamp: Optional[str] = None,
                        save_true_pred_labels: bool = False, separate_files: bool = False,
                        protect_existing_folder: bool = True):
        """Save the model and the results of one experiment."""


class BaseFullExperimentSaver(AbstractExperimentSaver):
    """Save the final model with ``model_saver`` and the results with ``results_saver`` (AIToolbox's
    composition of the two).

    Args:
        model_saver: an AbstractLocalModelSaver (PyTorchLocalModelSaver for PyTorch).
        results_saver: an AbstractLocalResultsSaver (LocalResultsSaver).
        project_name, experiment_name: folder names (plain names).
    """

    def __init__(self, model_saver: AbstractLocalModelSaver, results_saver: AbstractLocalResultsSaver,
                 project_name: str, experiment_name: str):
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

    def save_experiment(self, model, result_package, training_history, experiment_timestamp: Optional[str] = None,
                        save_true_pred_labels: bool = False, separate_files: bool = False,
                        protect_existing_folder: bool = True) -> List[str]:
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
        project_name, experiment_name: folder names (plain names).
        local_model_result_folder_path: root folder of the projects.
    """

    def __init__(self, model_saver: AbstractLocalModelSaver, project_name: str, experiment_name: str,
                 local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT):
        super().__init__(model_saver, LocalResultsSaver(local_model_result_folder_path), project_name,
                         experiment_name)
        self.local_model_result_folder_path = os.path.expanduser(os.fspath(local_model_result_folder_path))


class FullPyTorchExperimentLocalSaver(BaseFullExperimentLocalSaver):
    """Save a PyTorch experiment (final model and results) into the local experiment folder.

    Args:
        project_name, experiment_name: folder names (plain names).
        local_model_result_folder_path: root folder of the projects.
    """

    def __init__(self, project_name: str, experiment_name: str,
                 local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT):
        super().__init__(PyTorchLocalModelSaver(local_model_result_folder_path), project_name, experiment_name,
                         local_model_result_folder_path)


class BaseFullExperimentS3Saver(BaseFullExperimentLocalSaver):
    """Save the experiment locally, then upload the files to the same keys under
    ``s3://<bucket_name>/<cloud_dir_prefix>/<project>/<experiment>_<timestamp>/``.

    Uploads are synchronous (``save_experiment`` returns once they are complete) and retried by boto3 on
    network errors; a failure raises a StorageError, and the local files stay complete.

    Args:
        model_saver: an AbstractLocalModelSaver (PyTorchLocalModelSaver for PyTorch).
        project_name, experiment_name: folder names (plain names).
        bucket_name, cloud_dir_prefix: where in S3.
        local_model_result_folder_path: root folder of the projects on this machine.
        endpoint_url: S3-compatible endpoint (None: boto3's resolution, e.g. ``AWS_ENDPOINT_URL_S3``).
        storage: an existing S3Storage to upload through (its bucket and prefix are used).
    """

    def __init__(self, model_saver: AbstractLocalModelSaver, project_name: str, experiment_name: str,
                 bucket_name: str = 'model-result', cloud_dir_prefix: str = '',
                 local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT, endpoint_url: Optional[str] = None,
                 storage=None):
        super().__init__(model_saver, project_name, experiment_name, local_model_result_folder_path)
        if storage is None:
            from ..storage.s3 import S3Storage
            storage = S3Storage(bucket_name, cloud_dir_prefix or '', endpoint_url=endpoint_url)
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

    def save_experiment(self, model, result_package, training_history, experiment_timestamp: Optional[str] = None,
                        save_true_pred_labels: bool = False, separate_files: bool = False,
                        protect_existing_folder: bool = True) -> Tuple[str, str]:
        """Save as :meth:`BaseFullExperimentLocalSaver.save_experiment`, then upload every file written.

        Returns:
            ``(model path, results path)`` in the bucket, each ``<bucket_name>/<cloud key>`` (AIToolbox's format).
        """
        if experiment_timestamp is None:
            experiment_timestamp = new_experiment_timestamp()
        paths = super().save_experiment(model, result_package, training_history, experiment_timestamp,
                                        save_true_pred_labels, separate_files, protect_existing_folder)
        keys = []
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
        project_name, experiment_name: folder names (plain names).
        bucket_name, cloud_dir_prefix: where in S3.
        local_model_result_folder_path: root folder of the projects on this machine.
        endpoint_url: S3-compatible endpoint (None: boto3's resolution, e.g. ``AWS_ENDPOINT_URL_S3``).
    """

    def __init__(self, project_name: str, experiment_name: str, bucket_name: str = 'model-result',
                 cloud_dir_prefix: str = '', local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT,
                 endpoint_url: Optional[str] = None):
        super().__init__(PyTorchLocalModelSaver(local_model_result_folder_path), project_name, experiment_name,
                         bucket_name, cloud_dir_prefix, local_model_result_folder_path, endpoint_url)


_GCS_ERROR = ('{name}: Google Cloud Storage is not supported; save with FullPyTorchExperimentS3Saver (any '
              'S3-compatible endpoint, endpoint_url=...) or FullPyTorchExperimentLocalSaver')


class BaseFullExperimentGoogleStorageSaver(AbstractExperimentSaver):
    """Not supported: constructing it raises NotImplementedError (Google Cloud Storage is not supported)."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(_GCS_ERROR.format(name=type(self).__name__))

    def save_experiment(self, model, result_package, training_history, experiment_timestamp=None,
                        save_true_pred_labels=False, separate_files=False, protect_existing_folder=True):
        raise NotImplementedError(_GCS_ERROR.format(name=type(self).__name__))


class FullPyTorchExperimentGoogleStorageSaver(BaseFullExperimentGoogleStorageSaver):
    """Not supported: constructing it raises NotImplementedError (Google Cloud Storage is not supported)."""
