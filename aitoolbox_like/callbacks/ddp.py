"""Callbacks for DistributedDataParallel training: sampler epochs and building data inside each process."""
from typing import Any, Callable, Union

from torch.utils.data import DataLoader

from .abstract import AbstractCallback

#: Builds a DataLoader in each process; None or False: keep the TrainLoop's loader.
LoaderBuildFn = Union[Callable[[], 'DataLoader[Any]'], None, bool]


class DistributedSamplerSetEpoch(AbstractCallback):
    """Call ``set_epoch(epoch)`` on the loaders' distributed samplers at the start of every epoch, so each
    epoch is shuffled differently (and identically in every process). A DDP fit registers it itself.

    Args:
        train_sampler: a sampler with ``set_epoch`` (or None).
        validation_sampler: a sampler with ``set_epoch`` (or None).
        test_sampler: a sampler with ``set_epoch`` (or None).
    """

    def __init__(self, train_sampler: Any, validation_sampler: Any, test_sampler: Any) -> None:
        super().__init__('set_epoch for DistributedSamplers at the start of each epoch', execution_order=-100)
        self.train_sampler = train_sampler
        self.validation_sampler = validation_sampler
        self.test_sampler = test_sampler

    def on_epoch_begin(self) -> None:
        """``set_epoch(epoch)`` on every sampler that has it."""
        for sampler in (self.train_sampler, self.validation_sampler, self.test_sampler):
            if callable(getattr(sampler, 'set_epoch', None)):
                sampler.set_epoch(self.train_loop_obj.epoch)


class InMultiProcessDataLoad(AbstractCallback):
    """Build the data loaders inside each DDP process instead of sending them from the launching process
    (needed when a dataset cannot be pickled, e.g. it holds open files or a lambda, and cheaper for large
    in-memory data). Pass it as ``fit(..., in_process_data_load=InMultiProcessDataLoad(...))``.

    Each build function takes no arguments and returns a DataLoader (the loop then shards it with a
    DistributedSampler); None or False keeps the TrainLoop's loader. The functions themselves must be
    picklable: module-level functions or functools.partial of them, not lambdas.
    """

    def __init__(self, train_loader_build_fn: LoaderBuildFn = None, val_loader_build_fn: LoaderBuildFn = None,
                 test_loader_build_fn: LoaderBuildFn = None) -> None:
        super().__init__('Multiprocess in-process data loading logic infuser', execution_order=-100)
        for name, fn in (('train_loader_build_fn', train_loader_build_fn), ('val_loader_build_fn', val_loader_build_fn),
                         ('test_loader_build_fn', test_loader_build_fn)):
            if fn not in (None, False) and not callable(fn):
                raise TypeError(f'InMultiProcessDataLoad: {name} must be a function returning a DataLoader (or '
                                f'None), got {type(fn).__qualname__}')
        self.train_loader_build_fn = train_loader_build_fn
        self.val_loader_build_fn = val_loader_build_fn
        self.test_loader_build_fn = test_loader_build_fn

    def on_multiprocess_start(self) -> None:
        """Replace the loop's loaders by those the given functions build."""
        loop = self.train_loop_obj
        if self.train_loader_build_fn not in (None, False):
            loop.train_loader = self.build_train_dataloader()
        if self.val_loader_build_fn not in (None, False):
            loop.validation_loader = self.build_val_dataloader()
        if self.test_loader_build_fn not in (None, False):
            loop.test_loader = self.build_test_dataloader()

    def build_train_dataloader(self) -> 'DataLoader[Any]':
        """The train loader ``train_loader_build_fn`` builds."""
        build = self.train_loader_build_fn
        assert callable(build), 'called only when train_loader_build_fn is given'
        return build()

    def build_val_dataloader(self) -> 'DataLoader[Any]':
        """The validation loader ``val_loader_build_fn`` builds."""
        build = self.val_loader_build_fn
        assert callable(build), 'called only when val_loader_build_fn is given'
        return build()

    def build_test_dataloader(self) -> 'DataLoader[Any]':
        """The test loader ``test_loader_build_fn`` builds."""
        build = self.test_loader_build_fn
        assert callable(build), 'called only when test_loader_build_fn is given'
        return build()
