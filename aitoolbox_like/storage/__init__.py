"""Where experiment files go: a local folder or a cloud bucket (S3, Google Cloud Storage, Azure Blob Storage), behind
one small interface, chosen by URL (:func:`open_storage`) or by AIToolbox's ``cloud_save_mode``
(:func:`storage_for_mode`).

The cloud backends are imported lazily (each needs its optional client library: ``pip install
aitoolbox_like[s3]``, ``[gcs]`` or ``[azure]``), so ``import aitoolbox_like.storage`` works without any of them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import (Storage, StorageAuthError, StorageError, StorageUnreachableError, UploadsIncompleteError, join_key,
                   validate_key, validate_key_part)
from .journal import SyncReport, UploadJournal, sync_journal
from .local import LocalStorage, remove_stray_temp_files
from .uploader import BackgroundUploader, UploadFailure, UploadJob
from .urls import (CLOUD_SAVE_MODES, CLOUD_SCHEMES, cloud_scheme, is_cloud_url, open_storage, split_url,
                   storage_for_mode)

if TYPE_CHECKING:  # the runtime imports are lazy, see __getattr__
    from .azure import AzureBlobStorage
    from .gcs import GCSStorage
    from .s3 import S3Storage

__all__ = [
    'Storage', 'StorageError', 'StorageAuthError', 'StorageUnreachableError', 'UploadsIncompleteError',
    'validate_key', 'validate_key_part', 'join_key', 'LocalStorage', 'S3Storage', 'GCSStorage', 'AzureBlobStorage',
    'remove_stray_temp_files', 'BackgroundUploader', 'UploadFailure', 'UploadJob', 'UploadJournal', 'SyncReport',
    'sync_journal', 'open_storage', 'storage_for_mode', 'cloud_scheme', 'is_cloud_url', 'split_url',
    'CLOUD_SCHEMES', 'CLOUD_SAVE_MODES',
]

_BACKEND_NAMES = {'S3Storage': 's3', 'GCSStorage': 'gs', 'AzureBlobStorage': 'az'}


def __getattr__(name: str) -> Any:
    if name in _BACKEND_NAMES:
        from .urls import backend_class
        return backend_class(_BACKEND_NAMES[name])
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
