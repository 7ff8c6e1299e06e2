"""AIToolbox's aitoolbox.utils helpers (aitoolbox_like.compat.utils), reached by their AIToolbox module paths."""
import os
import tarfile
import zipfile

import numpy as np
import pytest
import torch

from aitoolbox_like.compat import utils
from aitoolbox_like.utils import dict_util, file_system, util


def test_the_aitoolbox_modules_are_our_functions():
    assert util.function_exists is utils.function_exists
    assert dict_util.flatten_dict is utils.flatten_dict
    assert file_system.zip_folder is utils.zip_folder


class Holder:
    attribute = 3

    def __init__(self, value='held'):
        self.value = value

    def method(self, suffix, *, sep=': '):
        return f'{self.value}{sep}{suffix}'

    def empty(self):
        pass

    def documented_empty(self):
        """Nothing here."""

    def full(self):
        return self.value


def test_function_exists_and_copy_function():
    assert util.function_exists(Holder(), 'method')
    assert not util.function_exists(Holder(), 'attribute')      # not callable
    assert not util.function_exists(Holder(), 'missing')

    copied = util.copy_function(Holder().method)
    # the copy takes the instance explicitly, so it works on another object with the attributes it reads
    assert copied(Holder('other'), 'x') == 'other: x'
    assert copied(Holder('other'), 'x', sep='-') == 'other-x'
    assert copied.__name__ == 'method' and copied is not Holder.method
    copied.__kwdefaults__['sep'] = '!'
    assert Holder().method('y') == 'held: y'       # the original's keyword defaults are not shared


def test_is_empty_function():
    def empty():
        pass

    def documented():
        """Docstring only."""

    def returns_value():
        return 'value'

    def adds(a, b):
        return a + b

    assert util.is_empty_function(empty) and util.is_empty_function(documented)
    assert util.is_empty_function(lambda: None)
    assert util.is_empty_function(Holder().empty) and util.is_empty_function(Holder().documented_empty)
    assert not util.is_empty_function(returns_value) and not util.is_empty_function(adds)
    assert not util.is_empty_function(Holder().full) and not util.is_empty_function(print)


def test_flatten_list_of_lists():
    assert util.flatten_list_of_lists([[1, 2], [3], []]) == [1, 2, 3]
    assert util.flatten_list_of_lists([[[1], [2]], [[3]]]) == [[1], [2], [3]]     # one level only
    assert util.flatten_list_of_lists(None) is None


def test_combine_prediction_metadata_batches():
    tensor, array = torch.arange(6).reshape(3, 2), np.ones((2, 4))
    combined = dict_util.combine_prediction_metadata_batches([
        {'ids': [1, 2], 't': tensor, 'a': array, 'rare': ['x']},
        {'ids': [3], 't': tensor, 'a': array},
    ])
    assert combined['ids'] == [1, 2, 3] and combined['rare'] == ['x']
    assert torch.equal(combined['t'], torch.cat([tensor, tensor]))
    assert combined['a'].shape == (4, 4)
    for value in ('text', 3, 1.5, {'k': 'v'}):
        with pytest.raises(TypeError, match='list, a torch.Tensor or a np.ndarray'):
            dict_util.combine_prediction_metadata_batches([{'m': value}, {'m': value}])


def test_flatten_and_combine_dicts():
    nested = {'a': {'b': {'c': 1, 'd': 2}, 'e': 3}, 'f': 4}
    assert dict_util.flatten_dict(nested) == {'a_b_c': 1, 'a_b_d': 2, 'a_e': 3, 'f': 4}
    assert dict_util.flatten_dict({'a': {'b': 1}}, parent_key='p', sep='.') == {'p.a.b': 1}
    assert dict_util.combine_dict_elements([{'a': 1, 'b': 2}, {'a': 3}, {'c': 4}]) == {'a': [1, 3], 'b': [2], 'c': [4]}

    history = {'loss': [1.0, 0.5], 'accumulated_loss': [], 'f1': [{'x': 0.1, 'y': {'z': 0.2}}, {'x': 0.3}]}
    flat = dict_util.flatten_combine_dict(history)
    # an empty metric is dropped, as in AIToolbox; the input is not modified
    assert flat == {'loss': [1.0, 0.5], 'f1_x': [0.1, 0.3], 'f1_y_z': [0.2]}
    flat['loss'].append(9)
    assert history['loss'] == [1.0, 0.5]


def test_create_folder_hierarchy(tmp_path):
    final, levels = file_system.create_folder_hierarchy(str(tmp_path), ['a', 'b', 'c'])
    assert final == os.path.join(str(tmp_path), 'a', 'b', 'c') and os.path.isdir(final)
    assert levels == [os.path.join(str(tmp_path), *['a', 'b', 'c'][:i]) for i in range(4)]
    # a second branch keeps the first
    file_system.create_folder_hierarchy(str(tmp_path), ['a', 'x'])
    assert os.path.isdir(final) and os.path.isdir(tmp_path / 'a' / 'x')
    with pytest.raises(ValueError, match='does not exist'):
        file_system.create_folder_hierarchy(str(tmp_path / 'missing'), ['a'])


def test_zip_and_unzip(tmp_path, caplog):
    source = tmp_path / 'source'
    (source / 'inner').mkdir(parents=True)
    (source / 'f.txt').write_text('one')
    (source / 'inner' / 'g.txt').write_text('two')
    for zip_path in (str(tmp_path / 'archive'), str(tmp_path / 'archive.zip')):
        assert file_system.zip_folder(str(source), zip_path) == str(tmp_path / 'archive.zip')
        with zipfile.ZipFile(tmp_path / 'archive.zip') as archive:
            assert sorted(archive.namelist()) == ['f.txt', 'inner/', 'inner/g.txt']

    file_system.unzip_file(str(tmp_path / 'archive.zip'), str(tmp_path / 'unzipped'))
    assert (tmp_path / 'unzipped' / 'inner' / 'g.txt').read_text() == 'two'

    with tarfile.open(tmp_path / 'archive.tar.gz', 'w:gz') as archive:
        archive.add(source / 'f.txt', arcname='f.txt')
    file_system.unzip_file(str(tmp_path / 'archive.tar.gz'), str(tmp_path / 'untarred'))
    assert (tmp_path / 'untarred' / 'f.txt').read_text() == 'one'

    file_system.unzip_file(str(source / 'f.txt'), str(tmp_path / 'nothing'))
    assert not (tmp_path / 'nothing').exists() and 'neither a .zip nor a .tar.gz' in caplog.text
