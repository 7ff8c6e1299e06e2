"""LogUpload: a log file into the experiment's cloud folder after every epoch, at the end and on failure
(re-exported by :mod:`.basic`, AIToolbox's home of it)."""
import logging
import os
import shutil
from typing import Optional

from ..experiment import get_experiment, is_cloud_mode
from ..storage.local import write_atomically
from .abstract import AbstractExperimentCallback

# The logger keeps the name of the module these callbacks were split from (basic), which logging set-ups name.
logger = logging.getLogger('aitoolbox_like.callbacks.basic')


class LogUpload(AbstractExperimentCallback):
    """Upload a log file into the experiment's cloud folder after every epoch, at the end of training and when
    training fails: ``<cloud_dir_prefix>/<project>/<experiment>_<timestamp>/<log file name>``.

    The file is copied into the local experiment folder under its name (a consistent snapshot even while the
    logger keeps writing) and the copy goes through the loop's shared background uploader, so training
    does not wait for the network.

    Args:
        log_file_path (str): the log file (e.g. the file a logging.FileHandler writes, or a tmux/tee log).
        fail_if_cloud_missing (bool): raise ValueError at registration when there is no cloud cloud_save_mode
            (False: log a warning and only keep the log where it is).
        project_name: the experiment (None: from the tracking TrainLoop; see AbstractExperimentCallback), as are
            the following five.
        experiment_name: see project_name.
        local_model_result_folder_path: see project_name.
        cloud_save_mode: see project_name.
        bucket_name: see project_name.
        cloud_dir_prefix: see project_name.
    """

    def __init__(self, log_file_path: str = '~/project/training.log', fail_if_cloud_missing: bool = True,
                 project_name: Optional[str] = None, experiment_name: Optional[str] = None,
                 local_model_result_folder_path: Optional[str] = None, cloud_save_mode: Optional[str] = None,
                 bucket_name: Optional[str] = None, cloud_dir_prefix: Optional[str] = None) -> None:
        super().__init__('Upload logging file to cloud', project_name, experiment_name,
                         local_model_result_folder_path, cloud_save_mode, bucket_name, cloud_dir_prefix,
                         execution_order=1500, device_idx_execution=0)
        self.log_file_path = os.path.abspath(os.path.expanduser(log_file_path))
        self.log_filename = os.path.basename(self.log_file_path)
        self.fail_if_cloud_missing = fail_if_cloud_missing
        self.uploads_on = False
        self._warned_missing = False

    def on_train_loop_registration(self) -> None:
        """Infer the experiment; check that uploads are possible (raise, or warn with
        fail_if_cloud_missing=False)."""
        self.try_infer_experiment_details(infer_cloud_details=True)
        self.uploads_on = is_cloud_mode(self.cloud_save_mode)     # raises for an unknown mode
        if self.uploads_on:
            return
        message = (f'LogUpload: cloud_save_mode={self.cloud_save_mode!r} uploads nothing, so {self.log_file_path} '
                   f"is not uploaded; use cloud_save_mode='s3' (or 'gcs', 'azure') with a bucket_name")
        if self.fail_if_cloud_missing:
            raise ValueError(f'{message} (or fail_if_cloud_missing=False to train without the upload)')
        logger.warning('%s; the log could be lost with this machine', message)

    def on_epoch_end(self) -> None:
        """Upload the log."""
        self.upload_log_file()

    def on_train_end(self) -> None:
        """Upload the log."""
        self.upload_log_file()

    def on_exception(self, exception: BaseException) -> None:
        """Upload the log of the failed run (an upload error is only logged)."""
        # The log of a failed run is the one most worth keeping.
        try:
            self.upload_log_file()
        except Exception as error:
            logger.error('LogUpload could not upload %s after %s: %s', self.log_file_path,
                         type(exception).__name__, error)

    def upload_log_file(self) -> Optional[str]:
        """Snapshot the log file into the experiment folder and queue its upload; returns the snapshot's path
        (None when uploads are off or the log file does not exist yet, which is warned about once)."""
        if not self.uploads_on:
            return None
        if not os.path.isfile(self.log_file_path):
            if not self._warned_missing:
                self._warned_missing = True
                logger.warning('LogUpload: log file %s does not exist (yet); nothing uploaded', self.log_file_path)
            return None
        experiment = get_experiment(self.train_loop_obj, self.project_name, self.experiment_name,
                                    self.local_model_result_folder_path)
        snapshot = os.path.join(experiment.claim(), self.log_filename)
        if os.path.abspath(snapshot) != self.log_file_path:
            # Replaced atomically: an upload still reading the previous snapshot keeps reading a whole file.
            with open(self.log_file_path, 'rb') as source:
                write_atomically(snapshot, lambda target: shutil.copyfileobj(source, target, 1024 * 1024))
        self.upload_experiment_files([snapshot])
        return snapshot
