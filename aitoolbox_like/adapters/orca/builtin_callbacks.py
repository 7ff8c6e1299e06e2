"""BigDL Orca 2.4.0's built-in PyTorch callbacks (``bigdl.orca.learn.pytorch.callbacks``), written for the adapter:
the same names, arguments, files and values as Orca's, on the loop's runner. ``make orca-check`` runs each beside
the published wheel's own class.

Where they differ from Orca's, on purpose (docs/callbacks/orca.md): ``ModelCheckpoint`` lets a resumed fit continue
in its own folder (Orca's refuses any folder holding checkpoints, its "todo: support resume training"); paths are
local (Orca's also take HDFS and S3 URLs); ``WandbLoggerCallback`` takes ``config=`` as its docstring says (Orca's
pops ``configs``), watches the runner's model with ``watch_model=True`` (Orca's reads an attribute it never sets)
and logs from the main process only (Orca's fails on the other ranks).
"""
import logging
import math
import os
import re
import shutil
import tempfile
import warnings
from typing import Any, Dict, List, Optional

from .callback import Callback, Runner

logger = logging.getLogger(__name__)



class ModelCheckpoint(Callback):
    """Orca's checkpoints: ``runner.save_checkpoint`` files (``{'epoch', 'models', 'optimizers', 'schedulers'}``,
    ``{'epoch', 'models'}`` with ``save_weights_only``) named from ``filepath``: ``'my/path/test-{epoch}'`` gives
    ``my/path/test-epoch=1.ckpt`` (``{iter}``: ``test-iter=5.ckpt``), and ``last.ckpt`` at the end of training.

    Args:
        filepath (str): the folder and the name pattern (``{epoch}`` or ``{iter}``, with a format, e.g.
            ``{epoch:02d}``).
        save_weights_only (bool): the epoch and the models only.
        by_epoch (bool): save after epochs (else after training iterations).
        interval (int): every that many epochs or iterations; -1 (by epoch): every epoch.
    """

    CHECKPOINT_JOIN_CHAR = '-'
    CHECKPOINT_NAME_LAST = 'last'
    FILE_EXTENSION = '.ckpt'

    def __init__(self, filepath: str = '', save_weights_only: bool = False, by_epoch: bool = True,
                 interval: int = -1) -> None:
        super().__init__()
        self.filepath = filepath
        self.save_weights_only = save_weights_only
        self.by_epoch = by_epoch
        self.interval = interval
        self.last_ckpt_path = ''
        self.filename = os.path.basename(self.filepath)
        self.dirname = os.path.dirname(self.filepath)

    def before_run(self, runner: Runner) -> None:
        """The folder is made; one that already holds checkpoints is refused (RuntimeError, as Orca), unless this fit
        resumes a run (its own checkpoints are there)."""
        dirname = os.path.dirname(self.filepath)
        if not os.path.exists(dirname):
            os.makedirs(dirname, exist_ok=True)
            return
        if not any('ckpt' in name for name in os.listdir(dirname)):
            return
        loop = runner.loop
        if loop.resume_plan is not None or loop.total_iteration_idx >= 0:
            return      # a resumed (or continued) run: the checkpoints there are its own
        raise RuntimeError(f'Find non-empty dirname with filepath of {self.filepath}.')

    def after_train_epoch(self, runner: Runner) -> None:
        """By epoch: a checkpoint every ``interval`` epochs (every epoch for -1), named with ``epoch``."""
        if not self.by_epoch:
            return
        if self.interval < 0:
            self.interval = 1
        if self.every_n_epoch(runner, self.interval):
            path = self._format_checkpoint_name(self.dirname, self.filename, {'epoch': runner.epochs})
            runner.save_checkpoint(path, self.save_weights_only)

    def after_train_iter(self, runner: Runner) -> None:
        """By iteration: a checkpoint every ``interval`` iterations, named with ``iter`` (the iterations so far)."""
        if self.by_epoch:
            return
        if self.every_n_iter(runner, self.interval):
            path = self._format_checkpoint_name(self.dirname, self.filename, {'iter': runner.global_step + 1})
            runner.save_checkpoint(path, self.save_weights_only)

    def after_run(self, runner: Runner) -> None:
        """``last.ckpt`` (the one written before it by this callback's previous run, if another, is removed)."""
        last = self._format_checkpoint_name(self.dirname, self.CHECKPOINT_NAME_LAST)
        previous, self.last_ckpt_path = self.last_ckpt_path, last
        runner.save_checkpoint(last, self.save_weights_only)
        if previous and previous != last:
            runner.remove_checkpoint(previous)

    @classmethod
    def get_latest_checkpoint(cls, dirname: str) -> str:
        """``dirname``'s ``last.ckpt``; RuntimeError when there is none."""
        path = cls._format_checkpoint_name(dirname, cls.CHECKPOINT_NAME_LAST)
        if not os.path.exists(path):
            logger.error('****Usage Error****: Latest checkpoint at %s not found.', path)
            raise RuntimeError(f'Latest checkpoint at {path} not found.')
        return path

    @classmethod
    def _format_checkpoint_name(cls, dirname: str, filename: str, stats: Optional[Dict[str, Any]] = None) -> str:
        """``filename`` with each ``{name...}`` field written ``name={value...}`` (0 for a value not in ``stats``),
        plus ``.ckpt``, in ``dirname``."""
        values = dict(stats or {})
        for field in re.findall(r'(\{.*?)[:\}]', filename):
            name = field[1:]
            if 'epoch' not in name and 'iter' not in name:
                warnings.warn('We only support filepath with {epoch} or {iter} for now.')
            filename = filename.replace(field, name + '={' + name)
            values.setdefault(name, 0)
        return os.path.join(dirname, filename.format(**values) + cls.FILE_EXTENSION)


class TensorBoardCallback(Callback):
    """Orca's TensorBoard logging: ``epoch_stats`` after each epoch (``freq='epoch'``, at step ``runner.epochs``), or
    ``metrics_stats`` after every batch (``'batch'``) or every ``freq`` batches (at step ``runner.batch_idx``), less
    ``epoch``, ``batch_count`` and ``num_samples``; written into a temporary folder and copied to ``log_dir`` when
    training ends, as Orca does.

    Args:
        log_dir (str): the TensorBoard folder.
        freq (str or int): ``'epoch'``, ``'batch'``, or every that many batches.
        **kwargs: ``SummaryWriter``'s arguments.
    """

    def __init__(self, log_dir: Optional[str] = None, freq: Any = 'epoch', **kwargs: Any) -> None:
        if log_dir is None:
            raise ValueError('TensorBoardCallback needs log_dir (the folder the logs are copied to)')
        self.log_dir = log_dir
        self.tmp_dir = os.path.join(tempfile.mkdtemp(), os.path.basename(log_dir))
        self.freq = freq
        self.kwargs = kwargs
        self.unlog_items = ['epoch', 'batch_count', 'num_samples']
        super().__init__()

    def _write(self, values: Dict[str, Any], step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(log_dir=self.tmp_dir, **self.kwargs)
        for name, value in values.items():
            if name not in self.unlog_items:
                writer.add_scalar(name, value, step)
        writer.close()

    def after_train_iter(self, runner: Runner) -> None:
        if self.freq != 'epoch' and runner.rank == 0:
            if self.freq == 'batch' or runner.batch_idx % int(self.freq) == 0:
                self._write(runner.metrics_stats, runner.batch_idx)

    def after_train_epoch(self, runner: Runner) -> None:
        if self.freq == 'epoch' and runner.rank == 0:
            self._write(runner.epoch_stats or {}, runner.epochs)

    def after_run(self, runner: Runner) -> None:
        if runner.rank == 0:
            if os.path.exists(self.tmp_dir):
                shutil.copytree(self.tmp_dir, self.log_dir, dirs_exist_ok=True)
                shutil.rmtree(self.tmp_dir)


class TqdmCallback(Callback):
    """Orca's progress bars (tqdm) in the main process: one per training epoch (``"<epoch>/<num_epochs>e"``, the
    batch loss as postfix) and one per validation pass (``"1/1e"``), kept on the runner as ``_progress_bar``; a line
    per prediction batch."""

    def __init__(self) -> None:
        self._progress_bar = None
        super().__init__()

    @staticmethod
    def _tqdm(total: int, desc: str) -> Any:
        try:
            from tqdm import tqdm
        except ImportError:
            raise RuntimeError("tqdm is not installed, please install with 'pip install tqdm'") from None
        return tqdm(total=total, desc=desc, unit='batch', leave=False)

    def before_train_epoch(self, runner: Runner) -> None:
        if runner.rank == 0:
            runner._progress_bar = self._tqdm(len(runner.train_loader), f'{runner.epochs + 1}/{runner.num_epochs}e')

    def after_train_iter(self, runner: Runner) -> None:
        if runner.rank == 0:
            runner._progress_bar.n = runner.batch_idx
            stats = runner.metrics_stats
            runner._progress_bar.set_postfix({'loss': stats['train_loss']} if 'train_loss' in stats else {})

    def before_val_epoch(self, runner: Runner) -> None:
        if runner.rank == 0:
            runner._progress_bar = self._tqdm(len(runner.val_loader), '1/1e')

    def after_val_iter(self, runner: Runner) -> None:
        if runner.rank == 0:
            runner._progress_bar.n = runner.batch_idx
            runner._progress_bar.set_postfix({'loss': runner.loss.item()})

    def after_pred_iter(self, runner: Runner) -> None:
        if runner.rank == 0:
            print('\r Predict batch_idx: {%d}' % runner.batch_idx, end='')


class MaxstepsCallback(Callback):
    """Orca's ``fit(max_steps=...)``: the fit's epochs become ``ceil(max_step / batches per epoch)`` and training
    stops after the ``max_step``-th batch (``runner.stop``: the epoch ends there, is validated, and the fit ends).

    Args:
        max_step (int): training batches.
    """

    #: It ends an epoch during a batch (runner.stop): in a fit of several processes every rank ends it there.
    may_end_epochs = True

    def __init__(self, max_step: int) -> None:
        super().__init__()
        self.max_step = max_step

    def before_run(self, runner: Runner) -> None:
        runner.num_epochs = math.ceil(self.max_step / len(runner.train_loader))

    def after_train_iter(self, runner: Runner) -> None:
        if runner.global_step >= self.max_step:
            runner.stop = True


class WandbLoggerCallback(Callback):
    """Orca's Weights & Biases logging: a run started before training (main process), ``epoch_stats`` logged after
    every epoch, the run finished at the end.

    Args:
        project (str): the W&B project.
        log_config (bool): also log the runner's ``config``.
        watch_model (bool): ``run.watch`` the model (gradients and topology).
        **kwargs: ``wandb.init``'s arguments (``config=`` among them).
    """

    def __init__(self, project: str, log_config: bool = False, watch_model: bool = False, **kwargs: Any) -> None:
        try:
            import wandb
        except ImportError:
            raise ImportError("pip install 'wandb' to use WandbLoggerCallback") from None
        try:
            wandb.ensure_configured()
        except AttributeError:
            raise RuntimeError('You should run `wandb login` from the command line first.') from None
        self.project = project
        self.log_config = log_config
        self.watch_model = watch_model
        self.kwargs = kwargs
        self.run: Any = None
        super().__init__()

    def before_run(self, runner: Runner) -> None:
        import wandb
        kwargs = dict(self.kwargs)
        config: Dict[str, Any] = dict(kwargs.pop('config', None) or {})
        if self.log_config:
            config.update(runner.config)
        if runner.rank != 0:
            self.run = None
            return
        self.run = wandb.init(project=self.project, config=config, **kwargs)
        if self.watch_model:
            models: List[Any] = runner.models
            self.run.watch(models[0])

    def after_train_epoch(self, runner: Runner) -> None:
        if self.run is not None:
            self.run.log(runner.epoch_stats)

    def after_run(self, runner: Runner) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
