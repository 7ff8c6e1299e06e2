"""Several losses / several optimizers behind the single-loss, single-optimizer interface."""
from collections.abc import Mapping

import torch


class MultiLoss(Mapping):
    """A dict of named losses that backpropagates as one: ``backward()`` runs each loss's backward
    (keeping the graph until the last), ``item()`` gives ``{name: float}``.

    Unlike AIToolbox, the loop backpropagates every loss once per batch and then steps every optimizer;
    ``loss_optimizer_map`` and the arguments of ``backward`` are accepted for compatibility and unused.
    """

    def __init__(self, loss_dict, loss_optimizer_map=None, retain_graph_until_last=True):
        if isinstance(loss_dict, (list, tuple)):
            loss_dict = {f'loss_{i}': loss for i, loss in enumerate(loss_dict)}
        if not isinstance(loss_dict, dict) or not loss_dict:
            raise TypeError('MultiLoss needs a non-empty dict {name: loss tensor} (or a list of loss tensors)')
        self.loss_dict = dict(loss_dict)
        self.loss_optimizer_map = loss_optimizer_map
        self.retain_graph_until_last = retain_graph_until_last

    def _map(self, fn):
        return MultiLoss({k: fn(v) for k, v in self.loss_dict.items()}, self.loss_optimizer_map,
                         self.retain_graph_until_last)

    def backward(self, optimizer_idx=None, iteration=None, amp_grad_scaler=None):
        losses = list(self.loss_dict.values())
        for i, loss in enumerate(losses):
            loss.backward(retain_graph=self.retain_graph_until_last and i < len(losses) - 1)

    def __truediv__(self, divisor):
        return self._map(lambda loss: loss / divisor)

    def scale(self, amp_scaler):
        return self._map(amp_scaler.scale)

    def detach(self):
        return self._map(torch.Tensor.detach)

    def item(self):
        return {k: v.item() for k, v in self.loss_dict.items()}

    def get_loss_dict(self):
        return self.loss_dict

    def total(self):
        """Sum of the losses: what backward() minimises; the loop logs it under the plain loss name."""
        return sum(self.loss_dict.values())

    def __getitem__(self, name):
        return self.loss_dict[name]

    def __iter__(self):
        return iter(self.loss_dict)

    def __len__(self):
        return len(self.loss_dict)

    def __repr__(self):
        return f'MultiLoss({self.loss_dict!r})'


class MultiOptimizer:
    """A list of optimizers; the TrainLoop steps each in turn (``loop.optimizer_idx`` says which)."""

    def __init__(self, optimizer_list):
        if not isinstance(optimizer_list, (list, tuple)) or not optimizer_list:
            raise TypeError('MultiOptimizer needs a non-empty list of optimizers')
        self.optimizer_list = list(optimizer_list)

    # AIToolbox called step/zero_grad with (optimizer_idx, iteration[, scaler]); both forms work.
    def step(self, optimizer_idx=None, iteration=None, amp_grad_scaler=None):
        for optimizer in self._selected(optimizer_idx):
            amp_grad_scaler.step(optimizer) if amp_grad_scaler is not None else optimizer.step()

    def zero_grad(self, optimizer_idx=None, iteration=None):
        for optimizer in self._selected(optimizer_idx):
            optimizer.zero_grad()

    def _selected(self, optimizer_idx):
        return self.optimizer_list if optimizer_idx is None else [self.optimizer_list[optimizer_idx]]

    def state_dict(self):
        return [optimizer.state_dict() for optimizer in self.optimizer_list]

    def load_state_dict(self, state_dict_list):
        if len(state_dict_list) != len(self.optimizer_list):
            raise ValueError(f'MultiOptimizer has {len(self.optimizer_list)} optimizers but the state has '
                             f'{len(state_dict_list)}')
        for optimizer, state in zip(self.optimizer_list, state_dict_list):
            optimizer.load_state_dict(state)

    @property
    def param_groups(self):
        return [group for optimizer in self.optimizer_list for group in optimizer.param_groups]

    def __len__(self):
        return len(self.optimizer_list)

    def __getitem__(self, idx):
        return self.optimizer_list[idx]

    def __iter__(self):
        return iter(self.optimizer_list)
