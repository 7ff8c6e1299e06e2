"""BasicDataset / ListDataset: indexing, length, and batching through a DataLoader as users feed them."""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like.model.datasets import BasicDataset, ListDataset


def test_basic_dataset_indexes_rows_of_lists_and_tensors():
    rows = [[1, 2], [3], [4, 5, 6]]
    dataset = BasicDataset(rows)
    assert len(dataset) == 3
    assert [dataset[i] for i in range(3)] == rows

    x = torch.arange(12.).reshape(4, 3)
    tensor_dataset = BasicDataset(x)
    assert len(tensor_dataset) == 4
    assert torch.equal(tensor_dataset[2], x[2])


def test_basic_dataset_batches_like_the_tensor_it_wraps():
    x = torch.randn(10, 3, generator=torch.Generator().manual_seed(0))
    batches = list(DataLoader(BasicDataset(x), batch_size=4))
    assert [b.shape[0] for b in batches] == [4, 4, 2]
    assert torch.equal(torch.cat(batches), x)


def test_list_dataset_returns_one_tuple_per_example():
    texts, labels = ['a', 'bb', 'ccc'], [0, 1, 0]
    dataset = ListDataset(texts, labels)
    assert len(dataset) == 3
    assert dataset[1] == ('bb', 1)
    assert list(dataset) == list(zip(texts, labels))


def test_list_dataset_batches_like_tensor_dataset():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(9, 2, generator=g), torch.randint(0, 3, (9,), generator=g)
    from_lists = list(DataLoader(ListDataset(list(x), y.tolist()), batch_size=4))
    from_tensors = list(DataLoader(TensorDataset(x, y), batch_size=4))
    assert len(from_lists) == len(from_tensors) == 3
    for (xl, yl), (xt, yt) in zip(from_lists, from_tensors):
        assert torch.equal(xl, xt) and torch.equal(yl, yt)


def test_list_dataset_refuses_lists_of_different_lengths_or_none():
    with pytest.raises(ValueError, match=r'same length.*\[3, 2\]'):
        ListDataset([1, 2, 3], [1, 2])
    with pytest.raises(ValueError):
        ListDataset()
