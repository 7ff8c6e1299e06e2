"""WandBTracking on the real wandb package in offline mode: the run files are read back and compared with
the loop's history."""
import glob
import importlib
import json
import math
import os
import struct
import sys
import time
import zlib

import pytest
import torch

from aitoolbox_like import AbstractCallback
from aitoolbox_like.callbacks.wandb import AlertConfig, WandBTracking
from aitoolbox_like.tracking import TrainLoopCheckpoint
from aitoolbox_like.train_loop import TrainLoop
from helpers import MLP, loaders

_BLOCK = 32 * 1024
_HEADER_LEN = 7          # ':W&B' + magic + version
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def read_wandb_records(path):
    """The protobuf Records of a .wandb file: a LevelDB-log-style stream of CRC-checked chunks in 32 KiB
    blocks (wandb 0.31 no longer ships a Python reader)."""
    from wandb.proto import wandb_internal_pb2
    data = open(path, 'rb').read()
    assert data[:4] == b':W&B', f'{path} is not a wandb run file'
    records, pending, pos = [], b'', _HEADER_LEN
    while pos + 7 <= len(data):
        if _BLOCK - pos % _BLOCK < 7:            # a block's tail too short for a chunk header is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        crc, length, chunk_type = struct.unpack('<IHB', data[pos:pos + 7])
        if chunk_type == 0 and length == 0:
            break
        payload = data[pos + 7:pos + 7 + length]
        if len(payload) < length:               # the writer is not done with this chunk yet
            break
        assert zlib.crc32(payload, zlib.crc32(bytes([chunk_type]))) & 0xffffffff == crc, f'bad chunk in {path}'
        pos += 7 + length
        if chunk_type in (_FIRST, _MIDDLE):
            pending = payload if chunk_type == _FIRST else pending + payload
            continue
        raw = payload if chunk_type == _FULL else pending + payload
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        records.append(record)
    return records


def _key(item):
    return item.key or '/'.join(item.nested_key)


def read_finished_run(path, timeout_s=20.0):
    """The records of a finished run. wandb-core may still be writing the file for a moment after
    run.finish() returns, so wait for the run's 'exit' record."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = read_wandb_records(path)
        if any(r.WhichOneof('record_type') == 'exit' for r in records):
            return records
        assert time.monotonic() < deadline, f'{path} has no exit record after {timeout_s} s'
        time.sleep(0.05)


def summarize(path):
    """{'run': the run record, 'config', 'history': {step: {key: value}}, 'summary', 'alerts', 'artifacts'}."""
    out = {'run': None, 'history': {}, 'alerts': [], 'summary': {}, 'config': {}, 'artifacts': []}
    for record in read_finished_run(path):
        kind = record.WhichOneof('record_type')
        if kind == 'run':
            out['run'] = record.run
            out['config'].update({_key(i): json.loads(i.value_json) for i in record.run.config.update})
        elif kind == 'config':
            out['config'].update({_key(i): json.loads(i.value_json) for i in record.config.update})
        elif kind == 'history':
            row = {_key(i): json.loads(i.value_json) for i in record.history.item}
            out['history'][row['_step']] = row
        elif kind == 'artifact':
            out['artifacts'].append((record.artifact.type, record.artifact.name,
                                     [entry.path for entry in record.artifact.manifest.contents]))
        elif kind == 'alert':
            out['alerts'].append(record.alert)
        elif kind == 'summary':
            out['summary'].update({_key(i): json.loads(i.value_json) for i in record.summary.update})
    return out


def run_files(root):
    return sorted(glob.glob(os.path.join(str(root), '**', 'offline-run-*', 'run-*.wandb'), recursive=True))


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    # wandb imported at use (here and in the tests): only the pytest worker that runs them pays its import
    import wandb
    for name, value in (('WANDB_MODE', 'offline'), ('WANDB_SILENT', 'true'), ('WANDB_DIR', str(tmp_path / 'wb')),
                        ('WANDB_CONFIG_DIR', str(tmp_path / 'wb_config')),
                        ('WANDB_CACHE_DIR', str(tmp_path / 'wb_cache')),
                        ('WANDB_DATA_DIR', str(tmp_path / 'wb_data'))):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv('WANDB_API_KEY', raising=False)
    yield tmp_path
    if wandb.run is not None:           # a failed test must not leave its run open for the next one
        wandb.finish()


class RecordBatchLosses(AbstractCallback):
    """Reads every batch loss on the host (a test may sync) to compare with what wandb got."""

    def __init__(self):
        super().__init__('record losses')
        self.losses = {}

    def on_batch_end(self):
        loop = self.train_loop_obj
        self.losses[loop.total_iteration_idx] = (loop.epoch, float(loop.loss_batch_accum[-1]))


class CountingWandB(WandBTracking):
    """Counts the flushes that actually read losses from the device."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.device_reads = 0

    def log_mid_train_loss(self):
        accum = self.train_loop_obj.loss_batch_accum
        reader = self.batch_losses
        already_read = reader._read if accum is reader._losses else 0
        if len(accum) > already_read:
            self.device_reads += 1
        super().log_mid_train_loss()


def _checkpoint_loop(tmp_path, seed=0):
    torch.manual_seed(seed)
    train, val, test = loaders(n=40, batch_size=8)       # 5 batches per epoch
    model = MLP()
    return TrainLoopCheckpoint(model, train, val, test, torch.optim.SGD(model.parameters(), lr=0.1),
                               torch.nn.CrossEntropyLoss(), 'proj', 'exp', str(tmp_path / 'results'),
                               {'lr': 0.1, 'batch_size': 8, 'layers': (6, 16, 3)}, cloud_save_mode='local',
                               progress_bar=False)


def _expected_epoch_rows(loop, epochs):
    history = loop.train_history
    rows = {}
    for epoch in epochs:
        row = {'epoch': epoch}
        for name in ('accumulated_loss', 'val_loss'):
            row[f'loss_at_epoch_end/{name}'] = history[name][history.get_epochs(name).index(epoch)]
        rows[epoch] = row
    return rows


def test_offline_run_logs_config_history_batch_losses_alerts_and_resumes_the_same_run(offline_wandb):
    import wandb
    tmp_path = offline_wandb
    loop = _checkpoint_loop(tmp_path)
    recorder = RecordBatchLosses()
    tracker = CountingWandB(batch_log_frequency=2, tags=['unit-test'], batch_sync_frequency=3,
                            alerts=[AlertConfig('val_loss', 0.0, 'minimize', wandb.AlertLevel.WARN),
                                    AlertConfig('metrics/never_logged', 1.0)])
    loop.fit(num_epochs=2, callbacks=[recorder, tracker])

    assert tracker.run is None                  # finished at the end of fit
    files = run_files(tmp_path / 'results' / 'proj')
    assert len(files) == 1, files
    # is_project=True: wandb's folder is inside the experiment folder
    assert f'exp_{loop.experiment_timestamp}' in files[0].split(os.sep)
    first_file = files[0]
    run = summarize(first_file)
    assert run['run'].run_id == tracker.run_id
    assert run['run'].project == 'proj' and run['run'].display_name == 'exp'
    assert list(run['run'].tags) == ['unit-test']
    assert run['config']['lr'] == 0.1 and run['config']['batch_size'] == 8
    assert run['config']['layers'] == [6, 16, 3]
    assert run['config']['experiment_file_path'] == os.path.abspath(__file__)
    # the experiment script (the tracking loop's experiment_file_path) is logged as a code artifact
    assert ('code', 'test_wandb.py', ['test_wandb.py']) in run['artifacts']

    # history metrics: one row per epoch at the epoch's last global step, values equal to the history
    steps_per_epoch = 5
    for epoch, expected in _expected_epoch_rows(loop, [0, 1]).items():
        row = run['history'][(epoch + 1) * steps_per_epoch - 1]
        for key, value in expected.items():
            assert row[key] == pytest.approx(value, rel=1e-12), key
    assert not any('train_end' in key for row in run['history'].values() for key in row)
    assert run['summary']['train_end_test_loss'] == pytest.approx(loop.train_history['train_end_test_loss'][-1])

    # batch losses: every 2nd global step, last value and the epoch's running mean
    for step, (epoch, loss) in recorder.losses.items():
        row = run['history'].get(step, {})
        if step % 2:
            assert 'train_loss/last_batch_loss' not in row
            continue
        assert row['train_loss/last_batch_loss'] == pytest.approx(loss, rel=1e-6)
        epoch_losses = [v for s, (e, v) in sorted(recorder.losses.items()) if e == epoch and s <= step]
        assert row['train_loss/accumulated_batch_loss'] == pytest.approx(sum(epoch_losses) / len(epoch_losses),
                                                                         rel=1e-6)
    # 10 steps, read every 3rd step (3 reads) plus what was left at each epoch end (2 reads)
    assert tracker.device_reads == 5

    # alerts: val_loss > 0 every epoch; the missing metric only warns
    assert [a.title for a in run['alerts']] == ['val_loss is too high'] * 2
    assert all(a.level == 'WARN' for a in run['alerts'])

    # the checkpoint carries the run id; resuming continues the same wandb run
    checkpoint_dir = os.path.join(str(tmp_path / 'results'), 'proj', f'exp_{loop.experiment_timestamp}')
    checkpoint_file = sorted(glob.glob(os.path.join(checkpoint_dir, 'checkpoint_model', '*_E1.pth')))[0]
    saved = torch.load(checkpoint_file, weights_only=True)
    assert saved['callbacks']['WandBTracking'] == {'run_id': tracker.run_id}

    # wandb names an offline run's folder by start second and run id: the resumed run must start in a later
    # second to get its own folder (a real resume comes much later).
    time.sleep(1.02 - time.time() % 1)
    resumed_loop = _checkpoint_loop(tmp_path, seed=5)
    resumed_tracker = WandBTracking(watch_model='all', watch_log_freq=1)
    resumed_loop.fit(num_epochs=3, callbacks=[resumed_tracker], resume_from=checkpoint_dir)
    assert resumed_tracker.run_id == tracker.run_id
    files = run_files(tmp_path / 'results' / 'proj')
    assert len(files) == 2          # offline: a second local folder for the same run id (merged by wandb sync)
    second = summarize([f for f in files if f != first_file][0])
    assert second['run'].run_id == tracker.run_id
    row = second['history'][3 * steps_per_epoch - 1]
    for key, value in _expected_epoch_rows(resumed_loop, [2])[2].items():
        assert row[key] == pytest.approx(value, rel=1e-12), key
    assert 'train_loss/last_batch_loss' not in row      # batch logging is off by default
    watched = {key.split('/bins')[0].split('/values')[0] for row in second['history'].values() for key in row}
    assert {'gradients/net.0.weight', 'parameters/net.0.weight'} <= watched, watched
    assert not resumed_loop.model._forward_hooks       # wandb.watch's hooks are removed at the end


def test_pre_initialized_mode_without_a_run_fails_clearly(offline_wandb):
    import wandb
    train, val, test = loaders()
    model = MLP()
    loop = TrainLoop(model, train, val, test, torch.optim.SGD(model.parameters(), lr=0.1),
                     torch.nn.CrossEntropyLoss(), progress_bar=False)
    assert wandb.run is None
    with pytest.raises(RuntimeError, match='found no wandb run'):
        loop.fit(num_epochs=1, callbacks=[WandBTracking(wandb_pre_initialized=True)])


def test_argument_checks():
    with pytest.raises(TypeError, match='AlertConfig'):
        WandBTracking(alerts=[{'metric_name': 'val_loss'}])
    with pytest.raises(TypeError, match='wrap it in a list'):
        WandBTracking(alerts=AlertConfig('val_loss', 1.0))
    with pytest.raises(ValueError, match="'maximize' or 'minimize'"):
        WandBTracking(alerts=[AlertConfig('val_loss', 1.0, objective='lower')])
    with pytest.raises(ValueError, match='watch_model'):
        WandBTracking(watch_model='weights')
    with pytest.raises(ValueError, match='batch_log_frequency'):
        WandBTracking(batch_log_frequency=0)


def test_aitoolbox_signature():
    import inspect
    params = list(inspect.signature(WandBTracking.__init__).parameters.values())
    positional = [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == ['self', 'metric_names', 'batch_log_frequency', 'hyperparams', 'tags', 'alerts',
                          'wandb_pre_initialized', 'source_dirs', 'log_dir', 'is_project', 'project_name',
                          'experiment_name', 'local_model_result_folder_path']
    assert params[-1].kind == params[-1].VAR_KEYWORD
    assert [f for f in AlertConfig.__dataclass_fields__] == ['metric_name', 'threshold_value', 'objective',
                                                             'wandb_alert_level']


def test_module_imports_without_wandb_and_use_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, 'wandb', None)       # import wandb now raises ImportError
    monkeypatch.delitem(sys.modules, 'aitoolbox_like.callbacks.wandb')
    module = importlib.import_module('aitoolbox_like.callbacks.wandb')
    module.AlertConfig('val_loss', 1.0)
    with pytest.raises(ImportError, match=r'pip install aitoolbox_like\[wandb\]'):
        module.WandBTracking()


def test_json_unfriendly_hyperparams_become_their_repr():
    from aitoolbox_like.callbacks.wandb import _json_safe
    cleaned = _json_safe({'device': torch.device('cpu'), 'nan': math.nan, 'nested': {'t': (1, 2)}})
    assert cleaned['device'] == "device(type='cpu')" and cleaned['nested'] == {'t': [1, 2]}


def test_pre_initialized_run_is_used_and_left_open(offline_wandb):
    import wandb
    tmp_path = offline_wandb
    user_run = wandb.init(project='mine', dir=str(tmp_path / 'own'), config={'set_by': 'user'})
    train, val, test = loaders()
    model = MLP()
    loop = TrainLoop(model, train, val, test, torch.optim.SGD(model.parameters(), lr=0.1),
                     torch.nn.CrossEntropyLoss(), progress_bar=False)
    tracker = WandBTracking(metric_names=['val_loss'], wandb_pre_initialized=True, is_project=False)
    loop.fit(num_epochs=1, callbacks=[tracker])
    assert wandb.run is user_run and tracker.run_id == user_run.id     # the script's run, still open
    user_run.log({'after_fit': 1.0}, step=100)
    user_run.finish()
    run = summarize(run_files(tmp_path / 'own')[0])
    assert run['config']['set_by'] == 'user'
    rows = list(run['history'].values())
    assert rows[0]['loss_at_epoch_end/val_loss'] == pytest.approx(loop.train_history['val_loss'][-1])
    assert 'loss_at_epoch_end/loss' not in rows[0]             # only the metric_names asked for
    assert rows[-1]['after_fit'] == 1.0


class Boom(AbstractCallback):
    def __init__(self):
        super().__init__('fails after the first epoch', execution_order=200)

    def on_epoch_end(self):
        raise RuntimeError('boom')


def test_an_exception_finishes_the_run_as_failed_and_propagates(offline_wandb):
    import wandb
    tmp_path = offline_wandb
    train, val, test = loaders()
    model = MLP()
    loop = TrainLoop(model, train, val, test, torch.optim.SGD(model.parameters(), lr=0.1),
                     torch.nn.CrossEntropyLoss(), progress_bar=False)
    tracker = WandBTracking(local_model_result_folder_path=str(tmp_path / 'results'))
    with pytest.raises(RuntimeError, match='boom'):
        loop.fit(num_epochs=2, callbacks=[tracker, Boom()])
    assert tracker.run is None and wandb.run is None
    path = run_files(tmp_path / 'results' / 'default_project')[0]
    exits = [r.exit for r in read_finished_run(path) if r.WhichOneof('record_type') == 'exit']
    assert exits[-1].exit_code == 1
    assert summarize(path)['history'][len(train) - 1]['epoch'] == 0     # epoch 0 was logged before the failure
