"""AIToolbox 1.8.0's ``aitoolbox.cloud.AWS`` classes, for code that uses them without a TrainLoop.

The TrainLoop and its callbacks do not use these: they upload through :mod:`aitoolbox_like.storage`. These classes
keep AIToolbox's constructors, methods, S3 key layout and return values, and are built from our pieces: the files
are written by :class:`~aitoolbox_like.results.savers.PyTorchLocalModelSaver` /
:class:`~aitoolbox_like.results.savers.LocalResultsSaver`, read by
:class:`~aitoolbox_like.results.model_loader.PyTorchLocalModelLoader` and moved by
the storage of their cloud (:func:`aitoolbox_like.storage.storage_for_mode`; for these S3 classes boto3's credential
and endpoint resolution, e.g. ``AWS_ENDPOINT_URL_S3``; ``pip install aitoolbox_like[s3]``). What differs from
AIToolbox:

* the cloud client is created at the first transfer, not in the constructor;
* S3 keys must be clean relative paths (no leading ``/``, no ``..`` or empty parts): a ValueError, not an odd key;
* model files are those of PyTorchLocalModelSaver (loadable with ``torch.load(weights_only=True)``), and the
  loader refuses a file that needs full unpickling unless ``allow_unsafe_pickle=True``;
* messages go to logging instead of print.

Reached as ``aitoolbox.cloud.AWS.<module>`` (under ``aitoolbox_like.compat``) or ``aitoolbox_like.cloud.AWS.<module>``.
``aitoolbox.cloud.GoogleCloud``'s classes are these over Google Cloud Storage (:mod:`.google_cloud`). The Keras savers
are not supported.
"""
import abc
import logging
import os
import posixpath
import shutil
from typing import TYPE_CHECKING, Any, List, Optional, Tuple, cast

from ..callbacks.basic import SESSender as _SESSender
from ..experiment import CHECKPOINT_DIR, MODEL_DIR, RESULTS_DIR, model_file_name
from ..experiment.folder import ExperimentFolder
from ..results.model_loader import AbstractLocalModelLoader, PyTorchLocalModelLoader
from ..results.savers import (DEFAULT_RESULTS_ROOT, LocalResultsSaver, PyTorchLocalModelSaver,
                                 new_experiment_timestamp)
from ..storage.urls import storage_for_mode

if TYPE_CHECKING:
    from ..storage.base import Storage

logger = logging.getLogger(__name__)

#: ``aitoolbox.cloud``'s lists of the cloud_save_mode values of each cloud.
s3_available_options = ['s3', 'aws_s3', 'aws']
gcs_available_options = ['gcs', 'google_storage', 'google storage']


class _LazyS3:
    """The bucket, reached through a storage of its cloud made at first use (so constructing needs neither the
    client library nor a valid bucket name yet)."""

    bucket_name: str
    #: The cloud of the bucket: 's3' here, 'gcs' for aitoolbox.cloud.GoogleCloud's classes.
    cloud_save_mode = 's3'
    _storage: Optional['Storage'] = None

    @property
    def storage(self) -> 'Storage':
        """The storage of ``bucket_name`` (an S3Storage here; keys are used as given)."""
        if self._storage is None:
            self._storage = storage_for_mode(self.cloud_save_mode, self.bucket_name)
        return self._storage

    @property
    def s3_client(self) -> Any:
        """The boto3 S3 client (AIToolbox's attribute)."""
        return cast(Any, self.storage).client


# ---------------------------------------------------------------------------------- aitoolbox.cloud.AWS.data_access

class BaseDataSaver(_LazyS3):
    """Upload local files and folders to an S3 bucket.

    Args:
        bucket_name: the S3 bucket.
    """

    def __init__(self, bucket_name: str = 'model-result') -> None:
        self.bucket_name = bucket_name

    def save_file(self, local_file_path: str, cloud_file_path: str) -> None:
        """Upload ``local_file_path`` to the key ``cloud_file_path``."""
        self.storage.save_file(os.path.expanduser(local_file_path), cloud_file_path)

    def save_folder(self, local_folder_path: str, cloud_folder_path: str) -> None:
        """Upload every file under ``local_folder_path`` to ``cloud_folder_path/<path inside the folder>`` (the
        folder's contents, not the folder itself: end ``cloud_folder_path`` with its name to keep it)."""
        local_folder_path = os.path.expanduser(local_folder_path)
        for root, _, files in os.walk(local_folder_path):
            for file_name in files:
                local_path = os.path.join(root, file_name)
                inside = os.path.relpath(local_path, local_folder_path).replace(os.sep, '/')
                self.storage.save_file(local_path, posixpath.join(cloud_folder_path, inside))


class BaseDataLoader(_LazyS3):
    """Download files from an S3 bucket into a local data folder.

    Args:
        bucket_name: the S3 bucket.
        local_base_data_folder_path: the local folder the data goes into.
    """

    def __init__(self, bucket_name: str = 'dataset-store', local_base_data_folder_path: str = '~/project/data') -> None:
        self.bucket_name = bucket_name
        self.local_base_data_folder_path = os.path.expanduser(local_base_data_folder_path)
        self.available_prepocessed_datasets: List[str] = []

    def load_file(self, cloud_file_path: str, local_file_path: str) -> None:
        """Download the key ``cloud_file_path`` to ``local_file_path``, unless that file exists already. A key
        that does not exist is logged, not raised (as in AIToolbox); other errors are raised."""
        local_file_path = os.path.expanduser(local_file_path)
        if os.path.isfile(local_file_path):
            logger.info('%s exists on the local disk; not downloading it from the cloud', local_file_path)
            return
        where = f'{self.storage.scheme}://{self.bucket_name}/{cloud_file_path}'
        logger.info('Downloading %s to %s', where, local_file_path)
        try:
            self.storage.load_file(cloud_file_path, local_file_path)
        except FileNotFoundError:
            logger.warning('%s does not exist; nothing downloaded', where)

    def exists_local_data_folder(self, data_folder_name: str, protect_local_folder: bool = True) -> bool:
        """Whether ``<local_base_data_folder_path>/<data_folder_name>`` is there to be used as it is.

        True when it exists and ``protect_local_folder``. Otherwise the folder is (re)created empty (an existing
        one deleted first) and the answer is False: the data has to be fetched.
        """
        folder = os.path.join(self.local_base_data_folder_path, data_folder_name)
        if os.path.exists(folder):
            if protect_local_folder:
                logger.info('%s exists and protect_local_folder is True: it is used as it is', folder)
                return True
            logger.info('%s exists and protect_local_folder is False: deleting it', folder)
            shutil.rmtree(folder)
        os.mkdir(folder)
        return False

    def preproc_dataset_available(self, preproc_dataset_name: str) -> bool:
        """Whether ``preproc_dataset_name`` is in ``available_prepocessed_datasets``."""
        return preproc_dataset_name in self.available_prepocessed_datasets


class AbstractDatasetFetcher(abc.ABC):
    """Fetches a dataset into the local data folder."""

    @abc.abstractmethod
    def fetch_dataset(self, dataset_name: Optional[str] = None, protect_local_folder: bool = True) -> None:
        """Download (and unpack) ``dataset_name``; keep an existing local copy when ``protect_local_folder``."""


# ------------------------------------------------------------------------------------ aitoolbox.cloud.AWS.model_save

def _experiment_key(cloud_dir_prefix: str, project_name: str, experiment_name: str, experiment_timestamp: str,
                    folder: str) -> str:
    return posixpath.join(cloud_dir_prefix, project_name, f'{experiment_name}_{experiment_timestamp}', folder)


class AbstractModelSaver(abc.ABC):
    """Saves a model to cloud storage."""

    @abc.abstractmethod
    def save_model(self, model: Any, project_name: str, experiment_name: str,
                   experiment_timestamp: Optional[str] = None, epoch: Optional[int] = None,
                   iteration_idx: Optional[int] = None, protect_existing_folder: bool = True) -> Tuple[str, str, str]:
        """Save ``model``; returns ``(path in the bucket, experiment_timestamp, local path)``."""


class BaseModelSaver(BaseDataSaver):
    """Where models go in the bucket: ``<cloud_dir_prefix>/<project>/<experiment>_<timestamp>/model`` (or
    ``checkpoint_model`` with ``checkpoint_model=True``).

    Args:
        bucket_name: the S3 bucket.
        cloud_dir_prefix: key prefix in the bucket.
        checkpoint_model: mid-training checkpoints rather than the final model.
    """

    def __init__(self, bucket_name: str = 'model-result', cloud_dir_prefix: str = '',
                 checkpoint_model: bool = False) -> None:
        BaseDataSaver.__init__(self, bucket_name)
        self.cloud_dir_prefix = cloud_dir_prefix
        self.checkpoint_model = checkpoint_model

    def create_experiment_cloud_storage_folder_structure(self, project_name: str, experiment_name: str,
                                                         experiment_timestamp: str) -> str:
        """The key of the experiment's model folder (nothing is created: S3 has no folders)."""
        return _experiment_key(self.cloud_dir_prefix, project_name, experiment_name, experiment_timestamp,
                               CHECKPOINT_DIR if self.checkpoint_model else MODEL_DIR)


class PyTorchS3ModelSaver(AbstractModelSaver, BaseModelSaver):
    """Save a PyTorch model representation dict (``model_state_dict``, ``optimizer_state_dict``, ``epoch``,
    ``hyperparams``) into the local experiment folder with PyTorchLocalModelSaver, then upload it to the same
    place under the bucket.

    Args:
        bucket_name: the S3 bucket.
        cloud_dir_prefix: key prefix in the bucket.
        local_model_result_folder_path: root folder of the projects on this machine.
        checkpoint_model: mid-training checkpoints (``checkpoint_model/``) rather than the final model (``model/``).
    """

    def __init__(self, bucket_name: str = 'model-result', cloud_dir_prefix: str = '',
                 local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT, checkpoint_model: bool = False) -> None:
        BaseModelSaver.__init__(self, bucket_name, cloud_dir_prefix, checkpoint_model)
        self.pytorch_local_saver = PyTorchLocalModelSaver(local_model_result_folder_path, checkpoint_model)

    def save_model(self, model: Any, project_name: str, experiment_name: str,
                   experiment_timestamp: Optional[str] = None, epoch: Optional[int] = None,
                   iteration_idx: Optional[int] = None, protect_existing_folder: bool = True) -> Tuple[str, str, str]:
        """Save locally, then upload (synchronously).

        Returns:
            ``('<bucket>/<key>', experiment_timestamp, local path)``; ``experiment_timestamp=None`` uses the
            current time.
        """
        if experiment_timestamp is None:
            experiment_timestamp = new_experiment_timestamp()
        model_name, model_local_path = self.pytorch_local_saver.save_model(
            model, project_name, experiment_name, experiment_timestamp, epoch, iteration_idx, protect_existing_folder)
        key = posixpath.join(self.create_experiment_cloud_storage_folder_structure(
            project_name, experiment_name, experiment_timestamp), model_name)
        self.save_file(model_local_path, key)
        return posixpath.join(self.bucket_name, key), experiment_timestamp, model_local_path


# ------------------------------------------------------------------------------------ aitoolbox.cloud.AWS.model_load

class BaseModelLoader(BaseDataLoader):
    """Download a saved model from the bucket into the local experiment folder and load it with
    ``local_model_loader``.

    Args:
        local_model_loader: an AbstractLocalModelLoader (PyTorchLocalModelLoader).
        local_model_result_folder_path: root folder of the projects on this machine.
        bucket_name: the S3 bucket.
        cloud_dir_prefix: key prefix in the bucket.
    """

    def __init__(self, local_model_loader: AbstractLocalModelLoader,
                 local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT, bucket_name: str = 'model-result',
                 cloud_dir_prefix: str = '') -> None:
        BaseDataLoader.__init__(self, bucket_name, local_model_result_folder_path)
        if not isinstance(local_model_loader, AbstractLocalModelLoader):
            raise TypeError(f'local_model_loader must be an AbstractLocalModelLoader (e.g. PyTorchLocalModelLoader), '
                            f'got {type(local_model_loader).__qualname__}')
        self.local_model_result_folder_path = self.local_base_data_folder_path
        self.cloud_dir_prefix = cloud_dir_prefix
        self.local_model_loader = local_model_loader

    def load_model(self, project_name: str, experiment_name: str, experiment_timestamp: str,
                   model_save_dir: str = CHECKPOINT_DIR, epoch_num: Optional[int] = None, **kwargs: Any) -> Any:
        """Download ``<model_save_dir>/model_<experiment>_<timestamp>[_E<epoch_num>].pth`` of the experiment
        (unless the local copy exists), then load it with the local loader (``kwargs`` go to it).

        Args:
            model_save_dir: 'checkpoint_model' (checkpoints) or 'model' (the model saved at the end of training).
            epoch_num: the checkpoint's epoch; None for the final model.
        """
        model_name = model_file_name(experiment_name, experiment_timestamp, epoch_num)
        key = posixpath.join(_experiment_key(self.cloud_dir_prefix, project_name, experiment_name,
                                             experiment_timestamp, model_save_dir), model_name)
        experiment_dir = ExperimentFolder.create_base_folder(project_name, experiment_name, experiment_timestamp,
                                                             self.local_model_result_folder_path)
        self.load_file(key, os.path.join(experiment_dir, model_save_dir, model_name))
        return self.local_model_loader.load_model(project_name, experiment_name, experiment_timestamp,
                                                  model_save_dir, epoch_num, **kwargs)


class PyTorchS3ModelLoader(BaseModelLoader):
    """Download a saved PyTorch model from S3 and initialise a model, optimizer, schedulers and grad scaler from it
    (see :class:`~aitoolbox_like.results.model_loader.PyTorchLocalModelLoader`).

    Args:
        local_model_result_folder_path: root folder of the projects on this machine.
        bucket_name: the S3 bucket.
        cloud_dir_prefix: key prefix in the bucket.
        allow_unsafe_pickle: load a file that needs full unpickling (which can run code stored in it), e.g. one
            saved by AIToolbox with objects in its hyperparameters; only for files you trust.
    """

    def __init__(self, local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT, bucket_name: str = 'model-result',
                 cloud_dir_prefix: str = '', allow_unsafe_pickle: bool = False) -> None:
        self.local_model_loader: PyTorchLocalModelLoader = PyTorchLocalModelLoader(
            local_model_result_folder_path, allow_unsafe_pickle=allow_unsafe_pickle)
        BaseModelLoader.__init__(self, self.local_model_loader, local_model_result_folder_path, bucket_name,
                                 cloud_dir_prefix)

    def init_model(self, model: Any, used_data_parallel: bool = False) -> Any:
        """Load the weights into ``model`` (after :meth:`load_model`) and return it."""
        return self.local_model_loader.init_model(model, used_data_parallel)

    def init_optimizer(self, optimizer: Any, device: str = 'cuda') -> Any:
        """Load the optimizer state into ``optimizer`` and return it."""
        return self.local_model_loader.init_optimizer(optimizer, device)

    def init_scheduler(self, scheduler_callbacks_list: List[Any], ignore_saved: bool = False,
                       ignore_missing_saved: bool = False) -> List[Any]:
        """Load the scheduler states into the scheduler callbacks and return the list."""
        return self.local_model_loader.init_scheduler(scheduler_callbacks_list, ignore_saved, ignore_missing_saved)

    def init_amp(self, amp_scaler: Any) -> Any:
        """Load the grad scaler state into ``amp_scaler`` and return it."""
        return self.local_model_loader.init_amp(amp_scaler)


# ---------------------------------------------------------------------------------- aitoolbox.cloud.AWS.results_save

class AbstractResultsSaver(abc.ABC):
    """Saves an evaluated result package and the training history to cloud storage."""

    @abc.abstractmethod
    def save_experiment_results(self, result_package: Any, training_history: Any, project_name: str,
                                experiment_name: str, experiment_timestamp: Optional[str] = None,
                                save_true_pred_labels: bool = False, separate_files: bool = False,
                                protect_existing_folder: bool = True) -> Tuple[str, str]:
        """Save the results; returns ``(path of the main results file in the bucket, experiment_timestamp)``."""


class BaseResultsSaver(BaseDataSaver):
    """Where results go in the bucket: ``<cloud_dir_prefix>/<project>/<experiment>_<timestamp>/results``.

    Args:
        bucket_name: the S3 bucket.
        cloud_dir_prefix: key prefix in the bucket.
    """

    def __init__(self, bucket_name: str = 'model-result', cloud_dir_prefix: str = '') -> None:
        BaseDataSaver.__init__(self, bucket_name)
        self.cloud_dir_prefix = cloud_dir_prefix

    def create_experiment_cloud_storage_folder_structure(self, project_name: str, experiment_name: str,
                                                         experiment_timestamp: str) -> str:
        """The key of the experiment's results folder."""
        return _experiment_key(self.cloud_dir_prefix, project_name, experiment_name, experiment_timestamp,
                               RESULTS_DIR)


class S3ResultsSaver(AbstractResultsSaver, BaseResultsSaver):
    """Write the results files into the local experiment folder with LocalResultsSaver, then upload each to the
    same place under the bucket.

    Args:
        bucket_name: the S3 bucket.
        cloud_dir_prefix: key prefix in the bucket.
        local_model_result_folder_path: root folder of the projects on this machine.
    """

    def __init__(self, bucket_name: str = 'model-result', cloud_dir_prefix: str = '',
                 local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT) -> None:
        BaseResultsSaver.__init__(self, bucket_name, cloud_dir_prefix)
        self.local_results_saver = LocalResultsSaver(local_model_result_folder_path)

    def save_experiment_results(self, result_package: Any, training_history: Any, project_name: str,
                                experiment_name: str, experiment_timestamp: Optional[str] = None,
                                save_true_pred_labels: bool = False, separate_files: bool = False,
                                protect_existing_folder: bool = True) -> Tuple[str, str]:
        """Save as LocalResultsSaver does (one results file, or separate ones with ``separate_files``), then
        upload every file written (synchronously).

        Returns:
            ``('<bucket>/<key of the main results file>', experiment_timestamp)``.
        """
        if experiment_timestamp is None:
            experiment_timestamp = new_experiment_timestamp()
        save = self.local_results_saver.save_experiment_results_separate_files if separate_files \
            else self.local_results_saver.save_experiment_results
        saved = save(result_package, training_history, project_name, experiment_name, experiment_timestamp,
                     save_true_pred_labels, protect_existing_folder)
        results_key = self.create_experiment_cloud_storage_folder_structure(project_name, experiment_name,
                                                                            experiment_timestamp)
        for path_in_results_dir, local_path in saved:
            self.save_file(local_path, posixpath.join(results_key, path_in_results_dir))
        return posixpath.join(self.bucket_name, results_key, saved[0][0]), experiment_timestamp


# ------------------------------------------------------------------------- aitoolbox.cloud.AWS.simple_email_service

class SESSender(_SESSender):
    """AIToolbox's SESSender: as :class:`aitoolbox_like.callbacks.basic.SESSender`, except that a send that SES
    rejects (a botocore ClientError) is logged and returns None instead of raising, as in AIToolbox."""

    def send_email(self, subject: str, body: str,  # type: ignore[override]
                   attachment_file_paths: Optional[Any] = None) -> Optional[str]:
        """Send the email; returns SES's MessageId, or None when SES rejected it (logged)."""
        from botocore.exceptions import ClientError
        try:
            return super().send_email(subject, body, attachment_file_paths)
        except ClientError as error:
            logger.error('SES did not send %r: %s', subject, error.response.get('Error', {}).get('Message', error))
            return None
