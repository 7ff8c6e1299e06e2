"""A device value read on the host without a synchronizing copy.

``tensor.item()`` or ``tensor.cpu()`` of a CUDA tensor is a blocking copy: the host waits for the whole stream, and
``torch.cuda.set_sync_debug_mode`` reports it. The loop reads a few values per epoch (the epoch's losses) and a
progress bar reads one now and then; :func:`host_copy` copies the value into pinned host memory behind the work
already queued and records an event, so the caller either waits for that event only (at the end of an epoch) or
asks whether it has passed and reads it later (a progress bar), never holding up a training step.
"""
from typing import Optional

import torch


class HostCopy:
    """A value on its way to the host: :meth:`ready` asks without waiting, :meth:`wait` waits for it alone."""

    def __init__(self, host: torch.Tensor, event: Optional['torch.cuda.Event']) -> None:
        self._host = host
        self._event = event

    def ready(self) -> bool:
        """Whether the copy has arrived (never waits)."""
        return self._event is None or self._event.query()

    def wait(self) -> torch.Tensor:
        """The value on the host, once its copy arrived (waits for this copy's event, not for the device)."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        return self._host


def host_copy(tensor: torch.Tensor) -> HostCopy:
    """Start copying ``tensor`` to the host. A CPU tensor is there already; a CUDA tensor is copied into pinned
    memory on its current stream (after the work that computes it) and an event marks the end of the copy."""
    if tensor.device.type != 'cuda':
        return HostCopy(tensor, None)
    host = torch.empty(tensor.shape, dtype=tensor.dtype, device='cpu', pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(tensor.device))
    return HostCopy(host, event)


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the host: ``tensor.cpu()`` without a stream-wide synchronization (it waits for this copy)."""
    return host_copy(tensor).wait()
