"""Several losses / several optimizers behind the single-loss, single-optimizer interface."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any, cast

import torch


class MultiLoss(MutableMapping[str, torch.Tensor]):
    """A dict of named losses that backpropagates as one: ``backward()`` runs each loss's backward
    (keeping the graph until the last), ``item()`` gives ``{name: float}``.

    The loop calls ``backward()`` once per batch, which backpropagates every loss, and then steps every
    optimizer. AIToolbox's form ``backward(optimizer_idx, iteration, amp_grad_scaler)`` (for code that drives a
    MultiLoss itself) backpropagates only the loss of that optimizer, as ``loss_optimizer_map`` assigns them
    (by default the i-th loss to the i-th optimizer); ``loss_backward_remaining`` counts down as in AIToolbox.
    """

    def __init__(self, loss_dict: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
                 loss_optimizer_map: Any = None, retain_graph_until_last: bool = True) -> None:
        if isinstance(loss_dict, (list, tuple)):
            loss_dict = {f'loss_{i}': loss for i, loss in enumerate(loss_dict)}
        if not isinstance(loss_dict, dict) or not loss_dict:
            raise TypeError('MultiLoss needs a non-empty dict {name: loss tensor} (or a list of loss tensors)')
        self.loss_dict: dict[str, torch.Tensor] = dict(loss_dict)
        self.loss_optimizer_map = loss_optimizer_map
        self.retain_graph_until_last = retain_graph_until_last
        self.loss_backward_remaining = len(self.loss_dict)
        if loss_optimizer_map is None:
            self.optimizer_loss_map = dict(enumerate(self.loss_dict))
        else:
            if len(loss_optimizer_map) != len(self.loss_dict):
                raise ValueError(f'loss_optimizer_map has {len(loss_optimizer_map)} entries but there are '
                                 f'{len(self.loss_dict)} losses: map every loss name to an optimizer index')
            self.optimizer_loss_map = {int(idx): str(name) for name, idx in loss_optimizer_map.items()}

    def apply(self, fn: Callable[[torch.Tensor], Any]) -> MultiLoss:
        """A MultiLoss of ``fn`` applied to every loss (e.g. ``torch.Tensor.cpu``)."""
        return MultiLoss({k: fn(v) for k, v in self.loss_dict.items()}, self.loss_optimizer_map,
                         self.retain_graph_until_last)

    def backward(self, optimizer_idx: int | None = None, iteration: int | None = None,
                 amp_grad_scaler: Any = None) -> None:
        """Backpropagate every loss; with ``optimizer_idx`` (AIToolbox's form) only the loss of that optimizer,
        through ``amp_grad_scaler.scale`` when given. ``iteration`` is accepted and unused, as in AIToolbox."""
        if optimizer_idx is None:
            losses = list(self.loss_dict.values())
            for i, loss in enumerate(losses):
                loss.backward(retain_graph=self.retain_graph_until_last and i < len(losses) - 1)
            return
        loss = self.loss_dict[self.optimizer_loss_map[optimizer_idx]]
        if amp_grad_scaler is not None:
            loss = amp_grad_scaler.scale(loss)
        if self.retain_graph_until_last and self.loss_backward_remaining > 1:
            loss.backward(retain_graph=True)
        else:
            loss.backward()
        self.loss_backward_remaining -= 1

    def __truediv__(self, divisor: float | torch.Tensor) -> MultiLoss:
        return self.apply(lambda loss: loss / divisor)

    def scale(self, amp_scaler: torch.amp.GradScaler) -> MultiLoss:
        """Each loss multiplied by the AMP GradScaler's scale (for fp16 backward)."""
        return self.apply(amp_scaler.scale)

    def detach(self) -> MultiLoss:
        """A MultiLoss of the detached losses (no graph), e.g. for logging."""
        # Through each loss's own detach(): the losses may be duck-typed objects, not tensors.
        return self.apply(lambda loss: loss.detach())

    def cpu(self, *args: Any, **kwargs: Any) -> MultiLoss:
        """A MultiLoss of the losses moved to the CPU."""
        return self.apply(lambda loss: loss.cpu(*args, **kwargs))

    def numpy(self) -> MultiLoss:
        """A MultiLoss of the losses as numpy arrays (AIToolbox's)."""
        return self.apply(lambda loss: loss.numpy())

    def item(self) -> dict[str, float]:
        """``{name: float}`` of the losses."""
        return {k: v.item() for k, v in self.loss_dict.items()}

    def get_loss_dict(self) -> dict[str, torch.Tensor]:
        """The ``{name: loss tensor}`` dict (not a copy)."""
        return self.loss_dict

    def total(self) -> torch.Tensor:
        """Sum of the losses: what backward() minimises; the loop logs it under the plain loss name."""
        # Never the int 0 of sum([]): the constructor refuses an empty dict.
        return cast(torch.Tensor, sum(self.loss_dict.values()))

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.loss_dict[name]

    def __setitem__(self, name: str, loss: torch.Tensor) -> None:
        self.loss_dict[name] = loss

    def __delitem__(self, name: str) -> None:
        del self.loss_dict[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.loss_dict)

    def __len__(self) -> int:
        return len(self.loss_dict)

    def __repr__(self) -> str:
        return f'MultiLoss({self.loss_dict!r})'


class MultiOptimizer:
    """A list of optimizers; the TrainLoop steps each in turn (``loop.optimizer_idx`` says which)."""

    def __init__(self, optimizer_list: Sequence[torch.optim.Optimizer]) -> None:
        if not isinstance(optimizer_list, (list, tuple)) or not optimizer_list:
            raise TypeError('MultiOptimizer needs a non-empty list of optimizers')
        self.optimizer_list = list(optimizer_list)

    # AIToolbox called step/zero_grad with (optimizer_idx, iteration[, scaler]); both forms work.
    def step(self, optimizer_idx: int | None = None, iteration: int | None = None,
             amp_grad_scaler: torch.amp.GradScaler | None = None) -> None:
        """Step every optimizer (or only ``optimizer_idx``), through ``amp_grad_scaler`` when given."""
        for optimizer in self._selected(optimizer_idx):
            amp_grad_scaler.step(optimizer) if amp_grad_scaler is not None else optimizer.step()

    def zero_grad(self, optimizer_idx: int | None = None, iteration: int | None = None) -> None:
        """Zero the gradients of every optimizer (or only ``optimizer_idx``)."""
        for optimizer in self._selected(optimizer_idx):
            optimizer.zero_grad()

    def _selected(self, optimizer_idx: int | None) -> list[torch.optim.Optimizer]:
        return self.optimizer_list if optimizer_idx is None else [self.optimizer_list[optimizer_idx]]

    def state_dict(self) -> list[dict[str, Any]]:
        """One ``state_dict()`` per optimizer, in order."""
        return [optimizer.state_dict() for optimizer in self.optimizer_list]

    def load_state_dict(self, state_dict_list: Sequence[dict[str, Any]]) -> None:
        """Restore what :meth:`state_dict` returned; the number of optimizers must match."""
        if len(state_dict_list) != len(self.optimizer_list):
            raise ValueError(f'MultiOptimizer has {len(self.optimizer_list)} optimizers but the state has '
                             f'{len(state_dict_list)}')
        for optimizer, state in zip(self.optimizer_list, state_dict_list):
            optimizer.load_state_dict(state)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The param groups of all optimizers, concatenated (what LR schedulers and loggers read)."""
        return [group for optimizer in self.optimizer_list for group in optimizer.param_groups]

    def __len__(self) -> int:
        return len(self.optimizer_list)

    def __getitem__(self, idx: int) -> torch.optim.Optimizer:
        return self.optimizer_list[idx]

    def __iter__(self) -> Iterator[torch.optim.Optimizer]:
        return iter(self.optimizer_list)
