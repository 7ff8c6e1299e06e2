"""Ray Train: a TrainLoop trains inside ``ray.train.torch.TorchTrainer``'s workers
(``pip install 'aitoolbox_like[ray]'``).

The loop code stays as it is. In the function each Ray worker runs, build the TrainLoop with ``gpu_mode='ddp'`` and
pass a :class:`RayTrainReport`::

    def train_fn(config):
        loop = TrainLoop(model, train_loader, val_loader, None, optimizer, criterion, gpu_mode='ddp')
        loop.fit(num_epochs=config['epochs'], callbacks=[RayTrainReport()], resume_from='auto')

    TorchTrainer(train_fn, scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(storage_path=..., failure_config=FailureConfig(max_failures=3))).fit()

Ray has already set up the torch.distributed process group in its workers, so ``gpu_mode='ddp'`` makes each worker
one rank of it (the model is wrapped in DistributedDataParallel and the loaders are sharded, as under torchrun).

After every epoch the callback hands the epoch's history values to ``ray.train.report``, with the loop's full state
as a ``ray.train.Checkpoint`` (the same file ``fit(resume_from=path)`` accepts). When Ray restarts the workers after
a failure (``FailureConfig(max_failures=N)``), ``fit(resume_from='auto')`` continues from the checkpoint that
``ray.train.get_checkpoint()`` returns, and the run ends with the weights an uninterrupted run gets.

Ray is imported when the callback is first used, not when this module is imported.
"""
import logging
import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

import torch

from .. import distributed
from ..engine import loop_state
from ..callbacks.abstract import AbstractCallback
from ..checkpoint.files import atomic_torch_save, load_checkpoint
from ..results.reporting import is_number

if TYPE_CHECKING:
    from ..engine.train_loop import TrainLoop

logger = logging.getLogger(__name__)

_INSTALL_HINT = "pip install 'aitoolbox_like[ray]'"
#: Where :func:`quiet_ray_worker_logs` points a Ray worker process's setup hook.
QUIET_WORKER_LOGS_HOOK = 'aitoolbox_like.adapters.ray.quiet_ray_worker_logs'
# Ray Train's messages that repeat, every run, what its user cannot act on: the placement-group cleaner polls the
# State API, which a cluster started without its dashboard (ray.init(include_dashboard=False)) lacks, and warns once a
# second ("Failed to query Ray Train Controller actor state"); every rank's every report is logged at INFO. Modules
# of Ray's internals, by their logger names (the second names its logger by its file): see quiet_ray_worker_logs.
_RAY_CHATTER = (('ray.train.v2._internal.execution.controller.placement_group_cleaner', logging.ERROR, False),
                ('ray.train.v2._internal.execution.context', logging.WARNING, True))
#: The name of the loop-state file inside each checkpoint folder this callback reports to Ray.
CHECKPOINT_FILE_NAME = 'train_state.pth'


def import_ray_train() -> Any:
    """The ``ray.train`` module, or an ImportError that names the install command when Ray Train is missing."""
    try:
        import ray.train
    except ImportError as exc:
        raise ImportError(f'RayTrainReport needs Ray Train: {_INSTALL_HINT}') from exc
    return ray.train


def quiet_ray_worker_logs() -> None:
    """Silence Ray Train's per-run chatter in a Ray worker process (the placement-group cleaner's "Failed to query
    Ray Train Controller actor state" once a second without a dashboard, each rank's "Reporting training result"):
    Ray's ``worker_process_setup_hook``. Give it when starting Ray::

        ray.init(runtime_env={'worker_process_setup_hook': QUIET_WORKER_LOGS_HOOK})

    Ray Train's own warnings and errors, and everything the training says, are kept."""
    for module, level, named_by_file in _RAY_CHATTER:
        name = _module_file(module) if named_by_file else module
        if name is not None:
            logging.getLogger(name).setLevel(level)


def _module_file(module: str) -> Optional[str]:
    """The ``__file__`` a module of Ray will have, found without importing it: importing Ray Train's internals costs
    every Ray worker process the hook runs in (most of which never train) about 0.7 CPU-s."""
    import importlib.util
    top, *rest = module.split('.')
    spec = importlib.util.find_spec(top)        # a top-level package is located, not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], *rest[:-1], rest[-1] + '.py')
    return path if os.path.isfile(path) else None


def ray_train_context() -> Optional[Any]:
    """Ray Train's ``TrainContext`` of this process, or None when it is not a worker started by a Ray Train
    trainer's ``fit()``."""
    train = import_ray_train()
    try:
        return train.get_context()
    except RuntimeError:        # "`get_context` cannot be used outside of a Ray Train training function"
        return None


def _plain_number(value: Any) -> Optional[float]:
    """A history value as a Python number (Ray refuses tensors in metrics), or None when it is not a number."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return None
        value = value.item()
    return value if is_number(value) else None


def history_metrics(loop: 'TrainLoop', names: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The latest value of each history metric (of ``names``, or of every metric), as plain numbers, plus the
    finished epoch's index as ``epoch``. A dict-valued metric gives one entry per key (``<name>_<key>``); values
    that are not numbers (lists, strings, tensors of several elements) are left out."""
    metrics: Dict[str, Any] = {}
    history = loop.train_history
    for name in (names if names is not None else list(history.keys())):
        values = history.get(name)
        if not values:
            continue
        latest = values[-1]
        items = [(f'{name}_{key}', v) for key, v in latest.items()] if isinstance(latest, dict) else [(name, latest)]
        for key, value in items:
            number = _plain_number(value)
            if number is not None:
                metrics[key] = number
    metrics['epoch'] = loop.epoch
    return metrics


class RayTrainReport(AbstractCallback):
    """Report every epoch to Ray Train and resume from Ray's checkpoint when Ray restarts the workers.

    At the end of each epoch, on every worker: the loop's full state is built (on every rank, as a sharded FSDP
    model needs), rank 0 writes it into a temporary folder and calls ``ray.train.report(metrics,
    checkpoint=ray.train.Checkpoint.from_directory(folder))``; the other ranks call ``ray.train.report(metrics)``
    (Ray requires every worker to report the same number of times). ``metrics`` holds the latest value of each
    history metric (:func:`history_metrics`) and ``epoch``, the index of the epoch just finished. The folder holds
    one file, ``train_state.pth`` (:data:`CHECKPOINT_FILE_NAME`), which ``fit(resume_from=path)`` and
    :func:`aitoolbox_like.checkpoint.load_checkpoint` read. Ray uploads it to ``RunConfig(storage_path=...)``
    before ``report`` returns; the temporary folder is then removed.

    ``fit(resume_from='auto')`` asks this callback first (:meth:`find_resume_checkpoint`): inside a Ray worker that
    Ray started with a checkpoint (a restart after a failure, or a trainer restored from storage), the loop
    continues from it.

    The loop must train as one rank of Ray's process group: build it with ``gpu_mode='ddp'`` (or ``'fsdp'``). With
    the default single-process mode each Ray worker would train its own copy of the model on all the data, so
    fit fails at the start with an error saying so. Outside a Ray Train worker fit fails at the start as well.

    Ray's controller collects the reports about every 2 s: a worker that dies right after a report can take that
    report with it, and Ray then restarts from the previous checkpoint (the result is the same, the epochs since
    that one are trained again). ``wait_for_commit=True`` closes that window.

    Args:
        checkpoint_frequency (int): attach a checkpoint every this many epochs (epochs ``k-1, 2k-1, ...``) and
            after the last epoch of the fit; the other epochs report metrics only. 1: every epoch.
        metrics (sequence of str or None): the history metrics to report (None: every metric in the history).
            ``epoch`` is always reported.
        hyperparams (dict or None): hyperparameters stored in the checkpoints (as ModelCheckpoint's).
        wait_for_commit (bool): after reporting a checkpoint, rank 0 waits until Ray's controller has registered
            it (``ray.train.get_all_reported_checkpoints`` with ``CheckpointConsistencyMode.COMMITTED``, an alpha
            API of Ray Train's default engine, tested with Ray 2.60), so no training happens past a checkpoint that
            a failure could still lose. Costs up to about 2 s per checkpoint (the other ranks wait for rank 0 at
            their next step).
        execution_order (int): with the saving callbacks (100), after the metrics, schedulers and stopping
            callbacks have finished the epoch, so the checkpoint holds their end-of-epoch state.
    """

    # Read by fit(resume_from='auto'): this callback writes the checkpoints that 'auto' resumes from.
    writes_checkpoints = True

    def __init__(self, checkpoint_frequency: int = 1, metrics: Optional[Sequence[str]] = None,
                 hyperparams: Optional[Dict[str, Any]] = None, wait_for_commit: bool = False,
                 execution_order: float = 100) -> None:
        # Every rank reports (Ray waits for all workers), so the callback runs in every process.
        super().__init__('RayTrainReport', execution_order=execution_order, device_idx_execution=None)
        if isinstance(checkpoint_frequency, bool) or not isinstance(checkpoint_frequency, int) \
                or checkpoint_frequency < 1:
            raise ValueError(f'RayTrainReport: checkpoint_frequency must be an int >= 1 (epochs between checkpoints), '
                             f'got {checkpoint_frequency!r}')
        if metrics is not None and (isinstance(metrics, str) or not all(isinstance(m, str) for m in metrics)):
            raise TypeError(f'RayTrainReport: metrics must be a list of history metric names (e.g. [\'val_loss\']) '
                            f'or None for all of them, got {metrics!r}')
        if hyperparams is not None and not isinstance(hyperparams, dict):
            raise TypeError(f'RayTrainReport: hyperparams must be a dict or None, got {type(hyperparams).__qualname__}')
        self.checkpoint_frequency = checkpoint_frequency
        self.metrics = list(metrics) if metrics is not None else None
        self.hyperparams = hyperparams
        self.wait_for_commit = bool(wait_for_commit)
        self._warned_missing = False

    # ---- resume -------------------------------------------------------------------------------------------

    def find_resume_checkpoint(self, train_loop_obj: 'TrainLoop') -> Optional[Dict[str, Any]]:
        """The checkpoint ``fit(resume_from='auto')`` continues from: the loop state inside
        ``ray.train.get_checkpoint()`` (loaded, on CPU), or None when Ray started this worker without a checkpoint
        or this process is not a Ray Train worker (then on_train_begin says so).

        Called by the loop before the callbacks are registered (in a distributed run by rank 0, which passes the
        checkpoint on to the other ranks; a rank that calls it loads its own copy). Ray downloads a checkpoint in
        remote storage into a temporary folder, removed once the file is read."""
        if ray_train_context() is None:
            return None
        checkpoint = import_ray_train().get_checkpoint()
        if checkpoint is None:
            return None         # a fresh run: the loop logs that it starts from scratch
        with checkpoint.as_directory() as folder:
            path = os.path.join(folder, CHECKPOINT_FILE_NAME)
            if not os.path.isfile(path):
                raise FileNotFoundError(f'RayTrainReport: the Ray checkpoint {checkpoint.path} has no '
                                        f'{CHECKPOINT_FILE_NAME}; it was not written by RayTrainReport. Resume it with '
                                        f'fit(resume_from=<path of its loop-state file>) instead of \'auto\'')
            state = load_checkpoint(path, map_location='cpu', source_name=f'{checkpoint.path}/{CHECKPOINT_FILE_NAME}')
        logger.info('RayTrainReport: resuming from Ray checkpoint %s (%d epochs done)', checkpoint.path,
                    state.get('loop', {}).get('epochs_completed', state.get('epoch', 0)))
        return state

    # ---- hooks --------------------------------------------------------------------------------------------

    def on_train_begin(self) -> None:
        context = ray_train_context()
        if context is None:
            raise RuntimeError('RayTrainReport reports to Ray Train, but this process is not a Ray Train worker: call '
                               'fit() inside the function given to ray.train.torch.TorchTrainer (see '
                               'docs/distributed.md, "Ray Train"), or leave RayTrainReport out of this fit')
        train = import_ray_train()
        if self.wait_for_commit and not all(hasattr(train, name) for name in ('get_all_reported_checkpoints',
                                                                                'CheckpointConsistencyMode')):
            raise RuntimeError('RayTrainReport(wait_for_commit=True) needs ray.train.get_all_reported_checkpoints and '
                               'ray.train.CheckpointConsistencyMode, which this Ray lacks: use a Ray version that has '
                               'them (2.60 does) with its default Ray Train engine (RAY_TRAIN_V2_ENABLED unset), or '
                               'wait_for_commit=False')
        ray_world_size = context.get_world_size()
        loop = self.train_loop_obj
        if ray_world_size > 1 and not loop.ddp_training_mode:
            raise RuntimeError(f'RayTrainReport: Ray runs {ray_world_size} workers, but the TrainLoop trains in one '
                               f'process (gpu_mode={loop.gpu_mode!r}), so each worker would train its own copy of the '
                               f'model on all the data. Build the TrainLoop with gpu_mode=\'ddp\': each worker then '
                               f'trains as one rank of the process group Ray set up')
        if loop.world_size != ray_world_size:
            raise RuntimeError(f'RayTrainReport: Ray runs {ray_world_size} workers but the torch.distributed process '
                               f'group has {loop.world_size} processes; call fit() in the workers of a TorchTrainer, '
                               f'which sets the process group up, without initialising another one')

    def on_epoch_end(self) -> None:
        loop = self.train_loop_obj
        train = import_ray_train()
        metrics = history_metrics(loop, self.metrics)
        self._warn_missing_metrics(metrics)
        if not self._checkpoint_due():
            train.report(metrics)
            return
        # Every rank takes part: each rank's RNG states go into rank 0's checkpoint, and under FSDP the shards are
        # gathered (collectives). Other ranks of a DDP run need no copy of the weights.
        weights = loop.is_main_process() or distributed.is_fsdp_model(loop.model)
        state = loop_state.build_checkpoint(loop, self.hyperparams, weights=weights, all_ranks=True)
        if not loop.is_main_process():
            train.report(metrics)
            return
        folder = tempfile.mkdtemp(prefix='aitoolbox_like_ray_')
        try:
            atomic_torch_save(state, os.path.join(folder, CHECKPOINT_FILE_NAME))
            # Ray copies the folder to its storage before report returns (the default synchronous upload).
            train.report(metrics, checkpoint=train.Checkpoint.from_directory(folder))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if self.wait_for_commit:
            train.get_all_reported_checkpoints(consistency_mode=train.CheckpointConsistencyMode.COMMITTED)

    def _checkpoint_due(self) -> bool:
        """The same answer on every rank (they must agree on whether build_checkpoint, a collective, runs)."""
        loop = self.train_loop_obj
        done = loop.epoch + 1
        last = loop.num_epochs is not None and done >= loop.num_epochs
        return done % self.checkpoint_frequency == 0 or last

    def _warn_missing_metrics(self, metrics: Dict[str, Any]) -> None:
        if self.metrics is None or self._warned_missing:
            return
        missing = [name for name in self.metrics if name not in metrics
                   and not any(key.startswith(f'{name}_') for key in metrics)]
        if missing:
            self._warned_missing = True
            logger.warning('RayTrainReport: the history has no numeric value for %s (history metrics: %s); they are '
                           'not reported', ', '.join(missing), ', '.join(self.train_loop_obj.train_history.keys()))
