"""Small models and data shared by the tests."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TTBasicModel


class MLP(TTBasicModel):
    def __init__(self, in_features=6, hidden=16, out_features=3, dropout=0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, out_features))

    def forward(self, x):
        return self.net(x)


class PlainMLP(nn.Module):
    def __init__(self, in_features=6, hidden=16, out_features=3):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, out_features))

    def forward(self, x):
        return self.net(x)


def classification_data(n=53, in_features=6, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_features, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return TensorDataset(x, y.clamp(max=classes - 1))


def loaders(n=53, batch_size=8, shuffle=True, seed=0):
    train = DataLoader(classification_data(n, seed=seed), batch_size=batch_size, shuffle=shuffle)
    val = DataLoader(classification_data(29, seed=seed + 1), batch_size=batch_size)
    test = DataLoader(classification_data(17, seed=seed + 2), batch_size=batch_size)
    return train, val, test


def state_equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
