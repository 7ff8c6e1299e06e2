"""What only S3 has, against a real S3 server (SeaweedFS on loopback, started by the s3_server fixture): its credentials,
its endpoint argument, and large uploads while training goes on. What every cloud has is in test_cloud_experiment.py."""
import logging
import os
import threading

import pytest
import torch

from aitoolbox_like import AbstractCallback
from aitoolbox_like.experiment import ExperimentUploader
from aitoolbox_like.storage import StorageAuthError
from aitoolbox_like.storage.s3 import S3Storage
from aitoolbox_like.train_loop import TrainLoop
from aitoolbox_like.tracking import TrainLoopCheckpoint
from s3_server import make_bucket
from saving_helpers import assert_same_weights, make_parts, weights


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    monkeypatch.setenv('AWS_ENDPOINT_URL_S3', s3_server.endpoint_url)
    # Fail fast inside botocore and retry in the uploader, so an outage shows up as uploader retries.
    monkeypatch.setattr(ExperimentUploader, 'storage_options', {'max_attempts': 1})
    monkeypatch.setattr(ExperimentUploader, 'uploader_options', {'initial_backoff_s': 0.2, 'max_backoff_s': 1.0,
                                                                 'max_retries': 200})
    monkeypatch.setattr(ExperimentUploader, 'wait_timeout_s', 120.0)
    return s3_server


def _keys(s3_server, bucket):
    pages = s3_server.client().get_paginator('list_objects_v2').paginate(Bucket=bucket)
    return sorted(obj['Key'] for page in pages for obj in page.get('Contents', ()))


def _loop(tmp_path, bucket, seed=0, cls=TrainLoopCheckpoint, **kwargs):
    model, train, val, test, optimizer = make_parts(seed=seed, **kwargs.pop('parts', {}))
    return cls(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), 'proj', 'exp', str(tmp_path),
               {'lr': 1e-2}, cloud_save_mode='s3', bucket_name=bucket, cloud_dir_prefix='runs/v1',
               progress_bar=False, **kwargs)


def test_wrong_credentials_give_a_clear_error_without_the_secret(s3_env, tmp_path, monkeypatch, caplog):
    bucket = make_bucket(s3_env)
    # Built here, so that this file (copied into the experiment folder at registration, before the bucket is
    # checked at the start of fit) does not hold the secret itself.
    secret = '-'.join(('definitely', 'wrong', 'secret', '9f8e7d'))
    monkeypatch.setenv('AWS_SECRET_ACCESS_KEY', secret)
    loop = _loop(tmp_path, bucket)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(StorageAuthError) as info:
        loop.fit(num_epochs=1)
    message = str(info.value)
    assert 'AWS_SECRET_ACCESS_KEY' in message and "cloud_save_mode='local'" in message
    assert secret not in message and secret not in caplog.text
    for root, _, files in os.walk(tmp_path):
        for name in files:
            assert secret.encode() not in open(os.path.join(root, name), 'rb').read()


class GatedStorage(S3Storage):
    """S3 storage whose first checkpoint upload waits until training has reached the end of epoch 1."""

    gate = None
    events = None

    def save_file(self, local_path, key):
        if key.endswith('_E0.pth'):
            self.events.append('upload of E0 waiting')
            assert self.gate.wait(60)
            super().save_file(local_path, key)
            self.events.append('upload of E0 done')
        else:
            super().save_file(local_path, key)


class Recorder(AbstractCallback):
    def __init__(self, gate, events):
        super().__init__('recorder', execution_order=2000)
        self.gate, self.events = gate, events

    def on_epoch_end(self):
        self.events.append(f'epoch {self.train_loop_obj.epoch} done')
        if self.train_loop_obj.epoch == 1:
            self.gate.set()


def test_a_100_mb_checkpoint_uploads_while_training_continues(s3_env, tmp_path, monkeypatch):
    bucket = make_bucket(s3_env)
    gate, events = threading.Event(), []
    monkeypatch.setattr(GatedStorage, 'gate', gate)
    monkeypatch.setattr(GatedStorage, 'events', events)
    import aitoolbox_like.storage.s3 as s3_module
    monkeypatch.setattr(s3_module, 'S3Storage', GatedStorage)
    loop = _loop(tmp_path, bucket, parts={'big_buffer_floats': 25_000_000})     # 100 MB of float32
    loop.fit(num_epochs=2, callbacks=[Recorder(gate, events)])
    # The epoch-0 upload cannot finish before epoch 1 ends (the gate), so had saving waited for the upload, training
    # would have stalled and the upload failed; instead training went on and fit waited for the upload at the end.
    assert events.index('epoch 0 done') < events.index('epoch 1 done') < events.index('upload of E0 done')
    assert loop.upload_failures == []
    ts = loop.experiment_timestamp
    head = s3_env.client().head_object(Bucket=bucket, Key=f'runs/v1/proj/exp_{ts}/checkpoint_model/model_exp_{ts}_E0.pth')
    local = tmp_path / 'proj' / f'exp_{ts}' / 'checkpoint_model' / f'model_exp_{ts}_E0.pth'
    assert head['ContentLength'] == local.stat().st_size > 100_000_000


def test_results_of_performance_callbacks_go_to_the_experiment_folder_in_s3(s3_env, tmp_path):
    from aitoolbox_like.callbacks.performance_eval import ModelTrainHistoryFileWriter
    bucket = make_bucket(s3_env)
    loop = _loop(tmp_path, bucket)
    loop.fit(num_epochs=2, callbacks=[ModelTrainHistoryFileWriter()])
    ts = loop.experiment_timestamp
    assert any(k.startswith(f'runs/v1/proj/exp_{ts}/results/') and k.endswith('.txt') for k in _keys(s3_env, bucket))


def test_result_callbacks_upload_to_s3_without_a_saving_callback(s3_env, tmp_path):
    from aitoolbox_like.callbacks.performance_eval import ModelTrainHistoryFileWriter, ModelTrainHistoryPlot
    from aitoolbox_like.callbacks.tensorboard import TensorboardTrainHistoryMetric
    bucket = make_bucket(s3_env)
    model, train, val, test, optimizer = make_parts(seed=0)
    loop = TrainLoop(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), progress_bar=False)
    experiment = dict(project_name='proj', experiment_name='plots', local_model_result_folder_path=str(tmp_path),
                      cloud_save_mode='s3', bucket_name=bucket, cloud_dir_prefix='res')
    plot = ModelTrainHistoryPlot(**experiment)
    writer = ModelTrainHistoryFileWriter(file_format='csv', **experiment)
    loop.fit(num_epochs=2, callbacks=[plot, writer, TensorboardTrainHistoryMetric(**experiment)])
    keys = _keys(s3_env, bucket)
    root = f'res/proj/plots_{loop.experiment_timestamp}'
    assert f'{root}/results/results.csv' in keys
    assert f'{root}/results/plots_epoch_1/val_loss.png' in keys
    assert any(k.startswith(f'{root}/tensorboard/') and 'tfevents' in k for k in keys)
    # What was uploaded is the final local file (the end of fit waited for the uploads).
    local_csv = os.path.join(writer.results_dir_path, 'results.csv')
    remote = S3Storage(bucket, 'res').load_file(f'proj/plots_{loop.experiment_timestamp}/results/results.csv',
                                                tmp_path / 'remote.csv')
    assert open(remote, 'rb').read() == open(local_csv, 'rb').read()


def test_model_load_from_s3_uses_the_explicit_endpoint(s3_server, tmp_path, monkeypatch):
    """A custom endpoint given only as an argument (no AWS_ENDPOINT_URL_S3) serves saving and loading alike."""
    import shutil

    from aitoolbox_like.callbacks.model_load import ModelLoadContinueTraining
    from aitoolbox_like.callbacks.model_save import ModelCheckpoint
    monkeypatch.delenv('AWS_ENDPOINT_URL_S3', raising=False)
    monkeypatch.delenv('AWS_ENDPOINT_URL', raising=False)
    monkeypatch.setattr(ExperimentUploader, 'storage_options', {'max_attempts': 1})
    bucket = make_bucket(s3_server)
    endpoint = dict(cloud_save_mode='s3', bucket_name=bucket, cloud_dir_prefix='ep', endpoint_url=s3_server.endpoint_url)

    model, train, val, test, optimizer = make_parts(seed=0)
    first = TrainLoop(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), progress_bar=False)
    first.fit(num_epochs=2, callbacks=[ModelCheckpoint('proj', 'exp', str(tmp_path / 'a'), {}, **endpoint)])
    shutil.rmtree(tmp_path / 'a')                        # only the bucket is left

    model, train, val, test, optimizer = make_parts(seed=5)
    resumed = TrainLoop(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), progress_bar=False)
    resumed.fit(num_epochs=2, callbacks=[ModelLoadContinueTraining(
        first.experiment_timestamp, project_name='proj', experiment_name='exp',
        local_model_result_folder_path=str(tmp_path / 'b'), **endpoint)])
    assert_same_weights(weights(resumed.model), weights(first.model))
    assert resumed.total_iteration_idx == first.total_iteration_idx
