"""Storage in an Azure Blob Storage container through Azure's client (``azure-storage-blob``).

Configured the ways Azure documents: the connection string in ``AZURE_STORAGE_CONNECTION_STRING`` (account key or
SAS, e.g. Azurite's), or the account URL (``endpoint_url=``, ``AZURE_STORAGE_ACCOUNT_URL``, or the account name in
``AZURE_STORAGE_ACCOUNT``) with the credentials ``azure.identity.DefaultAzureCredential`` finds (environment, managed
identity, Azure CLI login). ``bucket_name`` names the container. The client library is imported when an
AzureBlobStorage is created and the client made at the first operation; nothing reaches the network before.

Azure's client logs every request and response, with their headers, at INFO (its ``http_logging_policy``), which
drowns a script's own INFO log: when the client is made, the ``azure`` logger is set to WARNING unless a level was
set on it. A level set on it, or on any logger under it, brings that log back (:func:`quiet_sdk_log`).
"""
from __future__ import annotations

import logging
import os
import re
from typing import Any

from ..runtime._typing import StrPath
from .cloud import CloudStorage
from .base import (StorageAuthError, StorageError, missing_client_error)
from .local import write_atomically

logger = logging.getLogger(__name__)

CONNECTION_STRING_VARIABLE = 'AZURE_STORAGE_CONNECTION_STRING'
ACCOUNT_URL_VARIABLE = 'AZURE_STORAGE_ACCOUNT_URL'
ACCOUNT_NAME_VARIABLE = 'AZURE_STORAGE_ACCOUNT'
_SECRET_FIELDS = ('AccountKey', 'SharedAccessSignature')
_SAS_SIGNATURE = re.compile(r'(sig=)[^&\s]+', re.IGNORECASE)
_AUTH_CODES = frozenset({'AuthenticationFailed', 'AuthorizationFailure', 'AuthorizationPermissionMismatch',
                         'InsufficientAccountPermissions', 'AccountIsDisabled', 'InvalidAuthenticationInfo'})
_MISSING_CONTAINER_CODES = frozenset({'ContainerNotFound', 'ContainerBeingDeleted'})


def _import_client() -> Any:
    try:
        import azure.storage.blob
    except ImportError as error:
        raise missing_client_error('Azure Blob', 'azure-storage-blob', 'azure', error) from error
    return azure.storage.blob


#: The logger every logger of Azure's client libraries is under.
SDK_LOGGER = 'azure'


def quiet_sdk_log() -> None:
    """Set the ``azure`` logger to WARNING if its level is not set (NOTSET), else leave it as it is.

    A level the user set on ``azure`` (before or after: theirs replaces this one) or on a logger under it
    (``azure.core.pipeline.policies.http_logging_policy``: the request log; ``azure.identity``) takes precedence, so
    ``logging.getLogger('azure').setLevel(logging.INFO)`` shows Azure's log again.
    """
    sdk = logging.getLogger(SDK_LOGGER)
    if sdk.level == logging.NOTSET:
        sdk.setLevel(logging.WARNING)


def parse_connection_string(text: str) -> dict[str, str]:
    """The ``Name=value`` fields of an Azure connection string (values may hold ``=``)."""
    fields = {}
    for part in text.split(';'):
        name, sep, value = part.partition('=')
        if sep and name.strip():
            fields[name.strip()] = value.strip()
    return fields


def blob_endpoint(fields: dict[str, str]) -> str | None:
    """The Blob service URL a parsed connection string names (``BlobEndpoint``, or built from the account name)."""
    if fields.get('BlobEndpoint'):
        return fields['BlobEndpoint'].rstrip('/')
    if fields.get('AccountName'):
        protocol = fields.get('DefaultEndpointsProtocol', 'https')
        return f"{protocol}://{fields['AccountName']}.blob.{fields.get('EndpointSuffix', 'core.windows.net')}"
    return None


def is_transient(error: BaseException) -> bool | None:
    """Whether waiting and trying again might fix an error of Azure's client: True for connection errors,
    timeouts, 5xx and throttling, False for its other answers, None for an error that is not Azure's."""
    from azure.core import exceptions as az
    if isinstance(error, (az.ServiceRequestError, az.ServiceResponseError)):
        return True
    if isinstance(error, az.HttpResponseError):
        status = error.status_code or 0
        return status >= 500 or status in (408, 429)
    if isinstance(error, az.AzureError):
        return False
    return None


class AzureBlobStorage(CloudStorage):
    """Keys live under ``az://<container>/cloud_dir_prefix/`` (``bucket_name`` is the container).

    ``endpoint_url``: the account URL (``https://<account>.blob.core.windows.net``; None: the connection string's,
    else ``AZURE_STORAGE_ACCOUNT_URL`` / ``AZURE_STORAGE_ACCOUNT``). The connection string is used whenever it names
    the same account URL; otherwise ``credential`` (None: ``DefaultAzureCredential``, ``pip install
    azure-identity``). ``max_attempts``: attempts of the client's own retry policy (1: none; the background uploader
    retries instead).
    """

    scheme = 'az'
    cloud_name = 'Azure Blob Storage'
    bucket_word = 'container'

    def __init__(self, bucket_name: str, cloud_dir_prefix: str = '', endpoint_url: str | None = None,
                 max_attempts: int = 8, credential: Any = None, client: Any = None) -> None:
        super().__init__(bucket_name, cloud_dir_prefix)
        _import_client()
        self.max_attempts = max_attempts
        self.credential = credential
        self._explicit_endpoint = endpoint_url.rstrip('/') if endpoint_url else None
        self._service = client
        self._container: Any = None

    def __repr__(self) -> str:
        return (f'AzureBlobStorage({self.bucket_name!r}, {self.cloud_dir_prefix!r}, '
                f'endpoint_url={self.endpoint_url!r})')

    # -- configuration ----------------------------------------------------------------------------

    def _connection_fields(self) -> dict[str, str]:
        return parse_connection_string(os.environ.get(CONNECTION_STRING_VARIABLE, ''))

    @property
    def endpoint_url(self) -> str | None:
        """The account URL (no query: a SAS token never shows), known without making the client; None when
        nothing configures one."""
        if self._explicit_endpoint:
            return self._explicit_endpoint.split('?', 1)[0]
        if os.environ.get(ACCOUNT_URL_VARIABLE):
            return os.environ[ACCOUNT_URL_VARIABLE].rstrip('/').split('?', 1)[0]
        from_connection = blob_endpoint(self._connection_fields())
        if from_connection:
            return from_connection
        if os.environ.get(ACCOUNT_NAME_VARIABLE):
            return f'https://{os.environ[ACCOUNT_NAME_VARIABLE]}.blob.core.windows.net'
        return None

    @property
    def container(self) -> Any:
        """Azure's ``ContainerClient`` of the container, made at the first use."""
        if self._container is None:
            # Here and not at import: a script that imports us and never uses Azure keeps its logging as it was.
            quiet_sdk_log()
            if self._service is None:
                self._service = self._make_service()
            self._container = self._service.get_container_client(self.bucket_name)
        return self._container

    def _make_service(self) -> Any:
        blob = _import_client()
        options: dict[str, Any] = dict(retry_total=max(self.max_attempts - 1, 0), connection_timeout=10,
                                       read_timeout=60)
        endpoint = self.endpoint_url
        fields = self._connection_fields()
        if fields and (endpoint is None or blob_endpoint(fields) == endpoint) and self.credential is None:
            return blob.BlobServiceClient.from_connection_string(os.environ[CONNECTION_STRING_VARIABLE], **options)
        if endpoint is None:
            raise StorageAuthError(
                f"Azure Blob Storage container '{self.bucket_name}': no account is configured. Set "
                f'{CONNECTION_STRING_VARIABLE} (the storage account\'s connection string), or give the account URL '
                f'(endpoint_url=..., {ACCOUNT_URL_VARIABLE} or {ACCOUNT_NAME_VARIABLE}) and sign in so that '
                f'DefaultAzureCredential finds credentials (az login, a managed identity, AZURE_CLIENT_ID...).')
        credential = self.credential
        if credential is None:
            try:
                from azure.identity import DefaultAzureCredential
            except ImportError as error:
                raise missing_client_error('Azure Blob (signing in with an account URL)', 'azure-identity',
                                           'azure', error) from error
            credential = DefaultAzureCredential()
        account_url = self._explicit_endpoint or os.environ.get(ACCOUNT_URL_VARIABLE) or endpoint
        return blob.BlobServiceClient(account_url, credential=credential, **options)

    def _scrub(self, text: str) -> str:
        """``text`` without the connection string's secrets or a SAS signature."""
        for name in _SECRET_FIELDS:
            secret = self._connection_fields().get(name)
            if secret:
                text = text.replace(secret, '***')
        return _SAS_SIGNATURE.sub(r'\1***', text)

    # -- keys -------------------------------------------------------------------------------------

    def _blob(self, key: str) -> Any:
        return self.container.get_blob_client(self._full_key(key))

    # -- errors -----------------------------------------------------------------------------------

    def _missing_container(self) -> StorageError:
        return StorageError(
            f"Azure Blob Storage container '{self.bucket_name}' does not exist at {self.endpoint_url}. Create it "
            f'first (az storage container create --name {self.bucket_name}), or fix bucket_name')

    def _translate(self, error: BaseException, operation: str, key: str | None) -> BaseException:
        from azure.core import exceptions as az
        where = f"container '{self.bucket_name}' at {self.endpoint_url}"
        code = str(getattr(error, 'error_code', '') or '')
        status = getattr(error, 'status_code', None)
        if isinstance(error, az.ClientAuthenticationError) or code in _AUTH_CODES or status in (401, 403):
            # The code only: Azure's messages may quote a request URL holding a SAS token.
            reason = code or type(error).__name__
            return StorageAuthError(
                f'Azure Blob Storage {operation} on {where} was refused ({reason}). Check '
                f'{CONNECTION_STRING_VARIABLE} (its AccountKey or SAS), or the credentials DefaultAzureCredential '
                f'finds, and that they may read and write blobs of this container.')
        if code in _MISSING_CONTAINER_CODES:
            return self._missing_container()
        if isinstance(error, az.ResourceNotFoundError) and key is not None:
            return FileNotFoundError(f'No such key in storage: {self.uri(key)}')
        if isinstance(error, az.AzureError):
            error.message = self._scrub(str(error.message))
            error.args = tuple(self._scrub(a) if isinstance(a, str) else a for a in error.args)
        return error

    # -- operations -------------------------------------------------------------------------------

    def ensure_container(self) -> None:
        """Create the container if it does not exist yet."""
        from azure.core.exceptions import ResourceExistsError
        try:
            self.container.create_container()
            logger.info('Created container %s at %s', self.bucket_name, self.endpoint_url)
        except ResourceExistsError:
            pass
        except StorageError:
            raise
        except Exception as error:
            self._raise_translated(error, 'create container')

    ensure_bucket = ensure_container

    def check_bucket(self) -> None:
        """Check that the container exists and that we may use it (its properties)."""
        from azure.core.exceptions import ResourceNotFoundError
        try:
            self._call('get container properties', None, lambda: self.container.get_container_properties())
        except ResourceNotFoundError:
            raise self._missing_container() from None

    def create_exclusive(self, key: str, text: str) -> bool:
        """Store ``text`` under ``key`` unless a blob is there (an upload with ``If-None-Match: *``).

        True if this call created the blob, False if it existed (or a concurrent write to the same key won).
        """
        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import ContentSettings
        blob = self._blob(key)
        try:
            self._call('upload', None, blob.upload_blob, text.encode('utf-8'), overwrite=False,
                       content_settings=ContentSettings(content_type='text/plain; charset=utf-8'))
        except ResourceExistsError:
            return False
        return True

    def location(self) -> dict[str, str | None]:
        """``{'scheme', 'bucket', 'prefix', 'endpoint'}`` (the account URL, no secret): enough to build this storage
        again (the upload journal)."""
        return {'scheme': self.scheme, 'bucket': self.bucket_name, 'prefix': self.cloud_dir_prefix,
                'endpoint': self.endpoint_url}

    def save_file(self, local_path: StrPath, key: str) -> None:
        """Upload ``local_path`` to ``key``; the blob appears once complete (a large file goes up in blocks,
        committed together at the end)."""
        blob = self._blob(key)
        with open(local_path, 'rb') as f:
            self._call('upload', None, blob.upload_blob, f, overwrite=True)
        logger.debug('Uploaded %s to %s', local_path, self.uri(key))

    def load_file(self, key: str, local_path: StrPath) -> StrPath:
        """Download ``key`` to ``local_path`` atomically (a temporary file renamed when complete)."""
        blob = self._blob(key)
        write_atomically(local_path, lambda f: self._call('download', key,
                                                          lambda: blob.download_blob().readinto(f)))
        return local_path

    def exists(self, key: str) -> bool:
        """True if a blob is stored under exactly ``key``. A missing container is a StorageError, as for
        :meth:`list`."""
        from azure.core.exceptions import ResourceNotFoundError
        blob = self._blob(key)
        try:
            blob.get_blob_properties()
        except ResourceNotFoundError as error:
            if str(getattr(error, 'error_code', '') or '') in _MISSING_CONTAINER_CODES:
                raise self._missing_container() from None
            return False
        except Exception as error:
            self._raise_translated(error, 'get blob properties', key)
        return True

    def list(self, prefix: str = '') -> list[str]:
        """Sorted keys (relative to ``cloud_dir_prefix``) that start with ``prefix``."""
        full_prefix = f'{self.cloud_dir_prefix}/{prefix}' if self.cloud_dir_prefix else prefix
        names = self._call('list', None, lambda: [b.name for b in self.container.list_blobs(
            name_starts_with=full_prefix or None)])
        return sorted(self._relative_key(name) for name in names)

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing blob is not an error (a missing container is)."""
        from azure.core.exceptions import ResourceNotFoundError
        blob = self._blob(key)
        try:
            blob.delete_blob()
        except ResourceNotFoundError as error:
            if str(getattr(error, 'error_code', '') or '') in _MISSING_CONTAINER_CODES:
                raise self._missing_container() from None
        except Exception as error:
            self._raise_translated(error, 'delete', key)

    def write_text(self, key: str, text: str) -> None:
        """Store ``text`` (UTF-8, ``text/plain``) under ``key``."""
        from azure.storage.blob import ContentSettings
        blob = self._blob(key)
        self._call('upload', None, blob.upload_blob, text.encode('utf-8'), overwrite=True,
                   content_settings=ContentSettings(content_type='text/plain; charset=utf-8'))

    def read_text(self, key: str) -> str:
        """Return the UTF-8 text stored under ``key``; FileNotFoundError if missing."""
        blob = self._blob(key)
        data = self._call('download', key, lambda: blob.download_blob().readall())
        return bytes(data).decode('utf-8')
