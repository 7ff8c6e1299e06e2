"""A new user's first hour: each common mistake gets a message naming what is wrong and the fix, and nothing is
silent or left behind (docs/user-guide.md, "Common mistakes")."""
import glob
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import AbstractCallback, TrainLoop, TTBasicModel
from aitoolbox_like.callbacks.basic import EarlyStopping
from aitoolbox_like.callbacks.model_save import ModelCheckpoint
from aitoolbox_like.callbacks.tensorboard import TensorboardFullTracking

from fresh_process import FreshProcess

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class MLP(TTBasicModel):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 3)

    def forward(self, x):
        return self.layer(x)


def _data(*extra):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4, generator=generator)
    y = torch.randint(0, 3, (16,), generator=generator)
    return DataLoader(TensorDataset(x, *extra, y), batch_size=4)


def _loop(criterion=None, train=None, validation=None):
    torch.manual_seed(0)
    model = MLP()
    return TrainLoop(model, train or _data(), validation, None, torch.optim.SGD(model.parameters(), lr=0.1),
                     criterion if criterion is not None else nn.CrossEntropyLoss()), model


class AddValAccuracy(AbstractCallback):
    """A metric named as performance-evaluation callbacks name theirs ('val_' + the metric's name)."""

    def __init__(self):
        super().__init__('adds val_Accuracy')

    def on_epoch_end(self):
        self.train_loop_obj.insert_metric_result_into_history('val_Accuracy', 0.5)


def _saver(folder, **kwargs):
    return ModelCheckpoint('project', 'run', str(folder), {}, cloud_save_mode='local', async_save=False, **kwargs)


def test_a_misspelt_monitor_is_named_with_the_names_the_history_has_and_the_closest(tmp_path, caplog):
    loop, _ = _loop(validation=_data())
    with caplog.at_level(logging.WARNING, logger='aitoolbox_like'):
        loop.fit(num_epochs=2, callbacks=[AddValAccuracy(), _saver(tmp_path, monitor='val_acc'),
                                          EarlyStopping('val_accuracy', patience=0)])
    messages = [r.getMessage() for r in caplog.records if 'monitors' in r.getMessage()]
    assert len(messages) == 2                 # once each, at the end of the first epoch without it, not every epoch
    for who, monitor in (('ModelCheckpoint', 'val_acc'), ('EarlyStopping', 'val_accuracy')):
        [message] = [m for m in messages if m.startswith(who)]
        assert f"monitors {monitor!r}, but epoch 0 ended without a value" in message
        assert "'val_Accuracy', 'val_loss'" in message and "Did you mean 'val_Accuracy'?" in message
    assert loop.epochs_completed == 2        # AIToolbox code keeps working: a warning, not a stop


def test_a_criterion_class_instead_of_an_instance_is_refused_before_training():
    loop, model = _loop(criterion=nn.CrossEntropyLoss)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(TypeError, match=r'criterion is the class CrossEntropyLoss, not a loss: pass an instance, '
                                        r'e\.g\. CrossEntropyLoss\(\)'):
        loop.fit(num_epochs=1)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_ttbasicmodel_with_a_three_element_batch_says_how_it_feeds_forward_and_what_the_batch_held():
    loop, _ = _loop(train=_data(torch.zeros(16, 2)))
    with pytest.raises(TypeError) as error:
        loop.fit(num_epochs=1)
    message = str(error.value)
    assert 'TTBasicModel feeds every element of a batch but the last to forward() and uses the last as the target' \
        in message
    assert 'held 3 elements (tensor (4, 4), tensor (4, 2), tensor (4,))' in message
    assert 'forward() was called with 2 input(s)' in message and 'subclass TTModel' in message


def test_an_unknown_fit_argument_is_named_first_with_the_closest_one():
    loop, _ = _loop()
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) 'epochs' \(did you mean 'num_epochs'\?\)"):
        loop.fit(epochs=1)
    with pytest.raises(TypeError, match=r"\['num_gpus'\]; these are only accepted with gpu_mode='ddp' or 'fsdp'"):
        loop.fit(num_epochs=1, num_gpus=2)


SCRIPT = textwrap.dedent('''
    import logging, sys
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from aitoolbox_like import TrainLoop, TTBasicModel
    from aitoolbox_like.callbacks.model_save import ModelCheckpoint
    if sys.argv[1] == 'configured':
        logging.basicConfig(level=logging.WARNING, format='user: %(message)s')
    class MLP(TTBasicModel):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 3)
        def forward(self, x):
            return self.layer(x)
    model = MLP()
    data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 3, (8,))), batch_size=4)
    TrainLoop(model, data, None, None, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss()).fit(
        num_epochs=2, callbacks=[ModelCheckpoint('project', 'run', 'results', {}, cloud_save_mode='local')])
    logging.getLogger('aitoolbox_like').info('after fit')
    # The test's view of this process's logging after the fit (a test cannot see it from its own process).
    package = logging.getLogger('aitoolbox_like')
    print(f'after fit: aitoolbox_like level={package.level} handlers={len(package.handlers)} '
          f'root handlers={len(logging.getLogger().handlers)}')
''')


@pytest.mark.parametrize('logging_setup', ['none', 'configured'])
def test_per_epoch_lines_show_without_logging_configured_and_a_configured_program_keeps_its_own(tmp_path,
                                                                                                   logging_setup):
    (tmp_path / 'train.py').write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get('PYTHONPATH')])))
    result = subprocess.run([sys.executable, 'train.py', logging_setup], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=120)     # output is a pipe, not a terminal
    assert result.returncode == 0, result.stderr
    # The fit left the program's logging as it found it: no level on the library's logger, no handler added.
    assert f'after fit: aitoolbox_like level={logging.NOTSET} handlers=0 root handlers=' \
           f'{1 if logging_setup == "configured" else 0}\n' in result.stdout, result.stdout
    lines = result.stderr.splitlines()
    if logging_setup == 'none':
        epochs = [line.split(':')[0] for line in lines if line.startswith('Epoch ')]
        assert epochs == ['Epoch 0', 'Epoch 1']
        [folder_line] = [line for line in lines if line.startswith('Experiment folder: ')]
        assert str(tmp_path / 'results' / 'project' / 'run_') in folder_line and 'checkpoint_model' in folder_line
        assert 'after fit' not in result.stderr         # the handler is the fit's only: it does not stay behind
    else:
        assert not [line for line in lines if 'Epoch ' in line]      # WARNING level: the program's choice


def test_tensorboard_on_a_plain_loop_follows_the_experiment_of_the_checkpoint_callback_and_says_where(tmp_path,
                                                                                                      monkeypatch,
                                                                                                      caplog):
    monkeypatch.chdir(tmp_path)
    loop, _ = _loop()
    with caplog.at_level(logging.INFO, logger='aitoolbox_like'):
        loop.fit(num_epochs=1, callbacks=[TensorboardFullTracking(), _saver(tmp_path / 'results')])
    experiment_dir = loop.experiment.dir_path
    expected = os.path.join(experiment_dir, 'tensorboard', 'project_run')
    assert os.listdir(expected)                                  # event files inside the experiment
    assert not os.path.exists(tmp_path / 'experiments')          # not ./experiments/default_project/...
    assert [r.getMessage() for r in caplog.records if 'TensorBoard event files' in r.getMessage()] == [
        f'TensorboardFullTracking: TensorBoard event files go to {expected}']


def test_a_fit_that_fails_before_its_first_step_leaves_no_experiment_folder_and_the_next_try_trains(tmp_path):
    for _ in range(2):
        loop, _ = _loop()
        with pytest.raises(ValueError, match='no validation_loader'):
            loop.fit(num_epochs=1, callbacks=[_saver(tmp_path, monitor='val_loss')])
    assert os.listdir(tmp_path) == []

    loop, _ = _loop(validation=_data())
    loop.fit(num_epochs=1, callbacks=[_saver(tmp_path, monitor='val_loss')])
    [run] = os.listdir(tmp_path / 'project')
    assert os.listdir(tmp_path / 'project' / run / 'checkpoint_model')


@pytest.mark.timeout(240)
def test_sigterm_under_the_command_line_tells_the_command_that_continues_the_run(tmp_path):
    console_script = os.path.join(os.path.dirname(sys.executable), 'aitoolbox-like')
    recipe = os.path.join(REPO_ROOT, 'examples', 'recipes', 'digits.yaml')
    env = dict(os.environ, OMP_NUM_THREADS='1', MPLBACKEND='Agg')
    env.pop('DIGITS_OUTPUT_DIR', None)
    # The console script started cold, as a shell starts it; SIGTERM to its process, as a scheduler sends it.
    with FreshProcess([console_script, 'train', recipe, 'fit.num_epochs=100', f'vars.output_dir={tmp_path}'],
                      tmp_path, env, tmp_path / 'run') as run:
        deadline = time.monotonic() + 150
        while not glob.glob(str(tmp_path / '.aitoolbox_like' / 'digits' / 'cnn_*' / 'latest_checkpoint.txt')):
            assert run.running() and time.monotonic() < deadline, 'no checkpoint was written'
            time.sleep(0.05)
        run.send(signal.SIGTERM)
        run.wait(timeout=120)                       # kills a run still going after that
    stderr = run.output()[1]
    # docs/user-guide.md: the command exits with status 130 after the checkpoint, and says how to continue.
    assert run.returncode == 130, stderr[-3000:]
    [folder] = glob.glob(str(tmp_path / 'digits' / 'cnn_*'))
    assert f'continue with aitoolbox-like resume {folder}' in stderr, stderr[-3000:]
    assert "resume_from='latest'" not in stderr
