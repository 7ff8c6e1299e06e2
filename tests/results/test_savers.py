"""Saving an experiment trained without a TrainLoop, into the same layout the callbacks write."""
import json
import logging
import os
import pickle

import pytest
import torch

from aitoolbox_like.results import savers
from aitoolbox_like.results.model_loader import PyTorchLocalModelLoader
from aitoolbox_like.results.reporting import matplotlib_available
from aitoolbox_like.results.savers import (AbstractExperimentSaver, ExperimentFolder,
                                              FullPyTorchExperimentGoogleStorageSaver, FullPyTorchExperimentLocalSaver,
                                              FullPyTorchExperimentS3Saver, LocalResultsSaver,
                                              LocalSubOptimalModelRemover, PyTorchLocalModelSaver)
from aitoolbox_like.engine.history import TrainingHistory
from aitoolbox_like.results.basic import ClassificationResultPackage
from saving_helpers import Net, assert_same_weights, data, weights

TS = '2024-05-01_10-00-00'


def _hand_trained():
    """A plain PyTorch loop, as a user without a TrainLoop writes it."""
    torch.manual_seed(0)
    model, train = Net(), data(30, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    history = TrainingHistory()
    for epoch in range(2):
        loss = torch.nn.functional.cross_entropy(model(train.tensors[0]), train.tensors[1])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.insert_single_result_into_history('loss', loss.item(), epoch)
    model.eval()
    val = data(12, 2)
    package = ClassificationResultPackage()
    package.prepare_result_package(val.tensors[1], model(val.tensors[0]).argmax(dim=1),
                                   hyperparameters={'lr': 0.1, 'bash_script_path': '',
                                                    'python_experiment_file_path': ''})
    model_dict = {'model_state_dict': model.state_dict(), 'optimizer_state_dict': optimizer.state_dict(),
                  'epoch': 1, 'hyperparams': {'lr': 0.1, 'note': object()}}
    return model, model_dict, package, history


def _plots(folder):
    """The training-history plots the results savers add: one per metric with two values (here 'loss'),
    none without matplotlib."""
    return [str(folder / 'results' / 'plots' / 'loss.png')] if matplotlib_available() else []


def test_local_saver_writes_the_layout_and_the_loader_reads_the_model_back(tmp_path):
    model, model_dict, package, history = _hand_trained()
    saver = FullPyTorchExperimentLocalSaver('proj', 'exp', str(tmp_path))
    paths = saver.save_experiment(model_dict, package, history, experiment_timestamp=TS, save_true_pred_labels=True)
    folder = tmp_path / 'proj' / f'exp_{TS}'
    assert paths == [str(folder / 'model' / f'model_exp_{TS}.pth'),
                     str(folder / 'results' / f'results_hyperParams_hist_exp_{TS}.p')] + _plots(folder)
    assert sorted(os.listdir(folder)) == ['model', 'results']          # no stray temp files anywhere

    loader = PyTorchLocalModelLoader(str(tmp_path))
    loaded = loader.load_model('proj', 'exp', TS, model_save_dir='model')
    assert_same_weights(weights(loader.init_model(Net())), weights(model))
    assert loaded['hyperparams']['lr'] == 0.1 and loaded['hyperparams']['note'].startswith('<object')

    with open(paths[1], 'rb') as f:
        results = pickle.load(f)
    # AIToolbox's dict: the labels first, then the experiment, results, hyperparameters and history.
    assert list(results) == ['y_true', 'y_predicted', 'experiment_name', 'experiment_results_local_path',
                             'results', 'hyperparameters', 'training_history']
    assert results['experiment_name'] == 'exp'
    assert results['experiment_results_local_path'] == str(folder / 'results')
    assert results['results'] == package.get_results()
    assert results['hyperparameters']['lr'] == 0.1
    assert results['training_history']['loss'] == history['loss']
    assert torch.equal(torch.as_tensor(results['y_true']), torch.as_tensor(package.y_true))
    assert torch.equal(torch.as_tensor(results['y_predicted']), torch.as_tensor(package.y_predicted))
    if matplotlib_available():
        with open(paths[2], 'rb') as f:
            assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def test_separate_files(tmp_path):
    _, model_dict, package, history = _hand_trained()
    paths = FullPyTorchExperimentLocalSaver('proj', 'exp', str(tmp_path)).save_experiment(
        model_dict, package, history, experiment_timestamp=TS, separate_files=True)
    assert [os.path.basename(p) for p in paths[1:4]] == [f'results_exp_{TS}.p', f'hyperparams_exp_{TS}.p',
                                                         f'train_history_exp_{TS}.p']
    assert paths[4:] == _plots(tmp_path / 'proj' / f'exp_{TS}')
    with open(paths[2], 'rb') as f:
        assert pickle.load(f)['hyperparameters']['lr'] == 0.1


def test_json_file_format_with_separate_labels_file(tmp_path):
    _, _, package, history = _hand_trained()
    saver = LocalResultsSaver(str(tmp_path), file_format='json')
    saved = saver.save_experiment_results_separate_files(package, history, 'proj', 'exp', TS,
                                                         save_true_pred_labels=True)
    assert [name for name, _ in saved[:4]] == [f'results_exp_{TS}.json', f'hyperparams_exp_{TS}.json',
                                               f'train_history_exp_{TS}.json', f'true_pred_labels_exp_{TS}.json']
    assert saved[4:] == [[os.path.join('plots', 'loss.png'), p] for p in _plots(tmp_path / 'proj' / f'exp_{TS}')]
    contents = [json.loads(open(path).read()) for _, path in saved[:4]]
    assert contents[0]['results'] == pytest.approx(package.get_results())
    assert contents[1]['hyperparameters']['lr'] == 0.1
    assert contents[2]['training_history']['loss'] == history['loss']
    assert contents[3] == {'y_true': list(map(int, package.y_true)), 'y_predicted': list(map(int, package.y_predicted))}

    single = saver.save_experiment_results(package, history, 'proj', 'exp', TS)
    assert single[0] == [f'results_hyperParams_hist_exp_{TS}.json', str(tmp_path / 'proj' / f'exp_{TS}' / 'results' /
                                                                        f'results_hyperParams_hist_exp_{TS}.json')]
    assert sorted(json.loads(open(single[0][1]).read())) == ['experiment_name', 'experiment_results_local_path',
                                                              'hyperparameters', 'results', 'training_history']


def test_without_matplotlib_the_results_are_saved_without_plots_and_one_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(savers, 'matplotlib_available', lambda: False)
    _, _, package, history = _hand_trained()
    with caplog.at_level(logging.WARNING, logger=savers.__name__):
        saved = LocalResultsSaver(str(tmp_path)).save_experiment_results(package, history, 'proj', 'exp', TS)
    assert [name for name, _ in saved] == [f'results_hyperParams_hist_exp_{TS}.p']
    assert not (tmp_path / 'proj' / f'exp_{TS}' / 'results' / 'plots').exists()
    warnings = [r for r in caplog.records if r.name == savers.__name__ and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and 'matplotlib' in warnings[0].getMessage()


def test_bad_input_is_a_clear_error(tmp_path, caplog):
    _, model_dict, package, history = _hand_trained()
    saver = FullPyTorchExperimentLocalSaver('proj', 'exp', str(tmp_path))
    with pytest.raises(ValueError, match='optimizer_state_dict'):
        saver.save_experiment({'model_state_dict': {}}, package, history, experiment_timestamp=TS)
    with pytest.raises(ValueError, match='project_name'):
        FullPyTorchExperimentLocalSaver('../x', 'exp', str(tmp_path))
    # As AIToolbox: an unknown results format falls back to the default pickle, with a warning.
    with caplog.at_level(logging.WARNING, logger=savers.__name__):
        assert LocalResultsSaver(str(tmp_path), file_format='xlsx').file_format == 'pickle'
    assert "'pickle' or 'json'" in caplog.text
    with pytest.raises(TypeError, match='evaluated result package'):
        LocalResultsSaver(str(tmp_path)).save_experiment_results({'Accuracy': 1.0}, history, 'proj', 'exp', TS)
    assert isinstance(saver, AbstractExperimentSaver)


def test_checkpoint_saver_names_and_suboptimal_removal(tmp_path):
    _, model_dict, _, _ = _hand_trained()
    saver = PyTorchLocalModelSaver(str(tmp_path), checkpoint_model=True)
    remover = LocalSubOptimalModelRemover('val_loss', num_best_kept=2)
    history = TrainingHistory()
    saved = []
    for epoch, val_loss in enumerate([0.5, 0.3, 0.4, 0.2]):
        name, path = saver.save_model(model_dict, 'proj', 'exp', TS, epoch=epoch)
        saved.append(path)
        history.insert_single_result_into_history('val_loss', val_loss, epoch)
        remover.decide_if_remove_suboptimal_model(history, [path])
    assert name == f'model_exp_{TS}_E3.pth'
    folder = os.path.dirname(saved[0])
    assert folder == os.path.join(ExperimentFolder.get_base_folder_paths('proj', 'exp', TS, str(tmp_path))[1],
                                  'checkpoint_model')
    assert sorted(os.listdir(folder)) == [f'model_exp_{TS}_E1.pth', f'model_exp_{TS}_E3.pth']
    name, _ = saver.save_model(model_dict, 'proj', 'exp', TS, epoch=4, iteration_idx=9)
    assert name == f'model_exp_{TS}_E4_ITER9.pth'


@pytest.mark.parametrize('cloud', ['s3', 'gs'], indirect=True)
def test_cloud_savers_upload_the_same_files(cloud, tmp_path):
    bucket = cloud.make_bucket()
    _, model_dict, package, history = _hand_trained()
    saver_class = {'s3': FullPyTorchExperimentS3Saver, 'gs': FullPyTorchExperimentGoogleStorageSaver}[cloud.scheme]
    saver = saver_class('proj', 'exp', bucket_name=bucket, cloud_dir_prefix='runs',
                        local_model_result_folder_path=str(tmp_path))
    model_key, results_key = saver.save_experiment(model_dict, package, history, experiment_timestamp=TS,
                                                   save_true_pred_labels=True)
    assert model_key == f'{bucket}/runs/proj/exp_{TS}/model/model_exp_{TS}.pth'
    assert results_key == f'{bucket}/runs/proj/exp_{TS}/results/results_hyperParams_hist_exp_{TS}.p'
    storage = cloud.storage(bucket, f'runs/proj/exp_{TS}')
    plots = ['results/plots/loss.png'] if matplotlib_available() else []
    for rel in [f'model/model_exp_{TS}.pth', f'results/results_hyperParams_hist_exp_{TS}.p'] + plots:
        remote = storage.load_file(rel, tmp_path / 'remote' / rel).read_bytes()
        assert remote == (tmp_path / 'proj' / f'exp_{TS}' / rel).read_bytes()
