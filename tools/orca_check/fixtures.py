"""What the check trains: Orca's tests' kind of data (100 rows of random features, a regression target, batches of
4), a linear model, and a TrainLoop over them."""
from typing import Any, Tuple

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TrainLoop, TTBasicModel

ROWS = 100
BATCH_SIZE = 4
FEATURES = 5


class LinearModel(TTBasicModel):
    """A linear regression: the batch is ``(features, target)``, as Orca's default forward unpacks it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(FEATURES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def data(seed: int, rows: int = ROWS) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, FEATURES, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(rows, 1, generator=generator))


def loaders(rows: int = ROWS) -> Tuple[DataLoader, DataLoader]:
    """(train, validation) loaders of ``rows`` and 20 rows, batches of 4, not shuffled."""
    return (DataLoader(data(1, rows), batch_size=BATCH_SIZE),
            DataLoader(data(2, 20), batch_size=BATCH_SIZE))


def make_loop(seed: int = 0, rows: int = ROWS, **kwargs: Any) -> TrainLoop:
    torch.manual_seed(seed)
    model = LinearModel()
    train, validation = loaders(rows)
    return TrainLoop(model, train, validation, None, torch.optim.SGD(model.parameters(), lr=0.01), nn.MSELoss(),
                     progress_bar=False, **kwargs)
