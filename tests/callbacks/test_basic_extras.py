"""EmailNotification (message composition, a real send failure) and LogUpload (to a real S3 server)."""
import email
import logging
import os
import pickle
import socket
import sys
import time

import pytest
import torch

pytest.importorskip('boto3')

from aitoolbox_like import AbstractCallback  # noqa: E402
from aitoolbox_like.callbacks.basic import EmailNotification, LogUpload, SESSender  # noqa: E402
from aitoolbox_like.callbacks.performance_eval import ModelTrainHistoryFileWriter  # noqa: E402
from aitoolbox_like.experiment import ExperimentUploader  # noqa: E402
from aitoolbox_like.storage.s3 import S3Storage  # noqa: E402
from aitoolbox_like.tracking import TrainLoopCheckpoint  # noqa: E402
from aitoolbox_like.train_loop import TrainLoop  # noqa: E402
from helpers import MLP, loaders  # noqa: E402
from s3_server import make_bucket, s3_server  # noqa: E402,F401  (pytest fixture)


def _loop(cls=TrainLoop, **kwargs):
    torch.manual_seed(0)
    train, val, test = loaders(n=24, batch_size=8)
    model = MLP()
    return cls(model, train, val, test, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.CrossEntropyLoss(),
               progress_bar=False, **kwargs)


def _closed_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]          # nothing listens once the socket is closed


@pytest.fixture
def aws_env(tmp_path, monkeypatch):
    """Fake credentials and no profile, so nothing of the developer's AWS set-up is used."""
    for name in ('AWS_PROFILE', 'AWS_DEFAULT_PROFILE', 'AWS_SESSION_TOKEN', 'AWS_ENDPOINT_URL', 'AWS_REGION',
                 'AWS_DEFAULT_REGION'):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('AWS_ACCESS_KEY_ID', 'test-access-key')
    monkeypatch.setenv('AWS_SECRET_ACCESS_KEY', 'test-secret-key')
    monkeypatch.setenv('AWS_CONFIG_FILE', str(tmp_path / 'missing-config'))
    monkeypatch.setenv('AWS_SHARED_CREDENTIALS_FILE', str(tmp_path / 'missing-credentials'))
    monkeypatch.setenv('AWS_EC2_METADATA_DISABLED', 'true')


# ---------------------------------------------------------------------------------------------- email


def test_email_messages_carry_the_history_hyperparameters_and_result_files(aws_env, tmp_path):
    from botocore.stub import Stubber
    loop = _loop(TrainLoopCheckpoint, project_name='proj', experiment_name='exp',
                 local_model_result_folder_path=str(tmp_path / 'results'),
                 hyperparams={'lr': 0.1, 'note': '<b>bold</b>'}, cloud_save_mode='local')
    notifier = EmailNotification('Trainer', 'trainer@example.com', 'me@example.com', aws_region='us-east-1')
    writer = ModelTrainHistoryFileWriter()
    loop.callbacks_handler.register_callbacks([notifier, writer])

    # A real botocore SES client: Stubber validates each request against the SES API model.
    client = notifier.ses_sender.client
    sent = []
    client.meta.events.register('provide-client-params.ses.SendRawEmail', lambda params, **_: sent.append(params))
    with Stubber(client) as stubber:
        for i in range(3):
            stubber.add_response('send_raw_email', {'MessageId': f'id-{i}'})
        loop.fit(num_epochs=2)
        stubber.assert_no_pending_responses()
    assert notifier.sent_count == 3 and notifier.failed_count == 0

    messages = [email.message_from_bytes(params['RawMessage']['Data']) for params in sent]
    assert all(params['Source'] == 'Trainer <trainer@example.com>' for params in sent)
    assert all(params['Destinations'] == ['me@example.com'] for params in sent)
    assert [m['Subject'] for m in messages] == ['End of epoch 0 report: proj: exp', 'End of epoch 1 report: proj: exp',
                                                'End of training: proj: exp']
    assert messages[0]['From'] == 'Trainer <trainer@example.com>' and messages[0]['To'] == 'me@example.com'

    def html_of(message):
        return next(p for p in message.walk() if p.get_content_type() == 'text/html').get_payload(
            decode=True).decode()

    def attachments(message):
        return {p.get_filename(): p.get_payload(decode=True) for p in message.walk() if p.get_filename()}

    epoch_1 = html_of(messages[1])
    assert '<h2>End of epoch 1</h2>' in epoch_1
    for name in ('accumulated_loss', 'val_loss'):
        assert f'<li><p>{name}: {loop.train_history[name][-1]}</p></li>' in epoch_1
    assert '<li><p>loss:' not in epoch_1        # no value, no line (the training set is not evaluated)
    final = html_of(messages[2])
    assert f"<li><p>train_end_test_loss: {loop.train_history['train_end_test_loss'][-1]}</p></li>" in final
    assert '<li><p>lr: 0.1</p></li>' in final
    assert '&lt;b&gt;bold&lt;/b&gt;' in final and '<b>bold</b>' not in final      # values are escaped
    # the history file written in the same epoch is attached, as it was at that moment
    results_file = writer.last_written_files[0]
    assert list(attachments(messages[0])) == ['results.txt']
    assert b'Epoch: 0' in attachments(messages[0])['results.txt']
    assert b'Epoch: 1' not in attachments(messages[0])['results.txt']
    assert attachments(messages[1])['results.txt'] == open(results_file, 'rb').read()


def test_email_send_failure_is_logged_once_and_training_goes_on(aws_env, monkeypatch, caplog):
    monkeypatch.setenv('AWS_ENDPOINT_URL_SES', f'http://127.0.0.1:{_closed_port()}')
    monkeypatch.setenv('AWS_MAX_ATTEMPTS', '1')
    monkeypatch.setenv('AWS_RETRY_MODE', 'standard')
    loop = _loop()
    notifier = EmailNotification('Trainer', 'trainer@example.com', 'me@example.com')
    started = time.monotonic()
    with caplog.at_level(logging.DEBUG, logger='aitoolbox_like.callbacks.basic'):
        loop.fit(num_epochs=3, callbacks=[notifier])
    assert time.monotonic() - started < 30
    assert loop.train_history.get_epochs('val_loss') == [0, 1, 2]
    assert notifier.failed_count == 4 and notifier.sent_count == 0
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    message = errors[0].getMessage()
    assert 'End of epoch 0 report: default_project: experiment' in message
    assert '127.0.0.1' in message and 'training goes on' in message
    assert any('4 of 4 emails could not be sent' in r.getMessage() for r in caplog.records
               if r.levelno == logging.WARNING)


def test_sender_pickles_without_its_client(aws_env):
    sender = SESSender('n', 'n@example.com', ['a@example.com', 'b@example.com'], aws_region='us-east-1')
    assert sender.client is not None
    copy = pickle.loads(pickle.dumps(sender))
    assert copy._client is None and copy.recipients == ['a@example.com', 'b@example.com']
    message = copy.build_message('s', '<p>x</p>', ['/does/not/exist.png'])
    assert message['To'] == 'a@example.com, b@example.com'
    assert [p.get_filename() for p in message.walk() if p.get_filename()] == []


def test_email_without_boto3_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, 'boto3', None)
    with pytest.raises(ImportError, match=r'pip install aitoolbox_like\[s3\]'):
        EmailNotification('n', 'n@example.com', 'me@example.com')


# ---------------------------------------------------------------------------------------------- log upload


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    monkeypatch.setenv('AWS_ENDPOINT_URL_S3', s3_server.endpoint_url)
    monkeypatch.setattr(ExperimentUploader, 'storage_options', {'max_attempts': 1})
    monkeypatch.setattr(ExperimentUploader, 'uploader_options', {'initial_backoff_s': 0.2, 'max_backoff_s': 1.0,
                                                                 'max_retries': 20})
    monkeypatch.setattr(ExperimentUploader, 'wait_timeout_s', 60.0)
    return s3_server


class LogEachEpoch(AbstractCallback):
    def __init__(self):
        super().__init__('log a marker')

    def on_epoch_end(self):
        logging.getLogger('test_basic_extras.training').info('marker of epoch %d', self.train_loop_obj.epoch)


def test_log_upload_puts_the_log_into_the_cloud_experiment_folder(s3_env, tmp_path):
    bucket = make_bucket(s3_env)
    log_path = tmp_path / 'logs' / 'training.log'
    log_path.parent.mkdir()
    handler = logging.FileHandler(log_path)
    training_logger = logging.getLogger('test_basic_extras.training')
    training_logger.addHandler(handler)
    training_logger.setLevel(logging.INFO)
    try:
        loop = _loop()
        upload = LogUpload(str(log_path), project_name='proj', experiment_name='exp',
                           local_model_result_folder_path=str(tmp_path / 'results'), cloud_save_mode='s3',
                           bucket_name=bucket, cloud_dir_prefix='runs/v1')
        loop.fit(num_epochs=2, callbacks=[LogEachEpoch(), upload])
    finally:
        training_logger.removeHandler(handler)
        handler.close()
    assert loop.upload_failures == []
    key = f'proj/exp_{loop.experiment_timestamp}/training.log'
    uploaded = S3Storage(bucket, 'runs/v1').read_text(key)
    assert 'marker of epoch 0' in uploaded and 'marker of epoch 1' in uploaded
    snapshot = tmp_path / 'results' / 'proj' / f'exp_{loop.experiment_timestamp}' / 'training.log'
    assert uploaded == snapshot.read_text()            # the upload is the end-of-training snapshot
    assert log_path.read_text().startswith(uploaded)


def test_log_upload_needs_a_cloud_mode_unless_told_otherwise(tmp_path, caplog):
    log_path = tmp_path / 'training.log'
    log_path.write_text('hello\n')
    with pytest.raises(ValueError, match='fail_if_cloud_missing=False'):
        _loop().fit(num_epochs=1, callbacks=[LogUpload(str(log_path))])
    upload = LogUpload(str(log_path), fail_if_cloud_missing=False)
    with caplog.at_level(logging.WARNING):
        _loop().fit(num_epochs=1, callbacks=[upload])
    assert any('is not uploaded' in r.getMessage() for r in caplog.records)
    assert upload.upload_log_file() is None
    with pytest.raises(ValueError, match="cloud_save_mode must be one of .*'gcs'"):
        _loop().fit(num_epochs=1, callbacks=[LogUpload(str(log_path), cloud_save_mode='dropbox', bucket_name='b')])


def test_log_upload_warns_once_about_a_missing_log_file(s3_env, tmp_path, caplog):
    bucket = make_bucket(s3_env)
    upload = LogUpload(str(tmp_path / 'not-there.log'), project_name='proj', experiment_name='exp',
                       local_model_result_folder_path=str(tmp_path / 'results'), cloud_save_mode='s3',
                       bucket_name=bucket)
    with caplog.at_level(logging.WARNING):
        _loop().fit(num_epochs=2, callbacks=[upload])
    assert len([r for r in caplog.records if 'does not exist' in r.getMessage()]) == 1


def test_aitoolbox_signatures():
    import inspect
    assert list(inspect.signature(EmailNotification.__init__).parameters)[1:] == [
        'sender_name', 'sender_email', 'recipient_email', 'project_name', 'experiment_name', 'aws_region']
    assert inspect.signature(EmailNotification.__init__).parameters['aws_region'].default == 'eu-west-1'
    params = inspect.signature(LogUpload.__init__).parameters
    assert list(params)[1:] == ['log_file_path', 'fail_if_cloud_missing', 'project_name', 'experiment_name',
                                'local_model_result_folder_path', 'cloud_save_mode', 'bucket_name',
                                'cloud_dir_prefix']
    assert params['log_file_path'].default == '~/project/training.log'
    assert params['fail_if_cloud_missing'].default is True
    assert os.path.basename(LogUpload().log_file_path) == 'training.log'
