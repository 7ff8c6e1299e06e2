import glob
import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TrainLoop, TTBasicModel
from aitoolbox_like.callbacks.visualization import PredictionVisualization, SaveBatchImages, make_prediction_figure


class TinyCNN(TTBasicModel):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 10))

    def forward(self, x):
        return self.net(x)


def digits_loaders():
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = torch.tensor(digits.images[:240], dtype=torch.float32).unsqueeze(1) / 16
    y = torch.tensor(digits.target[:240])
    train = DataLoader(TensorDataset(x[:192], y[:192]), batch_size=32, shuffle=True,
                       generator=torch.Generator().manual_seed(1))
    val = DataLoader(TensorDataset(x[192:], y[192:]), batch_size=20)
    return train, val


def fit(num_epochs, callbacks):
    torch.manual_seed(0)
    train, val = digits_loaders()
    model = TinyCNN()
    loop = TrainLoop(model, train, val, None, torch.optim.SGD(model.parameters(), lr=0.5), nn.CrossEntropyLoss(),
                     progress_bar=False)
    loop.fit(num_epochs=num_epochs, callbacks=callbacks)
    return loop


def experiment_dir():
    dirs = glob.glob(os.path.join('experiments', 'default_project', 'experiment_*'))
    assert len(dirs) == 1
    return dirs[0]


def test_batch_image_grids_match_torchvision_and_leave_training_unchanged():
    import matplotlib.image
    callback = SaveBatchImages(num_images=16, nrow=8, save_to_tensorboard=True)
    loop = fit(2, [callback])
    reference = fit(2, [])
    for a, b in zip(loop.model.parameters(), reference.model.parameters()):
        assert torch.equal(a, b)      # drawing the batches did not change what training saw

    folder = os.path.join(experiment_dir(), 'batch_images')
    assert sorted(os.listdir(folder)) == ['train_epoch_0.png', 'train_epoch_1.png', 'val_epoch_0.png',
                                          'val_epoch_1.png']
    saved = matplotlib.image.imread(os.path.join(folder, 'val_epoch_1.png'))
    assert saved.shape[:2] == (2 + 2 * 10, 2 + 8 * 10)      # 2 rows of 8 images of 8x8, padding 2
    first_val = next(iter(loop.validation_loader))[0][:16]
    # torchvision imports as in any script the venv runs (the Makefile's venv has a start-up hook for its CUDA build
    # beside CPU torch: tools/cpu_torchvision.py); here, not at the top, so that only the worker running this test
    # pays its import.
    import torchvision
    expected = torchvision.utils.make_grid(first_val, nrow=8, normalize=True).permute(1, 2, 0).numpy()
    assert abs(saved[..., :3] - expected).max() <= 1 / 255 + 1e-6

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(os.path.join(experiment_dir(), 'tensorboard', 'default_project_experiment'),
                           size_guidance={'images': 0})
    acc.Reload()
    assert [e.step for e in acc.Images('batch_images/train')] == [0, 1]


def test_prediction_grid_every_k_epochs_shows_the_models_predictions():
    import matplotlib.image
    callback = PredictionVisualization(num_images=6, every_n_epochs=2, class_names=[f'digit{i}' for i in range(10)])
    loop = fit(3, [callback])
    folder = os.path.join(experiment_dir(), 'prediction_images')
    assert sorted(os.listdir(folder)) == ['predictions_epoch_0.png', 'predictions_epoch_2.png']
    image = matplotlib.image.imread(os.path.join(folder, 'predictions_epoch_2.png'))
    assert image.shape[0] > 200 and image.std() > 0

    x, y = next(iter(loop.validation_loader))
    loop.model.eval()
    with torch.no_grad():
        by_hand = loop.model(x[:6]).argmax(1)
    predicted, true = callback.last_predictions
    assert torch.equal(predicted, by_hand) and torch.equal(true, y[:6])


def test_prediction_figure_titles():
    images = torch.rand(3, 1, 8, 8)
    fig = make_prediction_figure(images, torch.tensor([1, 2, 0]), torch.tensor([1, 0, 0]), ['a', 'b', 'c'], ncols=2)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ['pred: b / true: b', 'pred: c / true: a', 'pred: a / true: a']
    colors = [ax.title.get_color() for ax in fig.axes if ax.get_title()]
    assert colors == ['green', 'red', 'green']


def test_flat_inputs_need_batch_image_fn():
    train = DataLoader(TensorDataset(torch.rand(8, 64), torch.zeros(8, dtype=torch.long)), batch_size=4)
    model = nn.Sequential(nn.Linear(64, 2))

    class Flat(TTBasicModel):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, x):
            return self.m(x)

    def make_loop():
        flat = Flat()
        return TrainLoop(flat, train, None, None, torch.optim.SGD(flat.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                         progress_bar=False)

    with pytest.raises(ValueError, match='batch_image_fn'):
        make_loop().fit(num_epochs=1, callbacks=[SaveBatchImages(on_val_data=False)])
    make_loop().fit(num_epochs=2, callbacks=[SaveBatchImages(on_val_data=False, batch_image_fn=unflatten)])
    assert os.path.exists(os.path.join(experiment_dir(), 'batch_images', 'train_epoch_1.png'))


def unflatten(batch):
    return batch[0].view(-1, 1, 8, 8)


def test_bad_arguments():
    with pytest.raises(ValueError, match='both False'):
        SaveBatchImages(on_train_data=False, on_val_data=False)
    with pytest.raises(ValueError, match='every_n_epochs'):
        PredictionVisualization(every_n_epochs=0)
    with pytest.raises(ValueError, match='nothing'):
        PredictionVisualization(save_to_file=False)
