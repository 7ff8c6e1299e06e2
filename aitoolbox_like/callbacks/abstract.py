"""The callback base classes users subclass: :class:`AbstractCallback` (every hook the loop calls, a documented
no-op; defined with the loop in aitoolbox_like/engine/callback.py), ``StopTraining`` and ``TrainingInterrupted``, and
:class:`AbstractExperimentCallback`, the base of callbacks that write into an experiment folder."""
import os
from typing import TYPE_CHECKING

from ..engine.callback import (HOOK_NAMES, HOOKS_WITH_ARGUMENTS, AbstractCallback,  # noqa: F401  (their public path)
                               AbstractScheduler, StopTraining, TrainingInterrupted, overrides_hook)
from ..experiment import get_experiment, get_uploader, is_cloud_mode

if TYPE_CHECKING:
    from ..engine.train_loop import TrainLoop


class AbstractExperimentCallback(AbstractCallback):
    """A callback that writes into an experiment folder (project / experiment / local folder / cloud).

    Missing details are taken from a tracking TrainLoop (TrainLoopCheckpoint and friends). With a plain TrainLoop
    and no arguments, a callback that infers its details while it is registered (in ``on_train_loop_registration``,
    as every experiment callback of this library does) writes under
    ``./experiments/<project>/<experiment>_<timestamp>``; called at any other time,
    :meth:`try_infer_experiment_details` raises AttributeError for the missing details, as AIToolbox's does.

    Args:
        callback_name (str): a readable name.
        project_name (str or None): name of the project folder.
        experiment_name (str or None): name of the experiment folder.
        local_model_result_folder_path (str or None): root folder under which the project folder lives.
        cloud_save_mode (str or None): where results are uploaded (None: local only).
        bucket_name (str or None): the bucket (Azure: container) results are uploaded to.
        cloud_dir_prefix (str or None): key prefix in the bucket.
        execution_order: as for AbstractCallback.
        device_idx_execution: as for AbstractCallback.
    """

    DEFAULT_PROJECT_NAME = 'default_project'
    DEFAULT_EXPERIMENT_NAME = 'experiment'
    DEFAULT_LOCAL_FOLDER = 'experiments'

    def __init__(self, callback_name, project_name=None, experiment_name=None, local_model_result_folder_path=None,
                 cloud_save_mode=None, bucket_name=None, cloud_dir_prefix=None,
                 execution_order=0, device_idx_execution=None):
        # AIToolbox's argument order, so subclasses written for AIToolbox keep working unchanged.
        super().__init__(callback_name, execution_order, device_idx_execution)
        self.project_name = project_name
        self.experiment_name = experiment_name
        self.local_model_result_folder_path = local_model_result_folder_path
        self.cloud_save_mode = cloud_save_mode
        self.bucket_name = bucket_name
        self.cloud_dir_prefix = cloud_dir_prefix
        # True while the loop registers this callback: details a plain TrainLoop lacks then get our defaults.
        self._registering = False

    def register_train_loop_object(self, train_loop_obj: 'TrainLoop') -> 'AbstractCallback':
        """Attach the callback to a loop and call on_train_loop_registration, where missing experiment details
        get the defaults (see the class docstring)."""
        self._registering = True
        try:
            return super().register_train_loop_object(train_loop_obj)
        finally:
            self._registering = False

    def try_infer_experiment_details(self, infer_cloud_details=False):
        """Fill in the experiment details that were not given, from the TrainLoop when it tracks an experiment.

        A plain TrainLoop has none: while the callback is being registered the defaults are used (a local folder
        under the working directory, no upload); at any other time this raises AttributeError, as AIToolbox's
        method does."""
        self._infer_experiment_details(infer_cloud_details, use_defaults=getattr(self, '_registering', False))

    def infer_experiment_details(self, infer_cloud_details=False):
        """As :meth:`try_infer_experiment_details`, using the defaults for what a plain TrainLoop does not give at
        any time (for callbacks that name their experiment later than their registration, e.g. at on_train_begin)."""
        self._infer_experiment_details(infer_cloud_details, use_defaults=True)

    def _infer_experiment_details(self, infer_cloud_details, use_defaults):
        loop = self.train_loop_obj
        if loop is None:
            raise RuntimeError(f'{self.callback_name}: try_infer_experiment_details() needs the callback to be '
                               f'registered on a TrainLoop first (call it from on_train_loop_registration).')
        defaults = {'project_name': self.DEFAULT_PROJECT_NAME, 'experiment_name': self.DEFAULT_EXPERIMENT_NAME,
                    'local_model_result_folder_path': os.path.abspath(self.DEFAULT_LOCAL_FOLDER)}
        # A plain TrainLoop whose saving callback (e.g. ModelCheckpoint) already named the experiment: its folder,
        # not a default one next to it.
        experiment = getattr(loop, 'experiment', None) if use_defaults else None
        named = {} if experiment is None else {'project_name': experiment.project_name,
                                               'experiment_name': experiment.experiment_name,
                                               'local_model_result_folder_path': experiment.root}
        for attr, default in defaults.items():
            if getattr(self, attr) is not None:
                continue
            value = getattr(loop, attr, None)
            if value is None:
                value = named.get(attr)
            if value is None and not use_defaults:
                raise AttributeError(f'{self.callback_name}: the TrainLoop ({type(loop).__name__}) does not track an '
                                     f'experiment, so {attr} cannot be taken from it; give project_name, '
                                     f'experiment_name and local_model_result_folder_path to the callback, or use a '
                                     f'TrainLoopCheckpoint / TrainLoopEndSave')
            setattr(self, attr, value if value is not None else default)
        if infer_cloud_details:
            missing = [attr for attr in ('cloud_save_mode', 'bucket_name', 'cloud_dir_prefix')
                       if getattr(self, attr) is None]
            # AIToolbox infers the cloud details only when none was given, and then needs all of them.
            if len(missing) == 3 and not use_defaults and not all(hasattr(loop, attr) for attr in missing):
                raise AttributeError(f'{self.callback_name}: the TrainLoop ({type(loop).__name__}) does not track an '
                                     f'experiment, so the cloud details cannot be taken from it; give '
                                     f'cloud_save_mode, bucket_name and cloud_dir_prefix to the callback')
            for attr in missing:
                setattr(self, attr, getattr(loop, attr, None))
        self.local_model_result_folder_path = os.path.expanduser(self.local_model_result_folder_path)

    def upload_experiment_files(self, paths):
        """Queue files written inside the local experiment folder for upload to the same keys in the cloud
        experiment folder, when this callback has a cloud ``cloud_save_mode`` (S3, GCS, Azure). One background
        uploader per loop
        serves every callback; training does not wait, and the end of fit waits for pending uploads."""
        loop = self.train_loop_obj
        if not paths or not is_cloud_mode(self.cloud_save_mode) or not loop.is_main_process():
            return
        uploader = getattr(loop, 'experiment_uploader', None)
        if uploader is None:
            experiment = get_experiment(loop, self.project_name, self.experiment_name,
                                        self.local_model_result_folder_path)
            uploader = get_uploader(loop, experiment, self.cloud_save_mode, self.bucket_name, self.cloud_dir_prefix)
            if uploader is None:
                return
        for path in paths:
            uploader.upload_experiment_file(path)

    @property
    def experiment_dir_path(self):
        """Local folder of this experiment: <local folder>/<project>/<experiment>_<timestamp>."""
        return os.path.join(self.local_model_result_folder_path, self.project_name,
                            f'{self.experiment_name}_{self.train_loop_obj.experiment_timestamp}')
