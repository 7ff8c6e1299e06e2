import collections
import io
import os

import numpy as np
import pytest
import torch

from aitoolbox_like.checkpoint.files import (FORMAT_VERSION, CheckpointError, atomic_torch_save,
                                       check_weights_only_safe, load_checkpoint)

_EXECUTED = []


def _mark_executed(value):
    _EXECUTED.append(value)
    return value


class _RunsCodeWhenUnpickled:
    def __reduce__(self):
        return (_mark_executed, ('payload ran',))


class _FailsToPickle:
    def __reduce__(self):
        raise RuntimeError('cannot pickle this')


def _training_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    return {
        'format_version': FORMAT_VERSION,
        'model_state_dict': model.state_dict(),
        'optimizer_state_dict': [optimizer.state_dict()],
        'epoch': 3,
        'iteration_idx': 120,
        'train_history': {'loss': [1.5, 1.2, 0.9], 'val_loss': [1.6, 1.3, 1.0]},
        'callbacks': {'EarlyStopping': {'best': 0.9, 'patience_left': 2, 'monitor': 'val_loss'}},
        'rng': {'torch': torch.get_rng_state(), 'python': [3, (1, 2, 3), None]},
        'shapes': torch.Size([2, 3]),
        'dtype': torch.bfloat16,
        'device': torch.device('cpu'),
        'hyperparams_json': '{"lr": 0.001}',
        'flags': {1: True, 2: False},
    }


def _assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def test_round_trip_with_weights_only(tmp_path):
    state = _training_state()
    check_weights_only_safe(state)
    path = tmp_path / 'ckpt.pt'
    atomic_torch_save(state, path)
    loaded = load_checkpoint(path)
    _assert_same(state, loaded)
    # And plain torch.load with weights_only agrees: the file is a standard torch checkpoint.
    _assert_same(state, torch.load(path, weights_only=True))


def test_load_from_file_object(tmp_path):
    buf = io.BytesIO()
    torch.save({'w': torch.arange(5)}, buf)
    buf.seek(0)
    assert torch.equal(load_checkpoint(buf)['w'], torch.arange(5))


def test_atomic_save_keeps_old_file_when_pickling_fails(tmp_path):
    path = tmp_path / 'ckpt.pt'
    atomic_torch_save({'epoch': 1, 'w': torch.ones(3)}, path)
    before = path.read_bytes()

    with pytest.raises(RuntimeError, match='cannot pickle this'):
        atomic_torch_save({'epoch': 2, 'w': torch.zeros(1000, 1000), 'bad': _FailsToPickle()}, path)

    assert path.read_bytes() == before
    assert load_checkpoint(path)['epoch'] == 1
    assert os.listdir(tmp_path) == ['ckpt.pt']  # the temp file was removed


def test_atomic_save_replaces_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / 'ckpt.pt'
    atomic_torch_save({'epoch': 1}, path)
    atomic_torch_save({'epoch': 2}, str(path))
    assert load_checkpoint(path)['epoch'] == 2
    assert os.listdir(tmp_path) == ['ckpt.pt']


def test_atomic_save_file_mode_follows_umask(tmp_path):
    path = tmp_path / 'ckpt.pt'
    atomic_torch_save({'epoch': 1}, path)
    umask = os.umask(0)
    os.umask(umask)
    assert (path.stat().st_mode & 0o777) == (0o666 & ~umask)


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / 'nope.pt'
    with pytest.raises(FileNotFoundError, match='nope.pt'):
        load_checkpoint(missing)


@pytest.mark.parametrize('keep', [0, 1, 10, 200, 0.5, -1])
def test_truncated_file_is_reported_as_corrupt(tmp_path, keep):
    path = tmp_path / 'ckpt.pt'
    atomic_torch_save(_training_state(), path)
    data = path.read_bytes()
    n = int(len(data) * keep) if isinstance(keep, float) else (len(data) + keep if keep < 0 else keep)
    path.write_bytes(data[:n])
    with pytest.raises(CheckpointError, match='truncated or corrupt') as info:
        load_checkpoint(path)
    assert 'ckpt.pt' in str(info.value)
    assert 'allow_unsafe_pickle' not in str(info.value)


def test_garbage_file_is_reported_as_corrupt(tmp_path):
    path = tmp_path / 'ckpt.pt'
    path.write_bytes(b'this is not a checkpoint at all')
    with pytest.raises(CheckpointError, match='truncated or corrupt'):
        load_checkpoint(path)


def test_damaged_global_name_is_corruption_not_code(tmp_path):
    path = tmp_path / 'ckpt.pt'
    torch.save({'w': torch.ones(2)}, path)
    data = path.read_bytes()
    assert b'torch._utils' in data
    # torch stores the pickle uncompressed, so this damages the name of a global in place.
    path.write_bytes(data.replace(b'torch._utils', b'torch)_utils'))
    with pytest.raises(CheckpointError, match='truncated or corrupt'):
        load_checkpoint(path)


def test_pickled_code_is_refused_unless_opted_in(tmp_path):
    path = tmp_path / 'ckpt.pt'
    torch.save({'w': torch.ones(2), 'obj': _RunsCodeWhenUnpickled()}, path)
    _EXECUTED.clear()

    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert 'arbitrary Python objects' in message
    assert 'allow_unsafe_pickle=True' in message and 'trust' in message
    assert '_mark_executed' in message
    assert _EXECUTED == []  # nothing from the file ran

    loaded = load_checkpoint(path, allow_unsafe_pickle=True)
    assert loaded['obj'] == 'payload ran'
    assert _EXECUTED == ['payload ran']


def test_numpy_in_checkpoint_is_refused(tmp_path):
    path = tmp_path / 'ckpt.pt'
    torch.save({'best': np.float64(0.5)}, path)
    with pytest.raises(CheckpointError, match='arbitrary Python objects'):
        load_checkpoint(path)


def test_newer_format_version_asks_to_upgrade(tmp_path):
    path = tmp_path / 'ckpt.pt'
    atomic_torch_save({'format_version': FORMAT_VERSION + 1}, path)
    with pytest.raises(CheckpointError, match='upgrade'):
        load_checkpoint(path)
    atomic_torch_save({'format_version': FORMAT_VERSION}, path)
    assert load_checkpoint(path)['format_version'] == FORMAT_VERSION


def test_map_location_is_applied(tmp_path):
    path = tmp_path / 'ckpt.pt'
    atomic_torch_save({'w': torch.ones(2)}, path)
    assert load_checkpoint(path, map_location='meta')['w'].device.type == 'meta'


@pytest.mark.parametrize('state, where', [
    ({'callbacks': {'EarlyStopping': {'fn': len}}},
     "checkpoint['callbacks']['EarlyStopping']['fn']: builtin_function_or_method"),
    ({'callbacks': {'EarlyStopping': {'fn': lambda: 0}}},
     "checkpoint['callbacks']['EarlyStopping']['fn']: function"),
    ({'history': {'loss': [1.0, np.float32(2.0)]}}, "checkpoint['history']['loss'][1]: numpy.float32"),
    ({'seen': {1, 2}}, "checkpoint['seen']: set"),
    ({'obj': [1, 2, _FailsToPickle()]}, "checkpoint['obj'][2]: "),
    ({'d': collections.defaultdict(list)}, "checkpoint['d']: collections.defaultdict"),
    ({'k': {(1, 2): 3}}, "checkpoint['k']: dict key (1, 2) has type tuple"),
])
def test_check_weights_only_safe_names_the_offender(state, where):
    with pytest.raises(CheckpointError) as info:
        check_weights_only_safe(state)
    assert str(info.value).startswith(where)


def test_check_weights_only_safe_hints_at_numpy_fix():
    with pytest.raises(CheckpointError, match=r'\.item\(\)'):
        check_weights_only_safe({'x': np.int64(3)}, where='state')


def test_check_weights_only_safe_handles_cycles_and_depth():
    cyclic = {'a': []}
    cyclic['a'].append(cyclic)
    check_weights_only_safe(cyclic)
    deep = current = {}
    for _ in range(5000):
        current['n'] = {}
        current = current['n']
    check_weights_only_safe(deep)


def test_everything_the_check_accepts_loads_with_weights_only(tmp_path):
    accepted = {
        'ints': [0, -1, 2 ** 70], 'floats': [0.5, float('inf')], 'complex': 1 + 2j, 'bools': (True, False),
        'none': None, 'str': 'x', 'bytes': b'\x00\x01', 'od': collections.OrderedDict(a=1),
        'param': torch.nn.Parameter(torch.ones(2)), 'size': torch.Size([1]), 'dtype': torch.int8,
        'device': torch.device('cpu'), 'intkeys': {1: 'a', -2: 'b'},
    }
    check_weights_only_safe(accepted)
    path = tmp_path / 'ckpt.pt'
    atomic_torch_save(accepted, path)
    _assert_same(accepted, load_checkpoint(path))
