"""The core seam the command line saves its files through: TrainLoop.experiment_files, written by the saving
callbacks next to the hyperparameter files (atomically, again only when a text changed)."""
import os

import pytest
import torch

from aitoolbox_like.tracking import TrainLoopCheckpoint
from recipe_parts import TinyNet, tiny_loaders


def _loop(tmp_path, files):
    torch.manual_seed(0)
    model = TinyNet()
    train, val, _ = tiny_loaders()
    loop = TrainLoopCheckpoint(model, train, val, None, torch.optim.SGD(model.parameters(), lr=0.1),
                               torch.nn.CrossEntropyLoss(), 'p', 'e', str(tmp_path), {}, cloud_save_mode='local',
                               progress_bar=False)
    loop.experiment_files.update(files)
    return loop


def test_experiment_files_are_written_with_the_hyperparameters_and_rewritten_when_changed(tmp_path):
    first = _loop(tmp_path, {'notes.txt': 'first run\n'})
    first.fit(num_epochs=1)
    folder = first.experiment.dir_path
    path = os.path.join(folder, 'notes.txt')
    with open(path) as f:
        assert f.read() == 'first run\n'
    assert os.path.isfile(os.path.join(folder, 'hyperparams_list.txt'))
    written_at = os.stat(path).st_mtime_ns

    same = _loop(tmp_path, {'notes.txt': 'first run\n'})
    same.fit(num_epochs=2, resume_from=folder)
    assert os.stat(path).st_mtime_ns == written_at        # unchanged text: not written again

    changed = _loop(tmp_path, {'notes.txt': 'first run\nresumed\n'})
    changed.fit(num_epochs=3, resume_from=folder)
    with open(path) as f:
        assert f.read() == 'first run\nresumed\n'
    assert [n for n in os.listdir(folder) if n.endswith('.tmp')] == []


@pytest.mark.parametrize('name', ['hyperparams_list.txt', 'latest_checkpoint.txt', '../outside.txt'])
def test_the_experiment_s_own_files_and_paths_outside_it_are_refused(tmp_path, name):
    loop = _loop(tmp_path, {name: 'x'})
    with pytest.raises(ValueError, match='experiment_files'):
        loop.fit(num_epochs=1)
    assert not (tmp_path / 'outside.txt').exists()
