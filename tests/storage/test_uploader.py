import json
import os
import threading
import time

import botocore.exceptions
import pytest

from aitoolbox_like.storage import BackgroundUploader, LocalStorage, StorageAuthError
from aitoolbox_like.storage.s3 import S3Storage
from aitoolbox_like.storage.uploader import is_retryable
from s3_server import make_bucket


def _poll(condition, timeout=20.0, interval=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def _make_files(folder, count, size=1000):
    paths = []
    for i in range(count):
        path = folder / f'ckpt_{i}.pt'
        path.write_bytes(os.urandom(size))
        paths.append(path)
    return paths


def _client_error(status, code):
    return botocore.exceptions.ClientError(
        {'Error': {'Code': code, 'Message': 'x'}, 'ResponseMetadata': {'HTTPStatusCode': status}},
        'PutObject')


class FlakyStorage(LocalStorage):
    """Local storage whose save_file raises the given errors first, then works."""

    def __init__(self, root, errors):
        super().__init__(root)
        self.errors = list(errors)
        self.calls = 0

    def save_file(self, local_path, key):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        super().save_file(local_path, key)


def test_uploads_files_and_points_latest_at_the_last(tmp_path):
    storage = LocalStorage(tmp_path / 'remote')
    files = _make_files(tmp_path, 5)
    with BackgroundUploader(storage) as uploader:
        for i, path in enumerate(files):
            uploader.submit(path, f'exp/model/ckpt_{i}.pt', latest_pointer_key='exp/model/latest')
        assert uploader.wait(timeout=30) == []
        assert uploader.pending_count == 0
    for i, path in enumerate(files):
        assert (tmp_path / f'remote/exp/model/ckpt_{i}.pt').read_bytes() == path.read_bytes()
    assert storage.read_text('exp/model/latest') == 'exp/model/ckpt_4.pt'


def test_delete_local_after_only_on_success(tmp_path):
    storage = FlakyStorage(tmp_path / 'remote', [StorageAuthError('denied')])
    bad, good = _make_files(tmp_path, 2)
    uploader = BackgroundUploader(storage)
    uploader.submit(bad, 'bad.pt', delete_local_after=True)
    uploader.submit(good, 'good.pt', delete_local_after=True)
    failures = uploader.close(timeout=30)
    assert [f.key for f in failures] == ['bad.pt']
    assert bad.exists()          # kept: it is the only copy
    assert not good.exists()     # uploaded, so the local copy went
    assert storage.exists('good.pt')


def test_failed_target_never_publishes_the_pointer(tmp_path):
    storage = LocalStorage(tmp_path / 'remote')
    storage.write_text('latest', 'old.pt')
    uploader = BackgroundUploader(storage, initial_backoff_s=0.01)
    uploader.submit(tmp_path / 'missing.pt', 'new.pt', latest_pointer_key='latest')
    failures = uploader.wait(timeout=30)
    uploader.close()
    assert len(failures) == 1
    assert failures[0].key == 'new.pt'
    assert 'missing.pt' in failures[0].error
    assert failures[0].attempts == 1  # the source file is gone: retrying cannot help
    assert storage.read_text('latest') == 'old.pt'


def test_transient_errors_are_retried_then_succeed(tmp_path):
    errors = [ConnectionRefusedError('refused'), _client_error(503, 'ServiceUnavailable'),
              botocore.exceptions.EndpointConnectionError(endpoint_url='http://127.0.0.1:1')]
    storage = FlakyStorage(tmp_path / 'remote', errors)
    (path,) = _make_files(tmp_path, 1)
    uploader = BackgroundUploader(storage, initial_backoff_s=0.01, max_backoff_s=0.02)
    uploader.submit(path, 'a.pt', latest_pointer_key='latest')
    assert uploader.close(timeout=30) == []
    assert storage.calls == 4
    assert uploader.retries == 3
    assert storage.read_text('latest') == 'a.pt'


def test_gives_up_after_max_retries(tmp_path):
    storage = FlakyStorage(tmp_path / 'remote', [ConnectionRefusedError('refused')] * 10)
    (path,) = _make_files(tmp_path, 1)
    uploader = BackgroundUploader(storage, max_retries=2, initial_backoff_s=0.01)
    uploader.submit(path, 'a.pt')
    failures = uploader.close(timeout=30)
    assert len(failures) == 1 and failures[0].attempts == 3
    assert 'ConnectionRefusedError' in failures[0].error
    assert uploader.failures == failures


def test_wait_reports_each_failure_once(tmp_path):
    storage = FlakyStorage(tmp_path / 'remote', [StorageAuthError('no')] * 2)
    a, b = _make_files(tmp_path, 2)
    uploader = BackgroundUploader(storage)
    uploader.submit(a, 'a.pt')
    assert [f.key for f in uploader.wait(timeout=30)] == ['a.pt']
    uploader.submit(b, 'b.pt')
    assert [f.key for f in uploader.wait(timeout=30)] == ['b.pt']
    assert [f.key for f in uploader.failures] == ['a.pt', 'b.pt']
    uploader.close()


@pytest.mark.parametrize('error, expected', [
    (StorageAuthError('denied'), False),
    (_client_error(403, 'AccessDenied'), False),
    (_client_error(404, 'NoSuchKey'), False),
    (_client_error(500, 'InternalError'), True),
    (_client_error(503, 'SlowDown'), True),
    (botocore.exceptions.EndpointConnectionError(endpoint_url='http://x'), True),
    (botocore.exceptions.ReadTimeoutError(endpoint_url='http://x'), True),
    (botocore.exceptions.ConnectionClosedError(endpoint_url='http://x'), True),
    (ConnectionRefusedError(), True),
    (ValueError('bad key'), False),
])
def test_retry_classification(error, expected):
    assert is_retryable(error) is expected


def test_submit_blocks_when_queue_is_full(tmp_path):
    release = threading.Event()
    started = threading.Event()

    class BlockingStorage(LocalStorage):
        def save_file(self, local_path, key):
            started.set()
            release.wait(30)
            super().save_file(local_path, key)

    storage = BlockingStorage(tmp_path / 'remote')
    files = _make_files(tmp_path, 3)
    uploader = BackgroundUploader(storage, max_queue_size=1)
    uploader.submit(files[0], 'k0')      # taken by the worker, which then blocks
    assert started.wait(10)
    uploader.submit(files[1], 'k1')      # fills the one queue slot
    third = threading.Thread(target=uploader.submit, args=(files[2], 'k2'))
    third.start()
    third.join(timeout=0.3)
    assert third.is_alive(), 'submit returned although the queue was full'
    release.set()
    third.join(timeout=30)
    assert not third.is_alive()
    assert uploader.close(timeout=30) == []
    assert storage.list() == ['k0', 'k1', 'k2']


def test_concurrent_submitters_lose_nothing(tmp_path):
    storage = LocalStorage(tmp_path / 'remote')
    files = _make_files(tmp_path, 40, size=100)
    uploader = BackgroundUploader(storage, max_queue_size=4)
    threads = [threading.Thread(target=lambda chunk=files[i::4]: [uploader.submit(p, f'k/{p.name}') for p in chunk])
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert uploader.close(timeout=30) == []
    assert storage.list('k/') == sorted(f'k/{p.name}' for p in files)


def test_close_with_timeout_abandons_and_reports(tmp_path):
    storage = FlakyStorage(tmp_path / 'remote', [ConnectionRefusedError('down')] * 1000)
    files = _make_files(tmp_path, 3)
    uploader = BackgroundUploader(storage, max_retries=1000, initial_backoff_s=5.0, max_backoff_s=5.0)
    for i, path in enumerate(files):
        uploader.submit(path, f'k{i}')
    assert _poll(lambda: uploader.retries >= 1)
    failures = uploader.close(timeout=0.2)
    assert sorted(f.key for f in failures) == ['k0', 'k1', 'k2']
    assert all('closed' in f.error for f in failures)
    assert uploader.pending_count == 0
    with pytest.raises(RuntimeError, match='closed'):
        uploader.submit(files[0], 'again')


# -- against the real S3 server -------------------------------------------------------------------

def test_pointer_is_written_only_after_its_target_exists(s3_server, tmp_path):
    bucket = make_bucket(s3_server)
    seen_at_pointer_time = []

    class CheckingS3Storage(S3Storage):
        def write_text(self, key, text):
            # Ask the server, not our own bookkeeping, whether the target is there yet.
            seen_at_pointer_time.append((text, self.exists(text)))
            super().write_text(key, text)

    storage = CheckingS3Storage(bucket, 'exp', endpoint_url=s3_server.endpoint_url,
                                multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024)
    files = _make_files(tmp_path, 2, size=6 * 1024 * 1024)  # multipart
    with BackgroundUploader(storage) as uploader:
        for i, path in enumerate(files):
            uploader.submit(path, f'model/ckpt_{i}.pt', latest_pointer_key='model/latest')
        assert uploader.wait(timeout=60) == []
    assert seen_at_pointer_time == [('model/ckpt_0.pt', True), ('model/ckpt_1.pt', True)]
    assert storage.read_text('model/latest') == 'model/ckpt_1.pt'


def test_server_down_then_back_nothing_lost(s3_server, tmp_path):
    bucket = make_bucket(s3_server)
    # max_attempts=1: botocore gives up at once and the uploader's own backoff does the retrying.
    storage = S3Storage(bucket, 'exp', endpoint_url=s3_server.endpoint_url, max_attempts=1)
    files = _make_files(tmp_path, 4, size=50_000)
    uploader = BackgroundUploader(storage, max_retries=500, initial_backoff_s=0.05, max_backoff_s=0.3)
    try:
        s3_server.stop()
        for i, path in enumerate(files):
            uploader.submit(path, f'model/ckpt_{i}.pt', latest_pointer_key='model/latest')
        assert _poll(lambda: uploader.retries >= 3), 'uploads never failed while the server was down'
        assert uploader.pending_count == 4
        assert uploader.failures == []
    finally:
        s3_server.start()
    assert uploader.wait(timeout=60) == []
    assert uploader.pending_count == 0
    uploader.close()

    for i, path in enumerate(files):
        out = storage.load_file(f'model/ckpt_{i}.pt', tmp_path / f'back_{i}.pt')
        assert out.read_bytes() == path.read_bytes()
    assert storage.read_text('model/latest') == 'model/ckpt_3.pt'


def test_auth_failure_is_not_retried_and_hides_the_secret(s3_server, tmp_path, monkeypatch):
    bucket = make_bucket(s3_server)
    monkeypatch.setenv('AWS_SECRET_ACCESS_KEY', 'definitely-wrong-secret-123')
    storage = S3Storage(bucket, endpoint_url=s3_server.endpoint_url, max_attempts=1)
    (path,) = _make_files(tmp_path, 1)
    uploader = BackgroundUploader(storage, initial_backoff_s=0.01)
    uploader.submit(path, 'a.pt', latest_pointer_key='latest')
    failures = uploader.close(timeout=30)
    assert len(failures) == 1
    assert failures[0].attempts == 1 and uploader.retries == 0
    assert 'StorageAuthError' in failures[0].error
    assert 'definitely-wrong-secret-123' not in failures[0].error
    assert s3_server.access_key not in failures[0].error
    assert not S3Storage(bucket, endpoint_url=s3_server.endpoint_url,
                         client=s3_server.client()).exists('latest')


# -- owning the files it still has to send; the journal ---------------------------------------------------

def test_delete_after_upload_waits_for_the_confirmed_upload(tmp_path):
    from aitoolbox_like.storage import UploadJournal
    journal = UploadJournal(tmp_path / 'pending_uploads.json')
    gate = threading.Event()

    class GatedStorage(LocalStorage):
        def save_file(self, local_path, key):
            assert gate.wait(30)
            super().save_file(local_path, key)

    storage = GatedStorage(tmp_path / 'remote')
    (queued, done) = _make_files(tmp_path, 2)
    uploader = BackgroundUploader(storage, journal=journal)
    uploader.submit(queued, 'queued.pt')
    assert uploader.delete_after_upload(queued) is False      # its upload is pending: kept for now
    assert queued.exists()
    assert [e['delete_local_after'] for e in journal.entries()] == [True]
    gate.set()
    assert uploader.wait(timeout=30) == []
    assert not queued.exists() and storage.exists('queued.pt')
    assert uploader.delete_after_upload(done) is True         # nothing pending: deleted at once
    assert not done.exists()
    assert journal.entries() == [] and not (tmp_path / 'pending_uploads.json').exists()
    uploader.close()


def test_a_file_whose_upload_failed_for_good_is_never_deleted(tmp_path):
    storage = FlakyStorage(tmp_path / 'remote', [StorageAuthError('denied')])
    (path,) = _make_files(tmp_path, 1)
    uploader = BackgroundUploader(storage)
    uploader.submit(path, 'a.pt')
    assert len(uploader.wait(timeout=30)) == 1
    assert uploader.delete_after_upload(path) is False
    assert path.exists() and [j.key for j in uploader.unconfirmed()] == ['a.pt']
    uploader.close()


def test_max_retries_none_retries_until_the_upload_succeeds(tmp_path):
    storage = FlakyStorage(tmp_path / 'remote', [ConnectionRefusedError('down')] * 25)
    (path,) = _make_files(tmp_path, 1)
    uploader = BackgroundUploader(storage, max_retries=None, initial_backoff_s=0.001, max_backoff_s=0.002)
    uploader.submit(path, 'a.pt')
    assert uploader.close(timeout=60) == []
    assert storage.calls == 26 and storage.exists('a.pt')


def test_the_journal_lets_another_process_finish_the_uploads(tmp_path):
    from aitoolbox_like.storage import UploadJournal, sync_journal
    folder = tmp_path / 'exp'
    folder.mkdir()
    storage = FlakyStorage(tmp_path / 'remote', [ConnectionRefusedError('down')] * 1000)
    files = _make_files(folder, 3)
    uploader = BackgroundUploader(storage, max_retries=None, initial_backoff_s=0.01, max_backoff_s=0.01,
                                  journal=UploadJournal(folder / 'pending_uploads.json'))
    for i, path in enumerate(files):
        uploader.submit(path, f'k/{path.name}', latest_pointer_key='k/latest', delete_local_after=(i == 0))
    assert _poll(lambda: uploader.retries >= 2)
    assert len(uploader.close(timeout=0.1)) == 3          # the process ends with nothing uploaded
    entries = json.loads((folder / 'pending_uploads.json').read_text())['uploads']
    assert [e['file'] for e in entries] == [p.name for p in files]
    assert entries[0]['root'] == str(tmp_path / 'remote') and entries[0]['key'] == f'k/{files[0].name}'

    report = sync_journal(folder)                          # another process: the storage works again
    assert report.complete and len(report.uploaded) == 3
    remote = LocalStorage(tmp_path / 'remote')
    assert remote.list('k/') == sorted([f'k/{p.name}' for p in files] + ['k/latest'])
    assert remote.read_text('k/latest') == f'k/{files[2].name}'
    assert not files[0].exists() and files[1].exists()     # deleted only where asked, after its upload
    assert not (folder / 'pending_uploads.json').exists()
