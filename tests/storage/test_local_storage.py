import os

import pytest

from aitoolbox_like.storage import LocalStorage, validate_key_part
from aitoolbox_like.storage.base import join_key, validate_key


def test_file_round_trip_creates_folders(tmp_path):
    storage = LocalStorage(tmp_path / 'results')
    src = tmp_path / 'weights.bin'
    src.write_bytes(os.urandom(3000))

    storage.save_file(src, 'proj/exp/model/weights.bin')
    assert (tmp_path / 'results/proj/exp/model/weights.bin').read_bytes() == src.read_bytes()

    out = storage.load_file('proj/exp/model/weights.bin', tmp_path / 'down/again.bin')
    assert out == tmp_path / 'down/again.bin'
    assert out.read_bytes() == src.read_bytes()


def test_save_replaces_existing_and_leaves_no_temp_files(tmp_path):
    storage = LocalStorage(tmp_path)
    src = tmp_path / 'src.txt'
    src.write_text('one')
    storage.save_file(src, 'a/f.txt')
    src.write_text('two')
    storage.save_file(src, 'a/f.txt')
    assert storage.read_text('a/f.txt') == 'two'
    assert sorted(os.listdir(tmp_path / 'a')) == ['f.txt']


def test_failed_copy_keeps_old_file(tmp_path):
    storage = LocalStorage(tmp_path / 'root')
    storage.write_text('a/f.txt', 'old')
    with pytest.raises(FileNotFoundError):
        storage.save_file(tmp_path / 'does-not-exist', 'a/f.txt')
    assert storage.read_text('a/f.txt') == 'old'


def test_text_exists_list_delete(tmp_path):
    storage = LocalStorage(tmp_path)
    for key in ['p/e1/a.txt', 'p/e1/b.txt', 'p/e2/a.txt', 'q/x.txt', 'top.txt']:
        storage.write_text(key, key.upper())
    assert storage.read_text('p/e1/b.txt') == 'P/E1/B.TXT'
    assert storage.exists('q/x.txt')
    assert not storage.exists('q/y.txt')
    assert not storage.exists('q')  # a folder is not an object

    assert storage.list() == ['p/e1/a.txt', 'p/e1/b.txt', 'p/e2/a.txt', 'q/x.txt', 'top.txt']
    assert storage.list('p/') == ['p/e1/a.txt', 'p/e1/b.txt', 'p/e2/a.txt']
    assert storage.list('p/e1') == ['p/e1/a.txt', 'p/e1/b.txt']
    assert storage.list('p/e1/a') == ['p/e1/a.txt']
    assert storage.list('nothing/') == []

    storage.delete('p/e1/a.txt')
    storage.delete('p/e1/a.txt')  # idempotent
    assert storage.list('p/e1/') == ['p/e1/b.txt']


def test_missing_key_raises_file_not_found(tmp_path):
    storage = LocalStorage(tmp_path)
    with pytest.raises(FileNotFoundError, match='nope.txt'):
        storage.read_text('nope.txt')
    with pytest.raises(FileNotFoundError, match='nope.txt'):
        storage.load_file('nope.txt', tmp_path / 'x')


def test_uri_is_a_file_uri_inside_root(tmp_path):
    storage = LocalStorage(tmp_path)
    assert storage.uri('a/b.txt') == (tmp_path / 'a/b.txt').as_uri()


@pytest.mark.parametrize('key', ['../escape.txt', 'a/../../escape.txt', '/etc/passwd', 'a//b',
                                 'a/./b', '', 'a\\..\\b', 'a/\x00b', 'a/..'])
def test_keys_that_could_escape_are_rejected(tmp_path, key):
    storage = LocalStorage(tmp_path / 'root')
    src = tmp_path / 'src'
    src.write_text('x')
    with pytest.raises(ValueError):
        storage.save_file(src, key)
    with pytest.raises(ValueError):
        storage.write_text(key, 'x')
    assert not (tmp_path / 'escape.txt').exists()


@pytest.mark.parametrize('name', ['', '.', '..', '/abs', 'a/b', 'a\\b', 'nul\x00', 'C:evil'])
def test_validate_key_part_rejects_unsafe_names(name):
    with pytest.raises(ValueError, match='project_name'):
        validate_key_part(name, 'project_name')


@pytest.mark.parametrize('name', ['exp-1', 'my experiment', 'v1.2', '.hidden', '..dots', 'ünïcode'])
def test_validate_key_part_accepts_plain_names(name):
    assert validate_key_part(name, 'experiment_name') == name


def test_validate_key_part_rejects_non_strings():
    with pytest.raises(ValueError, match='experiment_name'):
        validate_key_part(None, 'experiment_name')


def test_join_and_validate_key():
    assert join_key('', 'a/', '/b', 'c.txt') == 'a/b/c.txt'
    assert validate_key('a/b/c.txt') == 'a/b/c.txt'


def test_remove_stray_temp_files_spares_a_live_writer(tmp_path):
    import threading

    from aitoolbox_like.storage.local import remove_stray_temp_files, write_atomically
    stray = tmp_path / '.model.pth.0123456789ab.tmp'
    stray.write_bytes(b'left by a killed save')
    nested = tmp_path / 'results' / '.r.json.abcdefabcdef.partial'
    nested.parent.mkdir()
    nested.write_bytes(b'x')
    ordinary = tmp_path / 'model.pth'
    ordinary.write_bytes(b'a saved model')
    writing, release = threading.Event(), threading.Event()

    def slow_write(f):
        f.write(b'first half')
        writing.set()
        assert release.wait(30)
        f.write(b' second half')

    writer = threading.Thread(target=write_atomically, args=(tmp_path / 'live.pth', slow_write),
                              kwargs={'temp_suffix': '.tmp'})
    writer.start()
    try:
        assert writing.wait(30)
        live = [p for p in tmp_path.iterdir() if p.name.startswith('.live.pth.')]
        assert len(live) == 1
        removed = remove_stray_temp_files(tmp_path)
        assert sorted(removed) == sorted([str(stray), str(nested)])
        assert live[0].exists() and ordinary.exists()
    finally:
        release.set()
        writer.join(30)
    assert (tmp_path / 'live.pth').read_bytes() == b'first half second half'
