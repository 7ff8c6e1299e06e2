"""The guarantees of a cloud experiment, on each cloud against its real server on loopback (the ``cloud`` fixture:
SeaweedFS for S3, gcp-storage-emulator for Google Cloud Storage, Azurite for Azure Blob Storage): the saved keys,
resuming on a new machine, kill -9 then resume, an outage mid-run, an outage that outlasts the run and the sync command,
runs on different machines never sharing a prefix, and a missing bucket or an unreachable endpoint named before
the first step."""
import json
import logging
import os
import shutil
import signal
import socket
import time
from pathlib import Path

import pytest
import torch

from aitoolbox_like import AbstractCallback
from aitoolbox_like.callbacks.basic import EarlyStopping
from aitoolbox_like.callbacks.train_schedule import StepLRScheduler
from aitoolbox_like.experiment import PENDING_UPLOADS, ExperimentUploader, bookkeeping_dir, find_cloud_checkpoint
from aitoolbox_like.results.reporting import matplotlib_available
from aitoolbox_like.results.basic import ClassificationResultPackage
from aitoolbox_like.storage import StorageError, StorageUnreachableError
from aitoolbox_like.tracking import TrainLoopCheckpoint, TrainLoopCheckpointEndSave
from saving_helpers import assert_same_weights, make_parts, weights

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


@pytest.fixture(autouse=True)
def _uploads_retried_by_the_uploader(monkeypatch):
    # The clients fail at once; the uploader does the retrying, with short backoffs (its default: for ever).
    monkeypatch.setattr(ExperimentUploader, 'storage_options', {'max_attempts': 1})
    monkeypatch.setattr(ExperimentUploader, 'uploader_options', {'initial_backoff_s': 0.05, 'max_backoff_s': 0.2})
    monkeypatch.setattr(ExperimentUploader, 'wait_timeout_s', 120.0)


def _loop(folder, cloud, bucket, seed=0, cls=TrainLoopCheckpoint, **kwargs):
    model, train, val, test, optimizer = make_parts(seed=seed)
    return cls(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), 'proj', 'exp',
                               str(folder), {'lr': 1e-2}, cloud_save_mode=cloud.mode, bucket_name=bucket,
                               cloud_dir_prefix='runs', progress_bar=False, **kwargs)


def _checkpoint_keys(ts, epochs, name='exp'):
    return [f'runs/proj/{name}_{ts}/checkpoint_model/model_{name}_{ts}_E{e}.pth' for e in epochs]


def _journal(folder):
    return Path(bookkeeping_dir(folder)) / PENDING_UPLOADS


def _wait_for(condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


class Outage(AbstractCallback):
    """Stops the server at the end of epoch ``down_after``; starts it again at the end of epoch ``up_after``, once
    the uploader has retried (never, with up_after=None)."""

    def __init__(self, cloud, down_after=0, up_after=None):
        super().__init__('outage', execution_order=2000)
        self.cloud, self.down_after, self.up_after = cloud, down_after, up_after
        self.retries_while_down = 0

    def on_epoch_end(self):
        epoch = self.train_loop_obj.epoch
        if epoch == self.down_after:
            self.cloud.stop()
        elif epoch == self.up_after:
            uploader = self.train_loop_obj.experiment_uploader.uploader
            assert _wait_for(lambda: uploader.retries > 0)
            self.retries_while_down = uploader.retries
            self.cloud.start()


def test_full_key_layout_after_three_epochs(cloud, tmp_path):
    bucket = cloud.make_bucket()
    loop = _loop(tmp_path, cloud, bucket, cls=TrainLoopCheckpointEndSave,
                 val_result_package=ClassificationResultPackage())
    loop.fit(num_epochs=3)
    ts = loop.experiment_timestamp
    root = f'runs/proj/exp_{ts}'
    # AIToolbox's files only: the run's claim is deleted once its uploads are confirmed, and no pointers are kept.
    assert cloud.keys(bucket) == sorted([
        f'{root}/hyperparams_list.txt', f'{root}/test_cloud_experiment.py', *_checkpoint_keys(ts, range(3)),
        f'{root}/model/model_exp_{ts}.pth', f'{root}/results/results_hyperParams_hist_exp_{ts}.p',
        *[f'{root}/results/plots/{m}.png' for m in (('accumulated_loss', 'val_loss')
                                                     if matplotlib_available() else ())]])
    storage = cloud.storage(bucket, 'runs')
    assert find_cloud_checkpoint(storage, f'proj/exp_{ts}') == f'proj/exp_{ts}/checkpoint_model/model_exp_{ts}_E2.pth'
    local = tmp_path / 'proj' / f'exp_{ts}' / 'checkpoint_model' / f'model_exp_{ts}_E2.pth'
    remote = storage.load_file(f'proj/exp_{ts}/checkpoint_model/model_exp_{ts}_E2.pth', tmp_path / 'remote.pth')
    assert remote.read_bytes() == local.read_bytes()
    assert loop.upload_failures == []


def test_auto_resumes_from_the_bucket_on_a_new_machine(cloud, tmp_path):
    bucket = cloud.make_bucket()
    reference = _loop(tmp_path / 'reference', cloud, bucket)
    reference.fit(num_epochs=3)
    first = _loop(tmp_path / 'machine-a', cloud, bucket)
    first.fit(num_epochs=2)
    shutil.rmtree(tmp_path / 'machine-a')      # the machine is gone; only the bucket is left
    resumed = _loop(tmp_path / 'machine-b', cloud, bucket, seed=9)
    resumed.fit(num_epochs=3, resume_from='auto')
    assert_same_weights(weights(resumed.model), weights(reference.model))
    ts = first.experiment_timestamp
    assert resumed.experiment_timestamp == ts
    assert _checkpoint_keys(ts, [2])[0] in cloud.keys(bucket)


def test_uploads_survive_an_outage_and_deleted_checkpoints_still_arrive(cloud, tmp_path):
    """The server is down from the end of epoch 0 to the end of epoch 2: training goes on, the uploads are retried,
    and the sub-optimal checkpoints rm_subopt_local_models deletes are deleted only once uploaded."""
    bucket = cloud.make_bucket()
    loop = _loop(tmp_path, cloud, bucket, rm_subopt_local_models=True, num_best_checkpoints_kept=1)
    outage = Outage(cloud, down_after=0, up_after=2)
    loop.fit(num_epochs=4, callbacks=[outage])
    assert outage.retries_while_down > 0
    assert loop.train_history.get_epochs('accumulated_loss') == [0, 1, 2, 3]
    assert loop.upload_failures == []
    ts = loop.experiment_timestamp
    assert set(_checkpoint_keys(ts, range(4))) <= set(cloud.keys(bucket))
    local = os.listdir(tmp_path / 'proj' / f'exp_{ts}' / 'checkpoint_model')
    assert f'model_exp_{ts}_E3.pth' in local and 1 <= len(local) <= 2
    assert not _journal(tmp_path / 'proj' / f'exp_{ts}').exists()


def test_an_outage_outlasting_the_run_ends_fit_with_one_message_and_the_sync_command_uploads_later(
        cloud, tmp_path, monkeypatch, caplog, warm_python):
    monkeypatch.setattr(ExperimentUploader, 'wait_timeout_s', 1.5)
    bucket = cloud.make_bucket()
    loop = _loop(tmp_path, cloud, bucket)
    caplog.set_level(logging.INFO)
    loop.fit(num_epochs=3, callbacks=[Outage(cloud, down_after=0)])          # the server stays down
    ts = loop.experiment_timestamp
    folder = tmp_path / 'proj' / f'exp_{ts}'
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and
              r.name.startswith('aitoolbox_like.experiment')]
    assert len(errors) == 1, errors
    assert 'aitoolbox_like.experiment.sync' in errors[0] and f'{cloud.scheme}://{bucket}/runs/proj/' in errors[0]
    entry = next(e for e in json.loads(_journal(folder).read_text())['uploads']
                 if e['file'] == f'checkpoint_model/model_exp_{ts}_E2.pth')
    assert entry['bucket'] == bucket and entry['prefix'] == 'runs' and entry['endpoint'] == cloud.endpoint_url
    assert entry.get('scheme', 's3') == cloud.scheme
    assert 'AccountKey' not in _journal(folder).read_text()       # the journal names the account, never its key

    loop.experiment_uploader.uploader.close(timeout=0)      # the process ends: only the journal is left
    cloud.start()
    # The command the message names, as its own process (forked from the tests' zygote, conftest's warm_python).
    done = warm_python.start(['-m', 'aitoolbox_like.experiment.sync', folder], REPO, dict(os.environ),
                             tmp_path / 'sync.out', tmp_path / 'sync.err')
    assert warm_python.wait(done, timeout=300) == 0, done.output()
    assert set(_checkpoint_keys(ts, range(3))) <= set(cloud.keys(bucket))
    assert not _journal(folder).exists()


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
    """The run kill_script.py makes (3 epochs, a checkpoint every 4 batches), trained here without a break."""
    model, train, val, test, optimizer = make_parts(seed=0)
    loop = TrainLoopCheckpoint(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), 'proj', 'run',
                               str(tmp_path_factory.mktemp('uninterrupted')), {'lr': 1e-2}, cloud_save_mode='local',
                               iteration_save_freq=4, progress_bar=False)
    loop.fit(num_epochs=3, callbacks=[StepLRScheduler(step_size=1, gamma=0.7), EarlyStopping(patience=50)])
    return weights(loop.model)


def test_kill_9_mid_epoch_then_resume_equals_the_uninterrupted_run_and_every_checkpoint_reaches_the_cloud(
        cloud, tmp_path, uninterrupted, warm_python):
    bucket = cloud.make_bucket()
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))
    # The killed run is a process of its own, forked from the tests' zygote (conftest's warm_python).
    killed = warm_python.start_here([os.path.join(HERE, 'kill_script.py'), tmp_path / 'out', tmp_path / 'never.pt',
                                     '--epochs', 3, '--iter-freq', 4, '--kill-at-batch', 13, '--cloud', cloud.mode,
                                     '--bucket', bucket], tmp_path / 'killed', env)
    assert warm_python.wait(killed, timeout=300) == -signal.SIGKILL, killed.output()[1][-3000:]
    [folder] = (tmp_path / 'out' / 'proj').glob('run_*')
    ts = folder.name[len('run_'):]

    model, train, val, test, optimizer = make_parts(seed=123)
    resumed = TrainLoopCheckpoint(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), 'proj', 'run',
                                  str(tmp_path / 'out'), {'lr': 1e-2}, cloud_save_mode=cloud.mode, bucket_name=bucket,
                                  cloud_dir_prefix='runs', iteration_save_freq=4, progress_bar=False)
    resumed.fit(num_epochs=3, callbacks=[StepLRScheduler(step_size=1, gamma=0.7), EarlyStopping(patience=50)],
                resume_from='latest')
    assert_same_weights(weights(resumed.model), uninterrupted)
    assert resumed.experiment_timestamp == ts and resumed.upload_failures == []
    keys = set(cloud.keys(bucket))
    assert set(_checkpoint_keys(ts, range(3), name='run')) <= keys
    assert f'runs/proj/run_{ts}/checkpoint_model/model_run_{ts}_E1_ITER12.pth' in keys     # the killed run's last
    assert not _journal(folder).exists()


@pytest.mark.parametrize('cloud', ['s3', 'az'], indirect=True)
def test_three_runs_started_in_the_same_second_on_different_machines_get_their_own_prefix(cloud, tmp_path,
                                                                                         warm_python):
    """The claim of a prefix is a create-if-absent write that the server arbitrates (S3 If-None-Match: *, Azure
    overwrite=False). The three machines are three processes (forked from tests/support/warm_python.py's zygote). Google's ifGenerationMatch=0 is checked in test_a_gcs_claim_is_a_create_if_absent_write: its
    emulator does not enforce it."""
    bucket = cloud.make_bucket()
    timestamp = '2030-01-02_03-04-05'
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))
    go = tmp_path / 'go'
    runs = []
    for i in range(3):
        files = {name: tmp_path / f'{name}{i}' for name in ('ready', 'result')}
        process = warm_python.start([os.path.join(HERE, 'claim_script.py'), tmp_path / f'machine{i}', cloud.mode,
                                     bucket, timestamp, files['ready'], go, files['result']], tmp_path, env,
                                    tmp_path / f'output{i}', tmp_path / f'output{i}')
        runs.append((process, files))
    assert _wait_for(lambda: all(f['ready'].exists() for _, f in runs), 120), [p.output() for p, _ in runs]
    go.touch()
    codes = [warm_python.wait(process, timeout=300) for process, _ in runs]
    assert codes == [0, 0, 0], [p.output() for p, _ in runs]
    results = [json.loads(f['result'].read_text()) for _, f in runs]
    assert sorted(r['timestamp'] for r in results) == [timestamp, f'{timestamp}_1', f'{timestamp}_2']
    storage = cloud.storage(bucket, 'shared')
    for i, result in enumerate(results):
        ts = result['timestamp']
        assert result['failures'] == 0
        # The local folder has the name claimed in the bucket, and the prefix holds this run's files only.
        assert result['dir'] == str(tmp_path / f'machine{i}' / 'proj' / f'exp_{ts}')
        assert sorted(os.listdir(tmp_path / f'machine{i}' / 'proj')) == [f'exp_{ts}']
        assert f'who:\t{tmp_path / f"machine{i}"}\n' in storage.read_text(f'proj/exp_{ts}/hyperparams_list.txt')
        local = tmp_path / f'machine{i}' / 'proj' / f'exp_{ts}' / 'checkpoint_model' / f'model_exp_{ts}_E0.pth'
        remote = storage.load_file(f'proj/exp_{ts}/checkpoint_model/model_exp_{ts}_E0.pth', tmp_path / f'r{i}.pth')
        assert remote.read_bytes() == local.read_bytes()


@pytest.mark.parametrize('cloud', ['gs'], indirect=True)
def test_a_gcs_claim_is_a_create_if_absent_write(cloud, tmp_path):
    bucket = cloud.make_bucket()
    timestamp = '2030-01-02_03-04-05'
    dirs = []
    for machine in ('a', 'b'):
        loop = _loop(tmp_path / machine, cloud, bucket)
        loop.experiment_timestamp = timestamp        # as if both started in the same second
        loop.fit(num_epochs=1)
        dirs.append(loop.experiment.dir_path)
    assert dirs == [str(tmp_path / 'a' / 'proj' / f'exp_{timestamp}'), str(tmp_path / 'b' / 'proj' / f'exp_{timestamp}_1')]
    # Each claim was written with the precondition that makes Google Cloud Storage refuse it when the object exists.
    claims = cloud.server.requests_with(f'b/{bucket}/o?uploadType=multipart&ifGenerationMatch=0')
    assert len(claims) == 2, cloud.server.log_tail()


def test_a_missing_bucket_fails_before_training_naming_it(cloud, tmp_path):
    loop = _loop(tmp_path, cloud, 'no-such-bucket-here')
    with pytest.raises(StorageError) as info:
        loop.fit(num_epochs=1)
    message = str(info.value)
    assert "'no-such-bucket-here' does not exist" in message and cloud.endpoint_url in message
    assert 'bucket_name' in message and "cloud_save_mode='local'" in message
    assert loop.train_history.get_epochs('accumulated_loss') == []


def test_an_unreachable_endpoint_fails_before_training_naming_it(cloud, tmp_path, monkeypatch):
    with socket.socket() as s:          # a port nobody listens on
        s.bind(('127.0.0.1', 0))
        dead = f'http://127.0.0.1:{s.getsockname()[1]}'
    variable = {'s3': 'AWS_ENDPOINT_URL_S3', 'gs': 'STORAGE_EMULATOR_HOST', 'az': 'AZURE_STORAGE_CONNECTION_STRING'}
    monkeypatch.setenv(variable[cloud.scheme], dead if cloud.scheme != 'az' else
                       cloud.server.connection_string.replace(cloud.server.endpoint_url, dead))
    loop = _loop(tmp_path, cloud, 'any-bucket')
    with pytest.raises(StorageUnreachableError) as info:
        loop.fit(num_epochs=1)
    message = str(info.value)
    named = {'s3': 'AWS_ENDPOINT_URL_S3', 'gs': 'STORAGE_EMULATOR_HOST', 'az': 'AZURE_STORAGE_ACCOUNT_URL'}
    assert dead in message and named[cloud.scheme] in message and 'endpoint_url' in message
    assert "cloud_save_mode='local'" in message and info.value.__cause__ is None
    assert loop.train_history.get_epochs('accumulated_loss') == []
