"""Checks run where they are needed: the bucket at the start of fit (never when a loop or callback is created or
registered, or its experiment details inferred); a checkpoint monitor only where a ranking needs it; AIToolbox's
AttributeError for a plain TrainLoop outside registration, our default folder inside it."""
import logging
import os
import socket

import pytest
import torch

from aitoolbox_like import AbstractCallback, TrainLoop
from aitoolbox_like.callbacks.abstract import AbstractExperimentCallback
from aitoolbox_like.callbacks.model_save import ModelCheckpoint
from aitoolbox_like.experiment import BEST_POINTER, ExperimentUploader, read_pointer
from aitoolbox_like.results.basic import ClassificationResultPackage
from aitoolbox_like.storage import StorageUnreachableError
from aitoolbox_like.tracking import TrainLoopCheckpoint, TrainLoopCheckpointEndSave
from saving_helpers import make_parts


@pytest.fixture
def unreachable_s3(monkeypatch):
    """An S3 endpoint nobody listens on: any request fails at once."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    endpoint = f'http://127.0.0.1:{port}'
    monkeypatch.setenv('AWS_ENDPOINT_URL_S3', endpoint)
    monkeypatch.setenv('AWS_ACCESS_KEY_ID', 'test')
    monkeypatch.setenv('AWS_SECRET_ACCESS_KEY', 'test')
    monkeypatch.setattr(ExperimentUploader, 'storage_options', {'max_attempts': 1})
    return endpoint


def _parts(seed=0):
    model, train, val, test, optimizer = make_parts(seed=seed)
    return model, train, val, test, optimizer, torch.nn.CrossEntropyLoss()


class Named(AbstractExperimentCallback):
    """An experiment callback that infers its details while registered, as the library's callbacks do."""

    def __init__(self, **kwargs):
        super().__init__('named', **kwargs)

    def on_train_loop_registration(self):
        self.try_infer_experiment_details(infer_cloud_details=True)


# ---------------------------------------------------------------------------------------------- the bucket


@pytest.mark.parametrize('lazy', [True, False])
def test_an_s3_loop_is_created_and_registered_without_any_request(tmp_path, unreachable_s3, lazy):
    loop = TrainLoopCheckpointEndSave(*_parts(), 'proj', 'exp', str(tmp_path), {}, cloud_save_mode='s3',
                                      bucket_name='b', val_result_package=ClassificationResultPackage(),
                                      lazy_experiment_save=lazy, progress_bar=False)
    callback = AbstractExperimentCallback('plain')
    loop.callbacks_handler.register_callbacks([callback, Named()])       # also the loop's own savers
    callback.try_infer_experiment_details(infer_cloud_details=True)
    assert (callback.cloud_save_mode, callback.bucket_name) == ('s3', 'b')
    folder = tmp_path / 'proj' / f'exp_{loop.experiment_timestamp}'
    # Without lazy saving the hyperparameter files are written at registration: locally, their upload waits.
    assert (folder / 'hyperparams_list.txt').is_file() != lazy


def test_the_bucket_is_checked_at_the_start_of_fit_before_the_first_step(tmp_path, unreachable_s3):
    class Steps(AbstractCallback):
        def __init__(self):
            super().__init__('steps')
            self.begun = self.batches = 0

        def on_train_begin(self):
            self.begun += 1

        def on_batch_begin(self):
            self.batches += 1

    loop = TrainLoopCheckpoint(*_parts(), 'proj', 'exp', str(tmp_path), {}, cloud_save_mode='s3', bucket_name='b',
                               progress_bar=False)
    steps = Steps()
    with pytest.raises(StorageUnreachableError, match=unreachable_s3):
        loop.fit(num_epochs=1, callbacks=[steps])
    assert steps.batches == 0 and loop.train_history.get_epochs('loss') == []


def test_a_local_experiment_never_touches_the_network(tmp_path, unreachable_s3):
    loop = TrainLoopCheckpoint(*_parts(), 'proj', 'exp', str(tmp_path), {}, cloud_save_mode='local',
                               progress_bar=False)
    loop.fit(num_epochs=1)
    assert loop.upload_failures == [] and loop.experiment_uploader is None


# ---------------------------------------------------------------------------------------------- details


def test_try_infer_experiment_details_raises_for_a_plain_loop_outside_registration(tmp_path):
    loop = TrainLoop(*_parts(), progress_bar=False)
    callback = AbstractExperimentCallback('plain')
    loop.callbacks_handler.register_callbacks([callback])
    for infer_cloud_details in (False, True):
        with pytest.raises(AttributeError):
            callback.try_infer_experiment_details(infer_cloud_details=infer_cloud_details)
    # Given explicitly, nothing is taken from the loop: no error (AIToolbox's rule).
    given = AbstractExperimentCallback('given', 'p', 'e', str(tmp_path), 'local', 'b', '')
    loop.callbacks_handler.register_callbacks([given])
    given.try_infer_experiment_details(infer_cloud_details=True)
    assert (given.project_name, given.cloud_save_mode) == ('p', 'local')


def test_while_registered_a_plain_loop_gives_the_default_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    loop = TrainLoop(*_parts(), progress_bar=False)
    named = Named()
    loop.callbacks_handler.register_callbacks([named])
    assert (named.project_name, named.experiment_name) == ('default_project', 'experiment')
    assert named.local_model_result_folder_path == str(tmp_path / 'experiments')
    assert named.cloud_save_mode is None
    # infer_experiment_details uses the defaults at any time (callbacks that name their experiment later).
    late = AbstractExperimentCallback('late')
    loop.callbacks_handler.register_callbacks([late])
    late.infer_experiment_details(infer_cloud_details=True)
    assert late.experiment_dir_path == str(tmp_path / 'experiments' / 'default_project' /
                                           f'experiment_{loop.experiment_timestamp}')


# ---------------------------------------------------------------------------------------------- the monitor


def _checkpoint_names(loop):
    return sorted(os.listdir(os.path.join(loop.experiment.dir_path, 'checkpoint_model')))


def test_default_monitor_without_end_of_epoch_evaluation_saves_every_epoch(tmp_path, caplog):
    loop = TrainLoop(*_parts(), end_auto_eval=False, progress_bar=False)
    saver = ModelCheckpoint('proj', 'exp', str(tmp_path), {}, cloud_save_mode='local')
    with caplog.at_level(logging.INFO, logger='aitoolbox_like'):
        loop.fit(num_epochs=3, callbacks=[saver])
    ts = loop.experiment_timestamp
    assert _checkpoint_names(loop) == [f'model_exp_{ts}_E{e}.pth' for e in range(3)]
    assert read_pointer(loop.experiment.dir_path).endswith('_E2.pth')
    assert read_pointer(loop.experiment.dir_path, BEST_POINTER) is None      # nothing to rank by
    # Nobody asked for a ranking: said once, and not as a warning.
    notes = [r for r in caplog.records if 'cannot rank them' in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.INFO


def test_rm_subopt_local_models_without_its_monitor_warns_once_and_deletes_nothing(tmp_path, caplog):
    loop = TrainLoopCheckpoint(*_parts(), 'proj', 'exp', str(tmp_path), {}, cloud_save_mode='local',
                               rm_subopt_local_models=True, num_best_checkpoints_kept=1, end_auto_eval=False,
                               progress_bar=False)
    with caplog.at_level(logging.WARNING, logger='aitoolbox_like'):
        loop.fit(num_epochs=3)
    assert len(_checkpoint_names(loop)) == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "'val_loss'" in warnings[0] and 'end_auto_eval=False' in warnings[0]
    assert 'rm_subopt_local_models deletes no checkpoint' in warnings[0]


def test_a_monitor_that_can_never_exist_is_still_refused_before_training(tmp_path):
    model, train, _, test, optimizer, criterion = _parts()
    loop = TrainLoop(model, train, None, test, optimizer, criterion, progress_bar=False)
    saver = ModelCheckpoint('proj', 'exp', str(tmp_path), {}, cloud_save_mode='local', monitor='val_loss')
    with pytest.raises(ValueError, match='no validation_loader'):
        loop.fit(num_epochs=1, callbacks=[saver])
    assert loop.train_history.get_epochs('loss') == []


def test_end_save_checks_its_loaders_when_fit_starts_not_at_registration(tmp_path):
    from aitoolbox_like.callbacks.model_save import ModelTrainEndSave
    model, train, _, test, optimizer, criterion = _parts()
    loop = TrainLoop(model, train, None, test, optimizer, criterion, lazy_experiment_save=True, progress_bar=False)
    saver = ModelTrainEndSave('proj', 'exp', str(tmp_path), {}, val_result_package=ClassificationResultPackage(),
                              cloud_save_mode='local')
    loop.callbacks_handler.register_callbacks([saver])      # as AIToolbox allows
    with pytest.raises(ValueError, match='needs a validation_loader'):
        loop.fit(num_epochs=1)
    assert loop.train_history.get_epochs('loss') == []


def test_checkpoint_hooks_driven_outside_fit_leave_complete_files_when_they_return(tmp_path):
    # AIToolbox code drives a checkpoint callback's hooks by hand, without fit, and lists the folder right after.
    from aitoolbox_like.callbacks.model_save import ModelIterationCheckpoint
    model, train, val, test, optimizer = make_parts()
    from aitoolbox_like.torchtrain.train_loop import TrainLoop as AIToolboxTrainLoop
    callback = ModelIterationCheckpoint(2, 'proj', 'exp', str(tmp_path), {}, cloud_save_mode='local')
    loop = AIToolboxTrainLoop(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss())
    loop.callbacks_handler.register_callbacks([callback])
    loop.callbacks_handler.execute_train_begin()
    for iteration in range(5):
        loop.total_iteration_idx = iteration
        loop.callbacks_handler.execute_batch_end()      # mid-epoch checkpoints at 2 and 4, outside any epoch
    loop.callbacks_handler.execute_epoch_end()
    folder = tmp_path / 'proj' / f'exp_{loop.experiment_timestamp}' / 'checkpoint_model'
    names = sorted(os.listdir(folder))
    assert names == sorted(f'model_exp_{loop.experiment_timestamp}_E0{suffix}.pth'
                           for suffix in ('', '_ITER2', '_ITER4'))
    for name in names:
        assert torch.load(folder / name, weights_only=True)['model_state_dict'].keys() == model.state_dict().keys()
