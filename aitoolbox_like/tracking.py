"""Tracking TrainLoops: a TrainLoop with saving callbacks registered for you (AIToolbox's classes).

- TrainLoopCheckpoint: full-state checkpoint after every epoch (or every ``iteration_save_freq`` batches).
- TrainLoopEndSave: the final model and the result packages' results at the end of training.
- TrainLoopCheckpointEndSave: both.

Their arguments are AIToolbox's: the experiment's (project, experiment, folder, hyperparameters, cloud), the saver's,
then every TrainLoop argument after ``criterion``, by position in AIToolbox's order (``collate_batch_pred_fn``,
``pred_transform_fn``, ``end_auto_eval``, ``lazy_experiment_save``, ``print_callbacks``, ``gpu_mode``,
``cuda_device_idx``, ``use_amp``, ...) or by keyword (``compile=True``, ``eval_loss_weighting='sample'``, any
argument TrainLoop has). ``preemption_safe=True`` (keyword): a SIGTERM / SIGINT then checkpoints and stops cleanly
(PreemptionCheckpoint, added by default when a checkpoint callback is registered); False turns it off.

All three write to ``<local_model_result_folder_path>/<project_name>/<experiment_name>_<timestamp>/`` and, with
``cloud_save_mode='s3'`` (``'gcs'``, ``'azure'``), upload the same files to ``s3://<bucket_name>/<cloud_dir_prefix>/``
(``gs://``, ``az://``; the bucket is checked at the start of fit, never when the loop is created). Our bookkeeping
(pointers, run claim, upload journal) lives in ``<local_model_result_folder_path>/.aitoolbox_like/<project_name>/``,
outside the project folder (aitoolbox_like.experiment).
"""
import inspect
import os
from typing import Any, Dict, Optional, Tuple

from .callbacks.model_save import ModelCheckpoint, ModelIterationCheckpoint, ModelTrainEndSave
from .engine.train_loop import TrainLoop
from .experiment import normalize_cloud_save_mode
from .storage.base import validate_key_part

__all__ = ['TrainLoopCheckpoint', 'TrainLoopCheckpointEndSave', 'TrainLoopEndSave']


class _TrackingLoop(TrainLoop):
    """A TrainLoop that names the experiment its saving callbacks write (they infer their details from these
    attributes, as in AIToolbox)."""

    def __init__(self, model: Any, train_loader: Any, validation_loader: Any, test_loader: Any, optimizer: Any,
                 criterion: Any, project_name: str, experiment_name: str, local_model_result_folder_path: str,
                 hyperparams: Optional[Dict[str, Any]], cloud_save_mode: Optional[str], bucket_name: str,
                 cloud_dir_prefix: str, source_dirs: Any, preemption_safe: bool, loop_args: Tuple[Any, ...],
                 loop_kwargs: Dict[str, Any]) -> None:
        super().__init__(model, train_loader, validation_loader, test_loader, optimizer, criterion, *loop_args,
                         **loop_kwargs)
        validate_key_part(project_name, 'project_name')
        validate_key_part(experiment_name, 'experiment_name')
        normalize_cloud_save_mode(cloud_save_mode)
        if hyperparams is None:
            hyperparams = {}
        if not isinstance(hyperparams, dict):
            raise TypeError(f'hyperparams must be a dict, got {type(hyperparams).__qualname__}')
        # False leaves out the default PreemptionCheckpoint.
        self.preemption_safe = bool(preemption_safe)
        self.project_name = project_name
        self.experiment_name = experiment_name
        self.local_model_result_folder_path = os.path.expanduser(os.fspath(local_model_result_folder_path))
        # As in AIToolbox, the dict is completed in place so the caller sees what is saved.
        caller_file = _caller_file()
        if 'experiment_file_path' not in hyperparams and caller_file:
            hyperparams['experiment_file_path'] = caller_file
        if 'source_dirs_paths' not in hyperparams:
            # As given (AIToolbox's default is the tuple ()): the saved hyperparameters show what the caller passed.
            hyperparams['source_dirs_paths'] = source_dirs
        self.hyperparams = hyperparams
        self.cloud_save_mode = cloud_save_mode
        self.bucket_name = bucket_name
        self.cloud_dir_prefix = cloud_dir_prefix
        self.source_dirs = source_dirs

    def _register_checkpoint_saver(self, rm_subopt_local_models: Any, num_best_checkpoints_kept: int,
                                   iteration_save_freq: int) -> None:
        """ModelCheckpoint after every epoch (``iteration_save_freq=0``), else ModelIterationCheckpoint every
        ``iteration_save_freq`` batches, registered at the start of the first fit (inside each process of a DDP
        fit)."""
        if isinstance(iteration_save_freq, bool) or not isinstance(iteration_save_freq, int) \
                or iteration_save_freq < 0:
            raise ValueError(f'iteration_save_freq must be an int >= 0 (0: checkpoint after every epoch), got '
                             f'{iteration_save_freq!r}')
        self.rm_subopt_local_models = rm_subopt_local_models
        self.iteration_save_freq = iteration_save_freq
        args = (self.project_name, self.experiment_name, self.local_model_result_folder_path, self.hyperparams)
        kwargs = dict(cloud_save_mode=self.cloud_save_mode, bucket_name=self.bucket_name,
                      cloud_dir_prefix=self.cloud_dir_prefix, rm_subopt_local_models=rm_subopt_local_models,
                      num_best_checkpoints_kept=num_best_checkpoints_kept)
        saver = ModelCheckpoint(*args, **kwargs) if iteration_save_freq == 0 else \
            ModelIterationCheckpoint(iteration_save_freq, *args, **kwargs)
        self.callbacks_handler.register_callbacks([saver], cache_callbacks=True)


class TrainLoopCheckpoint(_TrackingLoop):
    """TrainLoop that checkpoints the full training state after every epoch (ModelCheckpoint) or every
    ``iteration_save_freq`` batches (ModelIterationCheckpoint). Arguments as in AIToolbox, then TrainLoop's (see the
    module docstring); see ModelCheckpoint for rm_subopt_local_models / num_best_checkpoints_kept."""

    def __init__(self, model: Any, train_loader: Any, validation_loader: Any, test_loader: Any, optimizer: Any,
                 criterion: Any, project_name: str, experiment_name: str, local_model_result_folder_path: str,
                 hyperparams: Optional[Dict[str, Any]], cloud_save_mode: Optional[str] = 's3',
                 bucket_name: str = 'model-result', cloud_dir_prefix: str = '', source_dirs: Any = (),
                 rm_subopt_local_models: Any = False, num_best_checkpoints_kept: int = 2, iteration_save_freq: int = 0,
                 *loop_args: Any, preemption_safe: bool = True, **loop_kwargs: Any) -> None:
        super().__init__(model, train_loader, validation_loader, test_loader, optimizer, criterion, project_name,
                         experiment_name, local_model_result_folder_path, hyperparams, cloud_save_mode, bucket_name,
                         cloud_dir_prefix, source_dirs, preemption_safe, loop_args, loop_kwargs)
        self._register_checkpoint_saver(rm_subopt_local_models, num_best_checkpoints_kept, iteration_save_freq)


class TrainLoopEndSave(_TrackingLoop):
    """TrainLoop that saves the final model and evaluates the result packages at the end of training
    (ModelTrainEndSave). Arguments as in AIToolbox, then TrainLoop's (see the module docstring)."""

    def __init__(self, model: Any, train_loader: Any, validation_loader: Any, test_loader: Any, optimizer: Any,
                 criterion: Any, project_name: str, experiment_name: str, local_model_result_folder_path: str,
                 hyperparams: Optional[Dict[str, Any]], val_result_package: Any = None, test_result_package: Any = None,
                 cloud_save_mode: Optional[str] = 's3', bucket_name: str = 'model-result', cloud_dir_prefix: str = '',
                 source_dirs: Any = (), *loop_args: Any, preemption_safe: bool = True, **loop_kwargs: Any) -> None:
        super().__init__(model, train_loader, validation_loader, test_loader, optimizer, criterion, project_name,
                         experiment_name, local_model_result_folder_path, hyperparams, cloud_save_mode, bucket_name,
                         cloud_dir_prefix, source_dirs, preemption_safe, loop_args, loop_kwargs)
        self.val_result_package = val_result_package
        self.test_result_package = test_result_package
        self.check_if_result_packages_possible()
        self.callbacks_handler.register_callbacks([ModelTrainEndSave(
            self.project_name, self.experiment_name, self.local_model_result_folder_path, self.hyperparams,
            val_result_package, test_result_package, cloud_save_mode=cloud_save_mode, bucket_name=bucket_name,
            cloud_dir_prefix=cloud_dir_prefix)], cache_callbacks=True)

    def check_if_result_packages_possible(self) -> None:
        """AIToolbox's check: a result package for each loader it is evaluated on, and at least one."""
        if self.val_result_package is None and self.test_result_package is None:
            raise ValueError('give val_result_package and/or test_result_package (both are None)')
        if self.val_result_package is not None and self.validation_loader is None:
            raise ValueError('val_result_package was given but validation_loader is None')
        if self.test_result_package is not None and self.test_loader is None:
            raise ValueError('test_result_package was given but test_loader is None')
        for package in (self.val_result_package, self.test_result_package):
            if package is not None and not callable(getattr(package, 'prepare_result_package', None)):
                raise TypeError(f'result packages must be AbstractResultPackage instances, got '
                                f'{type(package).__qualname__}')


class TrainLoopCheckpointEndSave(TrainLoopEndSave):
    """TrainLoopEndSave plus a checkpoint after every epoch (or every ``iteration_save_freq`` batches). Arguments as
    in AIToolbox, then TrainLoop's (see the module docstring)."""

    def __init__(self, model: Any, train_loader: Any, validation_loader: Any, test_loader: Any, optimizer: Any,
                 criterion: Any, project_name: str, experiment_name: str, local_model_result_folder_path: str,
                 hyperparams: Optional[Dict[str, Any]], val_result_package: Any = None, test_result_package: Any = None,
                 cloud_save_mode: Optional[str] = 's3', bucket_name: str = 'model-result', cloud_dir_prefix: str = '',
                 source_dirs: Any = (), rm_subopt_local_models: Any = False, num_best_checkpoints_kept: int = 2,
                 iteration_save_freq: int = 0, *loop_args: Any, preemption_safe: bool = True,
                 **loop_kwargs: Any) -> None:
        TrainLoopEndSave.__init__(self, model, train_loader, validation_loader, test_loader, optimizer, criterion,
                                  project_name, experiment_name, local_model_result_folder_path, hyperparams,
                                  val_result_package, test_result_package, cloud_save_mode, bucket_name,
                                  cloud_dir_prefix, source_dirs, *loop_args, preemption_safe=preemption_safe,
                                  **loop_kwargs)
        self._register_checkpoint_saver(rm_subopt_local_models, num_best_checkpoints_kept, iteration_save_freq)


def _caller_file() -> Optional[str]:
    """The file of the code that created the tracking loop: the first caller outside this module and the loop's
    own (so the subclasses' __init__ chains need no depth bookkeeping)."""
    frame = inspect.currentframe()
    try:
        while frame is not None and frame.f_globals.get('__name__') == __name__:
            frame = frame.f_back
        return os.path.abspath(frame.f_code.co_filename) if frame is not None else None
    finally:
        del frame


def _spell_out_loop_arguments(cls: type) -> None:
    """Give ``cls`` the signature it accepts: its own parameters, with ``*loop_args, **loop_kwargs`` replaced by
    TrainLoop's arguments after ``criterion`` (so help(), the docs and recipe checks list them), and
    ``preemption_safe`` keyword-only."""
    own = list(inspect.signature(vars(cls)["__init__"]).parameters.values())[1:]     # without self
    loop = list(inspect.signature(TrainLoop.__init__).parameters.values())[7:]    # after self .. criterion
    head = [p for p in own if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    keyword_only = [p for p in own if p.kind is inspect.Parameter.KEYWORD_ONLY]
    cls.__signature__ = inspect.Signature(head + loop + keyword_only)  # type: ignore[attr-defined]


for _cls in (TrainLoopCheckpoint, TrainLoopEndSave, TrainLoopCheckpointEndSave):
    _spell_out_loop_arguments(_cls)

