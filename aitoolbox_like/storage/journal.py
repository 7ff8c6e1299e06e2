"""The journal of uploads not confirmed yet, and the sync that finishes them from another process.

The background uploader writes one entry per queued upload into a JSON file (``pending_uploads.json``; an
experiment keeps it in its bookkeeping folder, outside the experiment folder) before the upload starts, and removes
it once the storage confirmed the upload.
What the journal lists when a process ends (killed, the cloud down for longer than the end of fit waited) was never
confirmed: a resumed run into the same folder queues those uploads again, and :func:`sync_journal` (the command
``python -m aitoolbox_like.experiment.sync FOLDER``) uploads them.

Each entry names its target completely (cloud, bucket, prefix, endpoint, key; never a secret: the credentials are
found as the client finds them), so the journal alone is enough to finish
the uploads; the file it uploads is named relative to the journal's base folder (the experiment folder), so the
folders may be moved. Every
change is a read-modify-write of the file under an exclusive lock (``flock``) and an atomic rename, so a running
uploader and a sync of the same folder never lose each other's changes.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..runtime._typing import StrPath
from .base import Storage
from .local import exclusive_lock, remove_folder, write_text_atomically
from .urls import storage_for_location

logger = logging.getLogger(__name__)

JOURNAL_NAME = 'pending_uploads.json'
_FORMAT_VERSION = 1
# The fields of a journal entry besides the storage location (bucket / prefix / endpoint, or root).
ENTRY_FIELDS = ('id', 'file', 'key', 'pointer_key', 'pointer_text', 'delete_local_after', 'delete_local_folder')


class UploadJournal:
    """The pending uploads listed in the JSON file ``path``; files are named relative to ``base_dir`` (None: the
    journal's own folder).

    Thread-safe, and safe against another process changing the same file (an exclusive ``flock`` on the journal's
    folder around every read-modify-write). The file is removed when no upload is pending.
    """

    def __init__(self, path: StrPath, base_dir: StrPath | None = None) -> None:
        self.path = os.path.abspath(os.fspath(path))
        # The folder the file names are relative to; None: the journal's own folder (follows ``path``).
        self.base_dir_override = os.path.abspath(os.fspath(base_dir)) if base_dir is not None else None
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f'UploadJournal({self.path!r}, base_dir={self.base_dir!r})'

    @property
    def base_dir(self) -> str:
        """The folder the journal's file names are relative to."""
        return self.base_dir_override if self.base_dir_override is not None else os.path.dirname(self.path)

    @property
    def journal_dir(self) -> str:
        """The folder of the journal file."""
        return os.path.dirname(self.path)

    def relative(self, local_path: StrPath) -> str:
        """``local_path`` as the journal names it: '/'-separated, relative to :attr:`base_dir`."""
        return os.path.relpath(os.path.abspath(os.fspath(local_path)), self.base_dir).replace(os.sep, '/')

    def local_path(self, entry: dict[str, Any]) -> str:
        """The local file of a journal entry."""
        return os.path.join(self.base_dir, *str(entry['file']).split('/'))

    def entries(self) -> list[dict[str, Any]]:
        """The pending uploads, oldest first."""
        with self._lock:
            return self._read()

    def add(self, entry: dict[str, Any]) -> None:
        """Record an upload (an entry with the same ``id`` is replaced, keeping its place)."""
        def change(entries: list[dict[str, Any]]) -> None:
            for i, old in enumerate(entries):
                if old.get('id') == entry['id']:
                    entries[i] = dict(entry)
                    return
            entries.append(dict(entry))
        self._update(change, create=True)

    def remove(self, upload_id: str) -> None:
        """Forget an upload (confirmed, or nothing left to send); a missing id is not an error."""
        self._update(lambda entries: entries.__setitem__(slice(None), [e for e in entries
                                                                       if e.get('id') != upload_id]))

    def mark_delete_local(self, file: str) -> None:
        """Delete the local ``file`` (a journal name) once all its uploads are confirmed, whoever confirms them."""
        def change(entries: list[dict[str, Any]]) -> None:
            for entry in entries:
                if entry.get('file') == file:
                    entry['delete_local_after'] = True
        self._update(change)

    def mark_delete_local_folder(self, folder: str) -> None:
        """Delete the local ``folder`` (a journal name) whole once the uploads of all the files inside it are
        confirmed, whoever confirms them (a sharded checkpoint that rm_subopt_local_models removes)."""
        def change(entries: list[dict[str, Any]]) -> None:
            for entry in entries:
                if str(entry.get('file')).startswith(folder + '/'):
                    entry['delete_local_folder'] = folder
        self._update(change)

    # -- file -------------------------------------------------------------------------------------------------

    def _read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, encoding='utf-8') as f:
                data = json.load(f)
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as error:
            logger.error('Upload journal %s cannot be read (%s); treating it as empty', self.path, error)
            return []
        uploads = data.get('uploads') if isinstance(data, dict) else None
        return [dict(e) for e in uploads if isinstance(e, dict) and 'id' in e and 'file' in e and 'key' in e] \
            if isinstance(uploads, list) else []

    def _update(self, change: Callable[[list[dict[str, Any]]], None], create: bool = False) -> None:
        with self._lock:
            if not os.path.isdir(self.journal_dir):
                if not create:
                    return
                os.makedirs(self.journal_dir, exist_ok=True)
            with exclusive_lock(self.journal_dir):
                entries = self._read()
                before = json.dumps(entries, sort_keys=True)
                change(entries)
                if json.dumps(entries, sort_keys=True) == before and (entries or not os.path.exists(self.path)):
                    return
                if entries:
                    text = json.dumps({'format_version': _FORMAT_VERSION,
                                       'what': 'uploads not confirmed yet; upload them with: python -m '
                                               'aitoolbox_like.experiment.sync <experiment folder>',
                                       'uploads': entries}, indent=1)
                    write_text_atomically(self.path, text, temp_dir=self.journal_dir)
                else:
                    try:
                        os.remove(self.path)
                    except FileNotFoundError:
                        pass


# ---------------------------------------------------------------------------------------------- sync


@dataclass
class SyncReport:
    """What :func:`sync_journal` did: ``uploaded`` (storage URIs), ``failed`` ((local path, error) pairs, still
    in the journal) and ``missing`` (local files that no longer exist; dropped from the journal)."""
    folder: str
    uploaded: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """True when nothing is left to upload."""
        return not self.failed


def _location_of(entry: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, v) for k, v in entry.items() if k not in ENTRY_FIELDS))


def sync_journal(journal: UploadJournal | StrPath, endpoint_url: str | None = None,
                 storage_factory: Callable[[dict[str, Any]], Storage] | None = None) -> SyncReport:
    """Upload what ``journal`` (an UploadJournal, or a folder holding a ``pending_uploads.json`` that names files
    relative to itself) lists, in the order it was queued.

    A "latest" pointer is written after its object; a file marked for deletion is deleted once all its uploads
    succeeded (a folder marked for deletion, once the uploads of all the files inside it succeeded). Uploads that
    fail stay in the journal (try again later); after a network error the other uploads to the same storage are
    not tried. ``endpoint_url`` replaces the recorded endpoint (of every cloud the journal names).
    """
    if not isinstance(journal, UploadJournal):
        journal = UploadJournal(os.path.join(os.path.abspath(os.fspath(journal)), JOURNAL_NAME))
    report = SyncReport(journal.base_dir)
    storages: dict[tuple[tuple[str, Any], ...], Storage | BaseException] = {}
    from .uploader import is_retryable
    for entry in journal.entries():
        path = journal.local_path(entry)
        location = _location_of(entry)
        if location not in storages:
            try:
                storages[location] = storage_factory(dict(location)) if storage_factory is not None else \
                    storage_for_location(dict(location), endpoint_url)
            except Exception as error:
                storages[location] = error
        storage = storages[location]
        if isinstance(storage, BaseException):
            report.failed.append((path, f'{type(storage).__name__}: {storage}'))
            continue
        if not os.path.isfile(path):
            logger.warning('%s is listed for upload but no longer exists; dropped from the journal', path)
            report.missing.append(path)
            journal.remove(entry['id'])
            continue
        try:
            storage.save_file(path, entry['key'])
            if entry.get('pointer_key'):
                text = entry.get('pointer_text')
                storage.write_text(entry['pointer_key'], entry['key'] if text is None else text)
        except Exception as error:
            report.failed.append((path, f'{type(error).__name__}: {error}'))
            if is_retryable(error, path):
                storages[location] = error      # the storage is unreachable: do not try its other uploads
            continue
        journal.remove(entry['id'])
        report.uploaded.append(storage.uri(entry['key']))
        if entry.get('delete_local_after') and not any(e['file'] == entry['file'] for e in journal.entries()):
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
        doomed = str(entry.get('delete_local_folder') or '')
        if doomed and not any(str(e['file']).startswith(doomed + '/') for e in journal.entries()):
            try:
                remove_folder(os.path.join(journal.base_dir, *doomed.split('/')))
            except FileNotFoundError:
                pass
    return report
