"""The command line on the digits recipe: it trains what examples/digits_cnn.py trains, a run killed with SIGKILL
and resumed with `aitoolbox-like resume` ends with the weights of an uninterrupted run, a finished run is left
alone, and a recipe that does not check trains nothing.

The commands that train run forked from the tests' zygote (conftest's ``warm_python``: each its own process, as
``python -m aitoolbox_like ...`` or the console script, without paying torch's start-up each time), except the run
stopped by Ctrl-C, which is the console script started cold in a process group of its own, as a terminal's job, and
gets SIGINT as the terminal sends it (to the group); those that train nothing start the installed console script
and ``python -m aitoolbox_like`` cold, as a shell does."""
import glob
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from aitoolbox_like.experiment import read_pointer
from aitoolbox_like.recipes.cli import main

from fresh_process import FreshProcess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIGITS_RECIPE = os.path.join(ROOT, 'examples', 'recipes', 'digits.yaml')
# The console script setup.py installs, next to this interpreter.
CONSOLE_SCRIPT = os.path.join(os.path.dirname(sys.executable), 'aitoolbox-like')


def _env():
    env = dict(os.environ, OMP_NUM_THREADS='1', MPLBACKEND='Agg', PYTHONDONTWRITEBYTECODE='1')
    env.pop('DIGITS_OUTPUT_DIR', None)
    return env


def _checkpointed(out):
    """Whether the run writing into ``out`` has completed a checkpoint (the pointer, in the experiment's bookkeeping
    folder, appears then)."""
    return bool(glob.glob(str(out / '.aitoolbox_like' / 'digits' / 'cnn_*' / 'latest_checkpoint.txt')))


def _experiment(out):
    [folder] = glob.glob(os.path.join(out, 'digits', 'cnn_*'))
    return folder


def _latest(folder):
    return read_pointer(folder)


def _final_weights(folder):
    return torch.load(_latest(folder), weights_only=True)['model_state_dict']


def _assert_bit_equal(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.timeout(240)
def test_a_killed_run_resumed_from_its_folder_ends_with_the_weights_of_an_uninterrupted_run(tmp_path, warm_python):
    epochs = 5
    train = ['-m', 'aitoolbox_like', 'train', DIGITS_RECIPE, f'fit.num_epochs={epochs}']
    full = warm_python.start_here(train + [f'vars.output_dir={tmp_path / "full"}'], tmp_path / 'full', _env())
    assert warm_python.wait(full, timeout=200) == 0, full.output()[1]
    full_folder = _experiment(tmp_path / 'full')

    killed = warm_python.start_here(train + [f'vars.output_dir={tmp_path / "killed"}'], tmp_path / 'killed', _env())
    try:
        deadline = time.monotonic() + 150
        while not _checkpointed(tmp_path / 'killed'):
            assert warm_python.running(killed), 'the run ended before it wrote a checkpoint'
            assert time.monotonic() < deadline, 'no checkpoint after 150 s'
            time.sleep(0.02)
        os.kill(killed.pid, signal.SIGKILL)
    finally:
        warm_python.wait(killed, timeout=30)        # kills a run still going
    assert killed.returncode == -signal.SIGKILL
    folder = _experiment(tmp_path / 'killed')
    assert not _latest(folder).endswith(f'_E{epochs - 1}.pth'), 'the run was not interrupted'

    resumed = warm_python.start_here([CONSOLE_SCRIPT, 'resume', folder], tmp_path / 'resumed', _env())
    assert warm_python.wait(resumed, timeout=200) == 0, resumed.output()[1]
    assert _experiment(tmp_path / 'killed') == folder             # continued in its own folder
    assert _latest(folder).endswith(f'_E{epochs - 1}.pth')
    _assert_bit_equal(_final_weights(folder), _final_weights(full_folder))

    # The folder records how to repeat it: the resolved recipe and both commands.
    with open(os.path.join(folder, 'recipe.yaml')) as f:
        assert f'num_epochs: {epochs}\n' in f.read()
    with open(os.path.join(folder, 'command_line.txt')) as f:
        commands = [line for line in f.read().splitlines() if not line.startswith('#')]
    assert commands == [f'python -m aitoolbox_like train {DIGITS_RECIPE} fit.num_epochs={epochs} '
                        f'vars.output_dir={tmp_path / "killed"}', f'aitoolbox-like resume {folder}']

    # A finished run: said so, status 0, nothing trained (the installed console script, started cold).
    before = sorted(os.listdir(os.path.join(full_folder, 'checkpoint_model')))
    again = subprocess.run([CONSOLE_SCRIPT, 'resume', full_folder], cwd=tmp_path, env=_env(), capture_output=True,
                           text=True, timeout=200)
    assert again.returncode == 0, again.stderr
    assert f'finished: {epochs} epochs trained (fit.num_epochs={epochs})' in again.stdout
    assert sorted(os.listdir(os.path.join(full_folder, 'checkpoint_model'))) == before


@pytest.mark.timeout(240)
def test_ctrl_c_stops_train_with_status_130_and_no_end_of_training_report_until_the_resumed_run_ends(tmp_path,
                                                                                                     warm_python):
    epochs = 30       # far more than the run gets to before the signal
    out = tmp_path / 'out'
    with FreshProcess([CONSOLE_SCRIPT, 'train', DIGITS_RECIPE, f'fit.num_epochs={epochs}', f'vars.output_dir={out}'],
                      tmp_path, _env(), tmp_path / 'train') as train:
        deadline = time.monotonic() + 150
        while not _checkpointed(out):
            assert train.running(), train.output()[1][-3000:]
            assert time.monotonic() < deadline, 'no checkpoint after 150 s'
            time.sleep(0.02)
        train.ctrl_c()
        train.wait(timeout=120)                     # kills a run still going after that
        left = train.left_running()
    stdout, stderr = train.output()
    assert train.returncode == 130, stderr[-3000:]
    assert left == []
    folder = _experiment(out)
    assert f'interrupted (received SIGINT); continue with: aitoolbox-like resume {folder}' in stdout
    assert 'final ' not in stdout and 'Traceback' not in stderr
    results = os.listdir(os.path.join(folder, 'results'))
    assert not [name for name in results if name.startswith('train_end_')], results

    # The run continues to its end; then, and only then, the end-of-training report is written.
    resumed = warm_python.start_here([CONSOLE_SCRIPT, 'resume', folder, f'fit.num_epochs={_epochs_done(folder) + 1}'],
                                     tmp_path / 'resumed', _env())
    assert warm_python.wait(resumed, timeout=200) == 0, resumed.output()[1][-3000:]
    assert 'interrupted' not in resumed.output()[0]
    assert [name for name in os.listdir(os.path.join(folder, 'results')) if name.startswith('train_end_plots')]


def _epochs_done(folder):
    return torch.load(_latest(folder), weights_only=True)['epoch']


@pytest.mark.timeout(120)
def test_a_recipe_that_does_not_check_exits_with_status_2_and_no_traceback(tmp_path):
    result = subprocess.run([sys.executable, '-m', 'aitoolbox_like', 'train', DIGITS_RECIPE,
                             'callbacks.6.patience=ten', 'optimizer.lr=fast', f'vars.output_dir={tmp_path / "out"}'],
                            cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=100)
    assert result.returncode == 2
    assert "callbacks[6].patience: expected int, got 'ten' (set on the command line)" in result.stderr
    assert "optimizer.lr: expected float or Tensor, got 'fast' (set on the command line)" in result.stderr
    assert 'Traceback' not in result.stderr
    assert not (tmp_path / 'out').exists()        # nothing was built


def test_the_digits_recipe_trains_what_the_digits_script_trains(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, 'examples'))
    try:
        import digits_cnn
    finally:
        sys.path.remove(os.path.join(ROOT, 'examples'))
    script_loop = digits_cnn.main(['--epochs', '2', '--output-dir', str(tmp_path / 'script')])
    assert main(['train', DIGITS_RECIPE, 'fit.num_epochs=2', f'vars.output_dir={tmp_path / "recipe"}']) == 0
    folder = _experiment(tmp_path / 'recipe')
    _assert_bit_equal(_final_weights(folder), script_loop.model.state_dict())
    for name in ('recipe.yaml', 'command_line.txt', 'digits.yaml', 'hyperparams_list.txt'):
        assert os.path.isfile(os.path.join(folder, name)), name
