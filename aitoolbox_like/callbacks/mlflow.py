"""MLflow experiment tracking (``pip install aitoolbox_like[mlflow]``).

``MLflowTracking`` logs a training into an MLflow run: the hyperparameters as params, every value the training
history gains as metrics (per epoch at step = epoch; the batch losses per step when asked), the experiment
folder's files as artifacts, and tags (project, experiment, git commit). It runs on rank 0 only and never calls a
collective.

Nothing the callback sends can stop or slow the training: every MLflow call is made by one background thread
from a queue. When the tracking server is down the callback says so once (a warning), keeps what it could not
log queued and catches up when the server answers again; what is still not logged when fit ends (after waiting
``end_wait_timeout_s``) is reported in one message. ``mlflow`` is imported when the callback is created, not
when this module is imported.

The run id is part of the callback's state (``state_dict``), so it is saved in checkpoints and
``fit(resume_from=...)`` continues the same MLflow run.
"""
import collections
import importlib
import logging
import os
import subprocess
import sys
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ..experiment import CHECKPOINT_DIR, HYPERPARAMS_JSON, MODEL_DIR
from ._common import BatchLossReader, StepLearningRates, as_number, check_int, is_number
from ._mlflow_sender import Operation, Sender, is_transient_error
from .performance_eval import history_series
from .step_logging import AbstractStepLoggingTracker

logger = logging.getLogger(__name__)

_INSTALL_HINT = 'pip install aitoolbox_like[mlflow]'
# MLflow's limits per log_batch request (mlflow.utils.validation) and on a param value.
_MAX_METRICS_PER_BATCH = 1000
_MAX_PARAMS_TAGS_PER_BATCH = 100
_MAX_PARAM_VALUE_LENGTH = 6000
# Folders of an experiment folder that are never artifacts (other trackers' own files, caches, VCS).
_SKIP_DIRS = {'__pycache__', '.git', '.hg', '.svn', '.ipynb_checkpoints', 'wandb', 'mlruns', 'mlartifacts'}


def import_mlflow(who: str = 'MLflowTracking') -> Any:
    """The ``mlflow`` module, or an ImportError with the install hint when the extra is missing."""
    try:
        return importlib.import_module('mlflow')
    except ImportError as exc:
        raise ImportError(f'{who} needs the mlflow package: {_INSTALL_HINT}') from exc


def _flatten_params(params: Dict[str, Any], prefix: str = '') -> Dict[str, str]:
    """MLflow params (strings) of a hyperparameter dict: nested dicts as ``outer.inner``, long values cut."""
    flat: Dict[str, str] = {}
    for name, value in params.items():
        key = f'{prefix}{name}'
        if isinstance(value, dict) and value:
            flat.update(_flatten_params(value, key + '.'))
            continue
        text = str(value)
        if len(text) > _MAX_PARAM_VALUE_LENGTH:
            text = text[:_MAX_PARAM_VALUE_LENGTH - 3] + '...'
        flat[key] = text
    return flat


def git_commit(folder: Optional[str]) -> Optional[str]:
    """``git rev-parse HEAD`` in ``folder`` (None: the working directory), or None when there is no git, no
    repository or no commit (never raises)."""
    try:
        result = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=folder or None, capture_output=True, text=True,
                                timeout=10, check=False)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    commit = result.stdout.strip()
    return commit if result.returncode == 0 and len(commit) in (40, 64) else None


class MLflowTracking(AbstractStepLoggingTracker):
    """Track the training in MLflow: params, history metrics, batch losses, artifacts, tags, resume (what is
    logged and the arguments: see ``__init__``)."""

    def __init__(self, tracking_uri: Optional[str] = None, experiment_name: Optional[str] = None,
                 run_name: Optional[str] = None, log_checkpoints: bool = False,
                 batch_log_frequency: Optional[int] = None, tags: Optional[Dict[str, Any]] = None, *,
                 hyperparams: Optional[Dict[str, Any]] = None, metric_names: Optional[Sequence[str]] = None,
                 log_artifacts: bool = True, batch_sync_frequency: int = 100,
                 finish_run_on_train_end: bool = True, start_wait_s: float = 10.0,
                 end_wait_timeout_s: float = 60.0, retry_interval_s: float = 1.0,
                 max_retry_interval_s: float = 30.0, stall_warning_s: float = 60.0) -> None:
        """Track the training in MLflow (https://mlflow.org). Needs ``pip install aitoolbox_like[mlflow]``.

        Logged:
            * params: ``hyperparams`` (or the tracking TrainLoop's ``hyperparams``), as strings; nested dicts as
              ``outer.inner``.
            * after each epoch, at step = epoch: every history value recorded in that epoch under its history
              name (``loss``, ``val_loss``, ``val_Accuracy``; dict-valued metrics per key as ``<name>_<key>``),
              or only ``metric_names``. At the end of fit the ``train_end_*`` values, at step = the last epoch.
            * with ``batch_log_frequency=k``: ``batch_loss`` (the loss of every k-th batch) and
              ``batch_loss_running_mean`` (the epoch's running mean) at step = global batch index (per loss as
              ``batch_<name>`` / ``batch_<name>_running_mean`` for a MultiLoss), with the learning rate that step's
              update used (``learning_rate/group_<i>``, ``learning_rate/optimizer_<k>_group_<i>`` with several
              optimizers). The losses are read from the device in one transfer every ``batch_sync_frequency`` steps
              and at the end of each epoch, never once per step.
            * artifacts (``log_artifacts``): the files of the loop's experiment folder (``loop.experiment``,
              made by the saving callbacks or a tracking TrainLoop): results and plots, hyperparameter files
              (``hyperparams.json`` from the experiment's bookkeeping folder), the script copy and
              ``source_code.zip``, TensorBoard files; new and changed ones after every epoch and at the end of fit,
              under the same relative paths. ``checkpoint_model/`` and ``model/`` only with ``log_checkpoints``.
            * tags: ``project``, ``experiment``, ``experiment_folder`` (when there is one),
              ``mlflow.source.git.commit`` (``git rev-parse HEAD`` in the script's folder, when it is a git
              checkout) and ``tags``.

        Args:
            tracking_uri: the MLflow tracking URI (``http://host:5000``, ``sqlite:///mlflow.db``,
                ``databricks``, ...); None uses MLflow's own default (``MLFLOW_TRACKING_URI``, else
                ``sqlite:///mlflow.db`` in the working directory).
            experiment_name: the MLflow experiment (created when missing); None: the loop's project name
                (``project_name`` of a tracking TrainLoop or of the saving callbacks' experiment, else
                ``default_project``).
            run_name: the MLflow run's name; None: the loop's experiment name (else ``experiment``).
            log_checkpoints: also log the checkpoints and saved models of the experiment folder.
            batch_log_frequency: log every k-th batch loss (None: only per-epoch metrics).
            tags: extra run tags.
            hyperparams: (keyword-only) the params (None: the tracking TrainLoop's ``hyperparams``, if any).
            metric_names: (keyword-only) history metrics to log (None: all of them).
            log_artifacts: (keyword-only) log the experiment folder's files.
            batch_sync_frequency: (keyword-only) read pending batch losses from the device every n steps.
            finish_run_on_train_end: (keyword-only) end the run (status FINISHED) at the end of fit; a later fit
                of the same loop reopens it. An exception ends it as FAILED.
            start_wait_s: (keyword-only) how long the start of training waits for the run to be created (so
                that the first checkpoint holds its id); the training starts anyway after it.
            end_wait_timeout_s: (keyword-only) how long the end of fit waits for what is still queued (the
                server was down); what is not sent by then is reported and still sent while the process lives.
            retry_interval_s, max_retry_interval_s: (keyword-only) the first and the longest pause between tries
                while the server is down (doubling).
            stall_warning_s: (keyword-only) warn that the server is not answering when one call has been
                waiting this long (MLflow's own HTTP retries, ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, can take
                minutes before a call fails).

        Resume: the run id is the callback's state (``state_dict()``, key ``MLflowTracking``), so checkpoints
        hold it and ``fit(resume_from=...)`` logs into the same run (reopened as RUNNING; params it already has
        are not logged again). A checkpoint of a run whose id the server does not know (another tracking server)
        starts a new run, with a warning.
        """
        super().__init__('MLflow Experiment Tracking', execution_order=97, device_idx_execution=0)
        self._mlflow = import_mlflow()      # a missing extra fails here, not after the first epoch
        check_int('batch_log_frequency', batch_log_frequency, allow_none=True, who='MLflowTracking')
        check_int('batch_sync_frequency', batch_sync_frequency, who='MLflowTracking')
        if hyperparams is not None and not isinstance(hyperparams, dict):
            raise TypeError(f'MLflowTracking: hyperparams must be a dict, got {type(hyperparams).__qualname__}')
        if tags is not None and not isinstance(tags, dict):
            raise TypeError(f'MLflowTracking: tags must be a dict of tag name -> value, got '
                            f'{type(tags).__qualname__}')
        for name, value in (('start_wait_s', start_wait_s), ('end_wait_timeout_s', end_wait_timeout_s),
                            ('retry_interval_s', retry_interval_s), ('max_retry_interval_s', max_retry_interval_s),
                            ('stall_warning_s', stall_warning_s)):
            if not is_number(value) or value < 0:
                raise ValueError(f'MLflowTracking: {name} must be a number >= 0, got {value!r}')
        self.tracking_uri = tracking_uri
        self.mlflow_experiment_name = experiment_name
        self.run_name = run_name
        self.log_checkpoints = log_checkpoints
        self.batch_log_frequency = batch_log_frequency
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self.hyperparams = hyperparams
        self.metric_names = list(metric_names) if metric_names is not None else None
        self.log_artifacts = log_artifacts
        self.batch_sync_frequency = batch_sync_frequency
        self.finish_run_on_train_end = finish_run_on_train_end
        self.start_wait_s = float(start_wait_s)
        self.end_wait_timeout_s = float(end_wait_timeout_s)
        self.retry_interval_s = float(retry_interval_s)
        self.max_retry_interval_s = float(max_retry_interval_s)
        self.stall_warning_s = float(stall_warning_s)

        self.run_id: Optional[str] = None
        self.experiment_id: Optional[str] = None
        self.not_logged: List[str] = []        # what the last fit could not log (see on_train_end)
        self._client: Any = None
        self._sender: Optional[Sender] = None
        self._run_open = False
        self._known_params: Dict[str, str] = {}
        self._artifact_signatures: Dict[str, Tuple[int, int]] = {}
        self.batch_losses = BatchLossReader()
        self.learning_rates = StepLearningRates()

    # ---- state (checkpoints) --------------------------------------------------------------------

    @property
    def state_key(self) -> str:
        """Always ``'MLflowTracking'``."""
        return 'MLflowTracking'

    def state_dict(self) -> Optional[Dict[str, str]]:
        """``{'run_id': ...}`` once the run exists, so a checkpoint resumes the same MLflow run."""
        return {'run_id': self.run_id} if self.run_id is not None else None

    def load_state_dict(self, state_dict: Dict[str, str]) -> None:
        """Continue the checkpoint's MLflow run (reopened at the next on_train_begin)."""
        run_id = state_dict.get('run_id')
        if run_id and run_id != self.run_id:
            self.run_id = run_id
            self._run_open = False
            self._known_params = {}

    def __getstate__(self) -> Dict[str, Any]:
        # A DDP launch pickles the callbacks before training; the module, the client and the thread cannot travel.
        state = self.__dict__.copy()
        state.update(_mlflow=None, _client=None, _sender=None)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._mlflow = import_mlflow()

    # ---- set-up ---------------------------------------------------------------------------------

    def on_train_loop_registration(self) -> None:
        """Take the hyperparameters from a tracking TrainLoop when not given."""
        loop_hyperparams = getattr(self.train_loop_obj, 'hyperparams', None)
        if self.hyperparams is None and isinstance(loop_hyperparams, dict):
            self.hyperparams = loop_hyperparams

    def on_train_begin(self) -> None:
        """Create (or reopen) the run, and queue the params and tags."""
        loop = self.train_loop_obj
        experiment = loop.experiment
        # A plain TrainLoop with saving callbacks: their experiment names the run.
        if experiment is not None and getattr(loop, 'project_name', None) is None:
            self.project_name = self.project_name or experiment.project_name
            self.experiment_name = self.experiment_name or experiment.experiment_name
        # Not while registered (the saving callbacks' experiment may not exist yet), so the defaults are asked for.
        self.infer_experiment_details()
        if self._client is None:
            self._client = importlib.import_module('mlflow.tracking').MlflowClient(tracking_uri=self.tracking_uri)
        if self._sender is None:
            self._sender = Sender(self._execute, self._server_name, self.retry_interval_s,
                                   self.max_retry_interval_s, self.stall_warning_s)
        self.not_logged = []
        if not self._run_open:
            self._sender.submit(Operation('start'))
            self._run_open = True
            tags = self._run_tags()
            params = _flatten_params(self.hyperparams) if self.hyperparams else {}
            self._submit_batch(params=params, tags=tags)
            if not self._sender.wait(self.start_wait_s):
                logger.warning('MLflowTracking: the MLflow run is not created yet after %.0f s; training starts and '
                               'the run follows when the server %s answers', self.start_wait_s, self._server_name())
        self._log_artifacts()

    def _server_name(self) -> str:
        client = self._client
        uri = getattr(client, 'tracking_uri', None) or self.tracking_uri
        return str(uri) if uri else '(default tracking URI)'

    def _run_tags(self) -> Dict[str, str]:
        tags = {'project': str(self.project_name), 'experiment': str(self.experiment_name)}
        experiment = self.train_loop_obj.experiment
        if experiment is not None and experiment.claimed:
            tags['experiment_folder'] = experiment.dir_path
        script = self.hyperparams.get('experiment_file_path') if isinstance(self.hyperparams, dict) else None
        if not script and sys.argv and sys.argv[0] and os.path.isfile(sys.argv[0]):
            script = sys.argv[0]
        if script:
            tags['mlflow.source.name'] = os.path.abspath(str(script))
        commit = git_commit(os.path.dirname(os.path.abspath(str(script))) if script else None)
        if commit:
            tags['mlflow.source.git.commit'] = commit
        tags.update(self.tags)
        return tags

    # ---- the calls the sender makes -------------------------------------------------------------

    def _execute(self, operation: Operation) -> None:
        client = self._client
        if operation.kind == 'start':
            self._start_run()
            return
        if self.run_id is None:
            raise RuntimeError('no MLflow run')       # unreachable: 'start' is always done first
        if operation.kind == 'batch':
            entities = importlib.import_module('mlflow.entities')
            params = {k: v for k, v in operation.params.items() if k not in self._known_params}
            for key, value in operation.params.items():
                if key in self._known_params and self._known_params[key] != value:
                    logger.warning('MLflowTracking: param %r is %r in the MLflow run and %r now; MLflow params '
                                   'cannot change, the run keeps %r', key, self._known_params[key], value,
                                   self._known_params[key])
            client.log_batch(self.run_id,
                             metrics=[entities.Metric(k, v, t, s) for k, v, t, s in operation.metrics],
                             params=[entities.Param(k, v) for k, v in params.items()],
                             tags=[entities.RunTag(k, v) for k, v in operation.tags.items()],
                             synchronous=True)
            self._known_params.update(params)
        elif operation.kind == 'artifact':
            if not os.path.isfile(operation.path):
                logger.debug('MLflowTracking: %s was removed before it was logged', operation.path)
                return
            client.log_artifact(self.run_id, operation.path, operation.artifact_path)
        elif operation.kind == 'terminate':
            client.set_terminated(self.run_id, status=operation.status)

    def _start_run(self) -> None:
        client = self._client
        if self.run_id is not None:
            try:
                run = client.get_run(self.run_id)
            except Exception as error:
                if is_transient_error(error):
                    raise
                logger.warning('MLflowTracking: the MLflow server %s has no run %s (%s); starting a new run',
                               self._server_name(), self.run_id, error)
                self.run_id = None
            else:
                self.experiment_id = run.info.experiment_id
                self._known_params = dict(run.data.params)
                if run.info.status != 'RUNNING':
                    client.update_run(self.run_id, status='RUNNING')
                logger.info('MLflowTracking: continuing MLflow run %s (%s)', self.run_id, run.info.run_name)
                return
        experiment_name = self.mlflow_experiment_name or str(self.project_name)
        experiment = client.get_experiment_by_name(experiment_name)
        if experiment is not None:
            self.experiment_id = experiment.experiment_id
        else:
            try:
                self.experiment_id = client.create_experiment(experiment_name)
            except Exception:
                experiment = client.get_experiment_by_name(experiment_name)      # created meanwhile by another run
                if experiment is None:
                    raise
                self.experiment_id = experiment.experiment_id
        run = client.create_run(self.experiment_id, run_name=self.run_name or str(self.experiment_name))
        self._known_params = {}
        self.run_id = run.info.run_id
        logger.info('MLflowTracking: MLflow run %s (%s) started in experiment %r at %s', self.run_id,
                    run.info.run_name, experiment_name, self._server_name())

    # ---- training events ------------------------------------------------------------------------

    def on_epoch_end(self) -> None:
        """Queue the epoch's remaining batch losses, its history values and the new or changed files."""
        if self.batch_log_frequency is not None:
            self.log_mid_train_loss()
        history = self.train_loop_obj.train_history
        names = self.metric_names if self.metric_names is not None else \
            [name for name in history.keys() if not name.startswith('train_end_')]
        self.log_train_history_metrics(names)
        self._log_artifacts()
        if self._sender is not None:
            self._sender.check_stalled()

    def on_train_end(self) -> None:
        """Queue the rest (batch losses, ``train_end_*`` values, files), end the run, and wait for the queue
        (``end_wait_timeout_s``); report what could not be logged."""
        if self._sender is None:
            return
        if self.batch_log_frequency is not None:
            self.log_mid_train_loss()       # a StopTraining inside an epoch skips on_epoch_end
        self.log_train_end_metrics()
        if self.log_checkpoints:
            # This callback runs before the savers' on_train_end: the last checkpoint may still be written in the
            # background, and a partial or missing file must not be what the run keeps.
            self.train_loop_obj.wait_for_pending_saves()
        self._log_artifacts()
        if self.finish_run_on_train_end:
            # An interrupted run continues later (MLflow's KILLED: ended from outside before its end).
            status = 'KILLED' if self.train_loop_obj.interrupted else 'FINISHED'
            self._sender.submit(Operation('terminate', status=status))
            self._run_open = False
        self.flush(self.end_wait_timeout_s)
        self._release_sender()

    def on_exception(self, exception: BaseException) -> None:
        """End the run as FAILED (waiting a few seconds at most); the training's exception propagates."""
        if self._sender is None:
            return
        try:
            self._sender.submit(Operation('terminate', status='FAILED'))
            self._run_open = False
            self.flush(min(self.end_wait_timeout_s, 10.0))
            self._release_sender()
        except Exception as error:          # the training's own exception is the one to see
            logger.error('MLflowTracking: could not end the MLflow run after %s (%s: %s)',
                         type(exception).__name__, type(error).__name__, error)

    def flush(self, timeout: Optional[float] = None) -> List[str]:
        """Wait up to ``timeout`` seconds (None: until done) for everything queued to reach MLflow. Returns (and
        keeps in ``not_logged``) what is still not logged, described, with what the server refused; logs them
        in one error message. What is still queued goes on being sent while the process lives."""
        sender = self._sender
        if sender is None:
            return []
        sender.wait(timeout)
        pending = sender.pending()
        self.not_logged = [op.describe() for op in pending] + list(sender.dropped)
        sender.dropped.clear()
        if pending:
            counts: Dict[str, int] = collections.Counter()
            for op in pending:
                counts['metric values'] += len(op.metrics)
                counts['params'] += len(op.params)
                counts['tags'] += len(op.tags)
                counts['artifacts'] += op.kind == 'artifact'
            what = ', '.join(f'{n} {k}' for k, n in counts.items() if n) or 'the run start / status'
            logger.error('MLflowTracking: not logged to the MLflow server %s after waiting %s s: %s (%d queued '
                         'call(s); last error: %s). They are still sent if the server answers while this process '
                         'runs; the experiment folder keeps the files, the training history the metrics.',
                         self._server_name(), 'unbounded' if timeout is None else f'{timeout:.0f}', what,
                         len(pending), sender.last_error)
        return list(self.not_logged)

    def _release_sender(self) -> None:
        # Once the run is ended and everything is sent, the thread ends (a later fit starts another); with calls
        # still queued it stays, to send them while the process lives.
        sender = self._sender
        if sender is not None and not self._run_open and not sender.pending():
            sender.close()
            self._sender = None

    @property
    def server_down(self) -> bool:
        """True while the tracking server is not answering (from the first failed call until one succeeds)."""
        return self._sender is not None and self._sender.down

    # ---- logging --------------------------------------------------------------------------------

    def _submit_batch(self, metrics: Sequence[Tuple[str, float, int, int]] = (),
                      params: Optional[Dict[str, str]] = None, tags: Optional[Dict[str, str]] = None) -> None:
        if self._sender is None:
            return
        metrics = list(metrics)
        param_items = list((params or {}).items())
        tag_items = list((tags or {}).items())
        while metrics or param_items or tag_items:
            operation = Operation('batch', metrics=metrics[:_MAX_METRICS_PER_BATCH],
                                   params=dict(param_items[:_MAX_PARAMS_TAGS_PER_BATCH]),
                                   tags=dict(tag_items[:_MAX_PARAMS_TAGS_PER_BATCH]))
            metrics = metrics[_MAX_METRICS_PER_BATCH:]
            param_items = param_items[_MAX_PARAMS_TAGS_PER_BATCH:]
            tag_items = tag_items[_MAX_PARAMS_TAGS_PER_BATCH:]
            self._sender.submit(operation)

    def log_mid_train_loss(self) -> None:
        """Queue the batch losses of this epoch not queued yet: ``batch_<name>`` and the epoch's running mean
        ``batch_<name>_running_mean`` (name 'loss' for a single loss) of the steps that are multiples of
        ``batch_log_frequency``, at step = global batch index.

        All pending losses are copied to the host in one transfer (one host-device sync per call); they are this
        process's own losses.
        """
        rows = self.batch_losses.read_new(self.train_loop_obj)
        if not rows:
            return
        frequency = self.batch_log_frequency or 1
        timestamp = int(time.time() * 1000)
        metrics: List[Tuple[str, float, int, int]] = []
        for step, values, means in rows:
            if step % frequency == 0:
                for name, value in values.items():
                    metrics.append((f'batch_{name}', value, timestamp, step))
                    metrics.append((f'batch_{name}_running_mean', means[name], timestamp, step))
                for name, lr in self.learning_rates.take_named(step).items():
                    metrics.append((name, lr, timestamp, step))
        self._submit_batch(metrics)

    def log_train_history_metrics(self, metric_names: Iterable[str]) -> Dict[str, float]:
        """Queue the values of ``metric_names`` recorded in the current epoch (metrics computed every k epochs
        are not repeated with a stale value), at step = epoch. Returns them."""
        loop = self.train_loop_obj
        values = self._epoch_values(metric_names, loop.epoch)
        timestamp = int(time.time() * 1000)
        self._submit_batch([(name, value, timestamp, loop.epoch) for name, value in values.items()])
        return values

    def log_train_end_metrics(self) -> Dict[str, float]:
        """Queue the ``train_end_*`` history values (e.g. ``train_end_test_loss``) at step = the last epoch."""
        loop = self.train_loop_obj
        history = loop.train_history
        wanted = None if self.metric_names is None else set(self.metric_names)
        names = [n for n in history.keys() if n.startswith('train_end_')
                 and (wanted is None or n in wanted or n[len('train_end_'):] in wanted)]
        final: Dict[str, float] = {}
        for name, (_, series) in history_series(history, names).items():
            value = as_number(series[-1]) if series else None
            if value is not None:
                final[name] = value
        timestamp = int(time.time() * 1000)
        self._submit_batch([(name, value, timestamp, max(loop.epoch, 0)) for name, value in final.items()])
        return final

    def _epoch_values(self, metric_names: Iterable[str], epoch: int) -> Dict[str, float]:
        values: Dict[str, float] = {}
        for name, (epochs, series) in history_series(self.train_loop_obj.train_history, list(metric_names)).items():
            if not series or epochs[-1] != epoch:
                continue
            value = as_number(series[-1])
            if value is not None:
                values[name] = value
        return values

    def artifact_files(self) -> List[Tuple[str, str]]:
        """``(path, relative path)`` of every file of the experiment folder that is logged as an artifact (see
        ``__init__``); empty when the loop has no experiment folder."""
        experiment = self.train_loop_obj.experiment
        if experiment is None or not experiment.claimed or not os.path.isdir(experiment.dir_path):
            return []
        root = experiment.dir_path
        skip_dirs = set(_SKIP_DIRS) | (set() if self.log_checkpoints else {CHECKPOINT_DIR, MODEL_DIR})
        store = self._local_store_path()
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs and not d.startswith('.'))
            for filename in sorted(filenames):
                if filename.startswith('.'):       # temporary files of atomic writes
                    continue
                path = os.path.join(dirpath, filename)
                if store is not None and os.path.abspath(path).startswith(store):
                    continue
                files.append((path, os.path.relpath(path, root)))
        # The hyperparameters as JSON live in the bookkeeping folder, outside the experiment folder.
        hyperparams_json = os.path.join(experiment.work_dir, HYPERPARAMS_JSON)
        if os.path.isfile(hyperparams_json) and not any(rel == HYPERPARAMS_JSON for _, rel in files):
            files.append((hyperparams_json, HYPERPARAMS_JSON))
        return files

    def _local_store_path(self) -> Optional[str]:
        """The tracking store's own file / folder when it is local (never logged as an artifact of itself)."""
        uri = getattr(self._client, 'tracking_uri', None) or ''
        if uri.startswith('sqlite:///'):
            return os.path.abspath(uri[len('sqlite:///'):])
        if uri.startswith('file://'):
            return os.path.abspath(uri[len('file://'):])
        if uri and ':' not in uri:
            return os.path.abspath(uri)
        return None

    def _log_artifacts(self) -> None:
        if not self.log_artifacts or self._sender is None:
            return
        for path, rel in self.artifact_files():
            try:
                stat = os.stat(path)
            except OSError:
                continue
            signature = (stat.st_mtime_ns, stat.st_size)
            if self._artifact_signatures.get(rel) == signature:
                continue
            self._artifact_signatures[rel] = signature
            folder = os.path.dirname(rel).replace(os.sep, '/')
            self._sender.submit(Operation('artifact', path=path, artifact_path=folder or None))
