"""The CPU side of prefetching batches to the GPU (aitoolbox_like.runtime.prefetch): the order and the one-batch lead, what
is moved and what is left to the model, when a fit prefetches, and a fit through the prefetcher equal to the bit to
one without it (also across a resume in the middle of an epoch). The copies and streams run in tests/gpu."""
import collections
import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from aitoolbox_like import TTBasicModel
from aitoolbox_like.engine import train_loop as train_loop_module
from aitoolbox_like.runtime.prefetch import DevicePrefetcher, move_batch, prefetch_applies
from aitoolbox_like.tracking import TrainLoopCheckpoint


class Counting:
    """An iterator that counts how many items were taken from it."""

    def __init__(self, items):
        self.items, self.taken = iter(items), 0

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self.items)
        self.taken += 1
        return item


def test_batches_come_in_order_each_one_taken_a_batch_ahead():
    source = Counting([torch.tensor([i]) for i in range(4)])
    prefetcher = DevicePrefetcher(source, torch.device('cpu'))
    assert source.taken == 1                    # the first batch is taken when the epoch opens
    got = []
    for batch in prefetcher:
        got.append(int(batch))
        assert source.taken == min(len(got) + 1, 4)    # the next one is taken while this one trains
    assert got == [0, 1, 2, 3]
    assert list(DevicePrefetcher(iter([]), torch.device('cpu'))) == []


Pair = collections.namedtuple('Pair', 'x y')


class Opaque:
    """A batch element the loop cannot move: left for the model, as without prefetching."""


def test_tensors_in_tuples_lists_and_dicts_move_and_anything_else_is_left_as_it_is():
    opaque = Opaque()
    batch = (torch.ones(2), [torch.zeros(1), opaque], {'mask': torch.ones(3)}, Pair(torch.ones(1), 7), 'id-3')
    moved = move_batch(batch, torch.device('cpu'), pin=False)
    assert type(moved) is tuple and type(moved[3]) is Pair and moved[3].y == 7
    assert moved[1][1] is opaque and moved[4] == 'id-3'
    assert torch.equal(moved[2]['mask'], torch.ones(3))


class _FakeLoader:
    def __init__(self, num_workers):
        self.num_workers = num_workers


def test_a_fit_prefetches_on_cuda_by_default_only_when_the_loader_has_workers():
    cuda, cpu = torch.device('cuda', 0), torch.device('cpu')
    assert prefetch_applies(cuda, _FakeLoader(2), None)
    assert not prefetch_applies(cuda, _FakeLoader(0), None)     # the dataset runs in the training process
    assert not prefetch_applies(cuda, [(torch.ones(1),)], None)   # a plain list of batches
    assert prefetch_applies(cuda, _FakeLoader(0), True)
    assert not prefetch_applies(cuda, _FakeLoader(2), False)
    assert not prefetch_applies(cpu, _FakeLoader(2), True)


class Augmented(Dataset):
    """Draws from torch's generator in __getitem__ (an augmentation), which workers do in their own processes."""

    def __init__(self, n=48):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + 0.1 * torch.randn(6), self.y[i]


class Net(TTBasicModel):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)


def _loop(folder, seed=0):
    torch.manual_seed(seed)
    model = Net()
    loader = DataLoader(Augmented(), batch_size=8, shuffle=True, num_workers=2,
                        generator=torch.Generator().manual_seed(1), persistent_workers=False)
    return TrainLoopCheckpoint(model, loader, None, None, torch.optim.SGD(model.parameters(), lr=0.1),
                               nn.CrossEntropyLoss(), 'proj', 'run', str(folder), {}, cloud_save_mode='local',
                               iteration_save_freq=4, progress_bar=False, end_auto_eval=False)


def test_a_fit_through_the_prefetcher_equals_one_without_to_the_bit_also_resumed_mid_epoch(tmp_path, monkeypatch):
    torch.manual_seed(123)
    plain = _loop(tmp_path / 'plain')
    plain.fit(num_epochs=2)

    used = []
    monkeypatch.setattr(train_loop_module, 'prefetch_applies', lambda *args: used.append(True) or True)
    torch.manual_seed(123)
    prefetched = _loop(tmp_path / 'prefetched')
    prefetched.fit(num_epochs=2)
    assert used and all(torch.equal(a, b) for a, b in zip(plain.model.state_dict().values(),
                                                         prefetched.model.state_dict().values()))

    class Killed(RuntimeError):
        pass

    class KillAtBatch10(train_loop_module.AbstractCallback):
        def on_batch_begin(self):
            if self.train_loop_obj.total_iteration_idx == 9:
                raise Killed

    torch.manual_seed(123)
    first = _loop(tmp_path / 'resumed')
    with pytest.raises(Killed):
        first.fit(num_epochs=2, callbacks=[KillAtBatch10('kill')])
    folder = os.path.join(first.experiment.dir_path, 'checkpoint_model')
    [mid_epoch] = [name for name in os.listdir(folder) if 'E1_ITER8' in name]     # 2 batches into epoch 1
    resumed = _loop(tmp_path / 'resumed', seed=5)
    resumed.fit(num_epochs=2, resume_from=os.path.join(folder, mid_epoch))
    assert all(torch.equal(a, b) for a, b in zip(plain.model.state_dict().values(),
                                                 resumed.model.state_dict().values()))
