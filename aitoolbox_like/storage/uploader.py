"""Upload files in a background thread so training never waits for the network.

One worker thread handles jobs in submission order. A job that fails for a transient reason (no
connection, timeout, 5xx) is retried with exponential backoff (``max_retries=None``: until it succeeds or
the uploader is closed); an authentication failure is not, because retrying cannot fix it. A "latest"
pointer is written only after the object it names is fully uploaded, so a reader following the pointer
always finds a complete file.

The uploader owns the files it still has to send: :meth:`BackgroundUploader.delete_after_upload` deletes a
local file only once every upload of it is confirmed (a folder, such as a sharded checkpoint, once every upload of
a file inside it is confirmed, and then all at once). With a :class:`~.journal.UploadJournal`, every job is
written to disk before it is queued and removed once confirmed, so another process can finish what this one
could not (a resumed run, or ``python -m aitoolbox_like.experiment.sync``).
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..runtime._typing import StrPath
from .base import Storage, StorageError
from .local import remove_folder
from .urls import is_transient_backend_error

if TYPE_CHECKING:   # the journal's sync uses is_retryable from here
    from .journal import UploadJournal

logger = logging.getLogger(__name__)

_STOP = object()


@dataclass
class UploadJob:
    """One file to upload to ``key``, then optionally a "latest" pointer object naming it."""
    local_path: str
    key: str
    latest_pointer_key: str | None = None
    delete_local_after: bool = False
    # What the pointer object says; None: the uploaded object's key.
    latest_pointer_text: str | None = None
    # Names the job in the journal; a job submitted again (resume) keeps its id.
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # The last error of a job still being retried (None: not failed yet).
    last_error: str | None = None


@dataclass
class UploadFailure:
    """A job that did not complete. ``key`` is the object that failed (the target or its pointer)."""
    key: str
    local_path: str
    error: str
    attempts: int
    latest_pointer_key: str | None = None
    job_id: str = ''


def is_retryable(error: BaseException, local_path: StrPath | None = None) -> bool:
    """Whether waiting and trying again might succeed."""
    if isinstance(error, StorageError):     # StorageAuthError included: retrying cannot fix either
        return False
    if isinstance(error, FileNotFoundError) and local_path is not None and not os.path.exists(local_path):
        # The file to upload is gone; waiting will not bring it back.
        return False
    if isinstance(error, (IsADirectoryError, NotADirectoryError)):
        return False
    verdict = is_transient_backend_error(error)     # the cloud clients' own errors: network, 5xx, throttling
    if verdict is not None:
        return verdict
    # Covers ConnectionRefusedError and I/O errors on network filesystems for LocalStorage.
    return isinstance(error, OSError)


class BackgroundUploader:
    """Queue of uploads to ``storage`` worked through by one daemon thread.

    ``submit`` blocks while ``max_queue_size`` jobs are waiting, which bounds memory (and disk, for
    callers that write a file per job) when the network is slower than training; ``None``: never blocks.
    ``max_retries`` retries of a retryable error before the job fails; ``None``: retry (backoff capped at
    ``max_backoff_s``) until the upload succeeds or ``close`` gives up. ``journal``: record every job on disk
    until it is confirmed (the storage must support :meth:`Storage.location`).
    """

    def __init__(self, storage: Storage, max_queue_size: int | None = 32, max_retries: int | None = 6,
                 initial_backoff_s: float = 0.5, max_backoff_s: float = 30.0,
                 journal: UploadJournal | None = None) -> None:
        if max_queue_size is not None and max_queue_size < 1:
            raise ValueError(f'max_queue_size must be >= 1 or None, got {max_queue_size}')
        self.storage = storage
        self.journal = journal
        self._location = storage.location() if journal is not None else {}
        self.max_retries = max_retries
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.failures: list[UploadFailure] = []
        self.retries = 0  # retry attempts made so far, all jobs together
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queue_size or 0)
        # Jobs submitted and not confirmed (queued, in progress, or failed with the file still there), by id;
        # the local files they upload are deleted only when none is left (delete_after_upload).
        self._unconfirmed: dict[str, UploadJob] = {}
        self._delete_requested: set[str] = set()
        self._delete_requested_folders: set[str] = set()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self._reported = 0
        self._closed = False
        self._abort = threading.Event()
        self._thread = threading.Thread(target=self._run, name='aitoolbox-uploader', daemon=True)
        self._thread.start()

    def __enter__(self) -> BackgroundUploader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def pending_count(self) -> int:
        """Jobs submitted and not yet finished (queued or in progress)."""
        with self._lock:
            return self._pending

    def submit(self, local_path: StrPath, key: str, latest_pointer_key: str | None = None,
               delete_local_after: bool = False, latest_pointer_text: str | None = None,
               job_id: str | None = None) -> UploadJob:
        """Queue ``local_path`` for upload to ``key``; then point ``latest_pointer_key`` at it.

        The pointer object holds ``latest_pointer_text`` (default: ``key``) and is written only after the
        upload completed. ``delete_local_after``: delete the local file once the upload is confirmed (and no
        other upload of it is pending). ``job_id`` re-queues a job of the journal under its id. Blocks while
        the queue is full.
        """
        job = UploadJob(os.path.abspath(os.fspath(local_path)), key, latest_pointer_key, delete_local_after,
                        latest_pointer_text)
        if job_id is not None:
            job.id = job_id
        with self._lock:
            if self._closed:
                raise RuntimeError('BackgroundUploader is closed; no more uploads can be submitted')
            self._pending += 1
            self._unconfirmed[job.id] = job
            if delete_local_after:
                self._delete_requested.add(job.local_path)
        try:
            if self.journal is not None:
                self.journal.add(self._journal_entry(job))
            self._queue.put(job)
        except BaseException:
            with self._lock:
                self._pending -= 1
                self._unconfirmed.pop(job.id, None)
                self._idle.notify_all()
            raise
        return job

    def _journal_entry(self, job: UploadJob) -> dict[str, Any]:
        assert self.journal is not None
        return {'id': job.id, 'file': self.journal.relative(job.local_path), 'key': job.key,
                'pointer_key': job.latest_pointer_key, 'pointer_text': job.latest_pointer_text,
                'delete_local_after': job.delete_local_after, **self._location}

    def delete_after_upload(self, local_path: StrPath) -> bool:
        """Delete ``local_path`` now if no upload of it is unconfirmed, else once the last one is confirmed.

        Returns True if the file was deleted now. A file whose upload failed for good stays (it is the only
        copy); the journal keeps the request, so a later sync deletes it after uploading it.

        A folder (a sharded checkpoint) is deleted whole once no upload of a file inside it is unconfirmed; until
        then nothing in it is deleted, so it stays complete (see :func:`~.local.remove_folder`).
        """
        path = os.path.abspath(os.fspath(local_path))
        if os.path.isdir(path):
            return self._delete_folder_after_upload(path)
        with self._lock:
            if any(job.local_path == path for job in self._unconfirmed.values()):
                self._delete_requested.add(path)
                if self.journal is not None:
                    self.journal.mark_delete_local(self.journal.relative(path))
                return False
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            return True

    def _delete_folder_after_upload(self, folder: str) -> bool:
        with self._lock:
            if self._unconfirmed_inside(folder):
                self._delete_requested_folders.add(folder)
                if self.journal is not None:
                    self.journal.mark_delete_local_folder(self.journal.relative(folder))
                return False
            try:
                remove_folder(folder)
            except FileNotFoundError:
                pass
            return True

    def _unconfirmed_inside(self, folder: str) -> bool:
        inside = folder + os.sep
        return any(job.local_path.startswith(inside) for job in self._unconfirmed.values())

    def unconfirmed(self) -> list[UploadJob]:
        """Jobs not confirmed by the storage: queued, in progress, or failed (their files are kept)."""
        with self._lock:
            return list(self._unconfirmed.values())

    def wait(self, timeout: float | None = None) -> list[UploadFailure]:
        """Block until every submitted job has finished (or ``timeout`` seconds passed).

        Returns the failures recorded since the previous ``wait``/``close`` call; ``failures`` keeps
        all of them. Check ``pending_count`` to tell a timeout from completion.
        """
        with self._idle:
            self._idle.wait_for(lambda: self._pending == 0, timeout=None if timeout is None else max(timeout, 0.0))
            new = self.failures[self._reported:]
            self._reported = len(self.failures)
        return list(new)

    def close(self, timeout: float | None = None) -> list[UploadFailure]:
        """Finish queued uploads (up to ``timeout`` seconds), then stop the worker.

        Jobs still unfinished at the timeout are abandoned and recorded as failures (they stay in the
        journal). Returns the failures not yet returned by ``wait``.
        """
        with self._lock:
            already_closed = self._closed
            self._closed = True
        with self._idle:
            finished = self._idle.wait_for(lambda: self._pending == 0, timeout=timeout)
        if not finished:
            logger.error('Uploader closing with %d upload(s) unfinished after %.1f s; abandoning them',
                         self.pending_count, timeout)
            # The worker records each remaining job as failed without trying it, so the queue
            # empties quickly and the stop marker below fits.
            self._abort.set()
        if not already_closed:
            try:
                self._queue.put(_STOP, timeout=10.0)
            except queue.Full:
                logger.error('Uploader worker did not drain its queue; leaving the daemon thread behind')
        self._thread.join(timeout=None if finished else 10.0)
        return self.wait(timeout=0)

    # -- worker -----------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is _STOP:
                return
            try:
                self._process(job)
            except BaseException as error:  # never let the worker die and strand waiters
                logger.exception('Uploader: unexpected error for %s', job.key)
                self._record_failure(job, job.key, error, 1)
            finally:
                with self._lock:
                    self._pending -= 1
                    self._idle.notify_all()

    def _process(self, job: UploadJob) -> None:
        ok = self._attempt(job, job.key, lambda: self.storage.save_file(job.local_path, job.key))
        if not ok:
            return
        pointer_key = job.latest_pointer_key
        if pointer_key is not None:
            ok = self._attempt(job, pointer_key,
                               lambda: self.storage.write_text(pointer_key,
                                                               job.key if job.latest_pointer_text is None
                                                               else job.latest_pointer_text))
            if not ok:
                return
        self._confirm(job)

    def _confirm(self, job: UploadJob) -> None:
        """The storage has the job's object (and pointer): forget the job, delete the file if asked to."""
        with self._lock:
            self._unconfirmed.pop(job.id, None)
            if self.journal is not None:
                self.journal.remove(job.id)
            path = job.local_path
            if path in self._delete_requested and not any(j.local_path == path for j in self._unconfirmed.values()):
                self._delete_requested.discard(path)
                try:
                    os.remove(path)
                    logger.debug('Uploaded %s; removed the local copy', job.key)
                except FileNotFoundError:
                    pass
                except OSError as error:
                    logger.warning('Uploaded %s but could not delete the local copy: %s', job.key, error)
            for folder in [f for f in self._delete_requested_folders if path.startswith(f + os.sep)]:
                if self._unconfirmed_inside(folder):
                    continue
                self._delete_requested_folders.discard(folder)
                try:
                    remove_folder(folder)
                    logger.debug('Uploaded every file of %s; removed the local folder', folder)
                except FileNotFoundError:
                    pass
                except OSError as error:
                    logger.warning('Uploaded every file of %s but could not delete the local folder: %s', folder,
                                   error)

    def _attempt(self, job: UploadJob, key: str, operation: Callable[[], object]) -> bool:
        delay = self.initial_backoff_s
        attempts = 0
        while True:
            if self._abort.is_set():
                self._record_failure(job, key, 'uploader closed before the upload finished', attempts)
                return False
            attempts += 1
            try:
                operation()
                if attempts > 1:
                    logger.info('Uploaded %s after %d attempts', key, attempts)
                return True
            except Exception as error:
                job.last_error = _describe(error)
                if (self.max_retries is not None and attempts > self.max_retries) \
                        or not is_retryable(error, job.local_path):
                    self._record_failure(job, key, error, attempts)
                    return False
                of = 'until it succeeds' if self.max_retries is None else f'of {self.max_retries + 1}'
                logger.warning('Upload of %s failed (attempt %d %s), retrying in %.1f s: %s',
                               key, attempts, of, delay, _describe(error))
                with self._lock:
                    self.retries += 1
                # Interruptible by close(timeout) giving up.
                self._abort.wait(delay)
                delay = min(delay * 2, self.max_backoff_s)

    def _record_failure(self, job: UploadJob, key: str, error: BaseException | str, attempts: int) -> None:
        text = error if isinstance(error, str) else _describe(error)
        failure = UploadFailure(key=key, local_path=job.local_path, error=text, attempts=attempts,
                                latest_pointer_key=job.latest_pointer_key, job_id=job.id)
        job.last_error = text
        logger.error('Upload of %s to %s failed after %d attempt(s): %s', job.local_path, key,
                     attempts, text)
        with self._lock:
            self.failures.append(failure)
            if not os.path.exists(job.local_path):
                # Nothing left to send: no later process can finish this upload.
                self._unconfirmed.pop(job.id, None)
                if self.journal is not None:
                    self.journal.remove(job.id)


def _describe(error: BaseException) -> str:
    return f'{type(error).__name__}: {error}'
