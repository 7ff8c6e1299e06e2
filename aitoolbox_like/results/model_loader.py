"""Load a saved model of an experiment folder, for inference or to continue training by hand.

AIToolbox's ``PyTorchLocalModelLoader``: it reads the files that ModelCheckpoint / ModelIterationCheckpoint /
ModelTrainEndSave and the experiment savers write, always with ``torch.load(weights_only=True)`` unless the
caller opts in to full unpickling for a file they trust::

    loader = PyTorchLocalModelLoader('~/results')
    loader.load_model('digits', 'cnn', '2024-05-01_10-00-00', model_save_dir='model')
    model = loader.init_model(CNN())
"""
from __future__ import annotations

import abc
import logging
import os
from collections import OrderedDict
from typing import Any, Dict, List, Optional, TypeVar, cast

import torch
from torch import nn

from ..checkpoint.files import CheckpointError, load_checkpoint, load_model_weights
from ..experiment.layout import CHECKPOINT_DIR, LATEST_POINTER, model_file_name
from ..experiment.pointers import read_pointer
from .savers import ExperimentFolder

logger = logging.getLogger(__name__)

_ModuleT = TypeVar('_ModuleT', bound=nn.Module)
_OptimizerT = TypeVar('_OptimizerT')
_ListT = TypeVar('_ListT', bound=List[Any])


class AbstractLocalModelLoader(abc.ABC):
    """Loads a saved model representation from the experiment folder layout."""

    @abc.abstractmethod
    def load_model(self, project_name: str, experiment_name: str, experiment_timestamp: str, model_save_dir: str,
                   epoch_num: Optional[int] = None, **kwargs: Any) -> Any:
        """Load and return the saved model representation."""


class PyTorchLocalModelLoader(AbstractLocalModelLoader):
    """Load a saved PyTorch model (a dict: ``model_state_dict``, ``optimizer_state_dict``,
    ``schedulers_state_dict``, ``amp``, ``epoch``, ...) and initialise a model, optimizer, schedulers and grad
    scaler from it.

    Args:
        local_model_result_folder_path: root folder of the projects (as given to the saving callbacks).
        allow_unsafe_pickle: load with full unpickling, which can run code stored in the file; only for files you
            trust (e.g. old AIToolbox checkpoints that pickled objects in their hyperparameters). By default such
            a file is refused with a CheckpointError that says so.
    """

    def __init__(self, local_model_result_folder_path: str, allow_unsafe_pickle: bool = False) -> None:
        self.local_model_result_folder_path = os.path.expanduser(os.fspath(local_model_result_folder_path))
        self.allow_unsafe_pickle = allow_unsafe_pickle
        self.model_representation: Optional[Dict[str, Any]] = None
        self.model_path: Optional[str] = None

    def get_model_path(self, project_name: str, experiment_name: str, experiment_timestamp: str,
                       model_save_dir: str = CHECKPOINT_DIR, epoch_num: Optional[int] = None) -> str:
        """The file :meth:`load_model` reads (see there); FileNotFoundError listing the saved models if missing."""
        _, experiment_dir = ExperimentFolder.get_base_folder_paths(project_name, experiment_name,
                                                                    experiment_timestamp,
                                                                    self.local_model_result_folder_path)
        folder = os.path.join(experiment_dir, model_save_dir)
        path = os.path.join(folder, model_file_name(experiment_name, experiment_timestamp, epoch_num))
        if os.path.isfile(path):
            return path
        if epoch_num is None and model_save_dir == CHECKPOINT_DIR:
            # Checkpoints carry an epoch in their name; without one, the newest complete checkpoint is meant.
            latest = read_pointer(experiment_dir, LATEST_POINTER)
            if latest is not None and os.path.dirname(latest) == folder:
                return latest
        saved = sorted(f for f in os.listdir(folder) if f.endswith('.pth')) if os.path.isdir(folder) else []
        raise FileNotFoundError(f'no saved model {path}; {folder} holds {saved if saved else "no models"}. Check '
                                f'experiment_timestamp, model_save_dir ({CHECKPOINT_DIR!r} for checkpoints, '
                                f"'model' for the model saved at the end of training) and epoch_num")

    # AIToolbox's signature: the abstract method's **kwargs stand for loader-specific options, here map_location.
    def load_model(  # type: ignore[override]
            self, project_name: str, experiment_name: str, experiment_timestamp: str,
            model_save_dir: str = CHECKPOINT_DIR, epoch_num: Optional[int] = None,
            map_location: Any = None) -> Dict[str, Any]:
        """Load ``<experiment folder>/<model_save_dir>/model_<experiment>_<timestamp>[_E<epoch_num>].pth``.

        Args:
            project_name: which experiment folder (with experiment_name and experiment_timestamp).
            experiment_name: see project_name.
            experiment_timestamp: see project_name.
            model_save_dir: 'checkpoint_model' (checkpoints) or 'model' (the model saved at the end of training).
            epoch_num: the epoch of the checkpoint; None: the final model, or, in 'checkpoint_model', the newest
                checkpoint (the one ``latest_checkpoint.txt`` names).
            map_location: as for ``torch.load`` (None: the devices the tensors were saved from).

        Returns:
            The model representation dict (also kept as ``self.model_representation``).
        """
        path = self.get_model_path(project_name, experiment_name, experiment_timestamp, model_save_dir, epoch_num)
        return self.load_model_from_path(path, map_location)

    def load_model_from_path(self, model_path: str, map_location: Any = None) -> Dict[str, Any]:
        """Load a saved model file from anywhere (no experiment folder needed)."""
        representation = load_checkpoint(os.path.expanduser(os.fspath(model_path)), map_location=map_location,
                                         allow_unsafe_pickle=self.allow_unsafe_pickle)
        if not isinstance(representation, dict) or 'model_state_dict' not in representation:
            raise CheckpointError(f'{model_path} is not a saved model (a dict with model_state_dict); save models '
                                  f'with ModelCheckpoint, ModelTrainEndSave or PyTorchLocalModelSaver')
        # Files saved before schedulers were checkpointed have no scheduler states.
        representation.setdefault('schedulers_state_dict', [])
        self.model_representation = representation
        self.model_path = os.fspath(model_path)
        logger.info('Loaded model %s (epoch %s)', model_path, representation.get('epoch'))
        return representation

    def check_if_model_loaded(self) -> None:
        """Raise ValueError when no model has been loaded yet."""
        if self.model_representation is None:
            raise ValueError('no model loaded yet: call load_model() or load_model_from_path() first')

    def _loaded_representation(self) -> Dict[str, Any]:
        self.check_if_model_loaded()
        # check_if_model_loaded raised if it were None.
        return cast(Dict[str, Any], self.model_representation)

    def init_model(self, model: _ModuleT, used_data_parallel: bool = False) -> _ModuleT:
        """Load the saved weights into ``model`` (strictly: every key must match) and return it.

        Args:
            model: the torch module (TTModel) of the same architecture.
            used_data_parallel: the weights were saved from a DataParallel / DDP wrapper (keys start with
                ``module.``); the prefix is removed.
        """
        state_dict = self._loaded_representation()['model_state_dict']
        if used_data_parallel:
            state_dict = OrderedDict((k[len('module.'):] if k.startswith('module.') else k, v)
                                     for k, v in state_dict.items())
        return load_model_weights(model, state_dict, self.model_path or 'the loaded model')

    def init_optimizer(self, optimizer: _OptimizerT, device: str = 'cuda') -> _OptimizerT:
        """Load the saved optimizer state into ``optimizer`` (a torch optimizer or a MultiOptimizer) and return it.

        ``device`` is accepted for AIToolbox compatibility: torch moves the state to the parameters' devices.
        """
        state = self._loaded_representation().get('optimizer_state_dict')
        if state is None:
            raise CheckpointError(f'{self.model_path} holds no optimizer state')
        try:
            cast(Any, optimizer).load_state_dict(state)   # a torch optimizer or a MultiOptimizer
        except (ValueError, KeyError, IndexError, TypeError, RuntimeError) as error:
            raise CheckpointError(f'{self.model_path}: its optimizer state does not fit {type(optimizer).__name__} '
                                  f'({error}); was it saved with a different model or optimizer?') from error
        return optimizer

    def init_scheduler(self, scheduler_callbacks_list: _ListT, ignore_saved: bool = False,
                       ignore_missing_saved: bool = False) -> _ListT:
        """Load the saved scheduler states into the scheduler callbacks, in order, and return the list.

        Args:
            scheduler_callbacks_list: the scheduler callbacks, in the order of the training that saved them.
            ignore_saved: do not raise when the file has scheduler states but no schedulers are given.
            ignore_missing_saved: do not raise when schedulers are given but the file has no scheduler states.
        """
        saved = self._loaded_representation()['schedulers_state_dict']
        schedulers = list(scheduler_callbacks_list)
        if schedulers and not saved:
            if ignore_missing_saved:
                return scheduler_callbacks_list
            raise KeyError(f'{self.model_path} has no scheduler states but {len(schedulers)} scheduler(s) were given; '
                           f'pass ignore_missing_saved=True to start them fresh')
        if saved and not schedulers:
            if ignore_saved:
                return scheduler_callbacks_list
            raise ValueError(f'{self.model_path} has {len(saved)} scheduler state(s) but no schedulers were given; '
                             f'pass the scheduler callbacks, or ignore_saved=True to drop the states')
        if len(saved) != len(schedulers):
            raise ValueError(f'{len(schedulers)} scheduler(s) were given but {self.model_path} has {len(saved)} '
                             f'scheduler state(s); give the same schedulers, in the same order, as when saving')
        for scheduler, state in zip(schedulers, saved):
            if not callable(getattr(scheduler, 'load_state_dict', None)):
                raise TypeError(f'{type(scheduler).__qualname__} has no load_state_dict(); give scheduler callbacks')
            scheduler.load_state_dict(state)
        return scheduler_callbacks_list

    def init_amp(self, amp_scaler: torch.amp.GradScaler) -> torch.amp.GradScaler:
        """Load the saved grad scaler state into ``amp_scaler`` (``torch.amp.GradScaler``) and return it."""
        state = self._loaded_representation().get('amp')
        if not state:
            raise CheckpointError(f'{self.model_path} holds no grad scaler state: it was saved from a run without '
                                  f'fp16 AMP (use_amp=True); leave the scaler as it is')
        amp_scaler.load_state_dict(state)
        return amp_scaler
