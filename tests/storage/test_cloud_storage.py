"""The storage interface on each cloud (the ``cloud`` fixture: S3, Google Cloud Storage, Azure Blob Storage against
their real servers on loopback), chosen by URL or by cloud_save_mode; and what each cloud's configuration and
credentials errors say."""
import os
import subprocess
import sys
import textwrap

import pytest

from aitoolbox_like.checkpoint import sharded as sharded_checkpoint
from aitoolbox_like.storage import StorageAuthError, StorageError, open_storage, storage_for_mode
from aitoolbox_like.storage.urls import storage_for_location


def test_one_interface_on_every_cloud(cloud, tmp_path):
    bucket = cloud.make_bucket()
    storage = open_storage(f'{cloud.scheme}://{bucket}/proj/exp')
    assert storage.scheme == cloud.scheme and type(storage) is type(storage_for_mode(cloud.mode, bucket))
    src = tmp_path / 'w.bin'
    src.write_bytes(os.urandom(300_000))
    storage.save_file(src, 'weights/w.bin')
    assert storage.load_file('weights/w.bin', tmp_path / 'sub' / 'w.bin').read_bytes() == src.read_bytes()
    for key in ['m/1.pt', 'm/2.pt', 'm2/1.pt', 'results/r.txt']:
        storage.write_text(key, key)
    open_storage(f'{cloud.scheme}://{bucket}/proj/exp2').write_text('m/1.pt', 'another prefix')
    assert cloud.keys(bucket, 'proj/exp/') == ['proj/exp/m/1.pt', 'proj/exp/m/2.pt', 'proj/exp/m2/1.pt',
                                               'proj/exp/results/r.txt', 'proj/exp/weights/w.bin']
    assert storage.list('m') == ['m/1.pt', 'm/2.pt', 'm2/1.pt'] and storage.list('m/') == ['m/1.pt', 'm/2.pt']
    assert storage.read_text('m2/1.pt') == 'm2/1.pt'
    assert storage.exists('m/1.pt') and not storage.exists('m/3.pt') and not storage.exists('m')
    storage.delete('m/1.pt')
    storage.delete('m/1.pt')        # a missing key is not an error
    assert storage.list('m/') == ['m/2.pt']
    assert storage.uri('m/2.pt') == f'{cloud.scheme}://{bucket}/proj/exp/m/2.pt'
    with pytest.raises(FileNotFoundError, match='nothing-here'):
        storage.read_text('nothing-here')
    with pytest.raises(FileNotFoundError, match='nothing-here'):
        storage.load_file('nothing-here', tmp_path / 'x')
    assert not (tmp_path / 'x').exists()
    # The upload journal names the storage well enough to build it again, in another process, without a secret.
    location = storage.location()
    assert 'AccountKey' not in repr(location)
    assert storage_for_location(location).read_text('m/2.pt') == 'm/2.pt'


def test_a_sharded_checkpoint_folder_comes_back_whole(cloud, tmp_path):
    bucket = cloud.make_bucket()
    storage = open_storage(f'{cloud.scheme}://{bucket}/runs')
    folder = 'proj/exp_1/checkpoint_model/model_exp_1_E0.dcp'
    files = {sharded_checkpoint.TRAIN_STATE_FILE: os.urandom(1000), '__0_0.distcp': os.urandom(5000),
             sharded_checkpoint.MARKER: b'metadata'}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        storage.save_file(tmp_path / name, f'{folder}/{name}')
    local = sharded_checkpoint.download(storage, folder, str(tmp_path / 'back' / 'model_exp_1_E0.dcp'))
    assert {name: open(os.path.join(local, name), 'rb').read() for name in os.listdir(local)} == files


def test_a_missing_bucket_is_an_error_naming_it_for_every_operation(cloud):
    storage = open_storage(f'{cloud.scheme}://no-such-bucket-xyz/p', max_attempts=1)
    for operation in (storage.check_bucket, lambda: storage.exists('a.txt'), lambda: storage.list(),
                      lambda: storage.write_text('a.txt', 'x')):
        with pytest.raises(StorageError, match="'no-such-bucket-xyz' does not exist at"):
            operation()


def test_the_claim_of_a_prefix_is_a_create_if_absent_write(cloud):
    storage = open_storage(f'{cloud.scheme}://{cloud.make_bucket()}/p')
    assert storage.create_exclusive('claims/run', 'run-a') is True
    if cloud.scheme == 'gs':
        # The emulator does not enforce ifGenerationMatch; Google Cloud Storage refuses such a write (412) when the
        # object exists. The request carried it:
        assert cloud.server.requests_with('ifGenerationMatch=0'), cloud.server.log_tail()
        return
    assert storage.create_exclusive('claims/run', 'run-b') is False     # the server refused the second write
    assert storage.read_text('claims/run') == 'run-a'


@pytest.mark.parametrize('cloud', ['az'], indirect=True)
def test_a_wrong_azure_account_key_is_a_clear_error_without_the_key(cloud, monkeypatch):
    wrong_key = 'V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3JvbmdLZXk='
    monkeypatch.setenv('AZURE_STORAGE_CONNECTION_STRING',
                       cloud.server.connection_string.replace(cloud.server.connection_string.split(
                           'AccountKey=')[1].split(';')[0], wrong_key))
    storage = open_storage(f'az://{cloud.make_bucket()}', max_attempts=1)
    for operation in (storage.check_bucket, lambda: storage.write_text('a.txt', 'x'), lambda: storage.list()):
        with pytest.raises(StorageAuthError) as info:
            operation()
        message = str(info.value)
        assert 'AZURE_STORAGE_CONNECTION_STRING' in message and wrong_key not in message
        assert info.value.__cause__ is None and info.value.__suppress_context__


def test_azure_without_any_account_configured_names_the_settings(monkeypatch):
    for name in ('AZURE_STORAGE_CONNECTION_STRING', 'AZURE_STORAGE_ACCOUNT_URL', 'AZURE_STORAGE_ACCOUNT'):
        monkeypatch.delenv(name, raising=False)
    storage = open_storage('az://container-x')      # constructing needs nothing
    with pytest.raises(StorageAuthError, match='AZURE_STORAGE_CONNECTION_STRING.*endpoint_url'):
        storage.check_bucket()


def test_gcs_without_credentials_is_a_clear_error_naming_the_setting(tmp_path):
    """A machine with no Google credentials at all (and not on Google Cloud: the metadata server is not asked)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(('GOOGLE_', 'STORAGE_EMULATOR', 'CLOUDSDK'))}
    env.update(NO_GCE_CHECK='true', CLOUDSDK_CONFIG=str(tmp_path / 'gcloud'), HOME=str(tmp_path))
    code = textwrap.dedent('''
        from aitoolbox_like.storage import StorageAuthError, open_storage
        try:
            open_storage('gs://some-bucket/p').check_bucket()
        except StorageAuthError as error:
            print(error)
    ''')
    done = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "bucket 'some-bucket'" in done.stdout and 'GOOGLE_APPLICATION_CREDENTIALS' in done.stdout


@pytest.mark.parametrize('module, extra, url', [('google.cloud.storage', 'gcs', 'gs://b'),
                                                ('azure.storage.blob', 'azure', 'az://container'),
                                                ('boto3', 's3', 's3://b')])
def test_a_missing_client_library_names_the_extra(monkeypatch, module, extra, url):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError, match=rf'pip install aitoolbox_like\[{extra}\]'):
        open_storage(url)


def test_urls_and_modes_pick_the_storage(tmp_path):
    assert open_storage(str(tmp_path / 'folder')).location() == {'root': str(tmp_path / 'folder')}
    assert open_storage(f'file://{tmp_path}/f').location() == {'root': str(tmp_path / 'f')}
    with pytest.raises(ValueError, match='unknown storage scheme'):
        open_storage('ftp://host/x')
    with pytest.raises(ValueError, match="cloud_save_mode must be one of .*'gcs'.*'azure'"):
        storage_for_mode('dropbox', 'b')
