"""One way to ask for a storage: by URL (``s3://``, ``gs://``, ``az://``, ``file://`` or a plain path) or by
AIToolbox's ``cloud_save_mode`` and a bucket name. The only module that knows which class serves which cloud.

Every module outside :mod:`aitoolbox_like.storage` gets its storage here and never names a backend, so a cloud is
added in one place. The backends are imported when a storage of theirs is first asked for (each needs its own
optional client library: ``pip install aitoolbox_like[s3]``, ``[gcs]`` or ``[azure]``).

=====================  ==========  ==============================================  ==========================
cloud                  scheme      ``cloud_save_mode``                             endpoint variable
=====================  ==========  ==============================================  ==========================
Amazon S3 (any S3)     ``s3://``   ``'s3'``, ``'aws_s3'``, ``'aws'``               ``AWS_ENDPOINT_URL_S3``
Google Cloud Storage   ``gs://``   ``'gcs'``, ``'google_storage'``,                ``STORAGE_EMULATOR_HOST``
                                   ``'google storage'``
Azure Blob Storage     ``az://``   ``'azure'``, ``'azure_blob'``, ``'az'``         ``AZURE_STORAGE_ACCOUNT_URL``
=====================  ==========  ==============================================  ==========================

``bucket_name`` names the S3 or GCS bucket, or the Azure container.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable

from .base import Storage
from .local import LocalStorage

#: The cloud schemes, in the order the documentation lists them.
CLOUD_SCHEMES = ('s3', 'gs', 'az')
#: AIToolbox's ``cloud_save_mode`` spellings of each cloud (S3's and Google's are AIToolbox's own lists).
CLOUD_SAVE_MODES = {
    's3': ('s3', 'aws_s3', 'aws'),
    'gs': ('gcs', 'google_storage', 'google storage'),
    'az': ('azure', 'azure_blob', 'az'),
}
#: The modes that keep an experiment on this machine only.
LOCAL_SAVE_MODES = ('local', None, False, '')
#: The environment variable that names each cloud's endpoint for every client this process (and the processes it
#: starts) makes: boto3's, Google's emulator variable, and ours for the Azure account URL.
ENDPOINT_VARIABLES = {'s3': 'AWS_ENDPOINT_URL_S3', 'gs': 'STORAGE_EMULATOR_HOST', 'az': 'AZURE_STORAGE_ACCOUNT_URL'}
#: Each cloud's name in messages.
CLOUD_NAMES = {'s3': 'S3', 'gs': 'Google Cloud Storage', 'az': 'Azure Blob Storage'}
# scheme -> (module of this package, class)
_BACKENDS = {
    's3': ('s3', 'S3Storage'),
    'gs': ('gcs', 'GCSStorage'),
    'az': ('azure', 'AzureBlobStorage'),
}


def backend_class(scheme: str) -> Callable[..., Storage]:
    """The Storage class of a cloud ``scheme`` (``'s3'``, ``'gs'``, ``'az'``), its module imported now."""
    if scheme not in _BACKENDS:
        raise ValueError(f'unknown storage scheme {scheme!r}; expected one of {", ".join(CLOUD_SCHEMES)}')
    module, name = _BACKENDS[scheme]
    backend: Callable[..., Storage] = getattr(importlib.import_module(f'{__package__}.{module}'), name)
    return backend


def cloud_scheme(cloud_save_mode: Any) -> str | None:
    """The scheme of the cloud a ``cloud_save_mode`` names (``'s3'``, ``'gs'`` or ``'az'``), or None for the local-only
    modes (``'local'``, None). ValueError, listing the accepted values, for anything else."""
    if cloud_save_mode in LOCAL_SAVE_MODES:
        return None
    if isinstance(cloud_save_mode, str):
        for scheme, modes in CLOUD_SAVE_MODES.items():
            if cloud_save_mode.lower() in modes:
                return scheme
    accepted = ', '.join(repr(m) for modes in CLOUD_SAVE_MODES.values() for m in modes)
    raise ValueError(f"cloud_save_mode must be one of {accepted}, or 'local' (None) to keep the files on this "
                     f'machine only; got {cloud_save_mode!r}')


def is_cloud_url(text: Any) -> bool:
    """True for a string starting with ``s3://``, ``gs://`` or ``az://``."""
    return isinstance(text, str) and text.split('://', 1)[0] in CLOUD_SCHEMES and '://' in text


def split_url(url: str) -> tuple[str, str, str]:
    """``gs://bucket/some/key/`` -> ``('gs', 'bucket', 'some/key')``; bucket or key may be empty (the caller names
    what it expected). ValueError when ``url`` is not a cloud URL."""
    if not is_cloud_url(url):
        raise ValueError(f'{url!r} is not a cloud storage URL (s3://, gs:// or az://bucket/key)')
    scheme, _, rest = url.partition('://')
    bucket, _, key = rest.partition('/')
    return scheme, bucket, key.strip('/')


def storage_for_mode(cloud_save_mode: Any, bucket_name: str, cloud_dir_prefix: str = '',
                     endpoint_url: str | None = None, **options: Any) -> Storage:
    """The storage of ``bucket_name`` (bucket or container) under ``cloud_dir_prefix`` in the cloud that
    ``cloud_save_mode`` names. ``options`` go to the backend (``max_attempts``: the client's own retries).
    Nothing is reached over the network yet. ValueError for a local-only or unknown mode."""
    scheme = cloud_scheme(cloud_save_mode)
    if scheme is None:
        raise ValueError(f'cloud_save_mode={cloud_save_mode!r} keeps files on this machine: there is no cloud '
                         f'storage to open')
    return backend_class(scheme)(bucket_name, cloud_dir_prefix or '', endpoint_url=endpoint_url, **options)


def open_storage(url: str, endpoint_url: str | None = None, **options: Any) -> Storage:
    """The storage a URL names, rooted at its path: ``s3://bucket/prefix``, ``gs://bucket/prefix``,
    ``az://container/prefix``, or a local folder (``file:///path`` or a plain path)."""
    if is_cloud_url(url):
        scheme, bucket, prefix = split_url(url)
        if not bucket:
            raise ValueError(f'{url!r} names no bucket: expected {scheme}://<bucket>/<prefix>')
        return backend_class(scheme)(bucket, prefix, endpoint_url=endpoint_url, **options)
    path = os.fspath(url)
    if path.startswith('file://'):
        path = path[len('file://'):]
    elif '://' in path:
        raise ValueError(f'{url!r}: unknown storage scheme; expected s3://, gs://, az://, file:// or a local path')
    return LocalStorage(path)


def storage_for_location(location: dict[str, Any], endpoint_url: str | None = None) -> Storage:
    """The storage an upload-journal entry names (what :meth:`Storage.location` returned): a cloud (``scheme``,
    absent in entries written before Google and Azure storage, meaning S3; ``bucket``, ``prefix``, ``endpoint``;
    ``endpoint_url`` replaces the recorded endpoint) or a local folder (``root``)."""
    if location.get('bucket'):
        scheme = str(location.get('scheme') or 's3')
        return backend_class(scheme)(str(location['bucket']), str(location.get('prefix') or ''),
                                     endpoint_url=endpoint_url or location.get('endpoint') or None)
    if location.get('root'):
        return LocalStorage(str(location['root']))
    raise ValueError(f'journal entry names no storage: {location!r}')


def is_transient_backend_error(error: BaseException) -> bool | None:
    """What the backends already imported say of ``error``: True (waiting and trying again may succeed), False
    (it will not), or None (not one of their errors). An error of a backend never imported cannot occur."""
    for scheme in CLOUD_SCHEMES:
        module = sys.modules.get(f'{__package__}.{_BACKENDS[scheme][0]}')
        verdict = getattr(module, 'is_transient', None)
        if verdict is not None:
            answer = verdict(error)
            if answer is not None:
                return bool(answer)
    return None


__all__ = ['CLOUD_SCHEMES', 'CLOUD_SAVE_MODES', 'LOCAL_SAVE_MODES', 'ENDPOINT_VARIABLES', 'CLOUD_NAMES',
           'backend_class', 'cloud_scheme', 'is_cloud_url', 'split_url', 'storage_for_mode', 'open_storage',
           'storage_for_location', 'is_transient_backend_error']
