"""AIToolbox 1.8.0's ``aitoolbox.cloud.GoogleCloud`` classes: its Google Cloud Storage savers, loaders and data access.

As in AIToolbox they are the ``aitoolbox.cloud.AWS`` classes (:mod:`.cloud`) over a Google Cloud Storage bucket:
the same constructors, methods, key layout and return values (``'<bucket>/<key>'``). The bucket is reached through
:class:`~aitoolbox_like.storage.gcs.GCSStorage` (Google's client, its project and credentials found as Google
documents, ``STORAGE_EMULATOR_HOST`` for an emulator; ``pip install aitoolbox_like[gcs]``). What differs from
AIToolbox: the client is made and the bucket reached at the first transfer, not in the constructor (so a missing
bucket is reported there, naming it); keys must be clean relative paths; messages go to logging.

Reached as ``aitoolbox.cloud.GoogleCloud.<module>`` (under ``aitoolbox_like.compat``) or
``aitoolbox_like.cloud.GoogleCloud.<module>``. ``KerasGoogleStorageModelSaver`` is not supported (PyTorch only).
"""
from typing import Any, cast

from ..results.savers import DEFAULT_RESULTS_ROOT
from .cloud import (BaseDataLoader, BaseDataSaver, BaseModelLoader, BaseModelSaver, BaseResultsSaver,
                    PyTorchS3ModelLoader, PyTorchS3ModelSaver, S3ResultsSaver)


class _GoogleBucket:
    """What AIToolbox's Google classes add: the Google client and bucket objects, made at first use."""

    cloud_save_mode = 'gcs'
    storage: Any

    @property
    def gcs_client(self) -> Any:
        """Google's ``storage.Client`` (AIToolbox's attribute)."""
        return cast(Any, self.storage).client

    @property
    def gcs_bucket(self) -> Any:
        """Google's ``Bucket`` object of ``bucket_name`` (AIToolbox's attribute)."""
        return self.gcs_client.bucket(self.storage.bucket_name)


# ----------------------------------------------------------------------- aitoolbox.cloud.GoogleCloud.data_access

class BaseGoogleStorageDataSaver(_GoogleBucket, BaseDataSaver):
    """Upload local files and folders to a Google Cloud Storage bucket.

    Args:
        bucket_name: the Google Cloud Storage bucket.
    """


class BaseGoogleStorageDataLoader(_GoogleBucket, BaseDataLoader):
    """Download files from a Google Cloud Storage bucket into a local data folder.

    Args:
        bucket_name: the Google Cloud Storage bucket.
        local_dataset_folder_path: the local folder the data goes into.
    """

    def __init__(self, bucket_name: str = 'dataset-store', local_dataset_folder_path: str = '~/project/data') -> None:
        BaseDataLoader.__init__(self, bucket_name, local_dataset_folder_path)
        self.local_dataset_folder_path = self.local_base_data_folder_path


# ------------------------------------------------------------------------ aitoolbox.cloud.GoogleCloud.model_save

class BaseModelGoogleStorageSaver(BaseGoogleStorageDataSaver, BaseModelSaver):
    """Where models go in the bucket: ``<cloud_dir_prefix>/<project>/<experiment>_<timestamp>/model`` (or
    ``checkpoint_model`` with ``checkpoint_model=True``).

    Args:
        bucket_name: the Google Cloud Storage bucket.
        cloud_dir_prefix: key prefix in the bucket.
        checkpoint_model: mid-training checkpoints rather than the final model.
    """

    def __init__(self, bucket_name: str = 'model-result', cloud_dir_prefix: str = '',
                 checkpoint_model: bool = False) -> None:
        BaseModelSaver.__init__(self, bucket_name, cloud_dir_prefix, checkpoint_model)


class PyTorchGoogleStorageModelSaver(BaseModelGoogleStorageSaver, PyTorchS3ModelSaver):
    """Save a PyTorch model representation dict into the local experiment folder, then upload it to the same place
    under the bucket; ``save_model`` returns ``('<bucket>/<key>', experiment_timestamp, local path)``.

    Args:
        bucket_name: the Google Cloud Storage bucket.
        cloud_dir_prefix: key prefix in the bucket.
        local_model_result_folder_path: root folder of the projects on this machine.
        checkpoint_model: mid-training checkpoints (``checkpoint_model/``) rather than the final model (``model/``).
    """

    def __init__(self, bucket_name: str = 'model-result', cloud_dir_prefix: str = '',
                 local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT, checkpoint_model: bool = False) -> None:
        PyTorchS3ModelSaver.__init__(self, bucket_name, cloud_dir_prefix, local_model_result_folder_path,
                                     checkpoint_model)


# ------------------------------------------------------------------------ aitoolbox.cloud.GoogleCloud.model_load

class BaseModelGoogleStorageLoader(BaseGoogleStorageDataLoader, BaseModelLoader):
    """Download a saved model from the bucket into the local experiment folder and load it with
    ``local_model_loader``.

    Args:
        local_model_loader: an AbstractLocalModelLoader (PyTorchLocalModelLoader).
        local_model_result_folder_path: root folder of the projects on this machine.
        bucket_name: the Google Cloud Storage bucket.
        cloud_dir_prefix: key prefix in the bucket.
    """

    def __init__(self, local_model_loader: Any, local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT,
                 bucket_name: str = 'model-result', cloud_dir_prefix: str = '') -> None:
        BaseModelLoader.__init__(self, local_model_loader, local_model_result_folder_path, bucket_name,
                                 cloud_dir_prefix)
        self.local_dataset_folder_path = self.local_base_data_folder_path


class PyTorchGoogleStorageModelLoader(BaseModelGoogleStorageLoader, PyTorchS3ModelLoader):
    """Download a saved PyTorch model from Google Cloud Storage and initialise a model, optimizer, schedulers and grad
    scaler from it (``load_model``, then ``init_model`` / ``init_optimizer`` / ``init_scheduler`` / ``init_amp``).

    Args:
        local_model_result_folder_path: root folder of the projects on this machine.
        bucket_name: the Google Cloud Storage bucket.
        cloud_dir_prefix: key prefix in the bucket.
        allow_unsafe_pickle: load a file that needs full unpickling (only for files you trust).
    """

    def __init__(self, local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT, bucket_name: str = 'model-result',
                 cloud_dir_prefix: str = '', allow_unsafe_pickle: bool = False) -> None:
        PyTorchS3ModelLoader.__init__(self, local_model_result_folder_path, bucket_name, cloud_dir_prefix,
                                      allow_unsafe_pickle)
        self.local_dataset_folder_path = self.local_base_data_folder_path


# ---------------------------------------------------------------------- aitoolbox.cloud.GoogleCloud.results_save

class BaseResultsGoogleStorageSaver(BaseGoogleStorageDataSaver, BaseResultsSaver):
    """Where results go in the bucket: ``<cloud_dir_prefix>/<project>/<experiment>_<timestamp>/results``.

    Args:
        bucket_name: the Google Cloud Storage bucket.
        cloud_dir_prefix: key prefix in the bucket.
    """

    def __init__(self, bucket_name: str = 'model-result', cloud_dir_prefix: str = '') -> None:
        BaseResultsSaver.__init__(self, bucket_name, cloud_dir_prefix)


class GoogleStorageResultsSaver(BaseResultsGoogleStorageSaver, S3ResultsSaver):
    """Write the results files into the local experiment folder, then upload each to the same place under the
    bucket; ``save_experiment_results`` returns ``('<bucket>/<key of the main results file>', experiment_timestamp)``.

    Args:
        bucket_name: the Google Cloud Storage bucket.
        cloud_dir_prefix: key prefix in the bucket.
        local_model_result_folder_path: root folder of the projects on this machine.
    """

    def __init__(self, bucket_name: str = 'model-result', cloud_dir_prefix: str = '',
                 local_model_result_folder_path: str = DEFAULT_RESULTS_ROOT) -> None:
        S3ResultsSaver.__init__(self, bucket_name, cloud_dir_prefix, local_model_result_folder_path)
