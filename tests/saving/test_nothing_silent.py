"""Mistakes users make are reported clearly, before they cost anything, and a failed load changes nothing."""
import logging
import os
import pickle

import pytest
import torch
from torch import nn

from aitoolbox_like import AbstractCallback, TTModel
from aitoolbox_like.callbacks.model_save import ModelCheckpoint
from aitoolbox_like.callbacks.train_schedule import StepLRScheduler
from aitoolbox_like.checkpoint import CheckpointError, load_checkpoint
from aitoolbox_like.experiment import BEST_POINTER, MARKER_FILE, read_pointer
from aitoolbox_like.tracking import TrainLoopCheckpoint
from aitoolbox_like.train_loop import TrainLoop
from helpers import MLP, loaders
from s3_server import make_bucket


def state_copy(module_or_optimizer):
    return pickle.loads(pickle.dumps(module_or_optimizer.state_dict()))


def same_state(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    return a == b


def checkpointing_loop(tmp_path, model, optimizer, experiment='run'):
    train, val, _ = loaders()
    return TrainLoopCheckpoint(model, train, val, None, optimizer, nn.CrossEntropyLoss(), project_name='project',
                               experiment_name=experiment, local_model_result_folder_path=str(tmp_path),
                               hyperparams={}, cloud_save_mode='local')


def trained_checkpoint(tmp_path, optimizer_cls=torch.optim.SGD):
    torch.manual_seed(0)
    model = MLP()
    loop = checkpointing_loop(tmp_path, model, optimizer_cls(model.parameters(), lr=0.01))
    loop.fit(num_epochs=1)
    return loop


def test_checkpoint_of_another_architecture_changes_nothing(tmp_path):
    loop = trained_checkpoint(tmp_path)
    marker = os.path.join(loop.experiment.work_dir, MARKER_FILE)
    marker_before = open(marker).read()

    torch.manual_seed(1)
    other = MLP(out_features=4)      # the first layer has the saved shapes, the last does not
    optimizer = torch.optim.SGD(other.parameters(), lr=0.01, momentum=0.9)
    other_loop = checkpointing_loop(tmp_path, other, optimizer)
    weights_before, optimizer_before = state_copy(other), state_copy(optimizer)
    with pytest.raises(CheckpointError, match=r'different model .*different shapes.*Nothing was loaded'):
        other_loop.fit(num_epochs=2, resume_from='latest')
    assert same_state(state_copy(other), weights_before)          # not even the matching first layer
    assert same_state(state_copy(optimizer), optimizer_before)
    assert open(marker).read() == marker_before                   # the experiment's run marker is untouched


def test_optimizer_class_mismatch_is_refused_before_a_step(tmp_path):
    loop = trained_checkpoint(tmp_path, torch.optim.Adam)
    assert loop.train_history['accumulated_loss']
    torch.manual_seed(0)
    model = MLP()
    sgd_loop = checkpointing_loop(tmp_path, model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    before = state_copy(model)
    with pytest.raises(CheckpointError, match='saved with the optimizer Adam, but this TrainLoop has SGD'):
        sgd_loop.fit(num_epochs=2, resume_from='latest')
    assert same_state(state_copy(model), before)


def test_the_same_callback_object_twice_is_registered_once(caplog):
    model = MLP()
    train, val, _ = loaders()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = StepLRScheduler(step_size=1, gamma=0.5)
    loop = TrainLoop(model, train, val, None, optimizer, nn.CrossEntropyLoss())
    with caplog.at_level(logging.WARNING):
        loop.fit(num_epochs=2, callbacks=[scheduler, scheduler])
    assert optimizer.param_groups[0]['lr'] == 0.25          # halved once per epoch, not twice
    assert sum(cb is scheduler for cb in loop.callbacks) == 1
    assert 'more than once' in caplog.text


@pytest.mark.parametrize('make, error, match', [
    (lambda m, t, v: TrainLoop(m, t, v, None, torch.optim.SGD(MLP().parameters(), lr=0.1), nn.CrossEntropyLoss()),
     ValueError, "holds none of the model's parameters"),
    (lambda m, t, v: TrainLoop(m, t, v, None, torch.optim.SGD(m.parameters(), lr=0.1), None),
     ValueError, 'TTBasicModel.*criterion=None'),
])
def test_fit_refuses_wrong_pieces_before_the_first_step(make, error, match):
    model = MLP()
    train, val, _ = loaders()
    loop = make(model, train, val)
    before = state_copy(model)
    with pytest.raises(error, match=match):
        loop.fit(num_epochs=1)
    assert loop.total_iteration_idx == -1 and same_state(state_copy(model), before)


def test_fit_checks_resume_from_hyperparams_and_monitor_before_training(tmp_path):
    model = MLP()
    train, val, _ = loaders()
    loop = TrainLoop(model, train, None, None, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    with pytest.raises(TypeError, match='resume_from must be a checkpoint path'):
        loop.fit(num_epochs=1, resume_from=3)
    with pytest.raises(TypeError, match='hyperparams must be a dict'):
        loop.fit(num_epochs=1, callbacks=[ModelCheckpoint('p', 'e', str(tmp_path), hyperparams=['lr', 0.1],
                                                          cloud_save_mode='local')])
    loop = TrainLoop(model, train, None, None, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match="monitor='val_loss' but the TrainLoop has no validation_loader"):
        loop.fit(num_epochs=1, callbacks=[ModelCheckpoint('p', 'e', str(tmp_path), {}, cloud_save_mode='local',
                                                          monitor='val_loss')])
    assert loop.total_iteration_idx == -1


def test_an_unknown_monitor_deletes_no_checkpoint_and_says_so(tmp_path, caplog):
    model = MLP()
    train, val, _ = loaders()
    loop = TrainLoop(model, train, val, None, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    checkpoint = ModelCheckpoint('p', 'e', str(tmp_path), {}, cloud_save_mode='local', rm_subopt_local_models=True,
                                 num_best_checkpoints_kept=1, monitor='val_acuracy')
    with caplog.at_level(logging.WARNING):
        loop.fit(num_epochs=3, callbacks=[checkpoint])
    folder = os.path.join(loop.experiment.dir_path, 'checkpoint_model')
    assert len(os.listdir(folder)) == 3
    # Said once, at the end of the first epoch, with the closest name the history has.
    assert caplog.text.count("ModelCheckpoint monitors 'val_acuracy', but epoch 0 ended without a value") == 1
    assert 'nothing is decided by it' in caplog.text


class NaNFromEpoch(TTModel):
    """Its loss is NaN from epoch ``bad_epoch`` on (as when training diverges)."""

    def __init__(self, bad_epoch):
        super().__init__()
        self.net = nn.Linear(6, 3)
        self.bad_epoch = bad_epoch
        self.epoch = 0

    def forward(self, x):
        return self.net(x)

    def get_loss(self, batch_data, criterion, device):
        x, y = batch_data
        loss = criterion(self(x), y)
        return loss * float('nan') if self.epoch >= self.bad_epoch else loss

    def get_predictions(self, batch_data, device):
        x, y = batch_data
        return self(x), y, None


def test_a_nan_loss_never_makes_the_best_checkpoint(tmp_path, caplog):
    model = NaNFromEpoch(bad_epoch=1)
    train, _, _ = loaders()
    loop = TrainLoop(model, train, None, None, torch.optim.SGD(model.parameters(), lr=0.0), nn.CrossEntropyLoss())
    checkpoint = ModelCheckpoint('p', 'e', str(tmp_path), {}, cloud_save_mode='local', monitor='accumulated_loss')

    class Epoch(AbstractCallback):    # tells the model which epoch it is
        def __init__(self):
            super().__init__('epoch')

        def on_epoch_begin(self):
            model.epoch = self.train_loop_obj.epoch

    with caplog.at_level(logging.WARNING):
        loop.fit(num_epochs=3, callbacks=[Epoch(), checkpoint])
    assert read_pointer(loop.experiment.dir_path, BEST_POINTER).endswith('_E0.pth')
    assert caplog.text.count('is NaN in epoch') == 1


class ReturnsPythonFloat(MLP):
    def get_loss(self, batch_data, criterion, device):
        return super().get_loss(batch_data, criterion, device).item()


class ReturnsPerSampleLosses(MLP):
    def get_loss(self, batch_data, criterion, device):
        x, y = batch_data
        return nn.functional.cross_entropy(self(x), y, reduction='none')


class ReturnsDetachedLoss(MLP):
    def get_loss(self, batch_data, criterion, device):
        return super().get_loss(batch_data, criterion, device).detach()


@pytest.mark.parametrize('model_cls, error, match', [
    (ReturnsPythonFloat, TypeError, r'ReturnsPythonFloat.get_loss returned the Python number .*not loss.item\(\)'),
    (ReturnsPerSampleLosses, ValueError, r'ReturnsPerSampleLosses.get_loss returned a loss of shape \(8,\)'),
    (ReturnsDetachedLoss, RuntimeError, r'ReturnsDetachedLoss.get_loss returned a loss that is not connected to the '
                                        r'parameters .*not loss.detach\(\)'),
])
def test_get_loss_returning_a_wrong_value_names_the_method(model_cls, error, match):
    model = model_cls()
    before = state_copy(model)
    train, _, _ = loaders()
    loop = TrainLoop(model, train, None, None, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    with pytest.raises(error, match=match):
        loop.fit(num_epochs=1)
    assert same_state(before, model.state_dict())


def test_a_results_folder_that_is_a_file_is_named_as_the_argument_before_anything_is_written(tmp_path):
    model = MLP()
    a_file = tmp_path / 'results.txt'
    a_file.write_text('not a folder')
    loop = checkpointing_loop(a_file / 'runs', model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(NotADirectoryError, match=r"local_model_result_folder_path='.*results.txt/runs': "
                                                 r"'.*results.txt' is a file, not a folder"):
        loop.fit(num_epochs=1)
    assert a_file.read_text() == 'not a folder' and sorted(os.listdir(tmp_path)) == ['results.txt']


KILLED_IN_FIRST_SAVE = '''
import os, signal, sys
sys.path.insert(0, {tests!r})
import torch
sys.path.insert(0, {here!r})
from test_nothing_silent import checkpointing_loop
from helpers import MLP
os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)    # kill -9 in the middle of the run's first write
model = MLP()
checkpointing_loop({root!r}, model, torch.optim.SGD(model.parameters(), lr=0.1)).fit(num_epochs=1)
'''


def test_a_failed_resume_latest_removes_what_a_run_killed_in_its_first_save_left(tmp_path):
    import signal
    import subprocess
    import sys
    tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'support')
    script = KILLED_IN_FIRST_SAVE.format(tests=tests, here=os.path.dirname(os.path.abspath(__file__)),
                                         root=str(tmp_path))
    killed = subprocess.run([sys.executable, '-c', script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    left = [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files if f.endswith(('.tmp', '.partial'))]
    assert left, 'the kill left no unfinished write to clean up'

    model = MLP()
    before = state_copy(model)
    with pytest.raises(FileNotFoundError, match=r"no checkpoint of experiment project/run .*removed 1 unfinished "
                                                r"write\(s\) left by runs killed before their first checkpoint"):
        checkpointing_loop(tmp_path, model, torch.optim.SGD(model.parameters(), lr=0.1)).fit(
            num_epochs=1, resume_from='latest')
    assert not [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files
                if f.endswith(('.tmp', '.partial'))]
    assert same_state(before, model.state_dict())


def test_a_plain_pickle_is_named_as_such(tmp_path):
    path = tmp_path / 'model.pth'
    with open(path, 'wb') as f:
        pickle.dump({'model_state_dict': {'w': [1.0]}}, f)
    with pytest.raises(CheckpointError, match='is a plain pickle file, not a weights-only checkpoint'):
        load_checkpoint(str(path))


def test_loading_from_s3_names_the_s3_address(s3_server, tmp_path, monkeypatch):
    monkeypatch.setenv('AWS_ENDPOINT_URL_S3', s3_server.endpoint_url)
    bucket = make_bucket(s3_server)
    s3_server.client().put_object(Bucket=bucket, Key='exp/checkpoint_model/model.pth', Body=b'not a checkpoint')
    model = MLP()
    train, _, _ = loaders()
    loop = TrainLoop(model, train, None, None, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())
    with pytest.raises(CheckpointError) as error:
        loop.fit(num_epochs=1, resume_from=f's3://{bucket}/exp/checkpoint_model/model.pth')
    assert f's3://{bucket}/exp/checkpoint_model/model.pth' in str(error.value)
    assert 'aitoolbox_like_resume_' not in str(error.value)
