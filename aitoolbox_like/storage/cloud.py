"""What the cloud backends (S3, Google Cloud Storage, Azure Blob Storage) share: keys under a bucket and a prefix,
their URLs, and one way of turning a client's error into the error a user can act on."""
from __future__ import annotations

import abc
from typing import Any, Callable, NoReturn

from .base import Storage, StorageError, join_key, require_bucket_name, validate_key


class CloudStorage(Storage):
    """A bucket (an Azure container) and a key prefix in it: ``<scheme>://bucket_name/cloud_dir_prefix/<key>``.

    A subclass sets ``scheme`` and ``cloud_name``, makes its client and implements the operations through
    :meth:`_call`, which turns the client's errors into :meth:`_translate`'s."""

    #: What the bucket is called in messages (``'bucket'``, or ``'container'`` for Azure).
    bucket_word = 'bucket'

    def __init__(self, bucket_name: str, cloud_dir_prefix: str = '') -> None:
        self.bucket_name = require_bucket_name(bucket_name, self.bucket_word)
        prefix = (cloud_dir_prefix or '').strip('/')
        if prefix:
            validate_key(prefix, 'cloud_dir_prefix')
        self.cloud_dir_prefix = prefix

    # -- keys -------------------------------------------------------------------------------------

    def _full_key(self, key: str) -> str:
        validate_key(key)
        return join_key(self.cloud_dir_prefix, key)

    def _relative_key(self, full_key: str) -> str:
        return full_key[len(self.cloud_dir_prefix) + 1:] if self.cloud_dir_prefix else full_key

    def uri(self, key: str) -> str:
        """The ``<scheme>://bucket/prefix/key`` URL of ``key`` (of the prefix itself for an empty key)."""
        return f'{self.scheme}://{self.bucket_name}/{self._full_key(key)}' if key else \
            f'{self.scheme}://{self.bucket_name}/{self.cloud_dir_prefix}'.rstrip('/')

    # -- errors -----------------------------------------------------------------------------------

    @abc.abstractmethod
    def _translate(self, error: BaseException, operation: str, key: str | None) -> BaseException:
        """The error to raise for the client's ``error`` during ``operation`` (on ``key``): a StorageError naming
        what to fix, FileNotFoundError for a missing key, or ``error`` itself (with no secret in its message)."""

    def _raise_translated(self, error: BaseException, operation: str, key: str | None = None) -> NoReturn:
        translated = self._translate(error, operation, key)
        if translated is error:
            raise error
        if not isinstance(translated, (StorageError, FileNotFoundError)):
            # Another client error: its type is kept so that callers can decide to retry.
            raise translated
        # from None: the client's error would add nothing but noise (and, for auth failures, server responses that
        # may echo a credential).
        raise translated from None

    def _call(self, operation: str, key: str | None, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except StorageError:
            raise
        except Exception as error:
            self._raise_translated(error, operation, key)
