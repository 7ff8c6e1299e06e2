"""The interface shared by local and cloud storage (S3, Google Cloud Storage, Azure Blob Storage), and key
validation.

Keys are '/'-separated relative paths ("project/experiment/model/weights.pt") whatever the backend,
so callbacks build keys once and any storage can hold them.
"""
from __future__ import annotations

import abc
import re

from ..runtime._typing import StrPath

_DRIVE_RE = re.compile(r'^[A-Za-z]:')


class StorageError(RuntimeError):
    """A storage operation failed for a reason retrying will not fix (missing bucket, bad key)."""


class StorageAuthError(StorageError):
    """The storage rejected our credentials or permissions. Never carries the credentials."""


class StorageUnreachableError(StorageError):
    """The storage could not be reached when a run started (no server at the endpoint, no network).

    Raised by the start-of-fit check only: once training runs, the uploader retries network errors instead.
    """


class UploadsIncompleteError(StorageError):
    """Some files of an experiment were not uploaded when fit ended (raised with ``upload_failure='raise'``).

    ``not_uploaded`` lists the local paths; ``sync_command`` is the command that uploads them later.
    """

    def __init__(self, message: str, not_uploaded: list[str] | None = None, sync_command: str = '') -> None:
        super().__init__(message)
        self.not_uploaded = list(not_uploaded or [])
        self.sync_command = sync_command


def validate_key_part(name: str, what: str) -> str:
    """Return ``name`` if it is safe as one path component of a key, else raise ValueError.

    Used for user-supplied project and experiment names: they become directories, so anything
    that could climb out of the results folder or start a new root is refused.
    """
    if not isinstance(name, str):
        raise ValueError(f'{what} must be a string, got {type(name).__name__}: {name!r}')
    if name in ('', '.', '..'):
        raise ValueError(f'{what} must be a plain name, not {name!r}')
    if '\x00' in name:
        raise ValueError(f'{what} must not contain a NUL character: {name!r}')
    if '/' in name or '\\' in name:
        raise ValueError(f'{what} must not contain "/" or "\\" (it is one path component): {name!r}')
    if _DRIVE_RE.match(name):
        raise ValueError(f'{what} must not be an absolute path: {name!r}')
    return name


def validate_key(key: str, what: str = 'key') -> str:
    """Return ``key`` if every '/'-separated part passes :func:`validate_key_part`."""
    if not isinstance(key, str):
        raise ValueError(f'{what} must be a string, got {type(key).__name__}: {key!r}')
    if key.startswith('/'):
        raise ValueError(f'{what} must be relative (no leading "/"): {key!r}')
    for part in key.split('/'):
        try:
            validate_key_part(part, what)
        except ValueError:
            raise ValueError(
                f'{what} {key!r} is not a clean relative path: every "/"-separated part must be a '
                f'non-empty name other than "." or "..", without "\\" or NUL'
            ) from None
    return key


def join_key(*parts: str) -> str:
    """Join key fragments with '/', ignoring empty ones (e.g. an empty prefix)."""
    return '/'.join(p.strip('/') for p in parts if p and p.strip('/'))


def require_bucket_name(bucket_name: object, what: str = 'bucket') -> str:
    """``bucket_name`` if it is a plain bucket (container) name, else ValueError naming the setting."""
    if not isinstance(bucket_name, str) or not bucket_name or '/' in bucket_name:
        raise ValueError(f'bucket_name must be the {what} name, without "/", got {bucket_name!r}')
    return bucket_name


def missing_client_error(cloud: str, library: str, extra: str, error: ImportError) -> ImportError:
    """The ImportError a cloud backend raises when its client library is not installed, naming the pip extra."""
    missing = ImportError(f'{cloud} storage needs {library}, which is not installed: pip install '
                          f'aitoolbox_like[{extra}]')
    missing.__cause__ = error
    return missing


class Storage(abc.ABC):
    """Somewhere to put experiment files: a local folder or a cloud bucket (S3, Google Cloud Storage, an Azure
    container). :func:`aitoolbox_like.storage.open_storage` and :func:`~aitoolbox_like.storage.storage_for_mode` pick
    the class."""

    #: The URL scheme of the storage's addresses (``'s3'``, ``'gs'``, ``'az'``; ``'file'`` for a local folder).
    scheme = 'file'
    #: The name of the kind of storage in messages.
    cloud_name = 'local folder'

    @abc.abstractmethod
    def save_file(self, local_path: StrPath, key: str) -> None:
        """Copy the local file to ``key``, replacing any existing object; readers never see a partial one."""

    @abc.abstractmethod
    def load_file(self, key: str, local_path: StrPath) -> StrPath:
        """Copy ``key`` to ``local_path`` (parent folders created) and return ``local_path``.

        Raises FileNotFoundError if the key does not exist.
        """

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """True if an object is stored under exactly ``key``."""

    @abc.abstractmethod
    def list(self, prefix: str = '') -> list[str]:
        """Sorted keys that start with ``prefix`` (a plain string prefix, as in S3)."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""

    @abc.abstractmethod
    def write_text(self, key: str, text: str) -> None:
        """Store ``text`` (UTF-8) under ``key``."""

    @abc.abstractmethod
    def read_text(self, key: str) -> str:
        """Return the UTF-8 text stored under ``key``; FileNotFoundError if missing."""

    @abc.abstractmethod
    def uri(self, key: str) -> str:
        """A human-readable location for ``key`` (a file://, s3://, gs:// or az:// URL) for logs and messages."""

    def check_bucket(self) -> None:
        """Check that the bucket (container) exists and that we may use it, before anything is uploaded. Raises
        StorageError naming the setting to fix; network errors keep the client's own types. A local folder needs
        no check."""

    def create_exclusive(self, key: str, text: str) -> bool:
        """Store ``text`` under ``key`` only if no object is there yet; True if this call created it.

        The check and the write are one step of the storage (no other writer can slip in between).
        """
        raise NotImplementedError(f'{type(self).__name__} cannot create objects exclusively')

    def location(self) -> dict[str, str | None]:
        """What identifies this storage in the upload journal: ``root`` (a local folder), or ``bucket``, ``prefix``,
        ``endpoint`` and (other clouds than S3) ``scheme``; never a secret."""
        raise NotImplementedError(f'{type(self).__name__} cannot be named in an upload journal')
