"""AIToolbox's experiment savers that upload too: the local savers' files, then the same keys in a bucket (S3 or
Google Cloud Storage). Also importable from :mod:`aitoolbox_like.experiment.savers`, where AIToolbox users find them.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, List, Optional, Tuple

from ..storage.base import join_key
from ..storage.urls import storage_for_mode
from .folder import ExperimentFolder
from .savers import (DEFAULT_RESULTS_ROOT, AbstractLocalModelSaver, BaseFullExperimentLocalSaver, HistoryLike,
                     PyTorchLocalModelSaver, new_experiment_timestamp)

if TYPE_CHECKING:
    from ..result_package.abstract import AbstractResultPackage
    from ..storage.base import Storage

logger = logging.getLogger(__name__)


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
