"""Tracking TrainLoops: a TrainLoop with saving callbacks registered for you (AIToolbox's classes).

- TrainLoopCheckpoint: full-state checkpoint after every epoch (or every ``iteration_save_freq`` batches).
- TrainLoopEndSave: the final model and the result packages' results at the end of training.
- TrainLoopCheckpointEndSave: both.

All three take ``preemption_safe=True`` (last): a SIGTERM / SIGINT then checkpoints and stops cleanly
(PreemptionCheckpoint, added by callbacks/defaults.py when a checkpoint callback is registered); False turns it off.

All three write to ``<local_model_result_folder_path>/<project_name>/<experiment_name>_<timestamp>/`` and, with
``cloud_save_mode='s3'`` (``'gcs'``, ``'azure'``), upload the same files to ``s3://<bucket_name>/<cloud_dir_prefix>/``
(``gs://``, ``az://``; the bucket is checked at the start of fit, never when the loop is created). Our bookkeeping (pointers, run claim, upload journal) lives
in ``<local_model_result_folder_path>/.aitoolbox_like/<project_name>/``, outside the project folder
(aitoolbox_like.experiment).
"""
import inspect
import os

from .callbacks.model_save import ModelCheckpoint, ModelIterationCheckpoint, ModelTrainEndSave
from .experiment import normalize_cloud_save_mode
from .predictions import append_predictions, torch_cat_transf
from .storage.base import validate_key_part
from .train_loop import TrainLoop


def _caller_file():
    """The file of the code that created the tracking loop: the first caller outside this module (so the
    subclasses' __init__ chains need no depth bookkeeping)."""
    frame = inspect.currentframe()
    try:
        while frame is not None and frame.f_globals.get('__name__') == __name__:
            frame = frame.f_back
        return os.path.abspath(frame.f_code.co_filename) if frame is not None else None
    finally:
        del frame


class _TrackingMixin(TrainLoop):
    """What the tracking loops add to a TrainLoop: the experiment's names and where it is saved."""

    def _set_tracking_attributes(self, project_name, experiment_name, local_model_result_folder_path, hyperparams,
                                 cloud_save_mode, bucket_name, cloud_dir_prefix, source_dirs, caller_file):
        validate_key_part(project_name, 'project_name')
        validate_key_part(experiment_name, 'experiment_name')
        normalize_cloud_save_mode(cloud_save_mode)
        if hyperparams is None:
            hyperparams = {}
        if not isinstance(hyperparams, dict):
            raise TypeError(f'hyperparams must be a dict, got {type(hyperparams).__qualname__}')
        self.project_name = project_name
        self.experiment_name = experiment_name
        self.local_model_result_folder_path = os.path.expanduser(os.fspath(local_model_result_folder_path))
        # As in AIToolbox, the dict is completed in place so the caller sees what is saved.
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

    def _register_checkpoint_callback(self, rm_subopt_local_models, num_best_checkpoints_kept, iteration_save_freq):
        if isinstance(iteration_save_freq, bool) or not isinstance(iteration_save_freq, int) or iteration_save_freq < 0:
            raise ValueError(f'iteration_save_freq must be an int >= 0 (0: checkpoint after every epoch), got '
                             f'{iteration_save_freq!r}')
        self.rm_subopt_local_models = rm_subopt_local_models
        self.iteration_save_freq = iteration_save_freq
        args = (self.project_name, self.experiment_name, self.local_model_result_folder_path, self.hyperparams)
        kwargs = dict(cloud_save_mode=self.cloud_save_mode, bucket_name=self.bucket_name,
                      cloud_dir_prefix=self.cloud_dir_prefix, rm_subopt_local_models=rm_subopt_local_models,
                      num_best_checkpoints_kept=num_best_checkpoints_kept)
        if iteration_save_freq == 0:
            callback = ModelCheckpoint(*args, **kwargs)
        else:
            callback = ModelIterationCheckpoint(iteration_save_freq, *args, **kwargs)
        self.callbacks_handler.register_callbacks([callback], cache_callbacks=True)


class TrainLoopCheckpoint(_TrackingMixin, TrainLoop):
    """TrainLoop that checkpoints the full training state after every epoch (ModelCheckpoint) or every
    ``iteration_save_freq`` batches (ModelIterationCheckpoint). Arguments as in AIToolbox; see
    ModelCheckpoint for rm_subopt_local_models / num_best_checkpoints_kept."""

    def __init__(self, model, train_loader, validation_loader, test_loader, optimizer, criterion, project_name,
                 experiment_name, local_model_result_folder_path, hyperparams, cloud_save_mode='s3',
                 bucket_name='model-result', cloud_dir_prefix='', source_dirs=(), rm_subopt_local_models=False,
                 num_best_checkpoints_kept=2, iteration_save_freq=0, collate_batch_pred_fn=append_predictions,
                 pred_transform_fn=torch_cat_transf, end_auto_eval=True, lazy_experiment_save=False,
                 print_callbacks=False, gpu_mode='single', cuda_device_idx=None, use_amp=False, progress_bar=None,
                 preemption_safe=True):
        TrainLoop.__init__(self, model, train_loader, validation_loader, test_loader, optimizer, criterion,
                           collate_batch_pred_fn, pred_transform_fn, end_auto_eval, lazy_experiment_save,
                           print_callbacks, gpu_mode, cuda_device_idx, use_amp, progress_bar)
        # Read by callbacks/defaults.py: False leaves out the default PreemptionCheckpoint.
        self.preemption_safe = bool(preemption_safe)
        self._set_tracking_attributes(project_name, experiment_name, local_model_result_folder_path, hyperparams,
                                      cloud_save_mode, bucket_name, cloud_dir_prefix, source_dirs, _caller_file())
        self._register_checkpoint_callback(rm_subopt_local_models, num_best_checkpoints_kept, iteration_save_freq)


class TrainLoopEndSave(_TrackingMixin, TrainLoop):
    """TrainLoop that saves the final model and evaluates the result packages at the end of training
    (ModelTrainEndSave). Arguments as in AIToolbox."""

    def __init__(self, model, train_loader, validation_loader, test_loader, optimizer, criterion, project_name,
                 experiment_name, local_model_result_folder_path, hyperparams, val_result_package=None,
                 test_result_package=None, cloud_save_mode='s3', bucket_name='model-result', cloud_dir_prefix='',
                 source_dirs=(), collate_batch_pred_fn=append_predictions, pred_transform_fn=torch_cat_transf,
                 end_auto_eval=True, lazy_experiment_save=False, print_callbacks=False, gpu_mode='single',
                 cuda_device_idx=None, use_amp=False, progress_bar=None, preemption_safe=True):
        TrainLoop.__init__(self, model, train_loader, validation_loader, test_loader, optimizer, criterion,
                           collate_batch_pred_fn, pred_transform_fn, end_auto_eval, lazy_experiment_save,
                           print_callbacks, gpu_mode, cuda_device_idx, use_amp, progress_bar)
        self.preemption_safe = bool(preemption_safe)     # read by callbacks/defaults.py
        self._set_tracking_attributes(project_name, experiment_name, local_model_result_folder_path, hyperparams,
                                      cloud_save_mode, bucket_name, cloud_dir_prefix, source_dirs, _caller_file())
        self.val_result_package = val_result_package
        self.test_result_package = test_result_package
        self.check_if_result_packages_possible()
        self.callbacks_handler.register_callbacks([ModelTrainEndSave(
            self.project_name, self.experiment_name, self.local_model_result_folder_path, self.hyperparams,
            val_result_package, test_result_package, cloud_save_mode=cloud_save_mode, bucket_name=bucket_name,
            cloud_dir_prefix=cloud_dir_prefix)], cache_callbacks=True)

    def check_if_result_packages_possible(self):
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
    """TrainLoopEndSave plus a checkpoint after every epoch (or every ``iteration_save_freq`` batches)."""

    def __init__(self, model, train_loader, validation_loader, test_loader, optimizer, criterion, project_name,
                 experiment_name, local_model_result_folder_path, hyperparams, val_result_package=None,
                 test_result_package=None, cloud_save_mode='s3', bucket_name='model-result', cloud_dir_prefix='',
                 source_dirs=(), rm_subopt_local_models=False, num_best_checkpoints_kept=2, iteration_save_freq=0,
                 collate_batch_pred_fn=append_predictions, pred_transform_fn=torch_cat_transf, end_auto_eval=True,
                 lazy_experiment_save=False, print_callbacks=False, gpu_mode='single', cuda_device_idx=None,
                 use_amp=False, progress_bar=None, preemption_safe=True):
        TrainLoopEndSave.__init__(self, model, train_loader, validation_loader, test_loader, optimizer, criterion,
                                  project_name, experiment_name, local_model_result_folder_path, hyperparams,
                                  val_result_package, test_result_package, cloud_save_mode, bucket_name,
                                  cloud_dir_prefix, source_dirs, collate_batch_pred_fn, pred_transform_fn,
                                  end_auto_eval, lazy_experiment_save, print_callbacks, gpu_mode, cuda_device_idx,
                                  use_amp, progress_bar, preemption_safe)
        self._register_checkpoint_callback(rm_subopt_local_models, num_best_checkpoints_kept, iteration_save_freq)
