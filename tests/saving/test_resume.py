"""Exact resume: a run interrupted (in-process, or by SIGKILL in a subprocess) and resumed from its checkpoint ends
with weights equal to the bit to the uninterrupted run's."""
import os
import signal
import time

import pytest
import torch

from aitoolbox_like.callbacks.basic import EarlyStopping
from aitoolbox_like.callbacks.model_load import ModelLoadContinueTraining
from aitoolbox_like.callbacks.train_schedule import StepLRScheduler
from aitoolbox_like.checkpoint import CheckpointError, load_checkpoint
from aitoolbox_like.experiment import bookkeeping_dir, read_pointer
from aitoolbox_like.train_loop import TrainLoop
from aitoolbox_like.tracking import TrainLoopCheckpoint
from saving_helpers import Net, assert_same_weights, make_parts, weights

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, 'kill_script.py')


def _loop(tmp_path, seed=0, iteration_save_freq=0, **parts_kwargs):
    model, train, val, test, optimizer = make_parts(seed=seed, **parts_kwargs)
    return TrainLoopCheckpoint(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), 'proj', 'run',
                               str(tmp_path / 'results'), {'lr': 1e-2}, cloud_save_mode='local',
                               iteration_save_freq=iteration_save_freq, progress_bar=False)


def _callbacks():
    return [StepLRScheduler(step_size=1, gamma=0.7), EarlyStopping(patience=50)]


def _reference(tmp_path, epochs=4, **kwargs):
    loop = _loop(tmp_path / 'reference', **kwargs)
    loop.fit(num_epochs=epochs, callbacks=_callbacks())
    return loop


def _checkpoints(loop):
    folder = os.path.join(loop.experiment.dir_path, 'checkpoint_model')
    return folder, sorted(f for f in os.listdir(folder) if f.endswith('.pth'))


def test_resume_from_an_epoch_checkpoint_equals_the_uninterrupted_run(tmp_path):
    reference = _reference(tmp_path)

    first = _loop(tmp_path / 'interrupted')
    first.fit(num_epochs=2, callbacks=_callbacks())
    folder, files = _checkpoints(first)
    assert files[-1].endswith('_E1.pth')

    torch.manual_seed(999)      # the resumed process starts with another RNG state and other initial weights
    resumed = _loop(tmp_path / 'interrupted', seed=5)
    resumed.fit(num_epochs=4, callbacks=_callbacks(), resume_from=os.path.join(folder, files[-1]))

    assert_same_weights(weights(resumed.model), weights(reference.model))
    assert resumed.optimizer.param_groups[0]['lr'] == reference.optimizer.param_groups[0]['lr']
    assert resumed.train_history.train_history == reference.train_history.train_history
    assert resumed.train_history.get_epochs('val_loss') == [0, 1, 2, 3]
    # The resumed run writes on in the same experiment folder.
    assert resumed.experiment_timestamp == first.experiment_timestamp
    assert _checkpoints(resumed)[1][-1].endswith('_E3.pth')


def test_resume_inside_an_epoch_from_an_iteration_checkpoint(tmp_path):
    reference = _reference(tmp_path, epochs=3)     # 7 batches per epoch

    first = _loop(tmp_path / 'interrupted', iteration_save_freq=4)
    first.fit(num_iterations=10, callbacks=_callbacks())        # stops inside epoch 1
    folder, files = _checkpoints(first)
    mid = [f for f in files if f.endswith('_E1_ITER8.pth')]
    assert mid, files
    checkpoint = load_checkpoint(os.path.join(folder, mid[0]))
    assert checkpoint['data_position']['batches_done'] == 2       # batches 7 and 8 of epoch 1

    torch.manual_seed(31)
    resumed = _loop(tmp_path / 'interrupted', seed=7)
    resumed.fit(num_epochs=3, callbacks=_callbacks(), resume_from=os.path.join(folder, mid[0]))

    assert_same_weights(weights(resumed.model), weights(reference.model))
    assert resumed.train_history.train_history == reference.train_history.train_history
    assert resumed.total_iteration_idx == reference.total_iteration_idx


def test_resume_inside_a_gradient_accumulation_window(tmp_path):
    def fit(loop, **kwargs):
        loop.fit(callbacks=_callbacks(), grad_accumulation=3, **kwargs)

    reference = _loop(tmp_path / 'reference')
    fit(reference, num_epochs=2)
    first = _loop(tmp_path / 'interrupted', iteration_save_freq=4)
    fit(first, num_iterations=6)       # the checkpoint after batch 4 is inside the window 3..5
    folder, files = _checkpoints(first)
    resumed = _loop(tmp_path / 'interrupted', seed=3)
    fit(resumed, num_epochs=2, resume_from=os.path.join(folder, [f for f in files if 'ITER4' in f][0]))
    assert_same_weights(weights(resumed.model), weights(reference.model))


def test_model_load_continue_training_callback_resumes_the_same_way(tmp_path):
    reference = _reference(tmp_path, epochs=3)
    first = _loop(tmp_path / 'interrupted')
    first.fit(num_epochs=2, callbacks=_callbacks())

    resumed = _loop(tmp_path / 'interrupted', seed=11)
    loader = ModelLoadContinueTraining(first.experiment_timestamp, epoch_num=1)
    resumed.fit(num_epochs=3, callbacks=_callbacks() + [loader])
    assert_same_weights(weights(resumed.model), weights(reference.model))
    assert resumed.experiment_timestamp == first.experiment_timestamp
    # No empty folder was made for a new experiment id.
    assert os.listdir(tmp_path / 'interrupted' / 'results' / 'proj') == [f'run_{first.experiment_timestamp}']
    # AIToolbox's history of a continued fit: the epochs trained after loading (epoch 2), with their values.
    assert resumed.train_history.get_epochs('val_loss') == [2]
    assert resumed.train_history['val_loss'] == reference.train_history['val_loss'][2:]


def test_model_load_continue_training_restores_the_whole_history_when_asked(tmp_path):
    reference = _reference(tmp_path, epochs=3)
    first = _loop(tmp_path / 'interrupted')
    first.fit(num_epochs=2, callbacks=_callbacks())
    resumed = _loop(tmp_path / 'interrupted', seed=11)
    loader = ModelLoadContinueTraining(first.experiment_timestamp, epoch_num=1, restore_history=True)
    resumed.fit(num_epochs=3, callbacks=_callbacks() + [loader])
    assert_same_weights(weights(resumed.model), weights(reference.model))
    assert resumed.train_history.train_history == reference.train_history.train_history
    assert resumed.train_history.get_epochs('val_loss') == [0, 1, 2]


def _start_script(warm, out_dir, result, *args):
    return warm.start_here([SCRIPT, out_dir, result, *args], f'{result}.log')


def _run_script(warm_python, out_dir, result, *args, expect_kill=False):
    process = _start_script(warm_python, out_dir, result, *args)
    returncode = warm_python.wait(process, timeout=120)
    assert returncode == (-signal.SIGKILL if expect_kill else 0), process.output()[1][-3000:]
    return torch.load(result, weights_only=True) if not expect_kill else None


@pytest.fixture(scope='module')
def script_reference(tmp_path_factory, warm_python):
    tmp = tmp_path_factory.mktemp('reference')
    return _run_script(warm_python, tmp / 'out', tmp / 'result.pt', '--epochs', 3, '--iter-freq', 4)


def test_sigkill_mid_epoch_then_resume_equals_the_uninterrupted_run(tmp_path, script_reference, warm_python):
    # Killed inside the optimizer step of batch 13 (epoch 1); the newest checkpoint is the one after batch 12.
    _run_script(warm_python, tmp_path / 'out', tmp_path / 'killed.pt', '--epochs', 3, '--iter-freq', 4,
                '--kill-at-batch', 13, expect_kill=True)
    folder = next((tmp_path / 'out' / 'proj').glob('run_*'))
    assert read_pointer(folder).endswith('_E1_ITER12.pth')

    resumed = _run_script(warm_python, tmp_path / 'out', tmp_path / 'resumed.pt', '--epochs', 3, '--iter-freq', 4,
                          '--resume')
    assert_same_weights(resumed['weights'], script_reference['weights'])
    assert resumed['history']['train_history'] == script_reference['history']['train_history']
    assert resumed['experiment_timestamp'] == folder.name[len('run_'):]


def test_sigkill_during_a_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, warm_python):
    big = 6_000_000          # 24 MB of ballast per checkpoint: writing takes long enough to be caught
    out = tmp_path / 'out'
    reference = _run_script(warm_python, tmp_path / 'ref', tmp_path / 'ref.pt', '--epochs', 3, '--big-buffer', big)

    process = _start_script(warm_python, out, tmp_path / 'x.pt', '--epochs', 3, '--big-buffer', big)
    caught_during_write = False
    deadline = time.monotonic() + 120
    try:
        # Kill as soon as the second checkpoint (epoch 1) is being written: its temp file (created in the
        # experiment's bookkeeping folder, next to the pointers) exists.
        while warm_python.running(process) and time.monotonic() < deadline:
            folders = list((out / 'proj').glob('run_*')) if (out / 'proj').exists() else []
            if folders and os.path.isdir(bookkeeping_dir(folders[0])):
                names = os.listdir(bookkeeping_dir(folders[0]))
                if 'latest_checkpoint.txt' in names and any(n.startswith('.model_') and n.endswith('.tmp')
                                                            for n in names):
                    os.kill(process.pid, signal.SIGKILL)
                    caught_during_write = True
                    break
            time.sleep(0.0005)
    finally:
        warm_python.wait(process, timeout=30 if caught_during_write else 0.1)      # kills a run still going
    assert caught_during_write, 'the run finished before a checkpoint write could be interrupted'
    assert process.returncode == -signal.SIGKILL

    experiment = next((out / 'proj').glob('run_*'))
    folder = experiment / 'checkpoint_model'
    latest = read_pointer(experiment)
    assert latest.endswith('_E0.pth')                  # the pointer still names the last complete checkpoint
    assert load_checkpoint(latest)['epoch'] == 0
    assert not any(n.endswith('_E1.pth') for n in os.listdir(folder))     # no partial file under the real name
    # The temp file is not in the experiment folder at all.
    assert not any(n.startswith('.') for _, _, names in os.walk(experiment) for n in names)

    resumed = _run_script(warm_python, out, tmp_path / 'resumed.pt', '--epochs', 3, '--big-buffer', big, '--resume')
    assert_same_weights(resumed['weights'], reference['weights'])


# ---------------------------------------------------------------------------------------------- bad checkpoints


def _one_checkpoint(tmp_path):
    loop = _loop(tmp_path)
    loop.fit(num_epochs=1)
    folder, files = _checkpoints(loop)
    return os.path.join(folder, files[-1])


def test_a_checkpoint_of_another_model_is_refused_with_a_clear_error(tmp_path):
    path = _one_checkpoint(tmp_path)

    class Wider(Net):
        def __init__(self):
            super().__init__()
            self.net[0] = torch.nn.Linear(6, 32)
            self.net[3] = torch.nn.Linear(32, 3)

    model = Wider()
    _, train, val, test, _ = make_parts()
    loop = TrainLoop(model, train, val, test, torch.optim.Adam(model.parameters()), torch.nn.CrossEntropyLoss(),
                     progress_bar=False)
    with pytest.raises(CheckpointError, match='different model'):
        loop.fit(num_epochs=2, resume_from=path)


def test_truncated_checkpoint_is_refused_with_a_clear_error(tmp_path):
    path = _one_checkpoint(tmp_path)
    data = open(path, 'rb').read()
    broken = tmp_path / 'broken.pth'
    broken.write_bytes(data[:len(data) // 2])
    loop = _loop(tmp_path / 'other')
    with pytest.raises(CheckpointError, match='truncated or corrupt'):
        loop.fit(num_epochs=2, resume_from=str(broken))


def test_checkpoint_with_pickled_code_needs_an_explicit_opt_in(tmp_path):
    path = _one_checkpoint(tmp_path)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint['hyperparams'] = {'activation': torch.nn.ReLU()}       # an object: unpickling it runs code
    unsafe = tmp_path / 'unsafe.pth'
    torch.save(checkpoint, unsafe)
    loop = _loop(tmp_path / 'other')
    with pytest.raises(CheckpointError, match='allow_unsafe_pickle=True'):
        loop.fit(num_epochs=2, resume_from=str(unsafe))

    loop = _loop(tmp_path / 'other2')
    loader = ModelLoadContinueTraining('x', project_name='p', experiment_name='e',
                                       local_model_result_folder_path=str(tmp_path), allow_unsafe_pickle=True)
    os.makedirs(tmp_path / 'p' / 'e_x' / 'checkpoint_model')
    os.replace(unsafe, tmp_path / 'p' / 'e_x' / 'checkpoint_model' / 'model_e_x_E0.pth')
    loader.epoch_num = 0
    loop.fit(num_epochs=2, callbacks=[loader])
    assert loop.train_history.get_epochs('accumulated_loss') == [1]      # the continued epoch (AIToolbox's history)


def test_checkpoints_load_with_weights_only_and_carry_the_full_state(tmp_path):
    path = _one_checkpoint(tmp_path)
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint['format_version'] == 1
    for key in ('model_state_dict', 'optimizer_state_dict', 'schedulers_state_dict', 'amp', 'epoch', 'iteration_idx',
                'hyperparams', 'hyperparams_json', 'loop', 'train_history', 'callbacks', 'rng', 'data_position',
                'experiment'):
        assert key in checkpoint
    assert checkpoint['hyperparams']['lr'] == 1e-2
    assert set(checkpoint['rng']) >= {'torch', 'python', 'numpy'}
