"""Nothing lost, nothing silent: the faults an S3 experiment survives, against a real S3 server (SeaweedFS on
loopback). Outages are made by stopping the server and starting it again, a few seconds each. The faults every cloud
survives (an outage mid-run, one that outlasts the run, a missing bucket, two machines on one prefix) are tested on
each cloud in test_cloud_experiment.py."""
import os
import time
from pathlib import Path

import pytest
import torch

from aitoolbox_like import AbstractCallback
from aitoolbox_like.experiment import PENDING_UPLOADS, ExperimentUploader, bookkeeping_dir, find_cloud_checkpoint
from aitoolbox_like.storage import UploadsIncompleteError
from aitoolbox_like.storage.s3 import S3Storage
from aitoolbox_like.tracking import TrainLoopCheckpoint
from s3_server import make_bucket
from saving_helpers import make_parts

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    monkeypatch.setenv('AWS_ENDPOINT_URL_S3', s3_server.endpoint_url)
    # botocore fails at once; the uploader does the retrying, with short backoffs. No max_retries: the default.
    monkeypatch.setattr(ExperimentUploader, 'storage_options', {'max_attempts': 1})
    monkeypatch.setattr(ExperimentUploader, 'uploader_options', {'initial_backoff_s': 0.05, 'max_backoff_s': 0.2})
    monkeypatch.setattr(ExperimentUploader, 'wait_timeout_s', 120.0)
    try:
        yield s3_server
    finally:
        s3_server.start()       # whatever a test did, the next one finds the server up


def _keys(s3_server, bucket, prefix=''):
    pages = s3_server.client().get_paginator('list_objects_v2').paginate(Bucket=bucket, Prefix=prefix)
    return sorted(obj['Key'] for page in pages for obj in page.get('Contents', ()))


def _loop(folder, bucket, seed=0, **kwargs):
    model, train, val, test, optimizer = make_parts(seed=seed)
    return TrainLoopCheckpoint(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), 'proj', 'exp',
                               str(folder), {'lr': 1e-2}, cloud_save_mode='s3', bucket_name=bucket,
                               cloud_dir_prefix='runs', progress_bar=False, **kwargs)


def _journal_path(folder):
    return Path(bookkeeping_dir(folder)) / PENDING_UPLOADS


def _checkpoint_keys(ts, epochs):
    return [f'runs/proj/exp_{ts}/checkpoint_model/model_exp_{ts}_E{e}.pth' for e in epochs]


def _wait_for(condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


class Outage(AbstractCallback):
    """Stops the S3 server at the end of epoch ``down_after``; starts it again at the end of epoch ``up_after``
    once the uploader has retried at least ``min_retries`` times (never, with up_after=None)."""

    def __init__(self, server, down_after=0, up_after=None, min_retries=1):
        super().__init__('outage', execution_order=2000)
        self.server, self.down_after, self.up_after, self.min_retries = server, down_after, up_after, min_retries
        self.retries_while_down = 0

    def on_epoch_end(self):
        epoch = self.train_loop_obj.epoch
        if epoch == self.down_after:
            self.server.stop(graceful=False)
        elif epoch == self.up_after:
            uploader = self.train_loop_obj.experiment_uploader.uploader
            assert _wait_for(lambda: uploader.retries >= self.min_retries)
            self.retries_while_down = uploader.retries
            self.server.start()


# ---------------------------------------------------------------------------------------------- 1, 2


def test_an_outage_longer_than_the_retry_budget_loses_nothing(s3_env, tmp_path):
    """The old uploader gave a job up after max_retries (6, about 2 s with these backoffs); now retryable
    failures stay queued and are retried for the whole fit."""
    bucket = make_bucket(s3_env)
    loop = _loop(tmp_path, bucket)
    outage = Outage(s3_env, down_after=0, up_after=2, min_retries=12)
    loop.fit(num_epochs=4, callbacks=[outage])
    assert outage.retries_while_down >= 12
    assert loop.upload_failures == []
    ts = loop.experiment_timestamp
    assert set(_checkpoint_keys(ts, range(4))) <= set(_keys(s3_env, bucket))
    assert find_cloud_checkpoint(S3Storage(bucket, 'runs'), f'proj/exp_{ts}').endswith('_E3.pth')


# ---------------------------------------------------------------------------------------------- 2, 3


def test_upload_failure_raise_makes_fit_raise(s3_env, tmp_path, monkeypatch):
    monkeypatch.setattr(ExperimentUploader, 'wait_timeout_s', 1.0)
    monkeypatch.setattr(ExperimentUploader, 'upload_failure', 'raise')
    bucket = make_bucket(s3_env)
    loop = _loop(tmp_path, bucket)
    with pytest.raises(UploadsIncompleteError) as info:
        loop.fit(num_epochs=2, callbacks=[Outage(s3_env, down_after=0)])
    assert 'aitoolbox_like.experiment.sync' in info.value.sync_command
    assert any(path.endswith('_E1.pth') for path in info.value.not_uploaded)
    loop.experiment_uploader.uploader.close(timeout=0)


def test_a_resumed_run_finishes_the_uploads_its_predecessor_left(s3_env, tmp_path, monkeypatch):
    monkeypatch.setattr(ExperimentUploader, 'wait_timeout_s', 0.5)
    bucket = make_bucket(s3_env)
    first = _loop(tmp_path, bucket)
    first.fit(num_epochs=2, callbacks=[Outage(s3_env, down_after=0)])
    first.experiment_uploader.uploader.close(timeout=0)  # killed with uploads still queued
    ts = first.experiment_timestamp
    s3_env.start()
    assert _checkpoint_keys(ts, [1])[0] not in _keys(s3_env, bucket)

    monkeypatch.setattr(ExperimentUploader, 'wait_timeout_s', 120.0)
    resumed = _loop(tmp_path, bucket, seed=4)
    resumed.fit(num_epochs=3, resume_from=str(tmp_path / 'proj' / f'exp_{ts}'))
    assert resumed.experiment_timestamp == ts
    assert resumed.upload_failures == []
    assert set(_checkpoint_keys(ts, range(3))) <= set(_keys(s3_env, bucket))
    assert not _journal_path(tmp_path / 'proj' / f'exp_{ts}').exists()


# ---------------------------------------------------------------------------------------------- 12


def test_stray_temp_files_of_a_killed_save_are_removed_on_resume(tmp_path):
    model, train, val, test, optimizer = make_parts(seed=0)
    first = TrainLoopCheckpoint(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), 'proj', 'exp',
                                str(tmp_path), {'lr': 1e-2}, cloud_save_mode='local', progress_bar=False)
    first.fit(num_epochs=1)
    folder = tmp_path / 'proj' / f'exp_{first.experiment_timestamp}'
    ts = first.experiment_timestamp
    work = Path(bookkeeping_dir(folder))
    # In the bookkeeping folder, and at the experiment root, where versions before it wrote them.
    strays = [work / f'.model_exp_{ts}_E1.pth.0123456789ab.tmp', work / '.hyperparams.json.abcdef012345.partial',
              folder / f'.model_exp_{ts}_E1.pth.0123456789ab.tmp']
    for path in strays:
        path.write_bytes(b'half a file')
    keep = folder / '.notes.txt'            # not a temp file name
    keep.write_text('mine')
    model, train, val, test, optimizer = make_parts(seed=1)
    resumed = TrainLoopCheckpoint(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), 'proj', 'exp',
                                  str(tmp_path), {'lr': 1e-2}, cloud_save_mode='local', progress_bar=False)
    resumed.fit(num_epochs=2, resume_from=str(folder))
    assert not any(path.exists() for path in strays)
    assert keep.exists()
    assert not [name for name in os.listdir(folder) if name.endswith(('.tmp', '.partial'))]


# ---------------------------------------------------------------------------------------------- a stop in the wait


@pytest.mark.timeout(90)
def test_ctrl_c_during_the_end_of_fit_wait_for_uploads_cuts_it_short_and_the_journal_keeps_them(s3_env, tmp_path,
                                                                                                caplog):
    """The server goes down after epoch 0, so the end of fit waits for the uploads (up to 120 s here, 10 minutes by
    default); a Ctrl-C 1 s into the wait ends it at once: the message lists what is not uploaded with the command
    that uploads it, the journal keeps it, and the signal then does what it does (KeyboardInterrupt)."""
    import signal
    import threading

    from aitoolbox_like.experiment.stop_waiting import SignalsCutWaits

    def ctrl_c_once_waiting():
        deadline = time.monotonic() + 60
        while not isinstance(getattr(signal.getsignal(signal.SIGINT), '__self__', None), SignalsCutWaits) \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(1.0)                             # 1 s into the wait
        os.kill(os.getpid(), signal.SIGINT)

    class CtrlCDuringTheWait(AbstractCallback):
        def __init__(self):
            super().__init__('ctrl-c during the wait', execution_order=10 ** 6)

        def on_train_end(self):
            threading.Thread(target=ctrl_c_once_waiting, daemon=True).start()

    bucket = make_bucket(s3_env)
    loop = _loop(tmp_path, bucket)
    with pytest.raises(KeyboardInterrupt):
        loop.fit(num_epochs=1, callbacks=[Outage(s3_env, down_after=0), CtrlCDuringTheWait()])
    assert 'SIGINT: stopped waiting for the uploads' in caplog.text
    assert 'a stop signal cut the wait short' in caplog.text and 'aitoolbox_like.experiment.sync' in caplog.text
    assert '_E0.pth' in _journal_path(loop.experiment.dir_path).read_text()
    loop.experiment_uploader.uploader.close(timeout=0)
