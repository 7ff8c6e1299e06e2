"""PyTorchLocalModelLoader reads what the saving callbacks and savers write, weights_only."""
import os

import pytest
import torch

from aitoolbox_like.callbacks.model_save import ModelCheckpoint
from aitoolbox_like.checkpoint import CheckpointError
from aitoolbox_like.results.model_loader import AbstractLocalModelLoader, PyTorchLocalModelLoader
from aitoolbox_like.results.basic import ClassificationResultPackage
from aitoolbox_like.train_loop import TrainLoop
from aitoolbox_like.tracking import TrainLoopCheckpointEndSave
from saving_helpers import Net, assert_same_weights, make_parts, weights


class Snapshots(ModelCheckpoint):
    """Keeps a copy of the weights and optimizer state at each epoch checkpoint, to compare with the files."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = {}

    def on_epoch_end(self):
        super().on_epoch_end()
        loop = self.train_loop_obj
        self.seen[loop.epoch] = (weights(loop.model), {k: {n: v.clone() for n, v in s.items()}
                                                       for k, s in loop.optimizer.state_dict()['state'].items()})


@pytest.fixture
def trained(tmp_path):
    model, train, val, test, optimizer = make_parts()
    loop = TrainLoop(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), progress_bar=False)
    checkpoints = Snapshots('proj', 'exp', str(tmp_path), {'lr': 1e-2}, cloud_save_mode='local')
    from aitoolbox_like.callbacks.model_save import ModelTrainEndSave
    end = ModelTrainEndSave('proj', 'exp', str(tmp_path), {'lr': 1e-2},
                            val_result_package=ClassificationResultPackage(), cloud_save_mode='local')
    loop.fit(num_epochs=3, callbacks=[checkpoints, end])
    return loop, checkpoints, tmp_path


def test_final_model_loads_into_a_fresh_model_bit_for_bit(trained):
    loop, _, root = trained
    loader = PyTorchLocalModelLoader(str(root))
    representation = loader.load_model('proj', 'exp', loop.experiment_timestamp, model_save_dir='model')
    assert representation['epoch'] == 2
    fresh = Net()
    assert loader.init_model(fresh) is fresh
    assert_same_weights(weights(fresh), weights(loop.model))


def test_checkpoint_of_an_epoch_restores_weights_and_optimizer(trained):
    loop, checkpoints, root = trained
    loader = PyTorchLocalModelLoader(str(root))
    loader.load_model('proj', 'exp', loop.experiment_timestamp, epoch_num=1)
    model = loader.init_model(Net())
    optimizer = loader.init_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2))
    saved_weights, saved_state = checkpoints.seen[1]
    assert_same_weights(weights(model), saved_weights)
    for idx, state in optimizer.state_dict()['state'].items():
        assert all(torch.equal(state[k], saved_state[idx][k]) for k in saved_state[idx])


def test_no_epoch_in_checkpoint_model_means_the_newest_checkpoint(trained):
    loop, checkpoints, root = trained
    loader = PyTorchLocalModelLoader(str(root))
    assert loader.load_model('proj', 'exp', loop.experiment_timestamp)['epoch'] == 2
    assert_same_weights(loader.init_model(Net()).state_dict(), checkpoints.seen[2][0])


def test_schedulers_and_amp_follow_aitoolboxs_rules(trained):
    loop, _, root = trained
    loader = PyTorchLocalModelLoader(str(root))
    loader.load_model('proj', 'exp', loop.experiment_timestamp, model_save_dir='model')
    assert loader.init_scheduler([]) == []

    class Scheduler:
        def load_state_dict(self, state):
            self.state = state
    with pytest.raises(KeyError, match='ignore_missing_saved=True'):
        loader.init_scheduler([Scheduler()])
    assert len(loader.init_scheduler([Scheduler()], ignore_missing_saved=True)) == 1
    with pytest.raises(CheckpointError, match='without fp16'):
        loader.init_amp(torch.amp.GradScaler('cpu'))


def test_missing_model_error_lists_what_is_saved(trained):
    loop, _, root = trained
    loader = PyTorchLocalModelLoader(str(root))
    with pytest.raises(FileNotFoundError, match=f'model_exp_{loop.experiment_timestamp}_E0.pth'):
        loader.load_model('proj', 'exp', loop.experiment_timestamp, epoch_num=9)
    with pytest.raises(ValueError, match='load_model'):
        PyTorchLocalModelLoader(str(root)).init_model(Net())


def test_a_different_model_is_a_clear_error(trained):
    loop, _, root = trained
    loader = PyTorchLocalModelLoader(str(root))
    loader.load_model('proj', 'exp', loop.experiment_timestamp, model_save_dir='model')
    with pytest.raises(CheckpointError, match='different model'):
        loader.init_model(torch.nn.Linear(6, 3))


class _Custom:
    pass


def test_pickled_objects_are_refused_unless_trusted(tmp_path):
    path = tmp_path / 'old.pth'
    torch.save({'model_state_dict': Net().state_dict(), 'hyperparams': {'obj': _Custom()}}, path)
    with pytest.raises(CheckpointError, match='allow_unsafe_pickle'):
        PyTorchLocalModelLoader(str(tmp_path)).load_model_from_path(str(path))
    loaded = PyTorchLocalModelLoader(str(tmp_path), allow_unsafe_pickle=True).load_model_from_path(str(path))
    assert loaded['schedulers_state_dict'] == []      # back-filled for files saved before schedulers were


def test_loader_is_an_abstract_local_model_loader():
    assert issubclass(PyTorchLocalModelLoader, AbstractLocalModelLoader)
    with pytest.raises(TypeError):
        AbstractLocalModelLoader()


def test_tracking_loop_end_model_loads_for_inference(tmp_path):
    model, train, val, test, optimizer = make_parts(seed=2)
    loop = TrainLoopCheckpointEndSave(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), 'proj', 'exp',
                                      str(tmp_path), {}, val_result_package=ClassificationResultPackage(),
                                      cloud_save_mode='local', progress_bar=False)
    loop.fit(num_epochs=1)
    loader = PyTorchLocalModelLoader(str(tmp_path))
    loader.load_model('proj', 'exp', loop.experiment_timestamp, 'model')
    restored = loader.init_model(Net()).eval()
    x = torch.randn(5, 6)
    assert torch.equal(restored(x), loop.model.eval()(x))
    assert os.path.isfile(loader.model_path)
