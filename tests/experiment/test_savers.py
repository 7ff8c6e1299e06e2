"""Saving an experiment trained without a TrainLoop, into the same layout the callbacks write."""
import json
import os

import pytest
import torch

from aitoolbox_like.experiment import ExperimentUploader
from aitoolbox_like.experiment.model_loader import PyTorchLocalModelLoader
from aitoolbox_like.experiment.savers import (AbstractExperimentSaver, ExperimentFolder,
                                              FullPyTorchExperimentGoogleStorageSaver, FullPyTorchExperimentLocalSaver,
                                              FullPyTorchExperimentS3Saver, LocalResultsSaver,
                                              LocalSubOptimalModelRemover, PyTorchLocalModelSaver)
from aitoolbox_like.history import TrainingHistory
from aitoolbox_like.result_package.basic import ClassificationResultPackage
from s3_server import make_bucket
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


def test_local_saver_writes_the_layout_and_the_loader_reads_the_model_back(tmp_path):
    model, model_dict, package, history = _hand_trained()
    saver = FullPyTorchExperimentLocalSaver('proj', 'exp', str(tmp_path))
    paths = saver.save_experiment(model_dict, package, history, experiment_timestamp=TS, save_true_pred_labels=True)
    folder = tmp_path / 'proj' / f'exp_{TS}'
    assert paths == [str(folder / 'model' / f'model_exp_{TS}.pth'),
                     str(folder / 'results' / f'results_hyperParams_hist_exp_{TS}.json'),
                     str(folder / 'results' / f'true_pred_labels_exp_{TS}.pt')]
    assert sorted(os.listdir(folder)) == ['model', 'results']          # no stray temp files anywhere

    loader = PyTorchLocalModelLoader(str(tmp_path))
    loaded = loader.load_model('proj', 'exp', TS, model_save_dir='model')
    assert_same_weights(weights(loader.init_model(Net())), weights(model))
    assert loaded['hyperparams']['lr'] == 0.1 and loaded['hyperparams']['note'].startswith('<object')

    results = json.loads(open(paths[1]).read())
    assert results['results'] == package.get_results()
    assert results['training_history']['loss'] == history['loss']
    labels = torch.load(paths[2], weights_only=True)
    (name, saved), = labels.items()
    assert torch.equal(saved['y_true'], torch.as_tensor(package.y_true))
    assert torch.equal(saved['y_predicted'], torch.as_tensor(package.y_predicted))


def test_separate_files(tmp_path):
    _, model_dict, package, history = _hand_trained()
    paths = FullPyTorchExperimentLocalSaver('proj', 'exp', str(tmp_path)).save_experiment(
        model_dict, package, history, experiment_timestamp=TS, separate_files=True)
    assert [os.path.basename(p) for p in paths[1:]] == [f'results_exp_{TS}.json', f'hyperparams_exp_{TS}.json',
                                                        f'train_history_exp_{TS}.json']
    assert json.loads(open(paths[2]).read())['hyperparameters']['lr'] == 0.1


def test_bad_input_is_a_clear_error(tmp_path):
    _, model_dict, package, history = _hand_trained()
    saver = FullPyTorchExperimentLocalSaver('proj', 'exp', str(tmp_path))
    with pytest.raises(ValueError, match='optimizer_state_dict'):
        saver.save_experiment({'model_state_dict': {}}, package, history, experiment_timestamp=TS)
    with pytest.raises(ValueError, match='project_name'):
        FullPyTorchExperimentLocalSaver('../x', 'exp', str(tmp_path))
    with pytest.raises(ValueError, match="file_format='json'"):
        LocalResultsSaver(str(tmp_path), file_format='pickle')
    with pytest.raises(NotImplementedError, match='Google Cloud Storage is not supported'):
        FullPyTorchExperimentGoogleStorageSaver('proj', 'exp')
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


def test_s3_saver_uploads_the_same_files(s3_server, monkeypatch, tmp_path):
    monkeypatch.setenv('AWS_ENDPOINT_URL_S3', s3_server.endpoint_url)
    monkeypatch.setattr(ExperimentUploader, 'storage_options', {'max_attempts': 1})
    bucket = make_bucket(s3_server)
    _, model_dict, package, history = _hand_trained()
    saver = FullPyTorchExperimentS3Saver('proj', 'exp', bucket_name=bucket, cloud_dir_prefix='runs',
                                         local_model_result_folder_path=str(tmp_path))
    model_key, results_key = saver.save_experiment(model_dict, package, history, experiment_timestamp=TS,
                                                   save_true_pred_labels=True)
    assert model_key == f'{bucket}/runs/proj/exp_{TS}/model/model_exp_{TS}.pth'
    assert results_key == f'{bucket}/runs/proj/exp_{TS}/results/results_hyperParams_hist_exp_{TS}.json'
    client = s3_server.client()
    for rel in (f'model/model_exp_{TS}.pth', f'results/results_hyperParams_hist_exp_{TS}.json',
                f'results/true_pred_labels_exp_{TS}.pt'):
        remote = client.get_object(Bucket=bucket, Key=f'runs/proj/exp_{TS}/{rel}')['Body'].read()
        assert remote == (tmp_path / 'proj' / f'exp_{TS}' / rel).read_bytes()
