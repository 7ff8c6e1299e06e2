"""Reports written into the experiment folder without a TrainLoop."""
import csv
import os
import zipfile

import pytest
import torch

from aitoolbox_like.results.reporting import (GradientPlotter, HyperParamSourceReporter, TrainingHistoryPlotter,
                                                 TrainingHistoryWriter)
from aitoolbox_like.engine.history import TrainingHistory

pytest.importorskip('matplotlib')


def test_hyperparam_source_reporter_writes_the_text_file_script_and_sources(tmp_path):
    source = tmp_path / 'src' / 'pkg'
    source.mkdir(parents=True)
    (source / 'a.py').write_text('A = 1\n')
    script = tmp_path / 'train.py'
    script.write_text('print(1)\n')
    reporter = HyperParamSourceReporter('proj', 'exp', 'ts', str(tmp_path / 'out'))
    hyperparams = {'lr': 0.1, 'batch': 4, 'experiment_file_path': str(script), 'source_dirs_paths': [str(source)]}
    path = reporter.save_hyperparams_to_text_file(hyperparams, sort_names=True)
    assert open(path).read().splitlines()[:2] == ['batch:\t4', f'experiment_file_path:\t{script}']
    assert open(reporter.save_experiment_python_file(hyperparams)).read() == 'print(1)\n'
    assert zipfile.ZipFile(reporter.save_experiment_source_files(hyperparams)).namelist() == ['pkg/a.py']
    assert reporter.experiment_dir_path == str(tmp_path / 'out' / 'proj' / 'exp_ts')


def _history():
    history = TrainingHistory()
    for epoch, (loss, acc) in enumerate([(1.0, 0.5), (0.7, 0.6), (0.5, 0.8)]):
        history.insert_single_result_into_history('loss', loss, epoch)
        history.insert_single_result_into_history('accuracy', acc, epoch)
    return history


def test_history_plotter_and_writer(tmp_path):
    paths = TrainingHistoryPlotter(str(tmp_path)).generate_report(_history())
    assert sorted(rel for rel, _ in paths) == [os.path.join('plots', 'accuracy.png'), os.path.join('plots', 'loss.png')]
    assert all(os.path.getsize(p) > 0 for _, p in paths)
    writer = TrainingHistoryWriter(str(tmp_path))
    rel, path = writer.generate_report(_history(), epoch=2, file_name='hist.tsv', file_format='tsv')
    rows = list(csv.reader(open(path), delimiter='\t'))
    assert rows == [['Epoch', 'loss', 'accuracy'], ['2', '0.5', '0.8']]
    with pytest.raises(ValueError, match='file_format'):
        writer.generate_report(_history(), 2, 'x', file_format='xlsx')


def test_gradient_plotter_skips_layers_without_gradients(tmp_path):
    paths = GradientPlotter(str(tmp_path)).generate_report([torch.randn(100), None, torch.randn(50).numpy()])
    assert [rel for rel, _ in paths] == [os.path.join('grad_plots', 'layer_0.png'),
                                         os.path.join('grad_plots', 'layer_2.png')]
