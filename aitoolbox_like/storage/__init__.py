"""Where experiment files go: a local folder or S3, behind one small interface.

S3Storage is imported lazily (it needs the optional boto3) so that ``import aitoolbox_like.storage``
works without the s3 extra.
"""
from .base import Storage, StorageAuthError, StorageError, join_key, validate_key, validate_key_part
from .local import LocalStorage
from .uploader import BackgroundUploader, UploadFailure, UploadJob

__all__ = [
    'Storage', 'StorageError', 'StorageAuthError', 'validate_key', 'validate_key_part', 'join_key',
    'LocalStorage', 'S3Storage', 'BackgroundUploader', 'UploadFailure', 'UploadJob',
]


def __getattr__(name):
    if name == 'S3Storage':
        from .s3 import S3Storage
        return S3Storage
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
