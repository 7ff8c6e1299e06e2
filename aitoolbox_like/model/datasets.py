"""Two small map-style datasets for data that is already in memory as lists (AIToolbox's
``torchtrain.data.dataset``)."""
from __future__ import annotations

from typing import Any, Sequence, Tuple

from torch.utils.data import Dataset


class BasicDataset(Dataset[Any]):
    """A dataset whose examples are the rows (first dimension) of one indexable object: a list, a tensor,
    a numpy array.

    Use it to put in-memory data behind a DataLoader without building a TensorDataset, e.g. a list of
    variable-length sequences with a custom ``collate_fn``.

    Args:
        data: anything with ``len()`` and integer indexing; ``dataset[i]`` is ``data[i]``.
    """

    def __init__(self, data: Sequence[Any]) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, idx: int) -> Any:
        return self.data[idx]


class ListDataset(Dataset[Tuple[Any, ...]]):
    """The list counterpart of ``torch.utils.data.TensorDataset``: example ``i`` is the tuple of the ``i``-th
    element of every given list.

    Use it when inputs and targets are parallel Python lists (e.g. token-id lists of different lengths, or
    strings) that cannot be stacked into tensors.

    Args:
        *data_lists: indexable sequences of equal length, e.g. ``ListDataset(inputs, targets)``.

    Raises:
        ValueError: no list given, or the lists differ in length.
    """

    def __init__(self, *data_lists: Sequence[Any]) -> None:
        if not data_lists:
            raise ValueError('ListDataset needs at least one data list')
        lengths = [len(data_list) for data_list in data_lists]
        if any(length != lengths[0] for length in lengths):
            raise ValueError(f'ListDataset: every data list must have the same length, got lengths {lengths}')
        self.data_lists = data_lists

    def __getitem__(self, index: int) -> Tuple[Any, ...]:
        return tuple(data_list[index] for data_list in self.data_lists)

    def __len__(self) -> int:
        return len(self.data_lists[0])
