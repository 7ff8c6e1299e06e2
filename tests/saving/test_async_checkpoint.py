"""Asynchronous checkpoints (async_save=True, the default): the training thread only copies the state to host memory;
the file, the pointers and the upload are written by a background thread, one at a time. These tests check what
docs/saving-and-resuming.md promises: exact resume, training goes on during a write, kill -9 during a write keeps the
previous checkpoint, errors surface, and the end of fit waits for the last write."""
import os
import pickle
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from aitoolbox_like import AbstractCallback
from aitoolbox_like.callbacks.model_save import ModelCheckpoint, ModelIterationCheckpoint, ModelTrainEndSave
from aitoolbox_like.callbacks.train_schedule import StepLRScheduler
from aitoolbox_like.checkpoint import AsyncCheckpointWriter, CheckpointError, load_checkpoint
from aitoolbox_like.experiment import bookkeeping_dir, read_pointer
from aitoolbox_like.results import ClassificationResultPackage
from aitoolbox_like.train_loop import TrainLoop
from saving_helpers import assert_same_weights, make_parts, weights

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, 'async_kill_script.py')


def _loop(seed=0):
    model, train, val, test, optimizer = make_parts(seed=seed)
    return TrainLoop(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), progress_bar=False)


def _saver(folder, async_save=True, iteration_freq=0, **kwargs):
    args = ('proj', 'run', str(folder), {'lr': 1e-2})
    kwargs = dict(cloud_save_mode='local', async_save=async_save, **kwargs)
    if iteration_freq:
        return ModelIterationCheckpoint(iteration_freq, *args, **kwargs)
    return ModelCheckpoint(*args, **kwargs)


def _fit(loop, epochs, saver, extra=(), resume_from=None):
    loop.fit(num_epochs=epochs, callbacks=[saver, StepLRScheduler(step_size=1, gamma=0.7), *extra],
             resume_from=resume_from)
    return loop


def _experiment(folder):
    return next((folder / 'proj').glob('run_*'))


def _work(experiment):
    """The experiment's bookkeeping folder: pointers and temporary files."""
    return Path(bookkeeping_dir(experiment))


def _latest(folder):
    return Path(read_pointer(_experiment(folder)))


def _assert_same_state(a, b):
    assert_same_weights(weights(a.model), weights(b.model))
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert sa['param_groups'] == sb['param_groups']
    for key in sa['state']:
        for name, value in sa['state'][key].items():
            assert torch.equal(value, sb['state'][key][name]), (key, name)
    assert a.train_history.train_history == b.train_history.train_history
    assert a.total_iteration_idx == b.total_iteration_idx


# ---------------------------------------------------------------------------------------------- exact resume


@pytest.mark.parametrize('iteration_freq', [0, 4])
def test_async_checkpoints_resume_exactly_like_sync_ones(tmp_path, iteration_freq):
    reference = _fit(_loop(), 4, _saver(tmp_path / 'sync', async_save=False, iteration_freq=iteration_freq))

    _fit(_loop(), 2, _saver(tmp_path / 'async', iteration_freq=iteration_freq))
    resumed = _fit(_loop(seed=123), 4, _saver(tmp_path / 'async', iteration_freq=iteration_freq),
                   resume_from='latest')
    _assert_same_state(resumed, reference)

    # The files themselves hold the same state, name for name.
    sync_dir, async_dir = (_experiment(tmp_path / name) / 'checkpoint_model' for name in ('sync', 'async'))
    strip = len(f'model_run_{_experiment(tmp_path / "sync").name[len("run_"):]}')
    sync_files = sorted(f[strip:] for f in os.listdir(sync_dir))
    assert sync_files == sorted(f[strip:] for f in os.listdir(async_dir))
    for sync_file, async_file in zip(sorted(os.listdir(sync_dir)), sorted(os.listdir(async_dir))):
        a, b = load_checkpoint(sync_dir / sync_file), load_checkpoint(async_dir / async_file)
        assert_same_weights(a['model_state_dict'], b['model_state_dict'])
        assert a['train_history'] == b['train_history']
        assert a['loop'] == b['loop']


def test_a_mid_epoch_checkpoint_written_in_the_background_resumes_exactly(tmp_path):
    reference = _fit(_loop(), 3, _saver(tmp_path / 'reference', async_save=False))
    _fit(_loop(), 2, _saver(tmp_path / 'run', iteration_freq=5))
    folder = _experiment(tmp_path / 'run') / 'checkpoint_model'
    mid = [f for f in os.listdir(folder) if f.endswith('_E1_ITER10.pth')]
    assert mid and load_checkpoint(folder / mid[0])['data_position']['batches_done'] == 4
    # Resume inside epoch 1 (after global batch 10), not from the later E1 checkpoint.
    resumed = _fit(_loop(seed=7), 3, _saver(tmp_path / 'run', iteration_freq=5), resume_from=str(folder / mid[0]))
    assert_same_weights(weights(resumed.model), weights(reference.model))
    assert resumed.train_history.train_history == reference.train_history.train_history


# ---------------------------------------------------------------------------------------------- no stall


class _Gate:
    """before_write hook: the first background write waits until the training thread opens the gate."""

    def __init__(self):
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def __call__(self, path):
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            assert self.release.wait(60), 'the gate was never opened'


class _Observer(AbstractCallback):
    """Records what the training thread does while the first checkpoint's write is held by the gate."""

    def __init__(self, saver, gate):
        super().__init__('observer', execution_order=200)
        self.saver, self.gate = saver, gate
        self.weights_at_save = None
        self.batches_while_blocked = []

    def on_epoch_end(self):
        if self.weights_at_save is None:        # right after the first save returned (execution_order 200 > 100)
            self.weights_at_save = weights(self.train_loop_obj.model)

    def on_batch_end(self):
        loop = self.train_loop_obj
        if loop.epoch == 1 and loop.iteration == 0:
            # The writer thread holds the epoch-0 write at the gate by now (or soon: it waits for the GIL).
            assert self.gate.entered.wait(60), 'the epoch-0 write never started'
        if loop.epoch == 1 and self.gate.entered.is_set() and not self.gate.release.is_set():
            folder = self.saver.experiment.dir_path
            checkpoints = os.path.join(folder, 'checkpoint_model')     # made by the write, in the background
            self.batches_while_blocked.append(
                (loop.iteration, self.saver.async_writer.pending,
                 read_pointer(folder) is not None,
                 os.listdir(checkpoints) if os.path.isdir(checkpoints) else []))
            if loop.iteration == 3:
                self.gate.release.set()


def test_training_goes_on_while_the_checkpoint_is_written(tmp_path):
    saver = _saver(tmp_path)
    gate = _Gate()
    saver.async_writer.before_write = gate
    observer = _Observer(saver, gate)
    loop = _fit(_loop(), 2, saver, extra=[observer])

    # Batches 0..3 of epoch 1 were trained while the epoch-0 write was held: the save returned after the copy.
    assert [b[0] for b in observer.batches_while_blocked] == [0, 1, 2, 3]
    for _, pending, pointer_exists, files in observer.batches_while_blocked:
        assert pending and not pointer_exists and files == []   # no file, no pointer before the write completes
    # The file holds the state at the save, not the weights training moved on to.
    experiment = _experiment(tmp_path)
    files = sorted(os.listdir(experiment / 'checkpoint_model'))
    assert [f[-7:] for f in files] == ['_E0.pth', '_E1.pth']
    e0 = load_checkpoint(experiment / 'checkpoint_model' / files[0])
    assert_same_weights(e0['model_state_dict'], observer.weights_at_save)
    assert not all(torch.equal(e0['model_state_dict'][k], v) for k, v in weights(loop.model).items())


def test_snapshot_is_a_deep_host_copy_that_reuses_its_buffers():
    writer = AsyncCheckpointWriter()
    w = torch.arange(6.)
    state = {'model': {'w': w, 'tied': w}, 'list': [torch.ones(2), 3, 'x'], 'size': torch.Size([2])}
    first = writer.snapshot(state)
    assert first['model']['w'] is first['model']['tied'] and first['model']['w'] is not w
    assert first['list'] is not state['list'] and first['list'][1:] == [3, 'x'] and first['size'] == torch.Size([2])
    buffer = first['model']['w']
    w.add_(1)
    assert torch.equal(buffer, torch.arange(6.))                        # a copy: later training does not move it
    second = writer.snapshot(state)
    assert second['model']['w'] is buffer and torch.equal(buffer, torch.arange(6.) + 1)     # buffer reused


def test_a_buffer_is_reused_only_for_a_tensor_of_its_shape_and_dtype():
    writer = AsyncCheckpointWriter()
    first = writer.snapshot({'a': torch.ones(3), 'b': torch.ones(2)})
    # The state changed shape and dtype at the same places: new buffers, never a broadcast or cast into the old ones.
    second = writer.snapshot({'a': torch.arange(4.), 'b': torch.arange(2, dtype=torch.int64)})
    assert second['a'] is not first['a'] and torch.equal(second['a'], torch.arange(4.))
    assert second['b'] is not first['b'] and second['b'].dtype == torch.int64


def _same_copy(a, b):
    """Two snapshots hold the same values in the same containers (tensors: dtype, layout, shape and values)."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.layout == b.layout and a.shape == b.shape
                and torch.equal(a.to_dense() if a.is_sparse else a, b.to_dense() if b.is_sparse else b))
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(_same_copy(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same_copy(x, y) for x, y in zip(a, b))
    return a == b


def _changed_states():
    """A checkpoint-like state, then the same state changed in each way a tensor at a place of the walk can change
    between two saves."""
    def state(**change):
        base = {'model': {'w': torch.arange(6.).reshape(2, 3), 'b': torch.ones(3), 'n': torch.tensor(7)},
                'optimizer': {'state': {0: {'step': torch.tensor(3.), 'avg': torch.full((2, 3), .5)}}, 'lr': 0.1}}
        base['model'].update(change)
        return base
    w = torch.arange(6.).reshape(2, 3) * 2
    return [
        ('new values', state(w=torch.arange(6.).reshape(2, 3) + 10)),
        ('two tensors of one shape swapped', state(w=torch.zeros(2, 3), b=torch.ones(3) * 4)),
        ('a shape', state(b=torch.ones(4))),
        ('a dtype', state(n=torch.tensor(7.5))),
        ('a tensor more', state(extra=torch.ones(1))),
        ('a tensor less', {**state(), 'model': {'w': torch.ones(2, 3)}}),
        ('tied', state(w=w, b=w)),
        ('sparse', state(b=torch.ones(3).to_sparse())),
        ('non-contiguous', state(w=torch.arange(6.).reshape(3, 2).t())),
    ]


@pytest.mark.parametrize('change, changed', _changed_states(), ids=[c for c, _ in _changed_states()])
def test_a_snapshot_after_a_change_equals_one_made_afresh(change, changed):
    # From the third save on, the n-th tensor met is guessed to go to the n-th buffer and the guesses are checked
    # together; whatever changed, the copy is the one a writer without buffers makes.
    writer = AsyncCheckpointWriter()
    unchanged = _changed_states()[0][1]
    for _ in range(2):
        writer.snapshot(unchanged)
    copied = writer.snapshot(changed)
    assert _same_copy(copied, AsyncCheckpointWriter().snapshot(changed))
    assert _same_copy(copied, changed)
    if change == 'tied':
        assert copied['model']['w'] is copied['model']['b']
    # Training goes on: the copy does not move with the state, and the next save copies it again.
    changed['optimizer']['state'][0]['avg'].add_(1)
    assert not _same_copy(copied, changed)
    assert _same_copy(writer.snapshot(changed), changed)


class _HeldState(AbstractCallback):
    """A callback whose state holds a value a weights_only checkpoint cannot: a NumPy scalar."""

    def __init__(self):
        super().__init__('held state')

    def state_dict(self):
        return {'best': np.float64(0.5)}


@pytest.mark.parametrize('async_save', [True, False])
def test_a_state_weights_only_refuses_is_named_when_it_is_saved(tmp_path, async_save):
    # The background save checks in the walk that copies the state; the message is the synchronous save's.
    with pytest.raises(CheckpointError) as error:
        _fit(_loop(), 1, _saver(tmp_path, async_save=async_save), extra=[_HeldState()])
    message = str(error.value)
    assert "['best']: numpy.float64 cannot be stored in a weights_only checkpoint" in message
    assert 'convert numpy values with .item()' in message and message.startswith('checkpoint[')


def test_a_dict_key_weights_only_refuses_is_named_by_the_snapshot():
    with pytest.raises(CheckpointError, match=r"checkpoint\['x'\]: dict key \(1, 2\) has type tuple"):
        AsyncCheckpointWriter().snapshot({'x': {(1, 2): torch.ones(1)}})


def test_one_writer_thread_serves_the_writes_until_it_is_closed_or_idle():
    writer = AsyncCheckpointWriter()
    threads, snapshots = [], []

    def job(snapshot):
        threads.append(threading.current_thread())
        snapshots.append(None if snapshot is None else int(snapshot['v']))     # its buffer serves the next one
    for value in range(3):
        writer.submit(f'write {value}', job, writer.snapshot({'v': torch.tensor(value)}))
        writer.wait()
    assert snapshots == [0, 1, 2]
    assert len(set(threads)) == 1 and threads[0] is not threading.current_thread() and threads[0].is_alive()
    writer.close()
    assert not threads[0].is_alive()
    writer.submit('after close', job, None)        # a write after close() starts a new thread
    writer.wait()
    assert threads[3] is not threads[0]
    writer.IDLE_SECONDS = 0.05
    writer.submit('idle', job, None)                # the thread now ends by itself once idle
    writer.wait()
    threads[-1].join(timeout=30)
    assert not threads[-1].is_alive()
    writer.submit('after idle', job, None)
    writer.wait()
    assert len(threads) == 6 and threads[-1].is_alive()
    writer.close()


def test_a_writer_travels_to_a_spawned_process_and_writes_there():
    # DDP spawn pickles the callbacks with their writer: the thread and its lock stay behind.
    writer = AsyncCheckpointWriter()
    writer.submit('before', lambda snapshot: None, writer.snapshot({'w': torch.ones(2)}))
    copy = pickle.loads(pickle.dumps(writer))
    assert not writer.pending
    done = []
    copy.submit('after', done.append, copy.snapshot({'w': torch.zeros(2)}))
    copy.wait()
    assert torch.equal(done[0]['w'], torch.zeros(2))
    copy.close()
    writer.close()


# ---------------------------------------------------------------------------------------------- kill -9


def test_sigkill_during_a_background_write_keeps_the_previous_checkpoint(tmp_path, warm_python):
    # The script's runs are processes of their own, forked from the tests' zygote (conftest's warm_python).
    big = 1_000_000
    reference = warm_python.start_here([SCRIPT, tmp_path / 'ref', tmp_path / 'ref.pt', '--big-buffer', big],
                                       tmp_path / 'reference')
    assert warm_python.wait(reference, timeout=300) == 0, reference.output()[1][-3000:]

    out = tmp_path / 'out'
    process = warm_python.start_here([SCRIPT, out, tmp_path / 'x.pt', '--big-buffer', big, '--block-write', 2],
                                     tmp_path / 'killed')
    deadline = time.monotonic() + 180
    try:
        # The second checkpoint (epoch 1) is half written and held; training goes on into epoch 2 meanwhile.
        reached = False
        while warm_python.running(process) and time.monotonic() < deadline:
            if (out / 'writing').exists() and any(n.startswith('trained_2_') for n in os.listdir(out)):
                reached = True
                break
            time.sleep(0.01)
        assert reached and warm_python.running(process), process.output()[1][-3000:]
        os.kill(process.pid, signal.SIGKILL)
    finally:
        warm_python.wait(process, timeout=30)       # kills a run still going
    assert process.returncode == -signal.SIGKILL

    experiment = _experiment(out)
    assert read_pointer(experiment).endswith('_E0.pth')
    assert load_checkpoint(_latest(out))['epoch'] == 0
    assert [f[-7:] for f in os.listdir(experiment / 'checkpoint_model')] == ['_E0.pth']    # E1 never appeared
    strays = [n for n in os.listdir(_work(experiment)) if n.endswith('.tmp')]
    assert len(strays) == 1 and os.path.getsize(_work(experiment) / strays[0]) > 0     # the half-written temp file

    resumed = warm_python.start_here([SCRIPT, out, tmp_path / 'resumed.pt', '--big-buffer', big, '--resume'],
                                     tmp_path / 'resumed')
    assert warm_python.wait(resumed, timeout=300) == 0, resumed.output()[1][-3000:]
    a, b = torch.load(tmp_path / 'resumed.pt'), torch.load(tmp_path / 'ref.pt')
    assert_same_weights(a['weights'], b['weights'])
    assert a['history']['train_history'] == b['history']['train_history']
    assert not any(n.endswith('.tmp') for n in os.listdir(_work(experiment)))       # the resume removed the stray


# ---------------------------------------------------------------------------------------------- errors, end of fit


def _failing_write(fail_on):
    calls = []

    def hook(path):
        calls.append(path)
        if len(calls) == fail_on:
            raise OSError(28, 'No space left on device')
    return hook


def test_a_background_write_error_is_raised_at_the_next_save(tmp_path):
    saver = _saver(tmp_path)
    saver.async_writer.before_write = _failing_write(1)
    loop = _loop()
    with pytest.raises(CheckpointError, match=r'_E0\.pth in the background failed: OSError.*No space') as error:
        _fit(loop, 3, saver)
    assert isinstance(error.value.__cause__, OSError)
    assert loop.epoch == 1          # raised by the save after epoch 1, the first one after the failure
    assert read_pointer(_experiment(tmp_path)) is None


def test_a_failed_last_write_is_raised_by_fit(tmp_path):
    saver = _saver(tmp_path)
    saver.async_writer.before_write = _failing_write(2)
    with pytest.raises(CheckpointError, match=r'_E1\.pth in the background failed'):
        _fit(_loop(), 2, saver)
    assert _latest(tmp_path).name.endswith('_E0.pth')


def test_the_end_of_fit_waits_for_the_last_checkpoint(tmp_path):
    saver = _saver(tmp_path)
    saver.async_writer.before_write = lambda path: time.sleep(0.3) if path.endswith('_E2.pth') else None
    _fit(_loop(), 3, saver)
    assert not saver.async_writer.pending
    assert _latest(tmp_path).name.endswith('_E2.pth')
    assert load_checkpoint(_latest(tmp_path))['epoch'] == 2


def test_the_end_save_model_is_complete_when_fit_returns(tmp_path):
    end_save = ModelTrainEndSave('proj', 'run', str(tmp_path), {'lr': 1e-2},
                                 val_result_package=ClassificationResultPackage(), cloud_save_mode='local')
    end_save.async_writer.before_write = lambda path: time.sleep(0.3)
    loop = _fit(_loop(), 1, end_save)
    model_file = end_save.saved_files[0]
    assert os.path.dirname(model_file).endswith('model') and not end_save.async_writer.pending
    assert_same_weights(load_checkpoint(model_file)['model_state_dict'], weights(loop.model))


def test_save_checkpoint_wait_returns_a_complete_checkpoint(tmp_path):
    saver = _saver(tmp_path)
    loop = _fit(_loop(), 1, saver)
    saver.async_writer.before_write = lambda path: time.sleep(0.3)
    path = saver.save_checkpoint(iteration_idx=loop.total_iteration_idx, wait=True)     # what PreemptionCheckpoint does
    assert not saver.async_writer.pending
    assert str(_latest(tmp_path)) == path and load_checkpoint(path)['iteration_idx'] == loop.total_iteration_idx
    saver.async_writer.before_write = _failing_write(1)
    saver.save_checkpoint()
    with pytest.raises(CheckpointError, match='No space'):
        saver.wait_for_pending_save()
    saver.wait_for_pending_save()           # reported once


def test_rm_subopt_deletes_only_complete_checkpoints(tmp_path):
    saver = _saver(tmp_path, rm_subopt_local_models='accumulated_loss', num_best_checkpoints_kept=1)
    seen = []

    def hook(path):
        # What the folder holds while a checkpoint is written: only complete files, the previous newest included.
        folder = os.path.dirname(path)      # made by the first write
        seen.append(sorted(os.listdir(folder)) if os.path.isdir(folder) else [])
    saver.async_writer.before_write = hook
    _fit(_loop(), 4, saver)
    for before in seen[1:]:
        assert before, 'a save deleted the previous newest checkpoint before the new one was complete'
    files = os.listdir(_experiment(tmp_path) / 'checkpoint_model')
    assert any(f.endswith('_E3.pth') for f in files) and 1 <= len(files) <= 2
