"""Storage in a Google Cloud Storage bucket through Google's client (``google-cloud-storage``).

The client finds its project and credentials as Google documents it (``GOOGLE_APPLICATION_CREDENTIALS``, the
gcloud application-default login, the metadata server of a Google Cloud machine); ``STORAGE_EMULATOR_HOST`` points it
at an emulator (with anonymous credentials). It is imported when a GCSStorage is created and made at the first
operation, so creating a GCSStorage never reaches the network.
"""
from __future__ import annotations

import logging
import os
from typing import Any

from ..runtime._typing import StrPath
from .cloud import CloudStorage
from .base import (StorageAuthError, StorageError, missing_client_error)
from .local import write_atomically

logger = logging.getLogger(__name__)

DEFAULT_ENDPOINT = 'https://storage.googleapis.com'
_TIMEOUT = (10, 60)     # seconds to connect, to read


def _import_client() -> Any:
    try:
        import google.cloud.storage as storage
    except ImportError as error:
        raise missing_client_error('Google Cloud Storage', 'google-cloud-storage', 'gcs', error) from error
    return storage


def is_transient(error: BaseException) -> bool | None:
    """Whether waiting and trying again might fix an error of Google's client: True for 5xx, throttling, timeouts
    and transport errors, False for its other answers, None for an error that is not Google's."""
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth
    if isinstance(error, (api.ServerError, api.TooManyRequests, api.RetryError, api.RequestRangeNotSatisfiable,
                          auth.TransportError)):
        return True
    if isinstance(error, api.ResumableTransferError):
        return True
    if isinstance(error, (api.GoogleAPIError, auth.GoogleAuthError)):
        return False
    return None


class GCSStorage(CloudStorage):
    """Keys live under ``gs://bucket_name/cloud_dir_prefix/``.

    ``endpoint_url``: another API endpoint than Google's (None: ``STORAGE_EMULATOR_HOST`` when set, else Google's).
    ``project``: the project of the client (None: as the client finds it). ``max_attempts``: 1 turns the client's own
    retries off (the background uploader retries instead); more: Google's default retry policy.
    """

    scheme = 'gs'
    cloud_name = 'Google Cloud Storage'

    def __init__(self, bucket_name: str, cloud_dir_prefix: str = '', endpoint_url: str | None = None,
                 project: str | None = None, max_attempts: int = 8, client: Any = None) -> None:
        super().__init__(bucket_name, cloud_dir_prefix)
        _import_client()
        self.project = project
        self.max_attempts = max_attempts
        # The endpoint the client would find by itself is left to it (an emulator's then comes with anonymous
        # credentials, as Google's client gives it).
        default = (DEFAULT_ENDPOINT, os.environ.get('STORAGE_EMULATOR_HOST'))
        self._explicit_endpoint = endpoint_url if endpoint_url and endpoint_url.rstrip('/') not in default else None
        self._client = client

    def __repr__(self) -> str:
        return f'GCSStorage({self.bucket_name!r}, {self.cloud_dir_prefix!r}, endpoint_url={self.endpoint_url!r})'

    @property
    def endpoint_url(self) -> str:
        """The API endpoint the client talks to (known without making the client)."""
        if self._client is not None:
            return str(self._client.api_endpoint)
        return self._explicit_endpoint or os.environ.get('STORAGE_EMULATOR_HOST') or DEFAULT_ENDPOINT

    @property
    def client(self) -> Any:
        """Google's ``storage.Client``, made at the first use (finding the credentials may ask the network)."""
        if self._client is None:
            storage = _import_client()
            options = {'api_endpoint': self._explicit_endpoint} if self._explicit_endpoint else None
            try:
                self._client = storage.Client(project=self.project, client_options=options)
            except Exception as error:
                self._raise_translated(error, 'connect')
        return self._client

    @property
    def _retry(self) -> Any:
        from google.cloud.storage.retry import DEFAULT_RETRY
        return DEFAULT_RETRY if self.max_attempts > 1 else None

    def _blob(self, key: str) -> Any:
        return self.client.bucket(self.bucket_name).blob(self._full_key(key))

    # -- errors -----------------------------------------------------------------------------------

    def _missing_bucket(self) -> StorageError:
        return StorageError(
            f"Google Cloud Storage bucket '{self.bucket_name}' does not exist at {self.endpoint_url}. Create it first "
            f'(gcloud storage buckets create gs://{self.bucket_name}), or fix bucket_name')

    def _translate(self, error: BaseException, operation: str, key: str | None) -> BaseException:
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth
        where = f"bucket '{self.bucket_name}' at {self.endpoint_url}"
        if isinstance(error, auth.DefaultCredentialsError):
            return StorageAuthError(
                f'Google Cloud Storage {operation} on {where} failed: no Google credentials were found. Set '
                f'GOOGLE_APPLICATION_CREDENTIALS to a service account key file, run `gcloud auth application-default '
                f'login`, or set STORAGE_EMULATOR_HOST for an emulator.')
        if isinstance(error, (auth.RefreshError, api.Unauthorized, api.Forbidden)):
            # The status only: the client's message may quote the request, which can carry a token.
            status = getattr(error, 'code', None) or type(error).__name__
            return StorageAuthError(
                f'Google Cloud Storage {operation} on {where} was refused ({status}). Check the credentials '
                f'(GOOGLE_APPLICATION_CREDENTIALS or the gcloud application-default login) and that they may read '
                f'and write objects of this bucket.')
        if isinstance(error, api.NotFound):
            if key is None:     # a write or a listing: only the bucket can be missing
                return self._missing_bucket()
            self.check_bucket()     # a read answers 404 for a missing bucket too: say which
            return FileNotFoundError(f'No such key in storage: {self.uri(key)}')
        return error

    # -- operations -------------------------------------------------------------------------------

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist yet."""
        from google.api_core import exceptions as api
        try:
            self.client.create_bucket(self.bucket_name, timeout=_TIMEOUT)
            logger.info('Created bucket %s at %s', self.bucket_name, self.endpoint_url)
        except api.Conflict:
            pass
        except Exception as error:
            self._raise_translated(error, 'create bucket')

    def check_bucket(self) -> None:
        """Check that the bucket exists and that we may list it (one listing of at most one object: the permission
        uploads need, which a bucket-metadata request would not show)."""
        self._call('list', None, lambda: list(self.client.list_blobs(self.bucket_name, max_results=1,
                                                                     timeout=_TIMEOUT, retry=self._retry)))

    def create_exclusive(self, key: str, text: str) -> bool:
        """Store ``text`` under ``key`` unless an object is there (an upload with ``ifGenerationMatch=0``).

        True if this call created the object, False if it existed (or a concurrent write to the same key won).
        """
        from google.api_core import exceptions as api
        blob = self._blob(key)
        try:
            blob.upload_from_string(text.encode('utf-8'), content_type='text/plain; charset=utf-8',
                                    if_generation_match=0, timeout=_TIMEOUT, retry=self._retry)
        except api.PreconditionFailed:
            return False
        except Exception as error:
            self._raise_translated(error, 'upload')
        return True

    def location(self) -> dict[str, str | None]:
        """``{'scheme', 'bucket', 'prefix', 'endpoint'}``: enough to build this storage again (the upload journal)."""
        return {'scheme': self.scheme, 'bucket': self.bucket_name, 'prefix': self.cloud_dir_prefix,
                'endpoint': self.endpoint_url}

    def save_file(self, local_path: StrPath, key: str) -> None:
        """Upload ``local_path`` to ``key``; the object appears once complete (a resumable upload above 8 MiB is
        finalized by its last chunk)."""
        blob = self._blob(key)
        self._call('upload', None, blob.upload_from_filename, os.fspath(local_path), timeout=_TIMEOUT,
                   retry=self._retry)
        logger.debug('Uploaded %s to %s', local_path, self.uri(key))

    def load_file(self, key: str, local_path: StrPath) -> StrPath:
        """Download ``key`` to ``local_path`` atomically (a temporary file renamed when complete)."""
        blob = self._blob(key)
        write_atomically(local_path, lambda f: self._call('download', key, blob.download_to_file, f,
                                                          timeout=_TIMEOUT, retry=self._retry))
        return local_path

    def exists(self, key: str) -> bool:
        """True if an object is stored under exactly ``key``. A missing bucket is a StorageError, as for
        :meth:`list` (the object request answers 404 for both: the bucket is then checked)."""
        blob = self._blob(key)
        if self._call('exists', key, blob.exists, timeout=_TIMEOUT, retry=self._retry):
            return True
        self.check_bucket()
        return False

    def list(self, prefix: str = '') -> list[str]:
        """Sorted keys (relative to ``cloud_dir_prefix``) that start with ``prefix``."""
        full_prefix = f'{self.cloud_dir_prefix}/{prefix}' if self.cloud_dir_prefix else prefix
        names = self._call('list', None, lambda: [blob.name for blob in self.client.list_blobs(
            self.bucket_name, prefix=full_prefix, timeout=_TIMEOUT, retry=self._retry)])
        return sorted(self._relative_key(name) for name in names)

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""
        from google.api_core import exceptions as api
        blob = self._blob(key)
        try:
            blob.delete(timeout=_TIMEOUT, retry=self._retry)
        except api.NotFound:
            pass
        except Exception as error:
            self._raise_translated(error, 'delete')

    def write_text(self, key: str, text: str) -> None:
        """Store ``text`` (UTF-8, ``text/plain``) under ``key``."""
        blob = self._blob(key)
        self._call('upload', None, blob.upload_from_string, text.encode('utf-8'),
                   content_type='text/plain; charset=utf-8', timeout=_TIMEOUT, retry=self._retry)

    def read_text(self, key: str) -> str:
        """Return the UTF-8 text stored under ``key``; FileNotFoundError if missing."""
        blob = self._blob(key)
        data = self._call('download', key, blob.download_as_bytes, timeout=_TIMEOUT, retry=self._retry)
        return bytes(data).decode('utf-8')

