"""The health of a long run: :class:`LossSpikeGuard` leaves out, or rolls back past, the updates of a loss spike, and
:class:`HangWatchdog` ends a run whose rank stopped making progress, naming it, instead of waiting for the collective's
timeout. See docs/long-runs.md."""
import collections
import faulthandler
import json
import logging
import math
import os
import socket
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Deque, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from .. import distributed
from ..engine import loop_state
from ..runtime.host_copy import HostCopy, host_copy
from ..model.multi_loss_optim import MultiLoss
from .abstract import AbstractCallback
from .preemption import find_checkpoint_callback

if TYPE_CHECKING:
    from ..engine.train_loop import TrainLoop

logger = logging.getLogger(__name__)

ACTIONS = ('skip', 'rollback')
MONITORS = ('loss', 'grad_norm')
SNAPSHOT_PLACES = ('host', 'device')


def _number(name: str, value: Any, low: float, who: str, integer: bool = False) -> None:
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not value >= low:
        raise ValueError(f'{who}: {name} must be {"an int" if integer else "a number"} >= {low}, got {value!r}')


class LossSpikeGuard(AbstractCallback):
    """Leave out the update of a loss spike, or roll back past it, as large runs do (OLMo-core's skipped steps,
    PaLM's restarts before a spike).

    At every optimizer update the guard reads the monitored value: the update's training loss (the mean of its
    micro-batches' losses) or the norm of its gradients (all parameters, unscaled), averaged over the ranks of a
    distributed fit, so every rank judges the same run. The value is a spike when its z-score against the last
    ``window`` values that were not spikes is above ``threshold`` (a value that is not finite always is); judging
    starts once half the window is filled. The mean and variance are the run's, kept in the guard's state, which is
    in every checkpoint.

    - ``action='skip'``: the update is left out (``loop.skip_update()``), on every rank.
    - ``action='rollback'``: the update is left out, and after the batch the run goes back to an in-memory snapshot:
      the weights, optimizer state, GradScaler, schedulers, callbacks' state, history and random-number states are
      restored (``loop.restart_from``), and training continues with the data ``skip_batches`` batches after the
      snapshot's batch: the batches in between are never trained. Snapshots are taken every ``rollback_steps``
      applied updates (and after the fit's first one); two are kept, and the rollback restores the newest taken at
      least ``rollback_steps`` updates before the spiking one (or the oldest there is): it goes back between
      ``rollback_steps`` and ``2 * rollback_steps - 1`` updates. Each snapshot holds a copy of the weights, of the
      optimizer state (Adam: twice the weights again) and of the callbacks' tensors (an EMA: once more), on the device
      or in pinned host memory (``snapshot_to``); ``snapshot_bytes`` says how much one takes. A snapshot costs a copy,
      not a synchronisation: it is queued behind the step's work. The snapshots are not in checkpoints: a resumed run
      takes its own from its first update on.

    Every skip and rollback is logged (a warning) and counted in the history of its epoch: ``loss_spikes_skipped``,
    ``loss_spikes_rolled_back``. ``skipped`` and ``rollbacks`` list them for the whole run.

    Cost per update: the value's copy to the host and the statistics (a few microseconds). With ``monitor='loss'``
    the copy starts right after the forward pass and is waited for only at the update, once the backward pass is
    queued: on a GPU the device keeps working while the host decides. ``monitor='grad_norm'`` needs the backward pass
    done: the host waits for it before it queues the optimizer step. In a distributed fit, ``monitor='loss'`` adds one
    all-reduce of one number per update, and the ranks agree on the skip (``may_skip_updates``). Not with a custom
    ``train_step`` and ``monitor='loss'`` (use ``'grad_norm'``), and rollbacks not under ``gpu_mode='fsdp'``.

    Args:
        window (int): the number of recent values the mean and variance are taken over (OLMo-core: 128).
        threshold (float): the z-score above which a value is a spike (OLMo-core: 6).
        action (str): ``'skip'`` or ``'rollback'``.
        rollback_steps (int): updates between snapshots, and how far back a rollback goes at least (PaLM: about 100).
        skip_batches (int or None): batches after the snapshot's batch that are never trained (PaLM: 200 to 500);
            None: up to and including the spiking batch. Never past the end of the snapshot's epoch.
        monitor (str): ``'loss'`` or ``'grad_norm'``.
        snapshot_to (str): ``'host'`` (pinned memory on a CUDA machine) or ``'device'`` (the model's device).
    """
    may_skip_updates = True
    history_names = ('loss_spikes_skipped', 'loss_spikes_rolled_back')

    def __init__(self, window: int = 128, threshold: float = 6.0, action: str = 'skip', rollback_steps: int = 100,
                 skip_batches: Optional[int] = None, monitor: str = 'loss', snapshot_to: str = 'host') -> None:
        # Just before PreemptionCheckpoint (10000): a stop after a rolled-back batch saves the restored state.
        super().__init__('Loss spike guard', execution_order=9_000)
        who = type(self).__name__
        _number('window', window, 2, who, integer=True)
        _number('threshold', threshold, 0, who)
        _number('rollback_steps', rollback_steps, 1, who, integer=True)
        if skip_batches is not None:
            _number('skip_batches', skip_batches, 0, who, integer=True)
        for name, value, allowed in (('action', action, ACTIONS), ('monitor', monitor, MONITORS),
                                     ('snapshot_to', snapshot_to, SNAPSHOT_PLACES)):
            if value not in allowed:
                raise ValueError(f'{who}: {name} must be one of {allowed}, got {value!r}')
        self.window, self.threshold, self.action = window, float(threshold), action
        self.rollback_steps, self.skip_batches, self.monitor = rollback_steps, skip_batches, monitor
        self.snapshot_to = snapshot_to
        # The run's state (in checkpoints).
        self.values: Deque[float] = collections.deque(maxlen=window)    # the recent values that were not spikes
        self._sum = self._sum_sq = 0.0      # of the values, kept as they come and go
        self._appended = 0
        self.updates = 0                    # optimizer updates applied in the run's trajectory
        self.skipped: List[Dict[str, Any]] = []      # {'epoch', 'batch', 'value', 'z'} of each skip
        self.rollbacks: List[Dict[str, Any]] = []    # ... and 'to_batch', 'continue_at' of each rollback
        #: Bytes of the latest snapshot (weights, optimizer state, the callbacks' tensors), or None.
        self.snapshot_bytes: Optional[int] = None
        # Per fit.
        self._snapshots: Deque[Tuple[int, Dict[str, Any]]] = collections.deque(maxlen=2)   # (updates, checkpoint)
        self._loss_sum: Any = None
        self._loss_count = 0
        self._pending: Optional[HostCopy] = None
        self._decided_at = -2
        self._rollback_due: Optional[Dict[str, Any]] = None
        self._rolling_back = False      # from a rollback until the first batch after it (the epoch reopens between)

    # ---- state ------------------------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        return {'values': list(self.values), 'updates': self.updates, 'skipped': list(self.skipped),
                'rollbacks': list(self.rollbacks)}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.values = collections.deque(state_dict.get('values', []), maxlen=self.window)
        self._recount()
        self.updates = int(state_dict.get('updates', 0))
        if not self._rolling_back:      # a rollback restores the snapshot's statistics; the record of the run goes on
            self.skipped = list(state_dict.get('skipped', []))
            self.rollbacks = list(state_dict.get('rollbacks', []))

    # ---- hooks ------------------------------------------------------------------------------------------------

    def hooks_in_use(self) -> List[str]:
        hooks = ['on_train_begin', 'on_after_gradient_update', 'on_batch_end', 'on_epoch_end', 'on_train_end',
                 'on_exception']
        return hooks + (['on_after_loss'] if self.monitor == 'loss' else [])

    def on_train_begin(self) -> None:
        """Check what the guard needs of this fit."""
        loop = self.train_loop_obj
        who = type(self).__name__
        if self.monitor == 'loss' and loop.train_step_owner is not None:
            raise ValueError(f"{who}(monitor='loss') reads the loss of the standard training step, but "
                             f"{type(loop.train_step_owner).__name__} owns train_step; use monitor='grad_norm'")
        if self.action == 'rollback' and distributed.is_fsdp_model(loop.model):
            raise ValueError(f"{who}(action='rollback') cannot snapshot a sharded model (gpu_mode='fsdp'); use "
                             f"action='skip'")
        self._snapshots.clear()
        self._loss_sum, self._loss_count, self._pending = None, 0, None
        self._decided_at, self._rollback_due, self._rolling_back = -2, None, False

    def on_after_loss(self) -> None:
        """(monitor='loss') Add the micro-batch's loss to the update's; after the window's last, start its copy to
        the host (averaged over the ranks first)."""
        loop = self.train_loop_obj
        loss = loop.loss
        if type(loss) is torch.Tensor:
            loss = loss.detach()
        elif isinstance(loss, MultiLoss):
            loss = torch.stack([torch.as_tensor(v).detach().float() for v in loss.values()]).sum()
        else:
            loss = loss.detach() if isinstance(loss, torch.Tensor) else torch.tensor(float(loss))
        self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
        self._loss_count += 1
        if loop.should_execute_optimizer_update():
            value = self._loss_sum if self._loss_count == 1 else self._loss_sum / self._loss_count
            self._loss_sum, self._loss_count = None, 0
            self._pending = host_copy(self._over_ranks(value))

    def on_after_gradient_update(self, optimizer_idx: int) -> None:
        """At the update (the first optimizer's hook): judge the value; leave a spike's update out."""
        loop = self.train_loop_obj
        if self._decided_at == loop.total_iteration_idx and loop.train_step_owner is None:
            return
        self._decided_at = loop.total_iteration_idx
        pending: Optional[HostCopy]
        if self.monitor == 'grad_norm':
            pending = host_copy(self._grad_norm())
        else:
            pending, self._pending = self._pending, None
            if pending is None:
                return
        value = float(pending.wait())
        z = self._z_score(value)
        if z is None or z <= self.threshold:
            self._append(value)
            return
        loop.skip_update()
        event = {'epoch': loop.epoch, 'batch': loop.total_iteration_idx, 'value': value,
                 'z': z if math.isfinite(z) else str(z)}
        if self.action == 'skip':
            self.skipped.append(event)
            if loop.is_main_process():
                logger.warning('%s: the %s %.5g at batch %d is %s standard deviations above the mean of the last %d '
                               'updates (%.5g): its update is left out', type(self).__name__, self.monitor, value,
                               loop.total_iteration_idx, f'{z:.1f}' if math.isfinite(z) else z, len(self.values),
                               self._mean())
        else:
            self._rollback_due = event

    def on_batch_end(self) -> None:
        """Count an applied update, take a snapshot when one is due, or roll back after a spike."""
        loop = self.train_loop_obj
        self._rolling_back = False
        if self._rollback_due is not None:
            event, self._rollback_due = self._rollback_due, None
            self._roll_back(event)
            return
        if not any(loop.update_applied):     # no update in this batch, or none applied
            return
        self.updates += 1
        if self.action == 'rollback' and (not self._snapshots or self.updates % self.rollback_steps == 0):
            self._take_snapshot()

    def on_epoch_end(self) -> None:
        """The epoch's skips and rollbacks, in the history."""
        loop = self.train_loop_obj
        epoch = loop.epoch
        loop.insert_metric_result_into_history('loss_spikes_skipped',
                                               sum(1 for e in self.skipped if e['epoch'] == epoch))
        loop.insert_metric_result_into_history('loss_spikes_rolled_back',
                                               sum(1 for e in self.rollbacks if e['epoch'] == epoch))

    def on_train_end(self) -> None:
        """Free the snapshots."""
        self._snapshots.clear()

    def on_exception(self, exception: BaseException) -> None:
        """Free the snapshots."""
        self._snapshots.clear()

    # ---- the value and its statistics ---------------------------------------------------------------------------

    def _over_ranks(self, value: torch.Tensor) -> torch.Tensor:
        loop = self.train_loop_obj
        if loop.world_size == 1:
            return value
        value = value.to(distributed.collective_device(loop.device)).reshape(1)
        dist.all_reduce(value)
        return value[0] / loop.world_size

    def _grad_norm(self) -> torch.Tensor:
        grads = [p.grad for p in self.train_loop_obj.model.parameters() if p.grad is not None]
        if not grads:
            return torch.zeros(())
        norm = torch.nn.utils.get_total_norm(grads)
        full_tensor = getattr(norm, 'full_tensor', None)        # a sharded model's gradients give a DTensor
        return full_tensor() if callable(full_tensor) else norm

    def _append(self, value: float) -> None:
        """Add a value to the window, keeping its sum and sum of squares (exact again every ``window`` values)."""
        values = self.values
        if len(values) == self.window:
            evicted = values[0]
            self._sum -= evicted
            self._sum_sq -= evicted * evicted
        values.append(value)
        self._sum += value
        self._sum_sq += value * value
        self._appended += 1
        if self._appended % self.window == 0:
            self._recount()

    def _recount(self) -> None:
        self._sum = math.fsum(self.values)
        self._sum_sq = math.fsum(v * v for v in self.values)

    def _mean(self) -> float:
        return self._sum / len(self.values) if self.values else float('nan')

    def _z_score(self, value: float) -> Optional[float]:
        """The z-score of ``value`` against the recent values (their sample standard deviation), inf for a value
        that is not finite, None while there are too few values to judge."""
        if not math.isfinite(value):
            return math.inf
        count = len(self.values)
        if count < max(2, self.window // 2):
            return None
        mean = self._sum / count
        variance = max(self._sum_sq - count * mean * mean, 0.0) / (count - 1)
        std = math.sqrt(variance)
        if std <= 1e-12 * max(abs(mean), 1.0):
            return math.inf if value > mean else 0.0
        return (value - mean) / std

    # ---- snapshots and rollbacks ------------------------------------------------------------------------------

    def _copy(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.snapshot_to == 'device' or tensor.device.type != 'cuda':
            return tensor.clone()
        host = torch.empty(tensor.shape, dtype=tensor.dtype, device='cpu', pin_memory=True)
        host.copy_(tensor, non_blocking=True)       # behind the step's work on the stream: no wait
        return host

    def _take_snapshot(self) -> None:
        snapshot = loop_state.build_snapshot(self.train_loop_obj, self._copy)
        self._snapshots.append((self.updates, snapshot))
        self.snapshot_bytes = _tensor_bytes(snapshot)

    def _roll_back(self, event: Dict[str, Any]) -> None:
        loop = self.train_loop_obj
        if not self._snapshots:
            self.skipped.append(event)      # nothing to go back to yet: the update was left out
            return
        spiking_update = self.updates + 1
        chosen = next(((u, s) for u, s in reversed(self._snapshots) if spiking_update - u >= self.rollback_steps),
                      self._snapshots[0])
        updates, snapshot = chosen
        snapshot_batch = snapshot['loop']['total_iteration_idx']
        skip = loop.total_iteration_idx - snapshot_batch if self.skip_batches is None else self.skip_batches
        self.rollbacks.append(dict(event, to_batch=snapshot_batch, continue_at=snapshot_batch + 1 + skip))
        self._rolling_back = True
        loop.restart_from(snapshot, skip_batches=skip, source=f'the snapshot after batch {snapshot_batch}')
        self.updates = updates
        while self._snapshots and self._snapshots[-1][0] > updates:
            self._snapshots.pop()           # taken on the trajectory just left
        if loop.is_main_process():
            logger.warning('%s: the %s %.5g at batch %d is %s standard deviations above the mean of the last %d '
                           'updates: rolled back to the snapshot after batch %d (%d updates before); the %d batches '
                           'after it are not trained, training continues with batch %d', type(self).__name__,
                           self.monitor, event['value'], event['batch'], event['z'] if isinstance(event['z'], str)
                           else f"{event['z']:.1f}", len(self.values), snapshot_batch, spiking_update - updates,
                           skip, snapshot_batch + 1 + skip)


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


# ---------------------------------------------------------------------------------------------- HangWatchdog


class HangWatchdog(AbstractCallback):
    """End a run whose rank stopped making progress, naming the rank and where it stopped, within ``timeout_s`` plus
    a few seconds (a collective's own timeout, 30 minutes by default, names no one).

    A thread of each rank watches the loop's progress: every training batch, evaluation batch and epoch boundary
    counts (a checkpoint write, an upload wait and torch.compile's work count as progress while they run). When a
    rank sees no progress for ``timeout_s``:

    1. it writes a report, to stderr and to ``hang_reports/rank<R>.txt`` in the experiment folder (when there is
       one): a header naming the rank, the seconds without progress and where its main thread is, either waiting in
       torch (a collective, or the backward's gradient all-reduce of a DDP step) or in user code (the innermost frame,
       such as a callback's hook), then the Python stacks of all its threads (``faulthandler``);
    2. where the rank's state allows (its main thread stopped between two training steps, and it is the rank that
       writes checkpoints), it writes an emergency checkpoint through the loop's checkpoint callback, and says so;
       otherwise it says why not;
    3. with the other ranks' reports in the experiment folder (waiting up to ``report_wait_s`` for them), it logs one
       line naming the ranks stopped in user code and the ranks only waiting in a collective;
    4. it exits with ``exit_code`` (``os._exit``: the main thread is stuck), so that torchrun, SLURM or Ray restarts
       the job.

    Every rank of a distributed fit runs it (each watches itself). A clean run never triggers it: choose
    ``timeout_s`` above the longest time between two batches (a step, a data-loader wait). Per step it costs two
    clock reads.

    Args:
        timeout_s (float): seconds without progress that count as a hang.
        exit_code (int): the process's exit status after a hang (not 0).
        report_wait_s (float): how long a rank waits for the others' reports before it names them.
    """

    def __init__(self, timeout_s: float, exit_code: int = 1, report_wait_s: float = 2.0) -> None:
        # Last: its on_batch_begin marks the step's start after every other callback's, its on_batch_end the end.
        super().__init__('Hang watchdog', execution_order=10 ** 9, device_idx_execution=None)
        who = type(self).__name__
        _number('timeout_s', timeout_s, 0.01, who)
        _number('report_wait_s', report_wait_s, 0, who)
        if isinstance(exit_code, bool) or not isinstance(exit_code, int) or exit_code == 0:
            raise ValueError(f'{who}: exit_code must be a non-zero int, got {exit_code!r}')
        self.timeout_s, self.exit_code, self.report_wait_s = float(timeout_s), exit_code, float(report_wait_s)
        self._beat = time.monotonic()
        self._between_steps = True
        self._last_done: Optional[Tuple[int, int, int]] = None     # (epoch, iteration, total_iteration_idx) done
        # Made at on_train_begin (a DDP fit pickles the callbacks into its processes; a lock cannot be pickled).
        self._stop: Optional[threading.Event] = None
        self._thread: Optional[threading.Thread] = None

    # ---- progress ---------------------------------------------------------------------------------------------

    def _progress(self) -> None:
        self._beat = time.monotonic()

    def on_train_begin(self) -> None:
        """Start watching."""
        self._progress()
        loop = self.train_loop_obj
        self._between_steps = True
        self._last_done = (loop.epoch, loop.iteration, loop.total_iteration_idx)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(threading.main_thread().ident, self._stop),
                                        name='HangWatchdog', daemon=True)
        self._thread.start()

    def on_epoch_begin(self) -> None:
        self._progress()

    def on_batch_begin(self) -> None:
        self._beat = time.monotonic()
        self._between_steps = False

    def on_batch_end(self) -> None:
        self._beat = time.monotonic()
        self._between_steps = True
        loop = self.train_loop_obj
        self._last_done = (loop.epoch, loop.iteration, loop.total_iteration_idx)

    def on_train_epoch_end(self) -> None:
        self._progress()

    def on_eval_batch_begin(self, batch: Any, dataset_info: Dict[str, Any]) -> None:
        self._progress()

    def on_eval_batch_end(self, batch: Any, outputs: Any, dataset_info: Dict[str, Any]) -> None:
        self._progress()

    def on_epoch_end(self) -> None:
        self._progress()

    def on_train_end(self) -> None:
        """Stop watching."""
        self._stop_watching()

    def on_exception(self, exception: BaseException) -> None:
        """Stop watching."""
        self._stop_watching()

    def _stop_watching(self) -> None:
        if self._stop is not None:
            self._stop.set()
        self._stop = self._thread = None

    # ---- the watching thread ----------------------------------------------------------------------------------

    def _watch(self, main_ident: Optional[int], stop: threading.Event) -> None:
        poll = min(1.0, self.timeout_s / 4)
        while not stop.wait(poll):
            silent = time.monotonic() - self._beat
            if silent <= self.timeout_s:
                continue
            frames = _stack_of(main_ident)
            if _busy(frames):
                continue            # a checkpoint write, an upload wait, a compilation: alive
            if stop.is_set():
                return
            self._report_and_exit(frames, silent)

    def _report_and_exit(self, frames: List[traceback.FrameSummary], silent: float) -> None:
        loop = self.train_loop_obj
        rank, world_size = loop.global_rank, loop.world_size
        waiting = _waiting_in_torch(frames, world_size)
        where = _innermost_user_frame(frames)
        state = ('waiting in torch (a collective, or the gradient all-reduce of a DDP backward)' if waiting else
                 f'in user code: {where}')
        header = (f'HangWatchdog: rank {rank} of {world_size} (pid {os.getpid()}, {socket.gethostname()}) made no '
                  f'progress for {silent:.1f} s (timeout_s={self.timeout_s:g}); its main thread is {state}')
        folder = self._report_folder()
        path = os.path.join(folder, f'rank{rank}.txt') if folder else None
        try:
            _write_report(header, path)
        except Exception:       # the report on stderr matters more than the file
            logger.exception('HangWatchdog: the report file %s could not be written', path)
            _write_report(header, None)
        checkpoint = self._emergency_checkpoint(waiting)
        if folder:
            _write_json(os.path.join(folder, f'rank{rank}.json'),
                        {'rank': rank, 'waiting': waiting, 'where': where, 'silent_s': silent, 'pid': os.getpid()})
            self._name_the_ranks(folder, world_size)
        sys.stderr.write(f'HangWatchdog: rank {rank} exits with status {self.exit_code}{checkpoint}\n')
        sys.stderr.flush()
        for handler in logging.getLogger().handlers + logger.handlers:
            try:
                handler.flush()
            except Exception:
                pass
        os._exit(self.exit_code)

    def _report_folder(self) -> Optional[str]:
        experiment = self.train_loop_obj.experiment
        if experiment is None or not getattr(experiment, 'claimed', False):
            return None
        folder = os.path.join(experiment.dir_path, 'hang_reports')
        os.makedirs(folder, exist_ok=True)
        return folder

    def _emergency_checkpoint(self, waiting: bool) -> str:
        """Write a checkpoint where the state allows it; returns what to say about it."""
        loop = self.train_loop_obj
        if not self._between_steps or waiting:
            return ('; no emergency checkpoint: its main thread stopped inside a training step, where the weights, '
                    'optimizer and data position do not agree (the last checkpoint is the resume point)')
        saver = find_checkpoint_callback(loop)
        if saver is None:
            return '; no emergency checkpoint: no checkpoint callback (ModelCheckpoint) is registered'
        if not loop.is_main_process() or distributed.is_fsdp_model(loop.model):
            return '; no emergency checkpoint from this rank: rank 0 writes checkpoints (a sharded one needs every rank)'
        if self._last_done is not None and loop.total_iteration_idx != self._last_done[2]:
            # Stuck in the next batch's on_batch_begin (its counters already moved): the state is the last batch's.
            epoch, iteration, done = self._last_done
            if (iteration + 1) % loop.grad_accumulation != 0 and epoch == loop.epoch:
                return ('; no emergency checkpoint: its main thread stopped inside a gradient-accumulation window '
                        '(the last checkpoint is the resume point)')
            loop.total_iteration_idx = done
            loop.iteration = iteration if epoch == loop.epoch else -1
        try:
            # The main thread is stuck between two steps: the state does not change under this thread.
            path = saver.save_checkpoint(iteration_idx=loop.total_iteration_idx, wait=True, all_ranks=False)
        except Exception as error:
            logger.exception('HangWatchdog: the emergency checkpoint failed')
            return f'; the emergency checkpoint failed: {error!r}'
        return f'; emergency checkpoint after batch {loop.total_iteration_idx}: {path}'

    def _name_the_ranks(self, folder: str, world_size: int) -> None:
        deadline = time.monotonic() + self.report_wait_s
        reports: Dict[int, Dict[str, Any]] = {}
        while True:
            for rank in range(world_size):
                if rank not in reports:
                    try:
                        with open(os.path.join(folder, f'rank{rank}.json')) as file:
                            reports[rank] = json.load(file)
                    except (OSError, ValueError):
                        pass
            if len(reports) == world_size or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        stuck = [f"rank {r} ({reports[r]['where']})" for r in sorted(reports) if not reports[r]['waiting']]
        waiting = [str(r) for r in sorted(reports) if reports[r]['waiting']]
        silent = [str(r) for r in range(world_size) if r not in reports]
        sys.stderr.write('HangWatchdog: stopped in user code: ' + (', '.join(stuck) or 'none seen') +
                         '; only waiting in a collective: ' + ('rank ' + ', '.join(waiting) if waiting else 'none') +
                         (f'; no report from rank {", ".join(silent)}' if silent else '') + '\n')


def _stack_of(ident: Optional[int]) -> List[traceback.FrameSummary]:
    """The stack of the thread ``ident``, outermost frame first (empty when the thread is gone)."""
    # sys._current_frames() is the documented way to read another thread's stack (the sys module's docs).
    frame = sys._current_frames().get(ident) if ident is not None else None
    return list(traceback.extract_stack(frame)) if frame is not None else []


# What a main thread does when it is busy, not stuck: writing a checkpoint, waiting for uploads, compiling.
_BUSY_PARTS = (os.sep + os.path.join('aitoolbox_like', 'checkpoint.py'), os.sep + os.path.join('torch', '_dynamo'),
               os.sep + os.path.join('torch', '_inductor'), os.sep + os.path.join('torch', 'serialization.py'),
               os.sep + os.path.join('aitoolbox_like', 'storage', 'uploader.py'))
_TORCH_WAITS = (os.sep + os.path.join('torch', 'distributed') + os.sep,)
_TORCH_BACKWARD = (os.sep + os.path.join('torch', 'autograd') + os.sep, os.sep + os.path.join('torch', '_tensor.py'))


def _busy(frames: List[traceback.FrameSummary]) -> bool:
    return any(part in frame.filename for frame in frames for part in _BUSY_PARTS)


def _waiting_in_torch(frames: List[traceback.FrameSummary], world_size: int) -> bool:
    """Whether the innermost frames are torch waiting on other ranks: a collective, or (several ranks) a backward
    pass, whose DDP gradient all-reduce waits for every rank."""
    if not frames:
        return False
    innermost = frames[-1].filename
    if any(part in innermost for part in _TORCH_WAITS):
        return True
    return world_size > 1 and any(part in innermost for part in _TORCH_BACKWARD)


def _innermost_user_frame(frames: List[traceback.FrameSummary]) -> str:
    """The innermost frame outside torch and Python's own library, as ``file:line in function``."""
    stdlib = os.path.dirname(os.__file__)
    torch_dir = os.path.dirname(torch.__file__)
    for frame in reversed(frames):
        if not frame.filename.startswith((stdlib, torch_dir)):
            return f'{frame.filename}:{frame.lineno} in {frame.name}'
    return f'{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}' if frames else 'unknown'


def _write_report(header: str, path: Optional[str]) -> None:
    """``header`` and every thread's stack (faulthandler, which needs no cooperation from the stuck thread), to
    stderr and to ``path``."""
    sys.stderr.write(header + '\n')
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    if path is not None:
        with open(path, 'w') as file:
            file.write(header + '\n')
            file.flush()
            faulthandler.dump_traceback(file=file, all_threads=True)


def _write_json(path: str, value: Dict[str, Any]) -> None:
    temporary = f'{path}.{os.getpid()}.tmp'
    with open(temporary, 'w') as file:
        json.dump(value, file)
    os.replace(temporary, path)
