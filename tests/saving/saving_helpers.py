"""A small deterministic training set-up shared by the saving tests and the kill -9 scripts."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TTBasicModel


class Net(TTBasicModel):
    """Dropout draws from the global RNG every step, so a resume that restored the RNG wrongly diverges."""

    def __init__(self, big_buffer_floats=0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
        if big_buffer_floats:
            # Makes every checkpoint large, so saving takes long enough to be interrupted.
            self.register_buffer('ballast', torch.zeros(big_buffer_floats))

    def forward(self, x):
        return self.net(x)


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = ((x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()).clamp(max=2)
    return TensorDataset(x, y)


def make_parts(seed=0, big_buffer_floats=0, n_train=40, batch_size=6):
    """Model, loaders and optimizer built the same way in every process."""
    torch.manual_seed(seed)
    model = Net(big_buffer_floats)
    train = DataLoader(data(n_train, 1), batch_size=batch_size, shuffle=True)
    val = DataLoader(data(18, 2), batch_size=batch_size)
    test = DataLoader(data(12, 3), batch_size=batch_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, train, val, test, optimizer


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f'weights differ: {different}'
