"""The next batch copied to the GPU while the current step runs.

A hand-written loop moves each batch with ``x.to(device)`` at the top of its step: the copy and the compute run one
after the other. :class:`DevicePrefetcher` takes the next batch from the loader as soon as the current one is handed
to the step, pins it (unless the loader did), and copies it to the device with ``non_blocking=True`` on a side
stream, so that the copy runs while the GPU computes the current step. The usual stream discipline keeps it exact:
the compute stream waits for the copy before it reads the batch, and each copied tensor is recorded as used by the
compute stream, so the caching allocator does not hand its memory out again while the step still reads it. A model's
``get_loss`` that calls ``.to(device)`` then finds the tensors already there (a no-op).

Only tensors inside tuples, lists and dicts are moved; anything else in a batch (a custom object) is left as it is,
for the model to move, as without prefetching. Taking the next batch early changes nothing the step computes when
the loader's workers produce the batches (``num_workers > 0``): the training process draws no random numbers for
them. With ``num_workers=0`` the dataset runs in the training process, where an augmentation drawing from torch's
generator between two steps would draw in another order; the loop prefetches there only when asked
(``TrainLoop(prefetch_to_device=True)``).
"""
from typing import Any, Iterator, Optional

import torch


def prefetch_applies(device: torch.device, loader: Any, requested: Optional[bool]) -> bool:
    """Whether a fit on ``device`` prefetches the batches of ``loader`` (``requested``: the loop's
    ``prefetch_to_device``): on CUDA only; by default when the loader has worker processes, where taking a batch
    early changes nothing the training process computes; always when True; never when False."""
    if device.type != 'cuda' or requested is False:
        return False
    return requested is True or (getattr(loader, 'num_workers', 0) or 0) > 0


def move_batch(batch: Any, device: torch.device, pin: bool) -> Any:
    """``batch`` with its tensors (inside tuples, lists and dicts) copied to ``device`` without blocking the host,
    pinned first when ``pin`` and not pinned yet (a copy from pageable memory cannot overlap)."""
    if isinstance(batch, torch.Tensor):
        if batch.device.type == 'cpu' and pin and not batch.is_pinned():
            batch = batch.pin_memory()
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple) and hasattr(batch, '_fields'):     # a namedtuple keeps its type
        return type(batch)(*(move_batch(item, device, pin) for item in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_batch(item, device, pin) for item in batch)
    if isinstance(batch, dict):
        return type(batch)((key, move_batch(value, device, pin)) for key, value in batch.items())
    return batch


def _record_stream(batch: Any, stream: 'torch.cuda.Stream') -> None:
    if isinstance(batch, torch.Tensor):
        if batch.device.type == 'cuda':
            batch.record_stream(stream)
    elif isinstance(batch, (list, tuple)):
        for item in batch:
            _record_stream(item, stream)
    elif isinstance(batch, dict):
        for item in batch.values():
            _record_stream(item, stream)


class DevicePrefetcher:
    """An iterator over ``iterator``'s batches, each already on ``device`` when it is returned, the next one copying
    meanwhile (see the module docstring). Batches come in the loader's order, one at a time ahead. On a CPU device
    there is nothing to copy and no stream: it only takes the batches one ahead (which the tests use)."""

    def __init__(self, iterator: Iterator[Any], device: torch.device) -> None:
        self.iterator = iterator
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == 'cuda' else None
        self._next: Optional[Any] = None
        self._exhausted = False
        self._preload()

    def _preload(self) -> None:
        try:
            batch = next(self.iterator)
        except StopIteration:
            self._exhausted = True
            self._next = None
            return
        if self.stream is None:
            self._next = move_batch(batch, self.device, pin=False)
            return
        # The side stream must not copy a pinned buffer before the work queued so far on the compute stream that
        # may still write it (a loader reusing its buffers): start after it.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            self._next = move_batch(batch, self.device, pin=True)

    def __iter__(self) -> 'DevicePrefetcher':
        return self

    def __next__(self) -> Any:
        if self._exhausted:
            raise StopIteration
        batch = self._next
        if self.stream is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_stream(self.stream)        # the step reads the batch after its copy, not before
            _record_stream(batch, compute)          # its memory stays the step's until the step's work is done
        self._preload()
        return batch
