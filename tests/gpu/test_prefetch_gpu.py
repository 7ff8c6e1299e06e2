"""Batches prefetched to the GPU (aitoolbox_like.runtime.prefetch): a fit with the default callbacks makes no host sync at
all (it runs under ``torch.cuda.set_sync_debug_mode('error')``), prefetching gives the weights of the same fit
without it to the bit, and a batch element the loop cannot move is left to the model."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from aitoolbox_like import TrainLoop, TTModel
from gpu_common import dataset, parts, weights


def _loop(device, prefetch_to_device=None, progress_bar=False):
    model, _, _, optimizer = parts(device, optimizer='adam')
    # Worker processes and pinned memory, as a GPU run's loaders usually are: the loop prefetches by default.
    train = DataLoader(dataset(96, 1), batch_size=16, shuffle=True, num_workers=2, pin_memory=True,
                       generator=torch.Generator().manual_seed(3))
    val = DataLoader(dataset(40, 2), batch_size=16, num_workers=2, pin_memory=True)
    return TrainLoop(model, train, val, None, optimizer, nn.CrossEntropyLoss(), cuda_device_idx=0,
                     progress_bar=progress_bar, prefetch_to_device=prefetch_to_device)


def test_a_fit_with_the_default_callbacks_makes_no_host_sync(device):
    if device.type != 'cuda':
        pytest.skip('host syncs are a CUDA matter')
    loop = _loop(device, progress_bar=True)     # the progress bar shows the running loss: read without a sync
    # The model and the optimizer are on the GPU already (parts): fit moves nothing synchronously.
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode('error')
    try:
        loop.fit(num_epochs=2)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    assert len(loop.train_history['val_loss']) == 2 and len(loop.train_history['accumulated_loss']) == 2


def test_prefetching_gives_the_weights_of_the_same_fit_without_it_to_the_bit(device):
    if device.type != 'cuda':
        pytest.skip('prefetching copies to a CUDA device')
    torch.manual_seed(11)
    plain = _loop(device, prefetch_to_device=False)
    plain.fit(num_epochs=2)
    torch.manual_seed(11)
    prefetched = _loop(device)
    prefetched.fit(num_epochs=2)
    assert weights(plain.model).keys() == weights(prefetched.model).keys()
    assert all(torch.equal(a, b) for a, b in zip(weights(plain.model).values(), weights(prefetched.model).values()))
    assert plain.train_history['val_loss'] == prefetched.train_history['val_loss']


class Tagged:
    """A batch element the loop cannot move: the model moves what it needs itself."""

    def __init__(self, x):
        self.x = x


class TaggedData(Dataset):
    def __init__(self):
        self.data = dataset(32, 4)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        x, y = self.data[i]
        return x, y


def _collate(items):
    xs, ys = zip(*items)
    return Tagged(torch.stack(xs)), torch.stack(ys)


class TaggedModel(TTModel):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc(x)

    def get_loss(self, batch_data, criterion, device):
        tagged, y = batch_data
        assert y.device.type == 'cuda'          # the tensor was moved by the prefetcher
        assert tagged.x.device.type == 'cpu'    # the object was left as it came
        return criterion(self(tagged.x.to(device)), y)

    def get_predictions(self, batch_data, device):
        tagged, y = batch_data
        return self(tagged.x.to(device)), y, None


def test_a_batch_element_the_loop_cannot_move_is_left_to_the_model(device):
    if device.type != 'cuda':
        pytest.skip('prefetching copies to a CUDA device')
    model = TaggedModel().to(device)
    loader = DataLoader(TaggedData(), batch_size=8, num_workers=1, collate_fn=_collate)
    loop = TrainLoop(model, loader, None, None, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                     cuda_device_idx=0, progress_bar=False, end_auto_eval=False)
    loop.fit(num_epochs=1)
    assert len(loop.train_history['accumulated_loss']) == 1
