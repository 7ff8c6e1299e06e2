"""Where experiment files go: a local folder or S3, behind one small interface.

S3Storage is imported lazily (it needs the optional boto3) so that ``import aitoolbox_like.storage``
works without the s3 extra.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import (Storage, StorageAuthError, StorageError, StorageUnreachableError, UploadsIncompleteError, join_key,
                   validate_key, validate_key_part)
from .journal import SyncReport, UploadJournal, sync_journal
from .local import LocalStorage, remove_stray_temp_files
from .uploader import BackgroundUploader, UploadFailure, UploadJob

if TYPE_CHECKING:  # the runtime import is lazy, see __getattr__
    from .s3 import S3Storage

__all__ = [
    'Storage', 'StorageError', 'StorageAuthError', 'StorageUnreachableError', 'UploadsIncompleteError',
    'validate_key', 'validate_key_part', 'join_key', 'LocalStorage', 'S3Storage', 'remove_stray_temp_files',
    'BackgroundUploader', 'UploadFailure', 'UploadJob', 'UploadJournal', 'SyncReport', 'sync_journal',
]


def __getattr__(name: str) -> Any:
    if name == 'S3Storage':
        from .s3 import S3Storage
        return S3Storage
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
