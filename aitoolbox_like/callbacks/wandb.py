"""Weights & Biases experiment tracking (``pip install aitoolbox_like[wandb]``).

``WandBTracking`` logs the hyperparameters as the run config, the training history after every epoch, the
training batch losses (optional), alerts when a metric crosses a threshold, the source code and (optional)
the model's gradients/parameters through ``wandb.watch``. It runs on rank 0 only and never calls a
collective.

The wandb run starts in ``on_train_begin`` (AIToolbox started it at registration): a run resumed with
``fit(resume_from=...)`` only knows its checkpoint's wandb run id after registration, and the same id is
what keeps a resumed training in the same wandb run.
"""
import json
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Set

import torch

from ..experiment import get_experiment
from ._common import BatchLossReader, StepLearningRates, as_number, check_int, is_number
from .performance_eval import history_series
from .step_logging import AbstractStepLoggingTracker
from .tensorboard import unwrap_model

if TYPE_CHECKING:
    from wandb.sdk.wandb_run import Run

logger = logging.getLogger(__name__)

_INSTALL_HINT = 'pip install aitoolbox_like[wandb]'
_WATCH_MODES = ('gradients', 'parameters', 'all')
_CODE_SKIP_DIRS = {'__pycache__', '.git', '.hg', '.svn', '.ipynb_checkpoints', '.venv', 'venv', '.mypy_cache',
                   '.pytest_cache', 'wandb', '.wandb'}


def import_wandb(who: str = 'WandBTracking') -> Any:
    """The ``wandb`` module, or an ImportError with the install hint when the extra is missing."""
    try:
        import wandb
    except ImportError as exc:
        raise ImportError(f'{who} needs the wandb package: {_INSTALL_HINT}') from exc
    return wandb


@dataclass
class AlertConfig:
    """When to send a wandb alert at the end of an epoch.

    Args:
        metric_name: the history metric to check: its plain name (``'val_loss'``, ``'val_accuracy'``) or the
            name it is logged under (``'loss_at_epoch_end/val_loss'``, ``'metrics/val_accuracy'``).
        threshold_value: the alert fires when the metric's value of the epoch is below it (objective
            ``'maximize'``) or above it (``'minimize'``).
        objective: ``'maximize'`` or ``'minimize'``.
        wandb_alert_level: a ``wandb.AlertLevel`` (or its name, 'INFO' / 'WARN' / 'ERROR'); None uses wandb's
            default level.
    """
    metric_name: str
    threshold_value: float
    objective: str = 'maximize'
    wandb_alert_level: Any = None


def _json_safe(hyperparams: Dict[str, Any]) -> Any:
    """A JSON-clean copy (values JSON cannot hold become their repr), as in the experiment's hyperparams.json."""
    return json.loads(json.dumps(hyperparams, default=repr))


class WandBTracking(AbstractStepLoggingTracker):
    """Track the training in Weights & Biases: config, history, batch losses, alerts, code and model watching
    (what is logged and the arguments: see ``__init__``)."""

    def __init__(self, metric_names: Optional[Sequence[str]] = None, batch_log_frequency: Optional[int] = None,
                 hyperparams: Optional[Dict[str, Any]] = None, tags: Optional[Sequence[str]] = None,
                 alerts: Optional[List[AlertConfig]] = None, wandb_pre_initialized: bool = False,
                 source_dirs: Sequence[str] = (), log_dir: Optional[str] = None, is_project: bool = True,
                 project_name: Optional[str] = None, experiment_name: Optional[str] = None,
                 local_model_result_folder_path: Optional[str] = None, *, batch_sync_frequency: int = 100,
                 watch_model: Optional[str] = None, watch_log_freq: int = 1000,
                 finish_run_on_train_end: bool = True, **kwargs: Any) -> None:
        """Track the training in Weights & Biases (https://wandb.ai).

        Needs ``wandb`` installed (``pip install aitoolbox_like[wandb]``) and, to upload, ``wandb login``
        (or ``WANDB_API_KEY``); ``WANDB_MODE=offline`` keeps the run on disk for a later ``wandb sync``.

        Logged:
            * config: ``hyperparams`` (or the tracking TrainLoop's ``hyperparams``), JSON-cleaned.
            * after each epoch, at step = global batch index: ``epoch`` and the history values recorded in
              that epoch: ``loss_at_epoch_end/<name>`` for names containing 'loss', else ``metrics/<name>``
              (dict-valued metrics per key as ``<name>_<key>``).
            * with ``batch_log_frequency=k``: ``train_loss/last_batch_loss`` and
              ``train_loss/accumulated_batch_loss`` (the epoch's running mean) of every k-th batch (per loss
              name for a MultiLoss), with the learning rate that step's update used (``learning_rate/group_<i>``,
              ``learning_rate/optimizer_<k>_group_<i>`` with several optimizers). The losses are read from the
              device in one transfer every ``batch_sync_frequency`` steps and at the end of the epoch, never once
              per step.
            * at the end of training the ``train_end_*`` history values into the run summary.
            * alerts (``alerts``), code (``source_dirs``) and, with ``watch_model``, ``wandb.watch`` histograms.

        Args:
            metric_names: history metrics to log (None: all of them).
            batch_log_frequency: log every k-th batch loss (None: only end-of-epoch logging).
            hyperparams: the run config (None: the tracking TrainLoop's ``hyperparams``, if any).
            tags: wandb run tags.
            alerts: AlertConfig list, checked after every epoch.
            wandb_pre_initialized: log into the run the script already started with ``wandb.init()``
                instead of starting one (that run is then not finished by the callback).
            source_dirs: folders (or files) logged as code artifacts. Empty with ``is_project=True``: the
                tracking TrainLoop's experiment script and ``source_dirs``.
            log_dir: wandb's folder with ``is_project=False`` (None: wandb's default, ``WANDB_DIR`` or ./wandb).
            is_project: put wandb's folder inside the experiment folder
                (``<local folder>/<project>/<experiment>_<timestamp>/wandb``).
            project_name, experiment_name, local_model_result_folder_path: the experiment (inferred from a
                tracking TrainLoop, else defaults); the wandb project and run name are project_name and
                experiment_name.
            batch_sync_frequency: (keyword-only) read pending batch losses from the device every n steps.
            watch_model: (keyword-only) None, or 'gradients' / 'parameters' / 'all' to call ``wandb.watch`` on
                the model (histograms every ``watch_log_freq`` batches; the hooks are removed at the end).
            watch_log_freq: (keyword-only) ``log_freq`` of ``wandb.watch``.
            finish_run_on_train_end: (keyword-only) finish the wandb run at the end of ``fit`` (a later fit of
                the same loop resumes it). False keeps it open for logging after fit (AIToolbox never finished
                it). A run started with ``wandb_pre_initialized`` is never finished by the callback.
            **kwargs: further ``wandb.init()`` arguments (entity, group, mode, settings, ...); they override
                the callback's own choices (e.g. ``save_code=False``).

        Resume: the wandb run id is part of the callback's state (``state_dict``), so it is saved in
        checkpoints; ``fit(resume_from=...)`` continues the same wandb run (``resume='allow'``). wandb ignores
        values logged at a step lower than the run's last step, so steps that the interrupted run had already
        logged past its last checkpoint are only logged again once training passes them.
        """
        super().__init__('WeightsAndBiases Experiment Tracking', project_name, experiment_name,
                         local_model_result_folder_path, execution_order=97, device_idx_execution=0)
        self._wandb = import_wandb()       # a missing extra fails here, not after the first epoch
        check_int('batch_log_frequency', batch_log_frequency, allow_none=True, who='WandBTracking')
        check_int('batch_sync_frequency', batch_sync_frequency, who='WandBTracking')
        check_int('watch_log_freq', watch_log_freq, who='WandBTracking')
        if watch_model is not None and watch_model not in _WATCH_MODES:
            raise ValueError(f'WandBTracking: watch_model must be None or one of {_WATCH_MODES}, got {watch_model!r}')
        if hyperparams is not None and not isinstance(hyperparams, dict):
            raise TypeError(f'WandBTracking: hyperparams must be a dict, got {type(hyperparams).__qualname__}')
        if isinstance(source_dirs, (str, os.PathLike)):
            source_dirs = [source_dirs]
        self.metric_names = metric_names
        self.batch_log_frequency = batch_log_frequency
        self.hyperparams = hyperparams
        self.tags = list(tags) if tags is not None else None
        self.alerts = alerts
        self.check_alerts()
        self.wandb_pre_initialized = wandb_pre_initialized
        self.source_dirs = list(source_dirs)
        self.wandb_params_kwargs = kwargs
        self.log_dir = log_dir if log_dir is None else os.path.expanduser(log_dir)
        self.is_project = is_project
        self.batch_sync_frequency = batch_sync_frequency
        self.watch_model = watch_model
        self.watch_log_freq = watch_log_freq
        self.finish_run_on_train_end = finish_run_on_train_end

        self.run: Optional['Run'] = None     # the wandb run, started in on_train_begin
        self.run_id: Optional[str] = None
        self._resuming = False
        self._code_logged = False
        self._watched: Optional[torch.nn.Module] = None
        self._warned_alert_metrics: Set[str] = set()
        self.batch_losses = BatchLossReader()
        self.learning_rates = StepLearningRates()

    # ---- state (checkpoints) --------------------------------------------------------------------

    @property
    def state_key(self) -> str:
        """Always ``'WandBTracking'``."""
        # One wandb run per loop: a subclass (or a differently configured instance) resuming a checkpoint
        # must find the run id under the same key.
        return 'WandBTracking'

    def state_dict(self) -> Optional[Dict[str, str]]:
        """``{'run_id': ...}`` once a run was started, so a checkpoint resumes the same wandb run."""
        return {'run_id': self.run_id} if self.run_id is not None else None

    def load_state_dict(self, state_dict: Dict[str, str]) -> None:
        """Continue the checkpoint's wandb run (opened at the next on_train_begin)."""
        run_id = state_dict.get('run_id')
        if not run_id:
            return
        if self.run is not None and self.run.id != run_id and not self.wandb_pre_initialized:
            # The open run is not the checkpoint's; the next on_train_begin opens the checkpoint's run.
            self._finish_run()
        self.run_id = run_id
        self._resuming = True

    def __getstate__(self) -> Dict[str, Any]:
        # A DDP launch pickles the callbacks before training; a live run (or the module) cannot travel.
        state = self.__dict__.copy()
        state.update(run=None, _wandb=None, _watched=None)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._wandb = import_wandb()

    # ---- set-up ---------------------------------------------------------------------------------

    def on_train_loop_registration(self) -> None:
        """Infer the experiment, the hyperparameters and the code to log from the TrainLoop."""
        self.try_infer_experiment_details(infer_cloud_details=False)
        self.try_infer_additional_logging_details()

    def try_infer_additional_logging_details(self) -> None:
        """Take the hyperparameters and the code to log from a tracking TrainLoop when not given. A plain
        TrainLoop has neither: the config is then empty and only wandb's own code saving applies (AIToolbox
        raised an error)."""
        loop = self.train_loop_obj
        loop_hyperparams = getattr(loop, 'hyperparams', None)
        if self.hyperparams is None and isinstance(loop_hyperparams, dict):
            self.hyperparams = loop_hyperparams
        if not self.source_dirs and self.is_project and isinstance(loop_hyperparams, dict):
            script = loop_hyperparams.get('experiment_file_path')
            self.source_dirs = ([script] if script else []) + list(getattr(loop, 'source_dirs', None) or [])

    def on_train_begin(self) -> None:
        """Start (or resume) the wandb run, and watch the model with watch_model."""
        if self.run is None:
            self._start_run()
        if self.watch_model is not None and self._watched is None:
            self._watched = unwrap_model(self.train_loop_obj.model)
            # Run.watch is new in wandb 0.18; older versions only have the module function (same run here).
            watch = getattr(self.run, 'watch', None) or self._wandb.watch
            watch(self._watched, log=self.watch_model, log_freq=self.watch_log_freq)

    def _wandb_dir(self) -> Optional[str]:
        if not self.is_project:
            if self.log_dir is not None:
                os.makedirs(self.log_dir, exist_ok=True)
            return self.log_dir
        experiment = get_experiment(self.train_loop_obj, self.project_name, self.experiment_name,
                                    self.local_model_result_folder_path)
        return experiment.claim()

    def _start_run(self) -> None:
        wandb = self._wandb
        if self.wandb_pre_initialized:
            if wandb.run is None:
                raise RuntimeError('WandBTracking(wandb_pre_initialized=True) found no wandb run: call wandb.init() '
                                   'before fit, or leave wandb_pre_initialized=False to let the callback start one')
            self.run = run = wandb.run
            if self._resuming and run.id != self.run_id:
                logger.warning('Resuming a checkpoint of wandb run %s, but the pre-initialized wandb run is %s; '
                               'to continue the same run call wandb.init(id=%r, resume="allow")',
                               self.run_id, run.id, self.run_id)
        else:
            init_kwargs = dict(project=self.project_name, name=self.experiment_name,
                               config=_json_safe(self.hyperparams) if self.hyperparams is not None else None,
                               tags=self.tags, save_code=True, dir=self._wandb_dir())
            if self.run_id is not None:
                init_kwargs.update(id=self.run_id, resume='allow')
            init_kwargs.update(self.wandb_params_kwargs)
            self.run = run = wandb.init(**init_kwargs)
            logger.info('wandb run %s (%s) %s; local files in %s', run.id, run.name,
                        'resumed' if self.run_id is not None else 'started', run.dir)
        self.run_id = run.id
        if not self._code_logged:
            self._code_logged = True
            self.log_source_code()

    def log_source_code(self) -> None:
        """Log each of ``source_dirs`` as a code artifact (a folder: every file in it, caches and VCS folders
        skipped; a file: that file). A path that does not exist gets a warning."""
        make_safe = self._wandb.util.make_artifact_name_safe
        run = self.run
        for source in self.source_dirs:
            path = os.path.abspath(os.path.expanduser(os.fspath(source)))
            name = make_safe(os.path.basename(path.rstrip(os.sep)) or 'source')
            if os.path.isdir(path):
                assert run is not None, 'the code is logged once the run is started'
                run.log_code(path, name=name, include_fn=lambda p, root: True,
                             exclude_fn=lambda p, root: bool(
                                 _CODE_SKIP_DIRS.intersection(os.path.relpath(p, root).split(os.sep)[:-1])))
            elif os.path.isfile(path):
                assert run is not None, 'the code is logged once the run is started'
                # log_code walks a folder: keep only this file of its parent folder.
                run.log_code(os.path.dirname(path), name=name, include_fn=lambda p, root: p == path,
                             exclude_fn=lambda p, root: False)
            else:
                logger.warning('WandBTracking: source path %s does not exist; not logged to wandb', path)

    # ---- training events ------------------------------------------------------------------------

    def on_epoch_end(self) -> None:
        """Log the epoch's remaining batch losses and history values; send the alerts."""
        if self.batch_log_frequency is not None:
            self.log_mid_train_loss()
        metric_names = self.metric_names if self.metric_names is not None else \
            [name for name in self.train_loop_obj.train_history.keys() if not name.startswith('train_end_')]
        metrics_log = self.log_train_history_metrics(metric_names)
        if self.alerts:
            self.send_configured_alerts(self.alerts, metrics_log)

    def on_train_end(self) -> None:
        """Log the remaining batch losses and the ``train_end_*`` values; finish the run (or unwatch)."""
        if self.run is None:
            return
        if self.batch_log_frequency is not None:
            self.log_mid_train_loss()       # a StopTraining inside an epoch skips on_epoch_end
        self.log_train_end_metrics()
        if self.finish_run_on_train_end and not self.wandb_pre_initialized:
            self._finish_run()
        else:
            self._unwatch()

    def on_exception(self, exception: BaseException) -> None:
        """Finish the run as failed (a run the callback started)."""
        if self.run is not None and not self.wandb_pre_initialized:
            # exit_code 1 marks the run as failed; it can still be resumed from a checkpoint.
            try:
                self._finish_run(exit_code=1)
            except Exception as error:     # the training's own exception is the one to see
                logger.error('WandBTracking: could not finish the wandb run after %s (%s: %s)',
                             type(exception).__name__, type(error).__name__, error)

    def _unwatch(self) -> None:
        if self._watched is not None:
            try:
                (getattr(self.run, 'unwatch', None) or self._wandb.unwatch)(self._watched)
            finally:
                self._watched = None

    def _finish_run(self, exit_code: Optional[int] = None) -> None:
        try:
            self._unwatch()
            run = self.run
            assert run is not None, 'only an open run is finished'
            run.finish(exit_code=exit_code)
        finally:
            self.run = None

    # ---- logging --------------------------------------------------------------------------------

    def log_mid_train_loss(self) -> None:
        """Log the batch losses of this epoch not logged yet: ``train_loss/last_batch_<name>`` and the epoch's
        running mean ``train_loss/accumulated_batch_<name>`` (name 'loss' for a single loss) of the steps that
        are multiples of ``batch_log_frequency``, at step = global batch index.

        All pending losses are copied to the host in one transfer (one host-device sync per call). The losses
        are this process's own (AIToolbox averaged them over ranks with a collective that a rank-0-only
        callback cannot call).
        """
        if self.run is None:
            return
        frequency = self.batch_log_frequency or 1
        for step, values, means in self.batch_losses.read_new(self.train_loop_obj):
            if step % frequency == 0:
                logged = {f'train_loss/last_batch_{name}': value for name, value in values.items()}
                logged.update({f'train_loss/accumulated_batch_{name}': mean for name, mean in means.items()})
                logged.update(self.learning_rates.take_named(step))
                self.run.log(logged, step=step)

    @staticmethod
    def logged_metric_name(metric_name: str) -> str:
        """The key a history metric is logged under: ``loss_at_epoch_end/<m>`` or ``metrics/<m>``."""
        return f"{'loss_at_epoch_end' if 'loss' in metric_name else 'metrics'}/{metric_name}"

    def log_train_history_metrics(self, metric_names: Iterable[str]) -> Dict[str, float]:
        """Log ``epoch`` and the values of ``metric_names`` recorded in the current epoch (metrics computed
        every k epochs are not repeated with a stale value), at step = global batch index.

        Returns:
            the logged dict (``{'epoch': e, '<prefix>/<metric>': value, ...}``).
        """
        loop = self.train_loop_obj
        metrics_log: Dict[str, float] = {'epoch': loop.epoch}
        for name, (epochs, values) in history_series(loop.train_history, list(metric_names)).items():
            if not values or epochs[-1] != loop.epoch:
                continue
            value = as_number(values[-1])
            if value is not None:
                metrics_log[self.logged_metric_name(name)] = value
        if self.run is not None:
            self.run.log(metrics_log, step=max(loop.total_iteration_idx, 0), commit=True)
        return metrics_log

    def log_train_end_metrics(self) -> Dict[str, float]:
        """Put the ``train_end_*`` history values (e.g. ``train_end_test_loss``) into the run summary."""
        history = self.train_loop_obj.train_history
        wanted = None if self.metric_names is None else set(self.metric_names)
        names = [n for n in history.keys() if n.startswith('train_end_')
                 and (wanted is None or n in wanted or n[len('train_end_'):] in wanted)]
        final: Dict[str, float] = {}
        for name, (_, values) in history_series(history, names).items():
            value = as_number(values[-1]) if values else None
            if value is not None:
                final[name] = value
        if final and self.run is not None:
            self.run.summary.update(final)
        return final

    def send_configured_alerts(self, alerts: List[AlertConfig], metrics_log: Dict[str, float]) -> None:
        """Send the wandb alerts whose condition holds for this epoch's values in ``metrics_log``.

        An alert's metric may be given by its history name or its logged name. A metric without a value in
        this epoch is skipped; one that is not in the history at all gets one warning.
        """
        for alert in alerts:
            key = alert.metric_name if alert.metric_name in metrics_log else self.logged_metric_name(alert.metric_name)
            if key not in metrics_log:
                plain_name = alert.metric_name.split('/', 1)[-1]
                if plain_name not in self.train_loop_obj.train_history and \
                        alert.metric_name not in self._warned_alert_metrics:
                    self._warned_alert_metrics.add(alert.metric_name)
                    logger.warning('WandBTracking alert on %r: no such metric in the train history (found %s)',
                                   alert.metric_name, sorted(self.train_loop_obj.train_history.keys()))
                continue
            value = metrics_log[key]
            if alert.objective == 'maximize' and value < alert.threshold_value:
                title, side = f'{alert.metric_name} is too low', 'below'
            elif alert.objective == 'minimize' and value > alert.threshold_value:
                title, side = f'{alert.metric_name} is too high', 'above'
            else:
                continue
            text = (f'Metric {alert.metric_name} is currently at {value} (epoch {self.train_loop_obj.epoch}), '
                    f'{side} the threshold of {alert.threshold_value}.')
            logger.info('WandBTracking alert: %s', text)
            if self.run is not None:
                self.run.alert(title=title, text=text, level=alert.wandb_alert_level)

    def check_alerts(self) -> None:
        """Raise TypeError / ValueError for an alert that is not an AlertConfig or has an unknown objective."""
        if self.alerts is None:
            return
        if isinstance(self.alerts, AlertConfig):
            raise TypeError('alerts must be a list of AlertConfig, got a single AlertConfig; wrap it in a list')
        for alert in self.alerts:
            if not isinstance(alert, AlertConfig):
                raise TypeError(f'alerts must be AlertConfig instances, got {type(alert).__qualname__}')
            if alert.objective not in ('maximize', 'minimize'):
                raise ValueError(f"AlertConfig objective must be 'maximize' or 'minimize', got "
                                 f'{alert.objective!r} in {alert}')
            if not is_number(alert.threshold_value):
                raise ValueError(f'AlertConfig threshold_value must be a number, got {alert.threshold_value!r}')
