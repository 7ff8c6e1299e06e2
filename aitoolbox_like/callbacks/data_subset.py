"""DataSubsetTestRun: train and evaluate on the first few batches only (re-exported by :mod:`.basic`, AIToolbox's
home of it)."""
import itertools
from typing import Any, Iterable, Iterator, List, Tuple

from ._common import check_int
from .abstract import AbstractCallback


class _FirstBatches:
    """An iterable over the first ``num_batches`` batches of a loader; ``len()`` is the subset's length and
    other attributes (dataset, batch_size, sampler) come from the wrapped loader."""

    def __init__(self, loader: Any, num_batches: int) -> None:
        self.loader = loader
        self.num_batches = num_batches

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.loader), self.num_batches)

    def __len__(self) -> int:
        return min(len(self.loader), self.num_batches)

    def __getattr__(self, name: str) -> Any:
        if name == 'loader':
            raise AttributeError(name)
        return getattr(self.loader, name)


class DataSubsetTestRun(AbstractCallback):
    """Train and evaluate on the first few batches only: a quick end-to-end check of a training script.

    At ``on_train_begin`` each loader is replaced by a ``list`` of its first batches, read once and reused in
    every epoch (AIToolbox's record). From registration until then the loop already holds a view of those
    batches, so ``len()`` of the loaders (e.g. ``get_num_optimizer_updates()`` in a scheduler's registration) is
    that of the subset.

    Args:
        num_train_batches (int): training batches per epoch.
        num_val_batches (int): validation batches (0 keeps the whole validation set).
        num_test_batches (int): test batches (0 keeps the whole test set).
    """

    def __init__(self, num_train_batches: int = 1, num_val_batches: int = 0, num_test_batches: int = 0) -> None:
        super().__init__('Run model on a small subset of the training dataset', execution_order=-100)
        check_int('num_train_batches', num_train_batches, 1, who='DataSubsetTestRun')
        check_int('num_val_batches', num_val_batches, 0, who='DataSubsetTestRun')
        check_int('num_test_batches', num_test_batches, 0, who='DataSubsetTestRun')
        self.num_train_batches = num_train_batches
        self.num_val_batches = num_val_batches
        self.num_test_batches = num_test_batches

    def on_train_loop_registration(self) -> None:
        """Check that the loaders to subset exist, and put views of their first batches in the loop."""
        loop = self.train_loop_obj
        for num, attr in ((self.num_val_batches, 'validation_loader'), (self.num_test_batches, 'test_loader')):
            if num > 0 and getattr(loop, attr) is None:
                raise ValueError(f'DataSubsetTestRun: {attr.replace("_", " ")} subset of {num} batches asked for, '
                                 f'but the TrainLoop has no {attr}')
        for attr, num in self._subsets():
            setattr(loop, attr, _FirstBatches(_unwrapped(getattr(loop, attr)), num))

    def on_train_begin(self) -> None:
        """Replace the loaders by lists of their first batches."""
        # Also after registration: loaders may have been replaced since (e.g. built inside each DDP process).
        loop = self.train_loop_obj
        for attr, num in self._subsets():
            setattr(loop, attr, self.subset_data_loader(getattr(loop, attr), num))

    def _subsets(self) -> List[Tuple[str, int]]:
        loop = self.train_loop_obj
        return [(attr, num) for attr, num in (('train_loader', self.num_train_batches),
                                              ('validation_loader', self.num_val_batches),
                                              ('test_loader', self.num_test_batches))
                if num > 0 and getattr(loop, attr) is not None]

    @staticmethod
    def subset_data_loader(data_loader: Iterable[Any], num_batches: int) -> List[Any]:
        """The first ``num_batches`` batches of ``data_loader``, as a list."""
        return list(itertools.islice(iter(_unwrapped(data_loader)), num_batches))


def _unwrapped(loader: Any) -> Any:
    # A view is never nested: a subset of a subset reads the original loader.
    return loader.loader if isinstance(loader, _FirstBatches) else loader
