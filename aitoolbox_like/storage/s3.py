"""Storage in an S3 bucket (AWS or any S3-compatible server) through boto3.

boto3 is imported when an S3Storage is created, so the core package works without the s3 extra.
"""
from __future__ import annotations

import logging
import os
from typing import Any

from ..runtime._typing import StrPath
from .cloud import CloudStorage
from .base import (StorageAuthError, StorageError, missing_client_error)

logger = logging.getLogger(__name__)

_AUTH_ERROR_CODES = frozenset({
    'InvalidAccessKeyId', 'SignatureDoesNotMatch', 'AccessDenied', 'AccessDeniedException',
    'ExpiredToken', 'InvalidToken', 'TokenRefreshRequired', 'AllAccessDisabled',
    'InvalidClientTokenId', 'UnrecognizedClientException',
    # HEAD responses have no body, so botocore reports only the status code.
    '403', 'Forbidden',
})
_NOT_FOUND_CODES = frozenset({'404', 'NoSuchKey', 'NotFound'})
_NO_BUCKET_CODES = frozenset({'NoSuchBucket'})
# A conditional write (If-None-Match) found the object there already, or raced another conditional write.
_PRECONDITION_CODES = frozenset({'PreconditionFailed', '412', 'ConditionalRequestConflict', '409'})


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/key/`` -> ``('bucket', 'some/key')``; either part may be empty (the caller names what
    it expected)."""
    bucket, _, key = uri[len('s3://'):].partition('/')
    return bucket, key.strip('/')


def _import_boto3() -> Any:
    try:
        import boto3
        import boto3.s3.transfer
        import botocore.config
        import botocore.exceptions
    except ImportError as error:
        raise missing_client_error('S3', 'boto3', 's3', error) from error
    return boto3


_RETRYABLE_CLIENT_CODES = frozenset({'SlowDown', 'RequestTimeout', 'RequestTimeTooSkewed',
                                     'InternalError', 'ServiceUnavailable', 'Throttling',
                                     'ThrottlingException'})


def is_transient(error: BaseException) -> bool | None:
    """Whether waiting and trying again might fix a botocore error: True for network errors, 5xx and throttling,
    False for other S3 answers, None for an error that is not botocore's."""
    import botocore.exceptions as bexc
    if isinstance(error, (bexc.EndpointConnectionError, bexc.ConnectionClosedError, bexc.ReadTimeoutError,
                          bexc.ConnectTimeoutError, bexc.ConnectionError, bexc.HTTPClientError)):
        return True
    response = getattr(error, 'response', None)
    if not isinstance(error, bexc.ClientError) or not isinstance(response, dict):
        return None
    status = response.get('ResponseMetadata', {}).get('HTTPStatusCode')
    code = str(response.get('Error', {}).get('Code', ''))
    if (isinstance(status, int) and status >= 500) or code in _RETRYABLE_CLIENT_CODES:
        return True
    return code.isdigit() and int(code) >= 500


class S3Storage(CloudStorage):
    """Keys live under ``s3://bucket_name/cloud_dir_prefix/``.

    ``endpoint_url=None`` leaves endpoint resolution to botocore, which honours
    ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` and the AWS config file. Credentials come from
    boto3's usual chain (environment, profile, instance role) and are never logged.
    """

    scheme = 's3'
    cloud_name = 'S3'

    def __init__(self, bucket_name: str, cloud_dir_prefix: str = '', endpoint_url: str | None = None,
                 region_name: str | None = None, max_attempts: int = 8,
                 multipart_threshold: int = 64 * 1024 * 1024, multipart_chunksize: int = 16 * 1024 * 1024,
                 client: Any = None) -> None:
        super().__init__(bucket_name, cloud_dir_prefix)
        boto3 = _import_boto3()
        import botocore.config
        from boto3.s3.transfer import TransferConfig

        if client is None:
            config_kwargs: dict[str, Any] = dict(
                retries={'max_attempts': max_attempts, 'mode': 'standard'},
                connect_timeout=10,
                read_timeout=60,
            )
            # S3-compatible servers (MinIO, SeaweedFS, Ceph) are usually reached by host:port,
            # where virtual-hosted bucket names ("bucket.localhost") do not resolve.
            if endpoint_url or os.environ.get('AWS_ENDPOINT_URL_S3') or os.environ.get('AWS_ENDPOINT_URL'):
                config_kwargs['s3'] = {'addressing_style': 'path'}
            # A private session: boto3's default session is not thread-safe to create clients from,
            # and the background uploader uses this client from its own thread.
            session = boto3.session.Session()
            client = session.client('s3', endpoint_url=endpoint_url, region_name=region_name,
                                    config=botocore.config.Config(**config_kwargs))
        self.client = client
        self.endpoint_url = client.meta.endpoint_url
        self.transfer_config = TransferConfig(multipart_threshold=multipart_threshold,
                                              multipart_chunksize=multipart_chunksize)

    def __repr__(self) -> str:
        return f'S3Storage({self.bucket_name!r}, {self.cloud_dir_prefix!r}, endpoint_url={self.endpoint_url!r})'

    # -- errors -----------------------------------------------------------------------------------

    def _translate(self, error: BaseException, operation: str, key: str | None = None) -> BaseException:
        """Map a botocore/boto3 failure to our exceptions, or return the (unwrapped) error itself.

        Network errors and 5xx stay botocore's own types so callers (the uploader) can retry them.
        """
        import botocore.exceptions
        from boto3.exceptions import S3UploadFailedError
        from boto3.exceptions import RetriesExceededError

        # boto3's transfer layer hides the real error behind compatibility wrappers.
        if isinstance(error, S3UploadFailedError) and error.__context__ is not None:
            error = error.__context__
        if isinstance(error, RetriesExceededError) and error.last_exception is not None:
            error = error.last_exception

        where = f"bucket '{self.bucket_name}' at endpoint {self.endpoint_url}"
        if isinstance(error, (botocore.exceptions.NoCredentialsError,
                              botocore.exceptions.PartialCredentialsError)):
            return StorageAuthError(
                f'S3 {operation} on {where} failed: no usable AWS credentials were found. Set '
                f'AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for this endpoint.'
            )
        if isinstance(error, botocore.exceptions.ClientError):
            err = error.response.get('Error', {})
            code = str(err.get('Code', ''))
            if code in _AUTH_ERROR_CODES:
                # Only the code and the server's generic message: some servers echo the access key
                # id or the string-to-sign in other fields of the error response.
                message = self._scrub(str(err.get('Message') or 'Forbidden'))
                return StorageAuthError(
                    f'S3 {operation} on {where} was rejected: {code} ({message}). Check that '
                    f'AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) hold valid credentials '
                    f'for this endpoint, and that they are allowed to access this bucket.'
                )
            if code in _NO_BUCKET_CODES:
                return StorageError(
                    f"S3 {operation} failed: bucket '{self.bucket_name}' does not exist at endpoint "
                    f'{self.endpoint_url}. Create it first (S3Storage.ensure_bucket() does).'
                )
            if code in _NOT_FOUND_CODES and key is not None:
                return FileNotFoundError(f'No such key in storage: {self.uri(key)}')
        return error

    def _scrub(self, text: str) -> str:
        # Belt and braces: should a server ever quote our credentials back, blank them out.
        try:
            credentials = self.client._request_signer._credentials
            frozen = credentials.get_frozen_credentials() if credentials is not None else None
        except Exception:
            frozen = None
        if frozen is not None:
            for secret in (frozen.access_key, frozen.secret_key, frozen.token):
                if secret:
                    text = text.replace(secret, '***')
        return text

    # -- operations -------------------------------------------------------------------------------

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist yet."""
        import botocore.exceptions
        try:
            self.client.head_bucket(Bucket=self.bucket_name)
            return
        except botocore.exceptions.ClientError as error:
            code = str(error.response.get('Error', {}).get('Code', ''))
            if code not in ('404', 'NoSuchBucket', 'NotFound'):
                self._raise_translated(error, 'HeadBucket')
        except Exception as error:
            self._raise_translated(error, 'HeadBucket')

        kwargs: dict[str, Any] = {'Bucket': self.bucket_name}
        region = self.client.meta.region_name
        # us-east-1 is the one region that rejects an explicit LocationConstraint.
        if region and region != 'us-east-1':
            kwargs['CreateBucketConfiguration'] = {'LocationConstraint': region}
        try:
            self.client.create_bucket(**kwargs)
            logger.info('Created bucket %s at %s', self.bucket_name, self.endpoint_url)
        except botocore.exceptions.ClientError as error:
            code = str(error.response.get('Error', {}).get('Code', ''))
            if code not in ('BucketAlreadyOwnedByYou', 'BucketAlreadyExists'):
                self._raise_translated(error, 'CreateBucket')
        except Exception as error:
            self._raise_translated(error, 'CreateBucket')

    def check_bucket(self) -> None:
        """Check that the bucket exists and that we may use it (a HeadBucket request).

        Raises StorageError naming the bucket and the endpoint when it does not exist, StorageAuthError when the
        credentials are refused; network errors keep botocore's types (the caller decides what they mean).
        """
        import botocore.exceptions
        try:
            self.client.head_bucket(Bucket=self.bucket_name)
        except botocore.exceptions.ClientError as error:
            code = str(error.response.get('Error', {}).get('Code', ''))
            if code in ('404', 'NoSuchBucket', 'NotFound'):
                raise StorageError(
                    f"S3 bucket '{self.bucket_name}' does not exist at endpoint {self.endpoint_url}. Create it "
                    f'first (aws s3 mb s3://{self.bucket_name}, or S3Storage(...).ensure_bucket()), or fix '
                    f'bucket_name'
                ) from None
            self._raise_translated(error, 'HeadBucket')
        except Exception as error:
            self._raise_translated(error, 'HeadBucket')

    def create_exclusive(self, key: str, text: str) -> bool:
        """Store ``text`` under ``key`` unless an object is there (a PutObject with ``If-None-Match: *``).

        True if this call created the object; False if it existed (or a concurrent conditional write to the same
        key won). Servers without conditional writes would answer True to every caller: callers that must be sure
        read the object back.
        """
        import botocore.exceptions
        full_key = self._full_key(key)
        try:
            self.client.put_object(Bucket=self.bucket_name, Key=full_key, Body=text.encode('utf-8'),
                                   ContentType='text/plain; charset=utf-8', IfNoneMatch='*')
        except botocore.exceptions.ClientError as error:
            code = str(error.response.get('Error', {}).get('Code', ''))
            status = error.response.get('ResponseMetadata', {}).get('HTTPStatusCode')
            if code in _PRECONDITION_CODES or status in (409, 412):
                return False
            self._raise_translated(error, 'PutObject', key)
        except Exception as error:
            self._raise_translated(error, 'PutObject', key)
        return True

    def location(self) -> dict[str, str | None]:
        """``{'bucket', 'prefix', 'endpoint'}``: enough to build this storage again (the upload journal)."""
        return {'bucket': self.bucket_name, 'prefix': self.cloud_dir_prefix, 'endpoint': self.endpoint_url}

    def save_file(self, local_path: StrPath, key: str) -> None:
        """Upload ``local_path`` to ``key`` (multipart above ``multipart_threshold``)."""
        full_key = self._full_key(key)
        # upload_file switches to a multipart upload above multipart_threshold; S3 only makes the
        # object visible once every part is in, so readers never see a partial file.
        self._call('upload', key, self.client.upload_file, os.fspath(local_path), self.bucket_name,
                   full_key, Config=self.transfer_config)
        logger.debug('Uploaded %s to %s', local_path, self.uri(key))

    def load_file(self, key: str, local_path: StrPath) -> StrPath:
        """Download ``key`` to ``local_path`` (parent folders created) and return ``local_path``."""
        full_key = self._full_key(key)
        local_path_str = os.fspath(local_path)
        parent = os.path.dirname(os.path.abspath(local_path_str))
        os.makedirs(parent, exist_ok=True)
        # download_file writes to a temporary name and renames it when complete.
        self._call('download', key, self.client.download_file, self.bucket_name, full_key,
                   local_path_str, Config=self.transfer_config)
        return local_path

    def exists(self, key: str) -> bool:
        """True if an object is stored under exactly ``key`` (a HEAD request). A missing bucket is a StorageError,
        as for :meth:`list` (a HEAD answers 404 for both: the bucket is then checked)."""
        full_key = self._full_key(key)
        try:
            self._call('HeadObject', key, self.client.head_object, Bucket=self.bucket_name, Key=full_key)
        except FileNotFoundError:
            self.check_bucket()
            return False
        return True

    def list(self, prefix: str = '') -> list[str]:
        """Sorted keys (relative to ``cloud_dir_prefix``) that start with ``prefix``."""
        if self.cloud_dir_prefix:
            full_prefix = self.cloud_dir_prefix + '/' + prefix
        else:
            full_prefix = prefix
        paginator = self.client.get_paginator('list_objects_v2')
        keys: list[str] = []

        def collect() -> None:
            for page in paginator.paginate(Bucket=self.bucket_name, Prefix=full_prefix):
                for item in page.get('Contents', ()):
                    keys.append(self._relative_key(item['Key']))

        self._call('ListObjectsV2', None, collect)
        return sorted(keys)

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error (S3 semantics)."""
        full_key = self._full_key(key)
        self._call('DeleteObject', None, self.client.delete_object, Bucket=self.bucket_name, Key=full_key)

    def write_text(self, key: str, text: str) -> None:
        """Store ``text`` (UTF-8, ``text/plain``) under ``key``."""
        full_key = self._full_key(key)
        self._call('PutObject', key, self.client.put_object, Bucket=self.bucket_name, Key=full_key,
                   Body=text.encode('utf-8'), ContentType='text/plain; charset=utf-8')

    def read_text(self, key: str) -> str:
        """Return the UTF-8 text stored under ``key``; FileNotFoundError if missing."""
        full_key = self._full_key(key)

        def read() -> str:
            response = self.client.get_object(Bucket=self.bucket_name, Key=full_key)
            with response['Body'] as body:
                return body.read().decode('utf-8')

        return self._call('GetObject', key, read)
