"""The callback base classes: every hook a TrainLoop calls, as a no-op."""
import logging
import os

logger = logging.getLogger(__name__)


class StopTraining(Exception):
    """Raise from any hook to end training cleanly: on_train_end still runs and fit returns."""


# Every hook the loop calls, in the order of a fit. The handler dispatches a hook only to
# callbacks whose class overrides it, so adding hooks here costs nothing per step.
HOOK_NAMES = (
    'on_train_loop_registration',
    'on_multiprocess_start',
    'on_train_begin',
    'on_epoch_begin',
    'on_batch_begin',
    'on_after_backward',
    'on_after_gradient_update',
    'on_after_optimizer_step',
    'on_batch_end',
    'on_epoch_end',
    'on_train_end',
    'on_exception',
    'on_after_batch_prediction',
)


class AbstractCallback:
    """Base class of every callback.

    Args:
        callback_name (str): a readable name, shown by print_callbacks and in error messages.
        execution_order (int): callbacks run in ascending order (stable for ties).
        device_idx_execution (int or None): None runs the callback in every process; an int k
            runs it only in the process of global rank k of a distributed run. In a single-process
            run every callback runs.
    """

    def __init__(self, callback_name, execution_order=0, device_idx_execution=None):
        self.callback_name = callback_name
        self.execution_order = execution_order
        self.device_idx_execution = device_idx_execution
        self.train_loop_obj = None

    def register_train_loop_object(self, train_loop_obj):
        self.train_loop_obj = train_loop_obj
        self.on_train_loop_registration()
        return self

    @property
    def message_service(self):
        """The loop's :class:`~aitoolbox_like.message_passing.MessageService`, through which callbacks pass
        data to each other; None before registration.

        Read from the loop on every access rather than copied at registration, so subclasses that override
        register_train_loop_object without calling super() get it too. Assigning it (as AIToolbox callbacks
        do in their own register_train_loop_object) pins that service for this callback.
        """
        pinned = self.__dict__.get('_message_service')
        if pinned is not None:
            return pinned
        return getattr(self.__dict__.get('train_loop_obj'), 'message_service', None)

    @message_service.setter
    def message_service(self, service):
        self.__dict__['_message_service'] = service

    @property
    def state_key(self):
        """Name of this callback's state inside a checkpoint; subclasses add their distinguishing
        arguments so that two instances of one class keep separate state."""
        return type(self).__name__

    def state_dict(self):
        """State to keep in checkpoints (only tensors, numbers, strings, lists and dicts), or None."""
        return None

    def load_state_dict(self, state_dict):
        pass

    def on_train_loop_registration(self):
        pass

    def on_multiprocess_start(self):
        pass

    def on_train_begin(self):
        pass

    def on_epoch_begin(self):
        pass

    def on_batch_begin(self):
        pass

    def on_after_backward(self):
        pass

    def on_after_gradient_update(self, optimizer_idx):
        pass

    def on_after_optimizer_step(self):
        pass

    def on_batch_end(self):
        pass

    def on_epoch_end(self):
        pass

    def on_train_end(self):
        pass

    def on_exception(self, exception):
        pass

    def on_after_batch_prediction(self, y_pred_batch, y_test_batch, metadata_batch, dataset_info):
        pass

    def __repr__(self):
        return f'{type(self).__name__}({self.callback_name!r}, execution_order={self.execution_order}, ' \
               f'device_idx_execution={self.device_idx_execution})'


class AbstractExperimentCallback(AbstractCallback):
    """A callback that writes into an experiment folder (project / experiment / local folder / cloud).

    Missing details are taken from a tracking TrainLoop (TrainLoopCheckpoint and friends); with a plain
    TrainLoop and no arguments the callback writes under ``./experiments/<project>/<experiment>_<timestamp>``.

    Args:
        callback_name (str): a readable name.
        project_name, experiment_name (str or None): names of the project and experiment folders.
        local_model_result_folder_path (str or None): root folder under which the project folder lives.
        cloud_save_mode, bucket_name, cloud_dir_prefix (str or None): where results are uploaded (None: local only).
        execution_order, device_idx_execution: as for AbstractCallback.
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

    def try_infer_experiment_details(self, infer_cloud_details=False):
        """Fill in the experiment details that were not given, from the TrainLoop when it tracks an
        experiment, else from defaults (a local folder under the working directory)."""
        loop = self.train_loop_obj
        if loop is None:
            raise RuntimeError(f'{self.callback_name}: try_infer_experiment_details() needs the callback to be '
                               f'registered on a TrainLoop first (call it from on_train_loop_registration).')
        for attr, default in (('project_name', self.DEFAULT_PROJECT_NAME),
                              ('experiment_name', self.DEFAULT_EXPERIMENT_NAME),
                              ('local_model_result_folder_path', os.path.abspath(self.DEFAULT_LOCAL_FOLDER))):
            if getattr(self, attr) is None:
                setattr(self, attr, getattr(loop, attr, None) or default)
        if infer_cloud_details:
            for attr in ('cloud_save_mode', 'bucket_name', 'cloud_dir_prefix'):
                if getattr(self, attr) is None:
                    setattr(self, attr, getattr(loop, attr, None))
        self.local_model_result_folder_path = os.path.expanduser(self.local_model_result_folder_path)

    def upload_experiment_files(self, paths):
        """Queue files written inside the local experiment folder for upload to the same keys in the cloud
        experiment folder, when this callback has an S3 ``cloud_save_mode``. One background uploader per loop
        serves every callback; training does not wait, and the end of fit waits for pending uploads."""
        from ..experiment import get_experiment, get_uploader, is_s3_mode
        loop = self.train_loop_obj
        if not paths or not is_s3_mode(self.cloud_save_mode) or not loop.is_main_process():
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
