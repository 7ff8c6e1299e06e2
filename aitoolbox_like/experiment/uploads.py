"""The cloud side of an experiment: which cloud a ``cloud_save_mode`` names, and the uploader that copies the
experiment folder into the same keys of a bucket (S3, Google Cloud Storage) or an Azure container, claiming its
prefix there first. Re-exported by :mod:`aitoolbox_like.experiment`.
"""
import logging
import os
import shlex
import sys
from typing import Any, Dict, List

from ..storage.base import StorageError, StorageUnreachableError, join_key
from ..storage.uploader import is_retryable
from ..storage.urls import CLOUD_NAMES, CLOUD_SAVE_MODES, ENDPOINT_VARIABLES, cloud_scheme, storage_for_mode

logger = logging.getLogger(__name__)

S3_SAVE_MODES = CLOUD_SAVE_MODES['s3']
GCS_SAVE_MODES = CLOUD_SAVE_MODES['gs']
AZURE_SAVE_MODES = CLOUD_SAVE_MODES['az']
LOCAL_SAVE_MODES = ('local', None, False, '')
# Each cloud's canonical cloud_save_mode (what normalize_cloud_save_mode returns).
_CANONICAL_MODES = {'s3': 's3', 'gs': 'gcs', 'az': 'azure'}
# The hidden folder at the root of the local folder (and under the cloud prefix) that holds our bookkeeping, as
# <project>/<experiment folder name>/.
BOOKKEEPING_DIR = '.aitoolbox_like'
# In the bookkeeping folder: the id of the run that claimed the experiment folder / prefix.
MARKER_FILE = 'run'
ACCESS_CHECK_PREFIX = '.aitoolbox_like_access_check'


def normalize_cloud_save_mode(cloud_save_mode):
    """The canonical name of the place a ``cloud_save_mode`` names: 's3', 'gcs' or 'azure' for each of their
    spellings (AIToolbox's 's3' / 'aws_s3' / 'aws' and 'gcs' / 'google_storage' / 'google storage'; 'azure' /
    'azure_blob' / 'az'), 'local' for local-only (None, 'local'). ValueError for anything else."""
    scheme = cloud_scheme(cloud_save_mode)
    return 'local' if scheme is None else _CANONICAL_MODES[scheme]


def is_cloud_mode(cloud_save_mode):
    """True when files are uploaded too (any cloud), False for the local-only modes; ValueError for an unknown one."""
    return cloud_scheme(cloud_save_mode) is not None


def is_s3_mode(cloud_save_mode):
    """True when files go to S3 (any of AIToolbox's S3 aliases); False for the other clouds and local-only."""
    return cloud_scheme(cloud_save_mode) == 's3'


def bookkeeping_key(experiment_key):
    """The bookkeeping prefix of an experiment folder given as a key ('<project>/<experiment>_<ts>'):
    '.aitoolbox_like/<project>/<experiment>_<ts>'."""
    return join_key(BOOKKEEPING_DIR, experiment_key.strip('/'))


def sync_command(folder):
    """The shell command that uploads what the journal of the experiment folder ``folder`` lists."""
    return f'{shlex.quote(os.path.basename(sys.executable) or "python")} -m aitoolbox_like.experiment.sync ' \
           f'{shlex.quote(os.fspath(folder))}'




class ExperimentUploader:
    """Uploads files of the local experiment folder to the same relative keys in the cloud experiment folder,
    in a background thread (training does not wait). Set on the loop as ``loop.experiment_uploader``.

    Creating it touches no network (callbacks create it when they are registered, also outside fit). The saving
    callbacks :meth:`start` it at the start of fit, before the first step (other callbacks at their first upload):
    it then checks the bucket or container, that it may write and delete under the experiment's prefix, and claims
    the prefix for this run (see :meth:`Experiment.add_cloud_claim`); an unreachable endpoint is a
    :class:`StorageUnreachableError`, a missing bucket or refused credentials a :class:`StorageError` /
    :class:`StorageAuthError`, before any training. Files given before then are uploaded once it has started.

    Nothing is lost, nothing is silent: every upload is recorded in the experiment's journal
    (``pending_uploads.json`` in its bookkeeping folder) until the storage confirmed it; network errors are retried
    (backoff up to ``max_backoff_s``) for as long as the process lives; a file the run deletes
    (``rm_subopt_local_models``) is deleted only after its upload is confirmed (:meth:`remove_local_file`); what is
    still unconfirmed when fit ends is reported once, with the command that uploads it later (see
    :meth:`Experiment.wait_for_uploads`).

    Class attributes (set them on the class, before fit):
        storage_options: passed to the storage (e.g. ``max_attempts``: the cloud client's own retries; tests turn
            them off so that the uploader does the retrying).
        uploader_options: passed to BackgroundUploader (``max_retries`` None by default: retry until confirmed).
        wait_timeout_s: how long the end of fit waits for the pending uploads, in all (10 min).
        exception_wait_timeout_s: the same when fit is failing with an exception (2 min).
        upload_failure: 'warn' (default): log the uploads not confirmed at the end of fit; 'raise': also raise
            UploadsIncompleteError from fit.
    """

    storage_options: Dict[str, Any] = {}
    uploader_options: Dict[str, Any] = {}
    wait_timeout_s = 600.0
    exception_wait_timeout_s = 120.0
    upload_failure = 'warn'

    def __init__(self, experiment, bucket_name, cloud_dir_prefix='', endpoint_url=None, storage=None,
                 cloud_save_mode='s3'):
        from ..storage import BackgroundUploader
        if self.upload_failure not in ('warn', 'raise'):
            raise ValueError(f"ExperimentUploader.upload_failure must be 'warn' or 'raise', got "
                             f'{self.upload_failure!r}')
        self.experiment = experiment
        if storage is None:
            storage = storage_for_mode(cloud_save_mode, bucket_name, cloud_dir_prefix or '', endpoint_url=endpoint_url,
                                       **self.storage_options)
        self.storage = storage
        # What the messages call it: the canonical mode of the storage's cloud.
        self.cloud_save_mode = _CANONICAL_MODES.get(storage.scheme, 'local')
        self.bucket_name = bucket_name
        self.cloud_dir_prefix = cloud_dir_prefix or ''
        options = {'max_retries': None, 'max_queue_size': None, **self.uploader_options}
        self.uploader = BackgroundUploader(storage, journal=experiment.journal, **options)
        self.started = False
        # Files given before start(), by their path inside the experiment folder: the claim may still rename it.
        self._held: List[str] = []

    def start(self):
        """Check the bucket and the permissions, claim the experiment's prefix, and upload the files given so far
        (once; later calls do nothing). Raises what :meth:`_checked` raises when the storage cannot be used."""
        if self.started:
            return
        self._check_access()
        self._checked(lambda: self.experiment.add_cloud_claim(self))
        self.started = True
        experiment = self.experiment
        if experiment.claimed and experiment.continued:
            self.resume_pending()
        held, self._held = self._held, []
        for rel in held:
            path = os.path.join(experiment.dir_path, *rel.split('/'))
            if os.path.isfile(path):
                self.upload_experiment_file(path)
            else:
                logger.warning('%s was to be uploaded but no longer exists', path)

    def _endpoint(self):
        return getattr(self.storage, 'endpoint_url', None) or self.storage.uri('')

    def _checked(self, operation):
        """Run a start-of-fit storage operation; our errors get the hint about cloud_save_mode='local', network
        errors become a StorageUnreachableError naming the endpoint."""
        try:
            return operation()
        except StorageError as error:
            raise type(error)(f'{error} (cloud_save_mode={self.cloud_save_mode!r} uploads the experiment to '
                              f"{self.storage.cloud_name}; pass cloud_save_mode='local' to keep it only on this "
                              f'machine)') from None
        except Exception as error:
            if not is_retryable(error):
                raise
            variable = ENDPOINT_VARIABLES.get(self.storage.scheme)
            also = ' / AWS_ENDPOINT_URL' if self.storage.scheme == 's3' else ''
            raise StorageUnreachableError(
                f'Cannot reach the {CLOUD_NAMES.get(self.storage.scheme, self.storage.cloud_name)} endpoint '
                f'{self._endpoint()} (bucket {self.bucket_name!r}): {type(error).__name__}: {error}. Check endpoint_url '
                f'(or {variable}{also}) and that this machine can reach the server, or pass '
                f"cloud_save_mode='local' to keep the experiment only on this machine.") from None

    def _check_access(self):
        # Fail at the start of fit, not after the first epoch: a wrong key, a missing bucket or an unreachable
        # endpoint shows here. The bucket itself first (an object's 404 cannot tell "no such key" from "no such
        # bucket"); then a put and a delete under the experiment's prefix: the permissions uploads need.
        self._checked(self.storage.check_bucket)
        probe = join_key(self.experiment.key_prefix, f'{ACCESS_CHECK_PREFIX}.{self.experiment.run_id}')
        self._checked(lambda: self.storage.write_text(probe, 'access check of aitoolbox_like; safe to delete'))
        self._checked(lambda: self.storage.delete(probe))

    # ---- the experiment's prefix in the bucket --------------------------------------------------------

    def claim_key(self, key_prefix):
        """The claim object of the experiment folder ``key_prefix`` (a key): in its bookkeeping prefix, outside the
        experiment's prefix."""
        return join_key(bookkeeping_key(key_prefix), MARKER_FILE)

    def claim_prefix(self, key_prefix, run_id, exclusive=True):
        """Make ``key_prefix`` (an experiment folder as a key) this run's in the bucket: create its claim object
        holding ``run_id`` only if absent (``exclusive``; then read back), or overwrite it (a continued run).
        True if the prefix is ours. A prefix holding objects but no claim (a finished run, a run of an older
        version, or of AIToolbox) counts as taken."""
        marker = self.claim_key(key_prefix)
        if not exclusive:
            self.storage.write_text(marker, run_id)
            return True
        try:
            if self.storage.read_text(marker).strip() == run_id:
                return True
            return False
        except FileNotFoundError:
            pass
        if any(not key.rsplit('/', 1)[-1].startswith(ACCESS_CHECK_PREFIX)
               for key in self.storage.list(key_prefix + '/')):
            return False
        if not self.storage.create_exclusive(marker, run_id):
            try:
                return self.storage.read_text(marker).strip() == run_id
            except FileNotFoundError:
                return False
        # Read back: a server that ignores If-None-Match lets every writer "create" the marker; the last wins.
        return self.storage.read_text(marker).strip() == run_id

    def release_prefix(self, key_prefix, run_id):
        """Give ``key_prefix`` back (delete its claim object) if this run holds it."""
        marker = self.claim_key(key_prefix)
        try:
            if self.storage.read_text(marker).strip() == run_id:
                self.storage.delete(marker)
        except FileNotFoundError:
            pass

    def resume_pending(self):
        """Queue again the uploads of this bucket / prefix / endpoint that the experiment's journal lists (a
        previous process queued them and never saw them confirmed). Returns how many were queued."""
        journal = self.experiment.journal
        location = self.storage.location()
        queued = set(job.id for job in self.uploader.unconfirmed())
        count = 0
        for entry in journal.entries():
            if entry['id'] in queued or any(entry.get(k) != v for k, v in location.items()):
                continue
            path = journal.local_path(entry)
            if not os.path.isfile(path):
                logger.warning('%s was listed for upload but no longer exists; dropped from %s', path, journal.path)
                journal.remove(entry['id'])
                continue
            self.uploader.submit(path, entry['key'], latest_pointer_key=entry.get('pointer_key'),
                                 delete_local_after=bool(entry.get('delete_local_after')),
                                 latest_pointer_text=entry.get('pointer_text'), job_id=entry['id'])
            count += 1
        if count:
            logger.info('Queued again %d upload(s) that a previous run of %s left unconfirmed', count,
                        self.experiment.dir_path)
        return count

    # ---- uploads ---------------------------------------------------------------------------------------

    def _relative(self, local_path):
        rel = os.path.relpath(os.path.abspath(local_path), self.experiment.dir_path)
        if rel.startswith('..') or os.path.isabs(rel):
            raise ValueError(f'{local_path} is not inside the experiment folder {self.experiment.dir_path}; only '
                             f'files of the experiment folder can be uploaded with upload_experiment_file()')
        return rel.replace(os.sep, '/')

    def key_for(self, local_path):
        """The cloud key of a file inside the local experiment folder."""
        return join_key(self.experiment.key_prefix, self._relative(local_path))

    def upload_experiment_file(self, local_path):
        """Queue ``local_path`` (inside the local experiment folder) for upload to the same relative key, starting
        the uploader first if needed (:meth:`start`: an upload is due). Returns the key."""
        rel = self._relative(local_path)
        self.start()
        # The start may have moved the experiment to a free name (its prefix was taken): the file moved with it.
        path = os.path.join(self.experiment.dir_path, *rel.split('/'))
        key = join_key(self.experiment.key_prefix, rel)
        self.uploader.submit(path, key)
        return key

    def upload_at_start(self, local_path):
        """Upload ``local_path`` (inside the local experiment folder) once the uploader has started, now if it has:
        for what a callback writes while it is registered, when no network may be used."""
        if self.started:
            self.upload_experiment_file(local_path)
            return
        rel = self._relative(local_path)
        if rel not in self._held:
            self._held.append(rel)

    @property
    def held_count(self):
        """Files waiting for :meth:`start` to be uploaded."""
        return len(self._held)

    def remove_local_file(self, local_path):
        """Delete a local file of the experiment once every upload of it is confirmed (now, if none is pending).

        What ``rm_subopt_local_models`` uses: deleting a file whose upload is still queued (the cloud down) would lose
        it. Returns True if the file was deleted now.
        """
        if not self.started:
            return False        # its upload has not even been queued
        return self.uploader.delete_after_upload(local_path)

    @property
    def pending_count(self):
        return self.uploader.pending_count

    @property
    def failures(self):
        return self.uploader.failures

    def wait(self, timeout=None):
        """Wait for the pending uploads; log and return the ones that failed since the last wait. When all are
        confirmed, this run's claim object is deleted from the bucket (see :meth:`Experiment.release_cloud_claims`)."""
        timeout = self.wait_timeout_s if timeout is None else timeout
        pending = self.uploader.pending_count
        if pending:
            logger.info('Waiting for %d upload(s) to %s to finish', pending, self.storage.uri(self.experiment.key_prefix))
        failures = self.uploader.wait(timeout)
        if self.uploader.pending_count:
            logger.error('%d upload(s) to %s still unfinished after %.0f s; the local files in %s are complete; '
                         'upload them later with: %s', self.uploader.pending_count, self.bucket_name, timeout,
                         self.experiment.dir_path, sync_command(self.experiment.dir_path))
        for failure in failures:
            logger.error('Upload failed: %s -> %s (%s); the local copy is kept', failure.local_path,
                         self.storage.uri(failure.key), failure.error)
        self.experiment.release_cloud_claims([self])
        return failures

    def close(self, timeout=None):
        """Stop the uploader after at most ``timeout`` seconds (None: once everything is uploaded); what is not
        uploaded by then stays in the journal for a later run or the sync command. Returns the failures."""
        return self.uploader.close(timeout)


def get_uploader(loop, experiment, cloud_save_mode, bucket_name, cloud_dir_prefix='', endpoint_url=None):
    """The loop's uploader for this cloud/bucket/prefix (created once), or None for local-only saving or on a
    rank other than 0 (only rank 0 writes)."""
    scheme = cloud_scheme(cloud_save_mode)
    if scheme is None or not loop.is_main_process():
        return None
    key = (scheme, bucket_name, (cloud_dir_prefix or '').strip('/'), endpoint_url)
    uploader = experiment.uploaders.get(key)
    if uploader is None:
        uploader = ExperimentUploader(experiment, bucket_name, cloud_dir_prefix, endpoint_url,
                                      cloud_save_mode=cloud_save_mode)
        experiment.uploaders[key] = uploader
        if loop.experiment_uploader is None:
            loop.experiment_uploader = uploader
    return uploader


def all_uploaders(loop):
    """Every uploader of the loop's experiment (one per cloud / bucket / prefix / endpoint)."""
    experiment = loop.experiment
    return list(experiment.uploaders.values()) if experiment is not None else []
