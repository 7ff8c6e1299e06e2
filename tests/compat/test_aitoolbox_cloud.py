"""AIToolbox's aitoolbox.cloud.AWS and aitoolbox.cloud.GoogleCloud classes (aitoolbox_like.compat.cloud,
.google_cloud) against real servers (SeaweedFS, gcp-storage-emulator), reached by their AIToolbox module paths."""
import logging
import os

import pytest
import torch
from torch import nn

from aitoolbox_like.cloud.AWS.data_access import BaseDataLoader, BaseDataSaver
from aitoolbox_like.cloud.AWS.model_load import PyTorchS3ModelLoader
from aitoolbox_like.cloud.AWS.model_save import KerasS3ModelSaver, PyTorchS3ModelSaver
from aitoolbox_like.cloud.AWS.results_save import S3ResultsSaver
from aitoolbox_like.cloud.AWS.simple_email_service import SESSender
from aitoolbox_like.cloud.GoogleCloud.model_load import PyTorchGoogleStorageModelLoader
from aitoolbox_like.results.model_loader import AbstractLocalModelLoader, PyTorchLocalModelLoader
from aitoolbox_like.engine.history import TrainingHistory
from aitoolbox_like.results import ClassificationResultPackage
from cloud_servers import gcs_server  # noqa: F401  (pytest fixture)
from s3_server import make_bucket, s3_server  # noqa: F401  (pytest fixture)

TS = '2024-05-01_10-00-00'


@pytest.fixture
def bucket(s3_server, monkeypatch):  # noqa: F811
    monkeypatch.setenv('AWS_ENDPOINT_URL_S3', s3_server.endpoint_url)
    return make_bucket(s3_server)


def keys(s3_server, bucket):  # noqa: F811
    response = s3_server.client().list_objects_v2(Bucket=bucket)
    return sorted(item['Key'] for item in response.get('Contents', []))


def model_dict(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return {'model_state_dict': model.state_dict(), 'optimizer_state_dict': optimizer.state_dict(), 'epoch': 3,
            'hyperparams': {'lr': 0.1}}


def test_constructing_needs_no_connection_nor_bucket():
    loader = PyTorchS3ModelLoader('', '', '')
    assert type(loader.local_model_loader) is PyTorchLocalModelLoader
    assert isinstance(loader.local_model_loader, AbstractLocalModelLoader)
    with pytest.raises(NotImplementedError, match='Keras'):
        KerasS3ModelSaver()
    assert PyTorchGoogleStorageModelLoader().bucket_name == 'model-result'


def test_model_saved_to_s3_and_loaded_back(s3_server, bucket, tmp_path):  # noqa: F811
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    saver = PyTorchS3ModelSaver(bucket_name=bucket, cloud_dir_prefix='runs',
                                local_model_result_folder_path=str(tmp_path / 'saved'), checkpoint_model=True)
    s3_path, timestamp, local_path = saver.save_model(model_dict(model), 'proj', 'exp', TS, epoch=3)
    key = f'runs/proj/exp_{TS}/checkpoint_model/model_exp_{TS}_E3.pth'
    assert (s3_path, timestamp) == (f'{bucket}/{key}', TS)
    assert local_path == str(tmp_path / 'saved' / 'proj' / f'exp_{TS}' / 'checkpoint_model' / f'model_exp_{TS}_E3.pth')
    assert keys(s3_server, bucket) == [key]

    final = PyTorchS3ModelSaver(bucket_name=bucket, local_model_result_folder_path=str(tmp_path / 'saved'))
    s3_path, new_timestamp, _ = final.save_model(model_dict(model), 'proj', 'exp')
    assert s3_path == f'{bucket}/proj/exp_{new_timestamp}/model/model_exp_{new_timestamp}.pth'

    # another machine: nothing local, the model comes from the bucket
    loader = PyTorchS3ModelLoader(str(tmp_path / 'elsewhere'), bucket_name=bucket, cloud_dir_prefix='runs')
    loaded = loader.load_model('proj', 'exp', TS, epoch_num=3)
    assert loaded['epoch'] == 3
    assert os.path.isfile(tmp_path / 'elsewhere' / 'proj' / f'exp_{TS}' / 'checkpoint_model' / f'model_exp_{TS}_E3.pth')
    restored = loader.init_model(nn.Linear(3, 2))
    assert all(torch.equal(a, b) for a, b in zip(restored.state_dict().values(), model.state_dict().values()))


def test_results_saved_to_s3(s3_server, bucket, tmp_path):  # noqa: F811
    package = ClassificationResultPackage()
    package.prepare_result_package(torch.tensor([0, 1, 1, 0]), torch.tensor([0, 1, 0, 0]), hyperparameters={})
    history = TrainingHistory()
    history.insert_single_result_into_history('loss', 0.5, 0)
    saver = S3ResultsSaver(bucket_name=bucket, local_model_result_folder_path=str(tmp_path))
    s3_path, timestamp = saver.save_experiment_results(package, history, 'proj', 'exp', TS)
    main_key = f'proj/exp_{TS}/results/results_hyperParams_hist_exp_{TS}.p'
    assert (s3_path, timestamp) == (f'{bucket}/{main_key}', TS)
    assert main_key in keys(s3_server, bucket)
    local = tmp_path / 'proj' / f'exp_{TS}' / 'results' / f'results_hyperParams_hist_exp_{TS}.p'
    remote = s3_server.client().get_object(Bucket=bucket, Key=main_key)['Body'].read()
    assert remote == local.read_bytes()


def test_data_saver_and_loader(s3_server, bucket, tmp_path, caplog):  # noqa: F811
    folder = tmp_path / 'data'
    (folder / 'sub').mkdir(parents=True)
    (folder / 'a.txt').write_text('a')
    (folder / 'sub' / 'b.txt').write_text('b')
    saver = BaseDataSaver(bucket_name=bucket)
    saver.save_file(str(folder / 'a.txt'), 'single/a.txt')
    saver.save_folder(str(folder), 'data')          # the folder's contents, under the key given
    saver.save_folder(str(folder), '')
    assert keys(s3_server, bucket) == ['a.txt', 'data/a.txt', 'data/sub/b.txt', 'single/a.txt', 'sub/b.txt']

    loader = BaseDataLoader(bucket_name=bucket, local_base_data_folder_path=str(tmp_path / 'local'))
    loader.load_file('data/sub/b.txt', str(tmp_path / 'local' / 'b.txt'))
    assert (tmp_path / 'local' / 'b.txt').read_text() == 'b'
    (tmp_path / 'local' / 'b.txt').write_text('kept')
    loader.load_file('data/sub/b.txt', str(tmp_path / 'local' / 'b.txt'))       # a local copy is not replaced
    assert (tmp_path / 'local' / 'b.txt').read_text() == 'kept'
    with caplog.at_level(logging.WARNING):
        loader.load_file('missing.txt', str(tmp_path / 'local' / 'missing.txt'))   # logged, as AIToolbox printed
    assert 'does not exist' in caplog.text and not (tmp_path / 'local' / 'missing.txt').exists()

    assert loader.exists_local_data_folder('ds') is False and (tmp_path / 'local' / 'ds').is_dir()
    (tmp_path / 'local' / 'ds' / 'f').write_text('x')
    assert loader.exists_local_data_folder('ds') is True
    assert loader.exists_local_data_folder('ds', protect_local_folder=False) is False
    assert os.listdir(tmp_path / 'local' / 'ds') == []


def test_ses_sender_logs_a_rejected_email_as_aitoolbox_did(caplog):
    pytest.importorskip('boto3')
    from botocore.exceptions import ClientError

    class RejectingClient:
        def send_raw_email(self, **kwargs):
            raise ClientError({'Error': {'Code': 'MessageRejected', 'Message': 'Email address is not verified.'}},
                              'SendRawEmail')

    sender = SESSender('Trainer', 'trainer@example.com', 'me@example.com')
    sender._client = RejectingClient()
    with caplog.at_level(logging.ERROR):
        assert sender.send_email('subject', 'body') is None
    assert 'Email address is not verified.' in caplog.text


# ------------------------------------------------------------------------------------ aitoolbox.cloud.GoogleCloud
# As AIToolbox's documentation uses them, against the Google Cloud Storage emulator (STORAGE_EMULATOR_HOST is how
# Google's client finds an emulator).

@pytest.fixture
def gcs_bucket(gcs_server, monkeypatch):
    monkeypatch.setenv('STORAGE_EMULATOR_HOST', gcs_server.endpoint_url)
    return gcs_server.make_bucket()


def test_google_cloud_model_saver_and_loader(gcs_server, gcs_bucket, tmp_path):
    from aitoolbox_like.cloud.GoogleCloud.model_load import PyTorchGoogleStorageModelLoader
    from aitoolbox_like.cloud.GoogleCloud.model_save import BaseModelGoogleStorageSaver, PyTorchGoogleStorageModelSaver
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    saver = PyTorchGoogleStorageModelSaver(bucket_name=gcs_bucket, cloud_dir_prefix='runs',
                                           local_model_result_folder_path=str(tmp_path / 'saved'),
                                           checkpoint_model=True)
    assert isinstance(saver, BaseModelGoogleStorageSaver) and isinstance(saver, PyTorchS3ModelSaver)
    path, timestamp, local_path = saver.save_model(model_dict(model), 'proj', 'exp', TS, epoch=3)
    key = f'runs/proj/exp_{TS}/checkpoint_model/model_exp_{TS}_E3.pth'
    assert (path, timestamp) == (f'{gcs_bucket}/{key}', TS)
    assert gcs_server.keys(gcs_bucket) == [key]
    assert saver.gcs_bucket.blob(key).exists()      # AIToolbox's attributes: Google's own client and bucket

    loader = PyTorchGoogleStorageModelLoader(str(tmp_path / 'elsewhere'), bucket_name=gcs_bucket,
                                             cloud_dir_prefix='runs')
    assert loader.load_model('proj', 'exp', TS, epoch_num=3)['epoch'] == 3
    restored = loader.init_model(nn.Linear(3, 2))
    assert all(torch.equal(a, b) for a, b in zip(restored.state_dict().values(), model.state_dict().values()))


def test_google_cloud_results_saver_and_data_access(gcs_server, gcs_bucket, tmp_path):
    from aitoolbox_like.cloud.GoogleCloud.data_access import BaseGoogleStorageDataLoader, BaseGoogleStorageDataSaver
    from aitoolbox_like.cloud.GoogleCloud.results_save import GoogleStorageResultsSaver
    package = ClassificationResultPackage()
    package.prepare_result_package(torch.tensor([0, 1, 1, 0]), torch.tensor([0, 1, 0, 0]), hyperparameters={})
    history = TrainingHistory()
    history.insert_single_result_into_history('loss', 0.5, 0)
    saver = GoogleStorageResultsSaver(bucket_name=gcs_bucket, local_model_result_folder_path=str(tmp_path))
    path, timestamp = saver.save_experiment_results(package, history, 'proj', 'exp', TS)
    main_key = f'proj/exp_{TS}/results/results_hyperParams_hist_exp_{TS}.p'
    assert (path, timestamp) == (f'{gcs_bucket}/{main_key}', TS)

    (tmp_path / 'a.txt').write_text('a')
    BaseGoogleStorageDataSaver(bucket_name=gcs_bucket).save_file(str(tmp_path / 'a.txt'), 'data/a.txt')
    loader = BaseGoogleStorageDataLoader(bucket_name=gcs_bucket, local_dataset_folder_path=str(tmp_path / 'local'))
    assert loader.local_dataset_folder_path == str(tmp_path / 'local')
    loader.load_file(main_key, str(tmp_path / 'local' / 'results.p'))
    loader.load_file('data/a.txt', str(tmp_path / 'local' / 'a.txt'))
    local = tmp_path / 'proj' / f'exp_{TS}' / 'results' / f'results_hyperParams_hist_exp_{TS}.p'
    assert (tmp_path / 'local' / 'results.p').read_bytes() == local.read_bytes()
    assert (tmp_path / 'local' / 'a.txt').read_text() == 'a'


def test_google_cloud_classes_are_built_without_a_connection_and_name_a_missing_bucket(gcs_server, monkeypatch,
                                                                                      tmp_path):
    from aitoolbox_like.cloud.GoogleCloud.model_save import PyTorchGoogleStorageModelSaver
    from aitoolbox_like.storage import StorageError
    monkeypatch.setenv('STORAGE_EMULATOR_HOST', gcs_server.endpoint_url)
    saver = PyTorchGoogleStorageModelSaver(bucket_name='no-such-bucket', local_model_result_folder_path=str(tmp_path))
    with pytest.raises(StorageError, match="'no-such-bucket' does not exist"):
        saver.save_model(model_dict(nn.Linear(3, 2)), 'proj', 'exp', TS)
