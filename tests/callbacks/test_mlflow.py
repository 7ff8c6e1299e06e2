"""MLflowTracking on the real mlflow package: a local sqlite store, and a real ``mlflow server`` (sqlite backend,
artifacts proxied to the SeaweedFS S3 server of the suite). Runs are read back with MlflowClient and compared with
the loop's history."""
import importlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from aitoolbox_like import AbstractCallback
from aitoolbox_like.callbacks.mlflow import MLflowTracking
from aitoolbox_like.callbacks.model_save import ModelCheckpoint
from aitoolbox_like.callbacks.performance_eval import ModelTrainHistoryFileWriter
from aitoolbox_like.tracking import TrainLoopCheckpoint
from aitoolbox_like.train_loop import TrainLoop
from helpers import MLP, loaders
from s3_server import make_bucket, s3_server  # noqa: F401  (pytest fixture)

# One mlflow at a time, in one pytest-xdist worker (its set-up is paid once, and two would share 2 cores).
pytestmark = pytest.mark.xdist_group('mlflow')

_SERVER_START_TIMEOUT_S = 60.0


def mlflow_client(tracking_uri):
    """mlflow's MlflowClient on ``tracking_uri``, imported here: mlflow takes about 2 s to import, which only the
    pytest worker that runs these tests pays, not every worker at collection."""
    from mlflow.tracking import MlflowClient
    return MlflowClient(tracking_uri)


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class MlflowServer:
    """One ``mlflow server`` process (its own process group); stop() and start() keep the port and the stores."""

    def __init__(self, folder, s3):
        self.folder = folder
        self.s3 = s3
        self.port = _free_port()
        self.bucket = make_bucket(s3, f'mlflow-{os.getpid()}')
        self.process = None

    @property
    def uri(self):
        return f'http://127.0.0.1:{self.port}'

    def start(self):
        # MLFLOW_SERVER_ENABLE_JOB_EXECUTION: no job runner (8 huey consumer processes that poll all the while, and
        # outlive the server's process group): the tests log runs, they run no MLflow jobs.
        env = dict(os.environ, MLFLOW_S3_ENDPOINT_URL=self.s3.endpoint_url, AWS_ACCESS_KEY_ID=self.s3.access_key,
                   AWS_SECRET_ACCESS_KEY=self.s3.secret_key, AWS_DEFAULT_REGION='us-east-1',
                   MLFLOW_SERVER_ENABLE_JOB_EXECUTION='false')
        log = open(os.path.join(self.folder, 'mlflow-server.log'), 'ab')
        self.process = subprocess.Popen(
            [sys.executable, '-m', 'mlflow', 'server', '--backend-store-uri',
             f"sqlite:///{os.path.join(self.folder, 'mlflow.db')}", '--artifacts-destination',
             f's3://{self.bucket}/artifacts', '--host', '127.0.0.1', '--port', str(self.port), '--workers', '1'],
            cwd=self.folder, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        log.close()
        deadline = time.monotonic() + _SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f'mlflow server exited: {self.log_tail()}'
            try:
                with urllib.request.urlopen(f'{self.uri}/health', timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f'mlflow server did not answer in {_SERVER_START_TIMEOUT_S} s: {self.log_tail()}')

    def stop(self):
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        # The server runs uvicorn in a child process: stop the process group the server leads (its PID).
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)

    def log_tail(self):
        with open(os.path.join(self.folder, 'mlflow-server.log'), errors='replace') as f:
            return f.read()[-3000:]


@pytest.fixture(scope='session')
def mlflow_server(s3_server, tmp_path_factory):  # noqa: F811  (the imported fixture)
    server = MlflowServer(str(tmp_path_factory.mktemp('mlflow_server')), s3_server)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def quick_http(monkeypatch):
    """MLflow's client retries a refused connection for minutes by default; the tests want the failure at once."""
    monkeypatch.setenv('MLFLOW_HTTP_REQUEST_MAX_RETRIES', '0')
    monkeypatch.setenv('MLFLOW_HTTP_REQUEST_TIMEOUT', '5')


def _checkpoint_loop(tmp_path, seed=0, **kwargs):
    torch.manual_seed(seed)
    train, val, test = loaders(n=40, batch_size=8)       # 5 batches per epoch
    model = MLP()
    return TrainLoopCheckpoint(model, train, val, test, torch.optim.SGD(model.parameters(), lr=0.1),
                               torch.nn.CrossEntropyLoss(), 'proj', 'exp', str(tmp_path / 'results'),
                               {'lr': 0.1, 'batch_size': 8, 'nested': {'depth': 2}}, cloud_save_mode='local',
                               progress_bar=False, **kwargs)


def _metric_steps(client, run_id, key):
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def _assert_history_logged(client, run_id, loop, names=('loss', 'val_loss', 'accumulated_loss')):
    history = loop.train_history
    for name in names:
        expected = dict(zip(history.get_epochs(name), history[name]))
        assert _metric_steps(client, run_id, name) == pytest.approx(expected, rel=1e-12), name


def _artifact_paths(client, run_id, path=None):
    paths = []
    for info in client.list_artifacts(run_id, path):
        paths += _artifact_paths(client, run_id, info.path) if info.is_dir else [info.path]
    return sorted(paths)


class RecordBatchLosses(AbstractCallback):
    """Reads every batch loss on the host (a test may sync) to compare with what MLflow got."""

    def __init__(self):
        super().__init__('record losses')
        self.losses = {}

    def on_batch_end(self):
        loop = self.train_loop_obj
        self.losses[loop.total_iteration_idx] = (loop.epoch, float(loop.loss_batch_accum[-1]))


def test_local_sqlite_store_logs_params_metrics_batch_losses_artifacts_and_tags(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    loop = _checkpoint_loop(tmp_path)
    recorder = RecordBatchLosses()
    tracker = MLflowTracking(uri, batch_log_frequency=2, tags={'team': 'vision'}, batch_sync_frequency=3)
    loop.fit(num_epochs=2, callbacks=[recorder, ModelTrainHistoryFileWriter(file_format='csv'), tracker])
    assert tracker.not_logged == []

    client = mlflow_client(uri)
    run = client.get_run(tracker.run_id)
    assert run.info.status == 'FINISHED'
    assert run.info.run_name == 'exp'
    assert client.get_experiment(run.info.experiment_id).name == 'proj'
    assert run.data.params['lr'] == '0.1' and run.data.params['batch_size'] == '8'
    assert run.data.params['nested.depth'] == '2'
    tags = run.data.tags
    assert tags['project'] == 'proj' and tags['experiment'] == 'exp' and tags['team'] == 'vision'
    assert tags['experiment_folder'] == loop.experiment.dir_path
    assert len(tags['mlflow.source.git.commit']) == 40      # the tests live in a git checkout
    _assert_history_logged(client, tracker.run_id, loop)
    assert _metric_steps(client, tracker.run_id, 'train_end_test_loss') == \
        pytest.approx({1: loop.train_history['train_end_test_loss'][-1]})

    # batch losses: every 2nd global step, last value and the epoch's running mean
    batch = _metric_steps(client, tracker.run_id, 'batch_loss')
    running = _metric_steps(client, tracker.run_id, 'batch_loss_running_mean')
    assert sorted(batch) == [s for s in sorted(recorder.losses) if s % 2 == 0]
    for step in batch:
        epoch, loss = recorder.losses[step]
        assert batch[step] == pytest.approx(loss, rel=1e-6)
        epoch_losses = [v for s, (e, v) in sorted(recorder.losses.items()) if e == epoch and s <= step]
        assert running[step] == pytest.approx(sum(epoch_losses) / len(epoch_losses), rel=1e-6)

    artifacts = _artifact_paths(client, tracker.run_id)
    script = os.path.basename(__file__)
    assert {'hyperparams.json', 'hyperparams_list.txt', script}.issubset(artifacts), artifacts
    assert any(p.startswith('results/') and p.endswith('.csv') for p in artifacts), artifacts
    assert not any(p.startswith('checkpoint_model/') for p in artifacts)    # log_checkpoints=False
    assert 'mlflow.db' not in artifacts


def test_plain_loop_with_file_store_and_checkpoints_as_artifacts(tmp_path, monkeypatch):
    monkeypatch.setenv('MLFLOW_ALLOW_FILE_STORE', 'true')
    store = str(tmp_path / 'mlruns')
    train, val, test = loaders(n=16)
    model = MLP()
    loop = TrainLoop(model, train, val, test, torch.optim.SGD(model.parameters(), lr=0.1),
                     torch.nn.CrossEntropyLoss(), progress_bar=False)
    tracker = MLflowTracking(store, experiment_name='mine', run_name='first', log_checkpoints=True)
    saver = ModelCheckpoint('p', 'e', str(tmp_path / 'results'), {'lr': 0.1}, 'local')
    loop.fit(num_epochs=1, callbacks=[saver, tracker])
    client = mlflow_client(store)
    run = client.get_run(tracker.run_id)
    assert client.get_experiment(run.info.experiment_id).name == 'mine' and run.info.run_name == 'first'
    assert run.data.tags['project'] == 'p' and run.data.tags['experiment'] == 'e'    # the saving callback's names
    assert run.data.params == {}
    _assert_history_logged(client, tracker.run_id, loop, names=('loss', 'val_loss'))
    assert any(p.startswith('checkpoint_model/') for p in _artifact_paths(client, tracker.run_id))


def test_server_with_s3_artifacts_resume_continues_the_same_run(mlflow_server, tmp_path, quick_http):
    loop = _checkpoint_loop(tmp_path)
    tracker = MLflowTracking(mlflow_server.uri, experiment_name='server-resume')
    loop.fit(num_epochs=2, callbacks=[tracker])
    assert tracker.not_logged == []
    client = mlflow_client(mlflow_server.uri)
    run_id = tracker.run_id
    assert client.get_run(run_id).info.status == 'FINISHED'
    artifacts = _artifact_paths(client, run_id)
    assert {'hyperparams.json', 'hyperparams_list.txt', os.path.basename(__file__)}.issubset(artifacts)
    # the artifacts are in the S3 bucket behind the server
    keys = [o['Key'] for o in mlflow_server.s3.client().list_objects_v2(
        Bucket=mlflow_server.bucket, Prefix='artifacts/').get('Contents', [])]
    assert any(k.endswith(f'{run_id}/artifacts/hyperparams.json') for k in keys), keys

    # the checkpoint carries the run id; resuming continues the same run
    checkpoint_dir = loop.experiment.dir_path
    saved = torch.load(os.path.join(checkpoint_dir, 'checkpoint_model', os.listdir(
        os.path.join(checkpoint_dir, 'checkpoint_model'))[0]), weights_only=True)
    assert saved['callbacks']['MLflowTracking'] == {'run_id': run_id}
    resumed_loop = _checkpoint_loop(tmp_path, seed=5)
    resumed = MLflowTracking(mlflow_server.uri, experiment_name='server-resume')
    resumed_loop.fit(num_epochs=3, callbacks=[resumed], resume_from=checkpoint_dir)
    assert resumed.run_id == run_id
    run = client.get_run(run_id)
    assert run.info.status == 'FINISHED' and run.data.params['lr'] == '0.1'
    assert sorted(_metric_steps(client, run_id, 'val_loss')) == [0, 1, 2]      # the metrics continue
    _assert_history_logged(client, run_id, resumed_loop)
    assert len(client.search_runs([run.info.experiment_id])) == 1


class ServerOutage(AbstractCallback):
    """Stops the mlflow server at the start of epoch 1; at the start of epoch 2 waits until the tracker noticed,
    then starts it again."""

    def __init__(self, server, tracker):
        super().__init__('outage', execution_order=-1)
        self.server, self.tracker = server, tracker

    def on_epoch_begin(self):
        epoch = self.train_loop_obj.epoch
        if epoch == 1:
            self.server.stop()
        elif epoch == 2:
            deadline = time.monotonic() + 60
            while not self.tracker.server_down and time.monotonic() < deadline:
                time.sleep(0.05)
            self.server.start()


def test_server_down_during_training_is_one_warning_and_caught_up(mlflow_server, tmp_path, quick_http, caplog):
    loop = _checkpoint_loop(tmp_path)
    tracker = MLflowTracking(mlflow_server.uri, experiment_name='outage', retry_interval_s=0.1,
                             max_retry_interval_s=0.5, batch_log_frequency=1)
    with caplog.at_level(logging.INFO, logger='aitoolbox_like.callbacks.mlflow'):
        loop.fit(num_epochs=3, callbacks=[ServerOutage(mlflow_server, tracker), tracker])
    assert mlflow_server.process is not None
    warnings = [r for r in caplog.records if r.name == 'aitoolbox_like.callbacks.mlflow' and
                r.levelno == logging.WARNING]
    assert len(warnings) == 1 and 'not answering' in warnings[0].getMessage(), [r.getMessage() for r in warnings]
    assert any('answers again' in r.getMessage() for r in caplog.records)
    assert tracker.not_logged == []
    client = mlflow_client(mlflow_server.uri)
    assert client.get_run(tracker.run_id).info.status == 'FINISHED'
    _assert_history_logged(client, tracker.run_id, loop)        # epoch 1, logged while down, was caught up
    assert sorted(_metric_steps(client, tracker.run_id, 'batch_loss')) == list(range(15))


def test_server_down_at_the_end_is_reported(tmp_path, quick_http, caplog):
    loop = _checkpoint_loop(tmp_path)
    tracker = MLflowTracking(f'http://127.0.0.1:{_free_port()}', start_wait_s=0.5, end_wait_timeout_s=0.5,
                             retry_interval_s=0.2)
    with caplog.at_level(logging.WARNING, logger='aitoolbox_like.callbacks.mlflow'):
        loop.fit(num_epochs=1, callbacks=[tracker])          # completes although nothing answers
    assert loop.epochs_completed == 1 and tracker.run_id is None
    assert tracker.not_logged and tracker.not_logged[0] == 'run start'
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and 'not logged to the MLflow server' in errors[0] and 'metric values' in errors[0]
    assert sum(r.levelno == logging.WARNING and 'not answering' in r.getMessage() for r in caplog.records) == 1


def test_argument_checks():
    with pytest.raises(ValueError, match='batch_log_frequency'):
        MLflowTracking(batch_log_frequency=0)
    with pytest.raises(TypeError, match='tags'):
        MLflowTracking(tags=['a'])
    with pytest.raises(ValueError, match='end_wait_timeout_s'):
        MLflowTracking(end_wait_timeout_s=-1)


def test_module_imports_without_mlflow_and_use_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, 'mlflow', None)       # import mlflow now raises ImportError
    monkeypatch.delitem(sys.modules, 'aitoolbox_like.callbacks.mlflow')
    module = importlib.import_module('aitoolbox_like.callbacks.mlflow')
    with pytest.raises(ImportError, match=r'pip install aitoolbox_like\[mlflow\]'):
        module.MLflowTracking()


def test_git_commit_fails_quietly(tmp_path):
    from aitoolbox_like.callbacks.mlflow import git_commit
    assert git_commit(str(tmp_path)) is None
    assert git_commit(str(tmp_path / 'missing')) is None
