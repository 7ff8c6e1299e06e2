"""A tiny model and data for the recipe tests (a recipe imports this file by its path)."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TTModel
from aitoolbox_like.recipes import register_data, register_model


@register_model
class TinyNet(TTModel):
    """Two linear layers on 4 features, 3 classes."""

    def __init__(self, hidden: int = 8):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 3))

    def get_loss(self, batch, criterion, device):
        x, y = batch
        return criterion(self.net(x.to(device)), y.to(device))

    def get_predictions(self, batch, device):
        x, y = batch
        return self.net(x.to(device)).argmax(1), y, None


@register_data
def tiny_loaders(num_samples: int = 64, batch_size: int = 8):
    """A shuffled train loader and a validation loader over the same random samples; no test loader."""
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(num_samples, 4, generator=generator),
                         torch.randint(0, 3, (num_samples,), generator=generator))
    return DataLoader(data, batch_size=batch_size, shuffle=True), DataLoader(data, batch_size=batch_size), None
