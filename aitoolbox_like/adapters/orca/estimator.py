"""BigDL Orca's PyTorch Estimator over a TrainLoop: ``Estimator.from_torch(model=, optimizer=, loss=, metrics=, ...)``
and its ``fit(data=creator, epochs, batch_size, validation_data, callbacks)``, ``evaluate``, ``predict``,
``get_model``, ``save`` / ``load``, with Orca's data handling and statistics.

What Orca's estimator does, and this one (Orca 2.4.0's ``PyTorchRayEstimator`` and ``TorchRunner`` are the
reference): the creators are called as Orca calls them (``model(config)``, ``optimizer(model, config)``,
``loss(config)`` or a loss object, ``scheduler_creator(optimizer, config)``, ``data(config, batch_size)``);
``batch_size`` is the total over the workers, each worker's loader built with ``batch_size // workers``; a creator's
DataLoader over a map-style dataset is rebuilt with Orca's shuffling ``DistributedSampler`` (training and validation,
also with one worker; the training sampler's epoch set to the epochs done before each epoch, the validation one left
at 0); the MainCallback goes first (Orca's swap, a default ``MainCallback()`` when none is given); ``use_tqdm`` adds a
``TqdmCallback``, ``max_steps`` a ``MaxstepsCallback``; each ``fit`` trains ``epochs`` more epochs; statistics are
each worker's own (``sync_stats=False``), and ``fit`` returns one dict per epoch (averaged over the workers with
``reduce_results``). The loop runs it: in this process, or under the loop's launchers: a process group already set up
(torchrun, SLURM's srun, Ray Train's workers) is joined, and ``workers_per_node > 1`` spawns that many processes.
"""
import copy
import functools
import logging
import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from ... import distributed
from ...engine.train_loop import TrainLoop
from ...callbacks.abstract import AbstractCallback
from ...callbacks.ddp import InMultiProcessDataLoad
from .builtin_callbacks import MaxstepsCallback, ModelCheckpoint, TqdmCallback
from .callback import Callback, MainCallback, Runner, runner_for

logger = logging.getLogger(__name__)


_NOT_A_CREATOR = ("Orca's SparkXShards, Spark DataFrames and Ray Datasets have no counterpart here: give a creator "
                  "function (config, batch_size) -> DataLoader, as Orca's estimator also takes")


def make_only_main_callback(callbacks: List[Any]) -> None:
    """Orca's ``make_only_mainCallback``: the MainCallback swapped to the front of ``callbacks`` (a default
    ``MainCallback()`` put there when none is given); two are refused (RuntimeError)."""
    found = 0
    for i in range(len(callbacks)):
        if isinstance(callbacks[i], Callback) and callbacks[i].orca_is_main():
            found += 1
            callbacks[0], callbacks[i] = callbacks[i], callbacks[0]
    if found == 0:
        callbacks.insert(0, MainCallback())
    elif found > 1:
        raise RuntimeError(f'Expect at most one MainCallback instance to be passed to torch estimator, got {found} '
                           f'MainCallback instances.')


class _FixedEpochSampler(DistributedSampler):
    """Orca's validation sampler: a shuffling DistributedSampler whose epoch Orca never sets (the same order every
    epoch); the DDP fit's set_epoch callback leaves it at 0 too."""

    def set_epoch(self, epoch: int) -> None:
        return None


def orca_loader(creator: Callable[..., Any], config: Any, batch_size: int, validation: bool = False) -> Any:
    """``creator(config, batch_size)``, a DataLoader over a map-style dataset rebuilt with Orca's shuffling
    DistributedSampler for this process (``TorchRunner.with_sampler``); anything else as it is."""
    loader = creator(config, batch_size)
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    sampler_class = _FixedEpochSampler if validation else DistributedSampler
    sampler: DistributedSampler[Any] = sampler_class(loader.dataset, num_replicas=distributed.get_world_size(), rank=distributed.get_rank(),
                            shuffle=True)
    return DataLoader(loader.dataset, batch_size=loader.batch_size, shuffle=False, num_workers=loader.num_workers,
                      collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, drop_last=loader.drop_last,
                      timeout=loader.timeout, worker_init_fn=loader.worker_init_fn, sampler=sampler)


class _SamplerEpoch(AbstractCallback):
    """Orca's ``train_epoch``: ``set_epoch(epochs done)`` on the training loader's sampler before each epoch."""

    def __init__(self) -> None:
        super().__init__('Orca: the training sampler\'s epoch', execution_order=-100)

    def on_epoch_begin(self) -> None:
        set_epoch = getattr(getattr(self.train_loop_obj.train_loader, 'sampler', None), 'set_epoch', None)
        if callable(set_epoch):
            set_epoch(self.train_loop_obj.epoch)


class _RunnerSettings(Callback):
    """The estimator's runner settings (metrics, schedulers, config, statistics), given to the runner of the loop
    that trains: in a spawned fit each process has its own loop and runner, built from what the fit sends it."""

    execution_order = -1000

    def __init__(self, runner: Runner) -> None:
        super().__init__()
        self.metrics, self.schedulers = list(runner.metrics), list(runner.schedulers)
        self.config, self.sync_stats = runner.config, runner.sync_stats

    def register_train_loop_object(self, train_loop_obj: 'TrainLoop') -> AbstractCallback:
        registered = super().register_train_loop_object(train_loop_obj)
        runner = runner_for(train_loop_obj)
        runner.metrics, runner.schedulers = list(self.metrics), list(self.schedulers)
        runner.config, runner.sync_stats = self.config, self.sync_stats
        return registered


class _EpochStats(Callback):
    """Keeps each epoch's ``runner.epoch_stats`` (what Orca's fit returns) and records Orca's statistics in the
    loop's history under Orca's names (``train_loss``, ``num_samples``, ...; ``val_loss`` is the loop's own)."""

    execution_order = 1000      # after the other callbacks' after_train_epoch

    def __init__(self) -> None:
        super().__init__()
        self.stats: List[Dict[str, Any]] = []

    def after_train_epoch(self, runner: Runner) -> None:
        stats = dict(runner.epoch_stats or {})
        self.stats.append(stats)
        loop = runner.loop
        for name, value in stats.items():
            if name not in ('epoch', 'val_loss') and isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and not loop.train_history.value_in_epoch(name, loop.epoch):
                loop.insert_metric_result_into_history(name, float(value))


def _is_creator(value: Any) -> bool:
    return callable(value) and not isinstance(value, (torch.nn.Module, torch.optim.Optimizer))


def _reduce(stats: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Each epoch's numbers averaged over the processes (Orca's ``process_stats``), when several train together."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return stats
    reduced = []
    for epoch in stats:
        names = [name for name, value in epoch.items() if isinstance(value, (int, float)) and not isinstance(value, bool)]
        values = torch.tensor([float(epoch[name]) for name in names], dtype=torch.float64)
        dist.all_reduce(values)
        means = (values / dist.get_world_size()).tolist()
        reduced.append({**epoch, **dict(zip(names, means))})
    return reduced


class TorchEstimator:
    """What ``Estimator.from_torch`` returns: Orca's PyTorch estimator over a :class:`~aitoolbox_like.TrainLoop`
    (``loop``), its runner ``runner_for(loop)`` holding the schedulers, metrics, config and statistics setting.

    Args: those of :meth:`Estimator.from_torch`.
    """

    def __init__(self, model: Any, optimizer: Any = None, loss: Any = None, metrics: Any = None,
                 backend: str = 'ray', config: Any = None, workers_per_node: int = 1,
                 scheduler_creator: Optional[Callable[..., Any]] = None, use_tqdm: bool = False,
                 sync_stats: bool = False) -> None:
        if isinstance(workers_per_node, bool) or not isinstance(workers_per_node, int) or workers_per_node < 1:
            raise ValueError(f'workers_per_node must be an int >= 1, got {workers_per_node!r}')
        self.config = {} if config is None else config
        self.model_creator = model if _is_creator(model) else None
        built = model(self.config) if self.model_creator is not None else model
        if isinstance(built, (list, tuple)) and not isinstance(built, torch.nn.Sequential):
            if len(built) != 1:
                raise ValueError(f'the model creator returned {len(built)} models; this Estimator trains one')
            built = built[0]
        if not isinstance(built, torch.nn.Module):
            raise TypeError(f'All models must be PyTorch models: the model (creator) gave {type(built).__qualname__}')
        self.optimizer_creator = optimizer if _is_creator(optimizer) else None
        optimizer = optimizer(built, self.config) if self.optimizer_creator is not None else optimizer
        criterion = loss if loss is None or isinstance(loss, torch.nn.Module) else loss(self.config)
        self.backend = backend
        self.workers_per_node = workers_per_node
        self.use_tqdm = use_tqdm
        self.metrics = metrics
        joined = distributed.is_distributed() or ('RANK' in os.environ and 'WORLD_SIZE' in os.environ)
        self.spawns = workers_per_node > 1 and not joined
        gpu_mode = 'ddp' if joined or self.spawns else 'single'
        # Orca's val_loss weighs each batch's loss by its samples: the loop's val_loss is the same number.
        self.loop = TrainLoop(built, None, None, None, optimizer, criterion, eval_loss_weighting='sample',
                              progress_bar=False, gpu_mode=gpu_mode)
        runner = runner_for(self.loop)
        runner.config = self.config
        runner.sync_stats = sync_stats
        runner.metrics = [] if metrics is None else list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]
        if scheduler_creator is not None:
            schedulers = scheduler_creator(optimizer, self.config)
            runner.schedulers = list(schedulers) if isinstance(schedulers, (list, tuple)) else [schedulers]
        self._given: List[Any] = []     # the callbacks of the last fit (Orca's fit takes its callbacks per call)

    @property
    def runner(self) -> Runner:
        """The loop's runner (``runner_for(loop)``)."""
        return runner_for(self.loop)

    @property
    def num_workers(self) -> int:
        """The workers training together: the processes of the run (torchrun's WORLD_SIZE), else
        ``workers_per_node``."""
        if distributed.is_distributed():
            return distributed.get_world_size()
        if 'WORLD_SIZE' in os.environ:
            return int(os.environ['WORLD_SIZE'])
        return self.workers_per_node

    def _local_batch_size(self, batch_size: int) -> int:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError('batch_size should be a positive integer')
        return max(batch_size // self.num_workers, 1)

    def _use_callbacks(self, callbacks: List[Any]) -> None:
        """Only this call's callbacks take part (Orca passes them per call): the last call's others leave."""
        loop = self.loop
        leaving = [cb for cb in self._given if not any(cb is given for given in callbacks)]
        if leaving:
            loop.callbacks[:] = [cb for cb in loop.callbacks if not any(cb is gone for gone in leaving)]
            loop.callbacks_handler.regate_for_rank()
        self._given = list(callbacks)

    # ---- Orca's methods ------------------------------------------------------------------------------------------

    def fit(self, data: Any, epochs: int = 1, batch_size: int = 32, profile: bool = False,
            reduce_results: bool = True, feature_cols: Optional[List[str]] = None,
            label_cols: Optional[List[str]] = None, validation_data: Any = None,
            callbacks: Optional[List[Any]] = None, max_steps: Optional[int] = None) -> List[Dict[str, Any]]:
        """Train ``epochs`` more epochs on ``data`` (a creator ``(config, batch_size) -> DataLoader``), validating
        on ``validation_data`` after each; returns each epoch's statistics (``runner.epoch_stats``)."""
        if not _is_creator(data) or (validation_data is not None and not _is_creator(validation_data)):
            raise TypeError(_NOT_A_CREATOR)
        if feature_cols is not None or label_cols is not None or profile:
            logger.warning('Estimator.fit: feature_cols, label_cols (Spark / Ray data) and profile have no effect here')
        local = self._local_batch_size(batch_size)
        callbacks = list(callbacks or [])
        make_only_main_callback(callbacks)
        if self.use_tqdm and not any(isinstance(cb, TqdmCallback) for cb in callbacks):
            callbacks.append(TqdmCallback())
        if max_steps is not None:
            callbacks.append(MaxstepsCallback(max_step=max_steps))
        recorder, settings = _EpochStats(), _RunnerSettings(self.runner)
        loop = self.loop
        self._use_callbacks(callbacks + [recorder, settings])
        build_train = functools.partial(orca_loader, data, self.config, local)
        build_val = functools.partial(orca_loader, validation_data, self.config, local, True) \
            if validation_data is not None else None
        total = loop.epochs_completed + epochs
        given = [settings] + callbacks + [recorder, _SamplerEpoch()]
        if loop.gpu_mode == 'ddp':
            loop.train_loader = loop.validation_loader = None
            kwargs: Dict[str, Any] = {'in_process_data_load': InMultiProcessDataLoad(build_train, build_val)}
            if self.spawns:
                kwargs['num_gpus'] = self.workers_per_node
            loop.fit(num_epochs=total, callbacks=given, **kwargs)
        else:
            loop.train_loader, loop.validation_loader = build_train(), build_val() if build_val else None
            loop.fit(num_epochs=total, callbacks=given)
        stats = recorder.stats if recorder.stats else self._stats_from_history(total - epochs)
        return _reduce(stats) if reduce_results else stats

    def _stats_from_history(self, first_epoch: int) -> List[Dict[str, Any]]:
        """The epochs' statistics from the loop's history (a spawned fit's processes kept them; rank 0's)."""
        history = self.loop.train_history
        epochs: Dict[int, Dict[str, Any]] = {}
        for name in history.keys():
            for epoch, value in zip(history.get_epochs(name), history[name]):
                if epoch >= first_epoch:
                    epochs.setdefault(epoch, {'epoch': epoch + 1})[name] = value
        return [epochs[epoch] for epoch in sorted(epochs)]

    def evaluate(self, data: Any, batch_size: int = 32, num_steps: Optional[int] = None, profile: bool = False,
                 reduce_results: bool = True, feature_cols: Optional[List[str]] = None,
                 label_cols: Optional[List[str]] = None, callbacks: Optional[List[Any]] = None) -> Dict[str, Any]:
        """Orca's validation of ``data`` (a creator; its loader as built, no sampler added, as Orca's evaluate):
        each metric under its name, ``val_loss`` and ``num_samples``; ``num_steps`` batches at most."""
        if not _is_creator(data):
            raise TypeError(_NOT_A_CREATOR)
        loader = data(self.config, self._local_batch_size(batch_size))
        if num_steps:
            loader = _FirstBatches(loader, num_steps)
        callbacks = list(callbacks or [])
        make_only_main_callback(callbacks)
        if self.use_tqdm and not any(isinstance(cb, TqdmCallback) for cb in callbacks):
            callbacks.append(TqdmCallback())
        self._use_callbacks(callbacks)
        self.loop.callbacks_handler.register_callbacks(callbacks)
        runner = self.runner
        runner.validation_loader = loader
        self.loop.evaluate_model_loss(loader, move_to_cpu=True, dataset_info={'type': 'validation'})
        results = dict(runner.validation_results or {})
        if reduce_results and distributed.is_distributed() and distributed.get_world_size() > 1:
            results = _reduce([results])[0]
        return results

    def predict(self, data: Any, batch_size: int = 32, feature_cols: Optional[List[str]] = None,
                profile: bool = False, callbacks: Optional[List[Any]] = None) -> np.ndarray:
        """The MainCallback's ``on_pred_forward`` over ``data`` (features only: a NumPy array or tensor, a tuple of
        them, a DataLoader, or a creator ``(config, batch_size)``), with Orca's prediction hooks; the batches'
        outputs concatenated (Orca returns them in SparkXShards)."""
        loader = self._prediction_loader(data, batch_size)
        callbacks = list(callbacks or [])
        make_only_main_callback(callbacks)
        self._use_callbacks(callbacks)
        self.loop.callbacks_handler.register_callbacks(callbacks)
        runner, model = self.runner, self.loop.model
        model.to(self.loop.device)
        was_training = model.training
        model.eval()
        outputs = []
        try:
            with torch.no_grad():
                _call(callbacks, 'before_pred_epoch', runner)
                for batch_idx, batch in enumerate(loader):
                    runner.batch = [batch] if isinstance(batch, torch.Tensor) else list(batch)
                    runner.batch_idx = batch_idx
                    _call(callbacks, 'before_pred_iter', runner)
                    _call(callbacks, 'on_pred_forward', runner)
                    outputs.append(runner.output)
                    _call(callbacks, 'after_pred_iter', runner)
                    for name in ('batch', 'batch_idx', 'output'):
                        runner.__dict__.pop(name, None)
                _call(callbacks, 'after_pred_epoch', runner)
        finally:
            model.train(was_training)
        return np.concatenate([np.asarray(output) for output in outputs], axis=0) if outputs else np.array([])

    def _prediction_loader(self, data: Any, batch_size: int) -> Iterable[Any]:
        params: Dict[str, Any] = {'batch_size': batch_size, 'shuffle': False}
        for name in ('num_workers', 'collate_fn', 'pin_memory'):
            if isinstance(self.config, dict) and name in self.config:
                params[name] = self.config[name]
        if isinstance(data, DataLoader):
            return data
        if _is_creator(data):
            return data(self.config, batch_size)
        arrays = data if isinstance(data, (list, tuple)) else [data]
        tensors = [torch.as_tensor(array) for array in arrays]
        return DataLoader(torch.utils.data.TensorDataset(*tensors), **params)

    def get_model(self) -> torch.nn.Module:
        """The trained model, as a new object (built by the model creator and given the trained weights)."""
        model = self.loop.model
        if self.model_creator is not None:
            fresh = self.model_creator(self.config)
            fresh = fresh[0] if isinstance(fresh, (list, tuple)) and not isinstance(fresh, torch.nn.Sequential) \
                else fresh
            fresh.load_state_dict(model.state_dict())
        else:
            fresh = copy.deepcopy(model)
        return fresh.module if hasattr(fresh, 'module') else fresh

    def get_state_dict(self) -> Dict[str, Any]:
        """Orca's state: ``{'epoch', 'models', 'optimizers', 'schedulers'}``."""
        return self.runner.get_state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any], blocking: bool = True) -> None:
        """Load Orca's state; the next fit's epochs count on from its epoch."""
        self.runner.load_state_dict(state_dict)

    def save(self, model_path: str) -> str:
        """Orca's state to ``model_path`` (``torch.save``, written by the main process)."""
        if distributed.is_main_process():
            torch.save(self.get_state_dict(), model_path)
        return model_path

    def load(self, model_path: str) -> None:
        """Load a file :meth:`save` (or Orca's estimator) wrote."""
        self.load_state_dict(torch.load(model_path, map_location=self.loop.device, weights_only=True))

    def save_checkpoint(self, model_path: str) -> None:
        """Orca's manual checkpoint: :meth:`save`."""
        self.save(model_path)

    def load_checkpoint(self, model_path: str) -> None:
        """Orca's: :meth:`load`."""
        self.load(model_path)

    def shutdown(self) -> None:
        """Orca releases its workers here; the loop holds none between fits."""


def _call(callbacks: Sequence[Any], name: str, runner: Runner) -> None:
    # Orca's TorchRunner.call_hook: on every callback that has the method
    for callback in callbacks:
        method = getattr(callback, name, None)
        if callable(method):
            method(runner)


class _FirstBatches:
    """The first ``n`` batches of a loader (Orca's ``num_steps``)."""

    def __init__(self, loader: Any, n: int) -> None:
        self.loader = loader
        self.n = n

    def __iter__(self) -> Any:
        for i, batch in enumerate(self.loader):
            if i == self.n:
                return
            yield batch

    def __len__(self) -> int:
        return min(self.n, len(self.loader))


class Estimator:
    """Orca's ``bigdl.orca.learn.pytorch.Estimator``: :meth:`from_torch` makes a :class:`TorchEstimator`."""

    @staticmethod
    def from_torch(*, model: Any = None, optimizer: Any = None, loss: Any = None,
                   metrics: Union[Any, List[Any], None] = None, backend: str = 'spark', config: Any = None,
                   workers_per_node: int = 1, scheduler_creator: Optional[Callable[..., Any]] = None,
                   use_tqdm: bool = False, model_dir: Optional[str] = None, sync_stats: bool = False,
                   log_level: int = logging.INFO, log_to_driver: bool = True) -> TorchEstimator:
        """Orca's arguments: ``model`` a creator ``config -> nn.Module`` (or a module); ``optimizer`` a creator
        ``(model, config) -> optimizer`` (or an optimizer); ``loss`` a loss object or a creator ``config -> loss``;
        ``metrics`` Orca metrics (``aitoolbox_like.adapters.orca.Accuracy``, ...) or functions
        ``f(output, target)``; ``config`` what the creators receive; ``workers_per_node`` processes to spawn here
        when no process group is set up (torchrun, srun and Ray Train set one up: this process is then one worker);
        ``scheduler_creator`` ``(optimizer, config) -> scheduler``, stepped once per epoch by the MainCallback's
        ``on_lr_adjust``; ``use_tqdm`` a TqdmCallback in every fit; ``sync_stats`` average the training statistics over
        the workers (False: each worker's own, as Orca's default). ``backend`` ('spark', 'ray', 'horovod'),
        ``model_dir``, ``log_level`` and ``log_to_driver`` choose Orca's cluster machinery, which the loop's launchers
        replace: they have no effect."""
        if backend not in ('spark', 'ray', 'horovod'):
            raise ValueError(f'Only horovod, ray and spark backends are supported for now, got backend: {backend}')
        if model is None:
            raise ValueError('Estimator.from_torch needs model= (a creator config -> nn.Module, or a module)')
        return TorchEstimator(model, optimizer, loss, metrics, backend, config, workers_per_node, scheduler_creator,
                              use_tqdm, sync_stats)

    @staticmethod
    def latest_checkpoint(checkpoint_dir: str) -> str:
        """The ``last.ckpt`` ``ModelCheckpoint`` wrote in ``checkpoint_dir`` (RuntimeError when there is none)."""
        return ModelCheckpoint.get_latest_checkpoint(checkpoint_dir)
