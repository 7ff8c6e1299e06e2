"""What the check trains: SG's test data (zero images, label 0), a small classifier, and metrics and losses giving
the values SG's tests give."""
from typing import Any, List, Optional, Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TTModel


class Net(TTModel):
    """A linear classifier over 3x4x4 images (SG's tests use LeNet / ResNet18 on 3x32x32 zeros; the learning
    rates and the stopping epochs they assert do not depend on the model)."""

    def __init__(self, num_classes: int = 5) -> None:
        super().__init__()
        self.fc = nn.Linear(48, num_classes)
        self.sliding: List[Any] = []

    def forward(self, x: torch.Tensor) -> Any:
        return self.fc(x.flatten(1))

    def get_loss(self, batch_data: Any, criterion: Any, device: Any) -> torch.Tensor:
        x, y = batch_data[0], batch_data[1]
        return criterion(self(x.to(device)), y.to(device))

    def get_predictions(self, batch_data: Any, device: Any) -> Any:
        x, y = batch_data[0], batch_data[1]
        return self(x.to(device)), y, None


class ZerosDataset(TensorDataset):
    """SG's classification_test_dataloader's data, with SG's ``transforms`` attributes the stage switches and the
    sliding-window callback use."""

    def __init__(self, size: int) -> None:
        super().__init__(torch.zeros(size, 3, 4, 4), torch.zeros(size, dtype=torch.long))
        self.transforms = Transforms()


class Transforms(list):
    """A list of transforms (YoloX's stage switch closes them), with SG's ``.transforms`` (sliding window)."""

    def __init__(self) -> None:
        super().__init__([Closable()])
        self.transforms: List[Any] = ['default']


class Closable:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def loader(batch_size: int, dataset_size: Optional[int] = None) -> DataLoader:
    """SG's classification_test_dataloader(batch_size, dataset_size)."""
    return DataLoader(ZerosDataset(dataset_size or batch_size), batch_size=batch_size)


class ConstantMetric:
    """A metric whose compute() gives the next value of ``values`` (SG's tests' DummyMetric: always 1; MetricTest:
    a list). ``computed`` counts the compute() calls."""

    def __init__(self, values: Sequence[Any]) -> None:
        self.values = list(values)
        self.computed = 0

    def update(self, *args: Any, **kwargs: Any) -> None:
        pass

    def reset(self) -> None:
        pass

    def compute(self) -> Any:
        value = self.values[min(self.computed, len(self.values) - 1)]
        self.computed += 1
        return value


class EpochLoss(nn.Module):
    """SG's early-stop tests' LossTest: the loss of every batch of epoch e is ``values[e]`` (kept differentiable)."""

    def __init__(self, values: Sequence[float]) -> None:
        super().__init__()
        self.values = torch.tensor(values)
        self.loop: Any = None

    def bind(self, loop: Any) -> None:
        self.loop = loop

    def forward(self, pred: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return (pred * 0).sum() + self.values[self.loop.epoch]


def named(cls: type, name: str) -> type:
    """``cls`` under SG's name for it (SG names a loss or metric by its class name)."""
    return type(name, (cls,), {})
