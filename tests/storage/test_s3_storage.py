import hashlib
import os
import sys

import pytest

from aitoolbox_like.storage import StorageAuthError, StorageError
from aitoolbox_like.storage.s3 import S3Storage
from s3_server import make_bucket


@pytest.fixture
def bucket(s3_server):
    return make_bucket(s3_server)


@pytest.fixture
def storage(s3_server, bucket):
    return S3Storage(bucket, 'proj/exp', endpoint_url=s3_server.endpoint_url, max_attempts=2)


def test_file_round_trip(storage, tmp_path):
    src = tmp_path / 'w.bin'
    src.write_bytes(os.urandom(100_000))
    storage.save_file(src, 'model/w.bin')
    out = storage.load_file('model/w.bin', tmp_path / 'sub/dir/w.bin')
    assert out == tmp_path / 'sub/dir/w.bin'
    assert out.read_bytes() == src.read_bytes()


def test_keys_are_stored_under_the_prefix(s3_server, storage, bucket):
    storage.write_text('a.txt', 'hello')
    raw = s3_server.client().get_object(Bucket=bucket, Key='proj/exp/a.txt')['Body'].read()
    assert raw == b'hello'
    assert storage.uri('a.txt') == f's3://{bucket}/proj/exp/a.txt'


@pytest.mark.parametrize('prefix', ['/proj/exp/', 'proj/exp', 'proj/exp/'])
def test_prefix_slashes_do_not_double(s3_server, bucket, prefix):
    storage = S3Storage(bucket, prefix, endpoint_url=s3_server.endpoint_url)
    storage.write_text('k.txt', 'x')
    listed = [o['Key'] for o in s3_server.client().list_objects_v2(Bucket=bucket)['Contents']]
    assert listed == ['proj/exp/k.txt']


def test_text_exists_list_delete(s3_server, storage, bucket):
    for key in ['m/1.pt', 'm/2.pt', 'm2/1.pt', 'results/r.txt', 'latest']:
        storage.write_text(key, key)
    # Same bucket, a different experiment prefix: must not show up in our listing.
    S3Storage(bucket, 'proj/exp2', endpoint_url=s3_server.endpoint_url).write_text('m/1.pt', 'other')

    assert storage.read_text('m2/1.pt') == 'm2/1.pt'
    assert storage.list() == ['latest', 'm/1.pt', 'm/2.pt', 'm2/1.pt', 'results/r.txt']
    assert storage.list('m/') == ['m/1.pt', 'm/2.pt']
    assert storage.list('m') == ['m/1.pt', 'm/2.pt', 'm2/1.pt']
    assert storage.list('zzz') == []

    assert storage.exists('m/1.pt')
    assert not storage.exists('m/3.pt')
    assert not storage.exists('m')  # a "folder" is not an object
    storage.delete('m/1.pt')
    storage.delete('m/1.pt')  # idempotent
    assert not storage.exists('m/1.pt')
    assert storage.list('m/') == ['m/2.pt']


def test_list_paginates_past_one_page(s3_server, bucket):
    storage = S3Storage(bucket, endpoint_url=s3_server.endpoint_url)
    client = s3_server.client()
    keys = [f'k/{i:04d}' for i in range(1005)]
    for key in keys:
        client.put_object(Bucket=bucket, Key=key, Body=b'')
    assert storage.list('k/') == keys


def test_missing_key_raises_file_not_found(storage, tmp_path):
    with pytest.raises(FileNotFoundError, match='nothing-here'):
        storage.read_text('nothing-here')
    with pytest.raises(FileNotFoundError, match='nothing-here'):
        storage.load_file('nothing-here', tmp_path / 'x')
    assert not (tmp_path / 'x').exists()


@pytest.mark.parametrize('key', ['../x', 'a//b', '/abs', 'a/./b', ''])
def test_bad_keys_are_rejected(storage, key):
    with pytest.raises(ValueError):
        storage.write_text(key, 'x')


def test_multipart_upload_of_a_large_file(s3_server, bucket, tmp_path):
    storage = S3Storage(bucket, 'big', endpoint_url=s3_server.endpoint_url,
                        multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024)
    src = tmp_path / 'big.bin'
    data = os.urandom(20 * 1024 * 1024 + 12345)
    src.write_bytes(data)
    storage.save_file(src, 'big.bin')

    head = s3_server.client().head_object(Bucket=bucket, Key='big/big.bin')
    assert head['ContentLength'] == len(data)
    # An S3 multipart object's ETag is "<md5 of part md5s>-<number of parts>".
    assert head['ETag'].strip('"').endswith('-5')

    out = storage.load_file('big.bin', tmp_path / 'back.bin')
    assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(data).digest()


def test_endpoint_from_environment(s3_server, bucket, monkeypatch):
    monkeypatch.setenv('AWS_ENDPOINT_URL_S3', s3_server.endpoint_url)
    storage = S3Storage(bucket)
    assert storage.endpoint_url == s3_server.endpoint_url
    storage.write_text('env.txt', 'via env')
    assert storage.read_text('env.txt') == 'via env'


def test_generic_endpoint_variable_is_honoured_too(s3_server, bucket, monkeypatch):
    monkeypatch.setenv('AWS_ENDPOINT_URL', s3_server.endpoint_url)
    storage = S3Storage(bucket)
    assert storage.endpoint_url == s3_server.endpoint_url
    assert storage.list() == []


def test_ensure_bucket_creates_once(s3_server):
    name = 'ensure-' + os.urandom(4).hex()
    storage = S3Storage(name, endpoint_url=s3_server.endpoint_url)
    with pytest.raises(StorageError, match=name):
        storage.write_text('a.txt', 'x')
    storage.ensure_bucket()
    storage.ensure_bucket()
    storage.write_text('a.txt', 'x')
    assert storage.read_text('a.txt') == 'x'


def _auth_operations(storage, tmp_path):
    src = tmp_path / 'f.bin'
    src.write_bytes(b'data')
    return {
        'save_file': lambda: storage.save_file(src, 'f.bin'),
        'load_file': lambda: storage.load_file('f.bin', tmp_path / 'out.bin'),
        'exists': lambda: storage.exists('f.bin'),
        'list': lambda: storage.list(),
        'write_text': lambda: storage.write_text('t.txt', 'x'),
        'read_text': lambda: storage.read_text('t.txt'),
        'delete': lambda: storage.delete('t.txt'),
    }


@pytest.mark.parametrize('wrong', ['secret', 'access_key'])
def test_wrong_credentials_raise_auth_error_without_leaking_them(s3_server, bucket, tmp_path,
                                                                 monkeypatch, wrong):
    access_key = s3_server.access_key if wrong == 'secret' else 'AKIAWRONGWRONGWRONG1'
    secret_key = 'wrong-secret-Zq8v1xY2' if wrong == 'secret' else s3_server.secret_key
    monkeypatch.setenv('AWS_ACCESS_KEY_ID', access_key)
    monkeypatch.setenv('AWS_SECRET_ACCESS_KEY', secret_key)
    storage = S3Storage(bucket, endpoint_url=s3_server.endpoint_url, max_attempts=1)
    for name, operation in _auth_operations(storage, tmp_path).items():
        with pytest.raises(StorageAuthError) as info:
            operation()
        message = str(info.value)
        assert bucket in message and s3_server.endpoint_url in message, name
        assert 'AWS_SECRET_ACCESS_KEY' in message, name
        assert secret_key not in message and access_key not in message, name
        # The exception chain is what a traceback prints; it must not carry them either.
        assert info.value.__cause__ is None and info.value.__suppress_context__, name


def test_missing_credentials_raise_auth_error(s3_server, bucket, monkeypatch):
    monkeypatch.delenv('AWS_ACCESS_KEY_ID')
    monkeypatch.delenv('AWS_SECRET_ACCESS_KEY')
    storage = S3Storage(bucket, endpoint_url=s3_server.endpoint_url, max_attempts=1)
    with pytest.raises(StorageAuthError, match='no usable AWS credentials'):
        storage.write_text('a.txt', 'x')


def test_missing_boto3_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, 'boto3', None)
    with pytest.raises(ImportError, match=r'pip install aitoolbox_like\[s3\]'):
        S3Storage('any-bucket')


def test_create_exclusive_creates_once(storage):
    assert storage.create_exclusive('exp/.marker', 'run-a') is True
    assert storage.create_exclusive('exp/.marker', 'run-b') is False       # If-None-Match: the server refuses
    assert storage.read_text('exp/.marker') == 'run-a'


def test_check_bucket_names_a_missing_bucket(s3_server):
    storage = S3Storage('no-such-bucket-xyz', endpoint_url=s3_server.endpoint_url, max_attempts=1)
    with pytest.raises(StorageError, match="'no-such-bucket-xyz' does not exist at endpoint " + s3_server.endpoint_url):
        storage.check_bucket()
