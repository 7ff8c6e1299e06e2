"""Local experiment saving: the folder layout, checkpoint retention, end-of-training results, experiment ids."""
import json
import os
import pickle
import zipfile

import numpy as np
import pytest
import torch

from aitoolbox_like.callbacks.model_save import ModelCheckpoint
from aitoolbox_like.checkpoint import load_checkpoint
from aitoolbox_like.experiment import BEST_POINTER, bookkeeping_dir, read_pointer
from aitoolbox_like.results.reporting import matplotlib_available
from aitoolbox_like.results.basic import ClassificationResultPackage
from aitoolbox_like.train_loop import TrainLoop
from aitoolbox_like.tracking import TrainLoopCheckpoint, TrainLoopCheckpointEndSave, TrainLoopEndSave
from saving_helpers import assert_same_weights, make_parts, weights


def _parts(seed=0):
    model, train, val, test, optimizer = make_parts(seed=seed)
    return model, train, val, test, optimizer, torch.nn.CrossEntropyLoss()


def _history_plots():
    """The end-of-training plots of these loops' histories (metrics with two or more values), as AIToolbox's
    results saver draws them; none without matplotlib."""
    return ('accumulated_loss', 'val_loss') if matplotlib_available() else ()


def _files(folder):
    return sorted(os.path.relpath(os.path.join(root, f), folder).replace(os.sep, '/')
                  for root, _, files in os.walk(folder) for f in files)


def test_checkpoint_end_save_layout_after_three_epochs(tmp_path):
    source = tmp_path / 'src' / 'mypkg'
    source.mkdir(parents=True)
    (source / 'module.py').write_text('X = 1\n')
    (source / '__pycache__').mkdir()
    (source / '__pycache__' / 'junk.pyc').write_bytes(b'0')
    hyperparams = {'lr': 1e-2, 'batch_size': 6}
    loop = TrainLoopCheckpointEndSave(*_parts(), 'proj', 'exp', str(tmp_path / 'results'), hyperparams,
                                      val_result_package=ClassificationResultPackage(),
                                      test_result_package=ClassificationResultPackage(), cloud_save_mode='local',
                                      source_dirs=[str(source)], progress_bar=False)
    loop.fit(num_epochs=3)
    ts = loop.experiment_timestamp
    folder = tmp_path / 'results' / 'proj' / f'exp_{ts}'
    # Exactly AIToolbox's files; ours are in the bookkeeping folder next to it.
    assert _files(folder) == sorted([
        'hyperparams_list.txt', 'test_model_save.py', 'source_code.zip',
        *[f'checkpoint_model/model_exp_{ts}_E{e}.pth' for e in range(3)],
        f'model/model_exp_{ts}.pth',
        f'results/results_hyperParams_hist_exp_{ts}.p', *[f'results/plots/{m}.png' for m in _history_plots()]])
    # AIToolbox completes the hyperparameters in place with the script and the source folders.
    assert hyperparams['experiment_file_path'] == os.path.abspath(__file__)
    assert 'lr:\t0.01\n' in (folder / 'hyperparams_list.txt').read_text()
    work = bookkeeping_dir(folder)
    assert sorted(os.listdir(work)) == ['best_checkpoint.txt', 'hyperparams.json', 'latest_checkpoint.txt', 'run']
    assert json.loads(open(os.path.join(work, 'hyperparams.json')).read())['batch_size'] == 6
    assert zipfile.ZipFile(folder / 'source_code.zip').namelist() == ['mypkg/module.py']
    assert read_pointer(folder) == str(folder / 'checkpoint_model' / f'model_exp_{ts}_E2.pth')

    final = load_checkpoint(folder / 'model' / f'model_exp_{ts}.pth')
    assert_same_weights(final['model_state_dict'], weights(loop.model))
    with open(folder / 'results' / f'results_hyperParams_hist_exp_{ts}.p', 'rb') as f:
        results = pickle.load(f)
    assert {'ClassificationResult_VAL', 'ClassificationResult_TEST'} <= set(results['results'])
    assert 'Accuracy' in results['results']['ClassificationResult_TEST']
    assert results['training_history']['val_loss'] == loop.train_history['val_loss']
    assert results['hyperparameters']['lr'] == 1e-2
    # AIToolbox saves the targets and predictions of each evaluated set inside the results file.
    for name, predict in (('ClassificationResult_VAL', loop.predict_on_validation_set),
                          ('ClassificationResult_TEST', loop.predict_on_test_set)):
        y_pred, y_true, _ = predict()
        assert np.array_equal(np.asarray(results['y_true'][name]), np.asarray(y_true))
        assert np.array_equal(np.asarray(results['y_predicted'][name]), np.asarray(y_pred))


def test_best_pointer_and_suboptimal_removal_keep_the_best_and_the_newest(tmp_path):
    loop = TrainLoop(*_parts(), progress_bar=False)
    checkpoint = ModelCheckpoint('proj', 'exp', str(tmp_path), {}, cloud_save_mode='local',
                                 rm_subopt_local_models=True, num_best_checkpoints_kept=2, monitor='val_loss')
    loop.fit(num_epochs=5, callbacks=[checkpoint])
    val_loss = loop.train_history['val_loss']
    ranked = sorted(range(5), key=lambda e: val_loss[e])
    folder = os.path.dirname(checkpoint.latest_checkpoint_path)
    ts = loop.experiment_timestamp
    kept = sorted(f for f in os.listdir(folder) if f.endswith('.pth'))
    assert kept == sorted({f'model_exp_{ts}_E{e}.pth' for e in ranked[:2] + [4]})
    assert read_pointer(os.path.dirname(folder), BEST_POINTER) == \
        os.path.join(folder, f'model_exp_{ts}_E{ranked[0]}.pth')


def test_end_save_does_not_rename_the_users_result_package(tmp_path):
    package = ClassificationResultPackage()
    name = package.pkg_name
    loop = TrainLoopEndSave(*_parts(), 'proj', 'exp', str(tmp_path), {}, val_result_package=package,
                            cloud_save_mode='local', progress_bar=False)
    loop.fit(num_epochs=1)
    loop.fit(num_epochs=2)
    assert package.pkg_name == name       # AIToolbox appended '_VAL' on every fit


def test_runs_started_in_the_same_second_get_separate_folders(tmp_path):
    loops = [TrainLoopCheckpoint(*_parts(seed), 'proj', 'exp', str(tmp_path), {'seed': seed}, cloud_save_mode='local',
                                 progress_bar=False) for seed in (0, 1)]
    loops[1].experiment_timestamp = loops[0].experiment_timestamp
    for loop in loops:
        loop.fit(num_epochs=1)
    assert loops[1].experiment_timestamp == loops[0].experiment_timestamp + '_1'
    for seed, loop in enumerate(loops):
        folder = tmp_path / 'proj' / f'exp_{loop.experiment_timestamp}'
        assert f'seed:\t{seed}' in (folder / 'hyperparams_list.txt').read_text()
        saved = load_checkpoint(read_pointer(folder))
        assert_same_weights(saved['model_state_dict'], weights(loop.model))


@pytest.mark.parametrize('project, experiment', [('..', 'exp'), ('proj', '../../etc'), ('/abs', 'exp'),
                                                 ('proj', 'a/b'), ('proj', 'a\\b')])
def test_names_that_would_escape_the_results_folder_are_rejected(tmp_path, project, experiment):
    with pytest.raises(ValueError, match='name|path|"/"'):
        TrainLoopCheckpoint(*_parts(), project, experiment, str(tmp_path), {}, cloud_save_mode='local')
    with pytest.raises(ValueError):
        ModelCheckpoint(project, experiment, str(tmp_path), {}, cloud_save_mode='local')


def test_unknown_cloud_save_mode_is_rejected_at_construction(tmp_path):
    with pytest.raises(ValueError, match="'s3'.*'gcs'.*'azure'.*'local'"):
        ModelCheckpoint('p', 'e', str(tmp_path), {}, cloud_save_mode='dropbox')
    for mode in ('gcs', 'google storage', 'azure'):     # constructing reaches no cloud
        TrainLoopCheckpoint(*_parts(), 'p', 'e', str(tmp_path), {}, cloud_save_mode=mode)


def test_resume_latest_finds_the_newest_experiment_of_the_project(tmp_path):
    first = TrainLoopCheckpoint(*_parts(), 'proj', 'exp', str(tmp_path), {}, cloud_save_mode='local',
                                progress_bar=False)
    first.fit(num_epochs=1)
    resumed = TrainLoopCheckpoint(*_parts(seed=4), 'proj', 'exp', str(tmp_path), {}, cloud_save_mode='local',
                                  progress_bar=False)
    resumed.fit(num_epochs=2, resume_from='latest')
    assert resumed.experiment_timestamp == first.experiment_timestamp
    assert resumed.train_history.get_epochs('val_loss') == [0, 1]
    assert os.listdir(tmp_path / 'proj') == [f'exp_{first.experiment_timestamp}']


TRACKING_LOOPS = (TrainLoopCheckpoint, TrainLoopEndSave, TrainLoopCheckpointEndSave)


def _tracking_loop(cls, tmp_path, **loop_kwargs):
    model, train, val, test, optimizer, criterion = _parts()
    packages = {} if cls is TrainLoopCheckpoint else {'val_result_package': ClassificationResultPackage()}
    return cls(model, train, val, test, optimizer, criterion, 'proj', 'exp', str(tmp_path), {}, **packages,
               cloud_save_mode=None, **loop_kwargs)


@pytest.mark.parametrize('cls', TRACKING_LOOPS)
def test_tracking_loops_pass_every_trainloop_argument_on(cls, tmp_path, monkeypatch):
    # Every argument TrainLoop has after criterion, today's and any added later, reaches TrainLoop.__init__ from each
    # tracking loop by keyword, and the tracking loop's signature lists it (help(), the docs, recipe checks).
    import inspect
    loop_parameters = list(inspect.signature(TrainLoop).parameters.values())[6:]
    assert [p.name for p in loop_parameters][-3:] == ['eval_loss_weighting', 'prefetch_to_device', 'eval_train_set']
    received = {}
    real_init = TrainLoop.__init__

    def recording_init(self, *args, **kwargs):
        received.update(kwargs)
        real_init(self, *args, **kwargs)
    monkeypatch.setattr(TrainLoop, '__init__', recording_init)
    _tracking_loop(cls, tmp_path, **{p.name: p.default for p in loop_parameters})
    assert received == {p.name: p.default for p in loop_parameters}
    signature = inspect.signature(cls).parameters
    assert all(signature[p.name].default is p.default for p in loop_parameters)


@pytest.mark.parametrize('cls', TRACKING_LOOPS)
def test_tracking_loops_compile_and_weight_the_loss_by_sample_like_a_trainloop(cls, tmp_path):
    loop = _tracking_loop(cls, tmp_path, compile={'backend': 'eager'}, eval_loss_weighting='sample',
                          progress_bar=False, preemption_safe=False)
    assert loop.compile_options == {'backend': 'eager'} and loop.compiled_model is not None
    assert loop.eval_loss_weighting == 'sample' and loop.preemption_safe is False
    loop.fit(num_epochs=1)
    model, train, val, test, optimizer, criterion = _parts()
    plain = TrainLoop(model, train, val, test, optimizer, criterion, compile={'backend': 'eager'},
                      eval_loss_weighting='sample', progress_bar=False)
    plain.fit(num_epochs=1)
    assert loop.train_history['val_loss'] == plain.train_history['val_loss']


def test_tracking_loops_take_aitoolbox_s_positional_order(tmp_path):
    # AIToolbox code passes the loop's own arguments by position after the saver's.
    from aitoolbox_like.model.predictions import append_predictions, torch_cat_transf
    model, train, val, test, optimizer, criterion = _parts()
    loop = TrainLoopCheckpoint(model, train, val, test, optimizer, criterion, 'proj', 'exp', str(tmp_path), {}, None,
                               'bucket', '', (), False, 2, 0, append_predictions, torch_cat_transf, 3, True, False,
                               'single', None, False)
    assert (loop.end_auto_eval, loop.lazy_experiment_save, loop.gpu_mode) == (3, True, 'single')
