"""Preemption-safe training: on SIGTERM / SIGINT (a scheduler preempting the job, Ctrl-C), or when a time budget
is spent, finish the current step, write a full checkpoint through the loop's checkpoint callback, wait a bounded
time for its upload, and end training cleanly, so that ``fit(resume_from='latest')`` continues bit-exactly.

:class:`PreemptionCheckpoint` is added by default to every fit that has a checkpoint callback
(``ModelCheckpoint`` / ``ModelIterationCheckpoint``; the tracking loops' ``preemption_safe=False`` turns it off).
See docs/callbacks/preemption.md.
"""
import logging
import os
import signal
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from .. import distributed
from ..distributed import slurm
from .abstract import AbstractCallback, TrainingInterrupted
from .model_save import ModelCheckpoint, ModelIterationCheckpoint

if TYPE_CHECKING:
    from ..engine.train_loop import TrainLoop

logger = logging.getLogger(__name__)

DEFAULT_SIGNALS: Tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)
#: The loop's interruptible phases (engine/train_loop.py): a stop abandons them at once.
FETCH, EVALUATION = 'fetch', 'evaluation'

# What a previous handler can be (signal.getsignal): a callable, SIG_DFL / SIG_IGN, or None (set outside Python).
_Handler = Union[Callable[[int, Any], Any], int, signal.Handlers, None]


def find_checkpoint_callback(loop: 'TrainLoop') -> Optional[ModelCheckpoint]:
    """The loop's registered checkpoint callback (``ModelCheckpoint`` or ``ModelIterationCheckpoint``) in this
    process, or None (also on DDP ranks other than 0, where the checkpoint callback does not run; under FSDP it runs
    on every rank)."""
    for callback in loop.callbacks:
        if isinstance(callback, ModelCheckpoint):
            return callback
    return None


def find_preemption_callback(loop: 'TrainLoop') -> Optional['PreemptionCheckpoint']:
    """The registered :class:`PreemptionCheckpoint` of ``loop``, or None."""
    for callback in loop.callbacks:
        if isinstance(callback, PreemptionCheckpoint):
            return callback
    return None


def preemption_default_needed(loop: 'TrainLoop') -> bool:
    """Whether :func:`~aitoolbox_like.callbacks.defaults.add_default_callbacks` adds a PreemptionCheckpoint: a
    checkpoint callback is registered, ``loop.preemption_safe`` is not False and none is registered yet.

    In a DDP fit only rank 0 holds the checkpoint callback, so rank 0 decides and broadcasts its answer: every rank
    gets the callback or none does (they must all take part in agreeing on the step to stop at). This is one small
    collective at the start of a DDP fit; every rank calls it at the same point."""
    wanted = getattr(loop, 'preemption_safe', True) is not False and find_checkpoint_callback(loop) is not None
    if loop.world_size > 1:
        decision: List[Any] = [wanted]
        dist.broadcast_object_list(decision, src=0)
        wanted = bool(decision[0])
    return wanted and find_preemption_callback(loop) is None


class PreemptionCheckpoint(AbstractCallback):
    """Checkpoint and stop cleanly when the process is asked to stop.

    On one of ``signals`` (installed at ``on_train_begin``, only in the main thread; the previous handlers are put
    back at ``on_train_end`` / ``on_exception``) the handler only sets a flag. At the end of the current training
    step (``on_batch_end``, after every other callback's ``on_batch_end``) the callback:

    1. writes a full mid-epoch checkpoint through the loop's checkpoint callback
       (``ModelCheckpoint.save_checkpoint(iteration_idx=loop.total_iteration_idx)``), which also updates
       ``latest_checkpoint.txt`` (skipped when ModelIterationCheckpoint just saved this very batch);
    2. waits for the experiment's pending uploads, ``upload_wait_s`` seconds at most;
    3. raises :class:`~aitoolbox_like.callbacks.abstract.TrainingInterrupted` (a ``StopTraining``):
       ``on_train_stopped`` and ``on_train_end`` run, ``fit`` returns normally and ``loop.interrupted`` names the
       reason; the end-of-training evaluation and reports are skipped (they belong to the run's real end).

    A second signal of the same kind while stopping calls the previous handler (a second Ctrl-C raises
    KeyboardInterrupt at once; a second SIGTERM with the default handler terminates the process).

    A stop meets its deadline in every phase of a fit, not only between two steps:

    - in one of the loop's interruptible phases (``loop.interruptible_phase``: waiting for the next training batch,
      the end-of-epoch or end-of-training evaluation, torch.compile's warm-up in a compiled model's first step) the
      handler abandons it at once (it raises ``TrainingInterrupted(phase=...)``; the loop puts its position back to
      the end of the last trained batch) and the checkpoint is written in ``on_train_stopped``; the resumed run
      fetches, evaluates or compiles again. In a DDP / FSDP fit an evaluation is abandoned at the next evaluation
      batch the ranks agree on (as training steps are: about every ``stop_within_s``), and a wait for a batch only
      when the signal reaches every rank there (torchrun and srun send it to every rank): the ranks then check that
      they all stopped after the same batch (within ``fsdp_exception_timeout_s``) before they save;
    - during a checkpoint write (the saving callbacks' on_epoch_end), the stop comes right after it, at the end of
      the epoch, with that checkpoint as the one to continue from.

    The time from the signal (or :meth:`request_stop`) to the durable checkpoint is logged and kept in
    ``stop_latency_s``.

    Per training step the callback costs one attribute check in ``on_batch_end`` (no device sync). In a DDP fit
    the ranks agree on the step to stop at, so that a stop takes at most about ``stop_within_s`` seconds (1 s), or
    one step when a step is longer, whatever the step time: at agreement steps every rank takes part in one blocking
    all-reduce (MAX) over a CPU (gloo) group of two numbers, its stop flag and its seconds per step since the previous
    agreement (``time.monotonic()`` read at agreement steps only). Every rank then knows whether to stop at this step,
    and computes the same number of steps to the next agreement: as many as the slowest rank's steps fit in
    ``stop_within_s`` (at least 1, at most twice the previous number, at most ``ddp_sync_every`` when given). Between
    two agreements a step costs a counter comparison: no host sync per step, no device sync ever; an agreement costs
    one host collective (well under a millisecond) about once per ``stop_within_s``. The first agreement comes after
    the fit's first step. A signal reaching any one rank stops them all, at the same step; rank 0 writes the
    checkpoint. Under FSDP every rank writes its shards of the checkpoint; a stop agreed on inside a
    gradient-accumulation window waits for the window's update step (a sharded checkpoint cannot hold the
    accumulated gradients). When steps suddenly become much slower, the interval planned from the faster ones can
    last longer once (until the next agreement measures the new speed).

    ``on_exception=True`` under FSDP (several processes): a sharded checkpoint needs every rank, which the exception
    may not have reached (a rank whose data loader failed alone leaves the others waiting in the next step's
    collectives). Each rank whose exception came between two steps (outside a gradient-accumulation window) therefore
    first joins an agreement with the others, an all-reduce over a gloo group of its own made at ``on_train_begin``,
    bounded by ``fsdp_exception_timeout_s``. When every rank arrives after the same batch (the same data error on all
    ranks), they write the sharded checkpoint together, synchronously. Otherwise (a rank did not arrive in time, or
    they stopped after different batches) no rank writes anything, and one warning says so (on each rank that timed
    out, or on rank 0): the shards of the others cannot be had, and a partial folder could not be resumed. The resume point is then the
    last complete checkpoint (the saving callback completes the one being written in the background, if any). A rank
    whose own exception came inside a step does not wait for the others at all: no rank waits longer than
    ``fsdp_exception_timeout_s`` for the others, and fit then re-raises the exception as always.

    Args:
        signals: the signals that request a stop (default SIGTERM and SIGINT). ``()`` installs none (a stop is then
            requested by :meth:`request_stop`, as ``Timer(max_duration_s=...)`` does).
        on_exception (bool): also write a checkpoint when fit fails with an exception, if it was raised between
            two training steps (by the data loader fetching the next batch, typically); an exception inside a step
            leaves no consistent state to save, so the last regular checkpoint stays the resume point.
        upload_wait_s (float): how long to wait for the checkpoint's upload (with ``cloud_save_mode='s3'``) before
            stopping; what is not uploaded by then stays in the upload journal.
        exit_code (None, int or 'signal'): None (default): ``fit`` returns normally after a signal, and the process
            exits however the script ends (status 0 when it simply ends). An int, or ``'signal'`` for
            ``128 + signal number`` (143 for SIGTERM, what a process killed by SIGTERM reports), raises
            ``SystemExit`` with that status at the end of ``on_train_end`` after a stop caused by a signal, so that a
            scheduler that restarts only failed jobs (a Kubernetes Job) runs the job again.
        ddp_sync_every (int or None): in a DDP fit, the most steps between two agreements on stopping (None, the
            default: only ``stop_within_s`` decides). A stop then comes at most this many steps after the signal.
        fsdp_exception_timeout_s (float): with ``on_exception=True`` in an FSDP fit of several processes, how long a
            rank waits for the others to reach ``on_exception`` too before it gives the checkpoint up (see above).
        slurm_signal (int or None): inside a SLURM job, the signal SLURM sends before the time limit
            (``#SBATCH --signal=USR1@90``: SIGUSR1, the default), handled besides ``signals``. After a stop it
            caused, the job is requeued (``scontrol requeue``) and every rank exits; after a stop caused by another
            signal every rank exits (see docs/distributed.md, "SLURM"). None: no such signal.
        stop_within_s (float): in a DDP or FSDP fit, the time the ranks may take to agree on a stop: they agree
            about this often (or after every step, when a step takes longer), so the checkpoint starts at most about
            this long after the signal (or one step). A single process checks its flag after every step.
    """

    def __init__(self, signals: Sequence[int] = DEFAULT_SIGNALS, on_exception: bool = False,
                 upload_wait_s: float = 120.0, exit_code: Union[None, int, str] = None,
                 ddp_sync_every: Optional[int] = None, fsdp_exception_timeout_s: float = 30.0,
                 slurm_signal: Optional[int] = slurm.DEFAULT_WARNING_SIGNAL, stop_within_s: float = 1.0) -> None:
        super().__init__('Preemption-safe checkpoint', execution_order=10_000, device_idx_execution=None)
        self.signals: Tuple[signal.Signals, ...] = tuple(signal.Signals(s) for s in signals)
        if isinstance(exit_code, bool) or not (exit_code is None or exit_code == 'signal' or
                                               isinstance(exit_code, int)):
            raise ValueError(f"exit_code must be None, an int or 'signal', got {exit_code!r}")
        if ddp_sync_every is not None and (isinstance(ddp_sync_every, bool) or not isinstance(ddp_sync_every, int)
                                           or ddp_sync_every < 1):
            raise ValueError(f'ddp_sync_every must be None or an int >= 1, got {ddp_sync_every!r}')
        if isinstance(stop_within_s, bool) or not isinstance(stop_within_s, (int, float)) or not stop_within_s > 0:
            raise ValueError(f'stop_within_s must be a number of seconds > 0, got {stop_within_s!r}')
        if upload_wait_s < 0:
            raise ValueError(f'upload_wait_s must be >= 0, got {upload_wait_s!r}')
        if isinstance(fsdp_exception_timeout_s, bool) or not isinstance(fsdp_exception_timeout_s, (int, float)) \
                or not fsdp_exception_timeout_s > 0:
            raise ValueError(f'fsdp_exception_timeout_s must be a number of seconds > 0, got '
                             f'{fsdp_exception_timeout_s!r}')
        self.save_on_exception = bool(on_exception)
        self.upload_wait_s = float(upload_wait_s)
        self.exit_code = exit_code
        self.ddp_sync_every = ddp_sync_every
        self.stop_within_s = float(stop_within_s)
        self.fsdp_exception_timeout_s = float(fsdp_exception_timeout_s)
        self.slurm_signal = None if slurm_signal is None else signal.Signals(slurm_signal)
        # What happened in the latest fit (read them after fit returns).
        self.stop_reason: Optional[str] = None        # why training stopped early, or None
        self.received_signal: Optional[int] = None    # the signal that asked for the stop, or None
        self.checkpoint_path: Optional[str] = None    # the checkpoint written on the way out (rank 0), or None
        self.stop_latency_s: Optional[float] = None   # seconds from the signal / request to the durable checkpoint
        self._requested: Optional[str] = None         # set by the signal handler / request_stop: the reason
        self._requested_at: Optional[float] = None    # time.monotonic() of the request
        self._pid = os.getpid()                       # the training process (forked loader workers inherit handlers)
        self._abandoned: Optional[str] = None         # the phase a stop abandoned; its checkpoint is still to write
        self._interrupt_group: Any = None             # DDP / FSDP: the bounded agreement after an abandoned fetch
        # DDP / FSDP, in an evaluation pass: the batch index, the next agreement, the batches every rank has, the
        # steps between agreements and the (stride, time.monotonic()) of the previous one.
        self._eval_index, self._eval_next, self._eval_limit = 0, 0, 0
        self._eval_stride = 1
        self._eval_agreed_at: Optional[Tuple[int, float]] = None
        self._signals_seen: List[int] = []            # every signal handled in this fit (SLURM: requeue or not)
        self._in_slurm_job = False
        self._previous_handlers: Dict[signal.Signals, _Handler] = {}
        self._between_steps = False
        self._group: Any = None
        self._exception_group: Any = None   # FSDP with on_exception: the bounded agreement on saving after an error
        # DDP / FSDP: the agreement on stopping (see _agreed_stop).
        self._next_agreement = -1           # the total_iteration_idx of the next agreement step
        self._stride = 1                    # the steps from the previous agreement to the next one
        self._agreed_at: Optional[Tuple[int, float]] = None     # (iteration, time.monotonic()) of the previous one
        self._stop_due = False              # a stop is agreed on; the checkpoint follows at the next update step
        self._window_reported = False

    # ---- requesting a stop --------------------------------------------------------------------------------

    def request_stop(self, reason: str = 'stop requested') -> None:
        """Ask training to checkpoint and stop at the end of the current step (safe from any thread); an evaluation
        in progress is abandoned at its next batch."""
        if self._requested is None:
            self._requested_at = time.monotonic()
            self._requested = reason

    @property
    def stop_requested(self) -> bool:
        """True once a stop was asked for in this process (by a signal or :meth:`request_stop`)."""
        return self._requested is not None

    def _handle_signal(self, signum: int, frame: Any) -> None:
        # Runs between two bytecodes of the main thread: only set the flag (logging here could re-enter a
        # stream's write). A second signal of the same kind goes to the previous handler, except SIGTERM in a SLURM
        # job: SLURM sends it twice at a preemption (its SIGKILL after KillWait is the hard stop).
        if self.received_signal == signum:
            if not (signum == signal.SIGTERM and self._in_slurm_job):
                self._forward_to_previous(signum, frame)
            return
        if self.received_signal is None:
            self.received_signal = signum
        self._signals_seen.append(signum)
        self.request_stop(f'received {signal.Signals(signum).name}')
        phase = self._phase_to_abandon()
        if phase is not None:
            # Between two bytecodes of the main thread inside the phase: what it was doing is abandoned, and the
            # checkpoint follows in on_train_stopped, once the loop has put its position back.
            self._abandoned = phase
            raise TrainingInterrupted(self._requested or 'stop requested', phase=phase)

    def _phase_to_abandon(self) -> Optional[str]:
        loop = self.train_loop_obj
        if loop is None or os.getpid() != self._pid or self.stop_reason is not None or self._abandoned is not None:
            return None
        phase = loop.interruptible_phase
        if phase is None:
            return None
        # Several processes: abandoning a phase must not leave another rank alone in a collective. An evaluation
        # pass is abandoned at an agreed batch instead (on_eval_batch_begin); a wait for the next batch holds no
        # collective, and the ranks check afterwards that they all stopped there (on_train_stopped).
        if loop.world_size > 1 and phase != FETCH:
            return None
        return phase

    def _forward_to_previous(self, signum: int, frame: Any) -> None:
        previous = self._previous_handlers.get(signal.Signals(signum), signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    # ---- hooks ------------------------------------------------------------------------------------------------

    def hooks_in_use(self) -> List[str]:
        hooks = ['on_train_begin', 'on_batch_end', 'on_train_end', 'on_exception', 'on_eval_begin',
                 'on_eval_batch_begin', 'on_epoch_end', 'on_train_stopped']
        if self.save_on_exception:
            # Only then does it need to know whether an exception came between two steps.
            hooks += ['on_batch_begin', 'on_train_epoch_end']
        return hooks

    def on_train_begin(self) -> None:
        """Reset the state of the previous fit, install the signal handlers and, in DDP, the agreement group."""
        self.stop_reason = self._requested = self._requested_at = None
        self.received_signal = None
        self._signals_seen = []
        self.checkpoint_path = None
        self.stop_latency_s = None
        self._abandoned = None
        self._pid = os.getpid()
        self._between_steps = False
        self._next_agreement, self._stride, self._agreed_at = -1, 1, None     # the first one after the first step
        self._stop_due = self._window_reported = False
        loop = self.train_loop_obj
        if loop.world_size > 1 and self._group is None:
            # Every rank runs on_train_begin; a gloo group lets the flags be reduced on the CPU (no device sync).
            self._group = dist.new_group(backend='gloo') if dist.get_backend() != 'gloo' else dist.group.WORLD
        if self.save_on_exception and loop.world_size > 1 and distributed.is_fsdp_model(loop.model) \
                and self._exception_group is None:
            # A group of its own: its timeout bounds the agreement, and a timed-out gloo group is unusable after,
            # which must not be training's. Made here, where every rank is known to take part (new_group is a
            # collective).
            self._exception_group = dist.new_group(backend='gloo',
                                                   timeout=timedelta(seconds=self.fsdp_exception_timeout_s))
        if loop.world_size > 1 and self.signals and self._interrupt_group is None:
            # Its timeout bounds the check that every rank abandoned the same wait for a batch (a group of its own:
            # a timed-out gloo group is unusable after).
            self._interrupt_group = dist.new_group(backend='gloo',
                                                   timeout=timedelta(seconds=self.fsdp_exception_timeout_s))
        self._install_handlers()

    def _install_handlers(self) -> None:
        if not self.signals:
            return
        if threading.current_thread() is not threading.main_thread():
            logger.warning('%s: fit runs outside the main thread, where signal handlers cannot be installed; '
                           'signals keep their previous behaviour (request_stop() still works)', type(self).__name__)
            return
        signals = self.signals
        self._in_slurm_job = slurm.in_job()
        if self.slurm_signal is not None and self.slurm_signal not in signals and self._in_slurm_job:
            signals += (self.slurm_signal,)
        for signum in signals:
            self._previous_handlers[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle_signal)

    def _restore_handlers(self) -> None:
        for signum, previous in self._previous_handlers.items():
            try:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            except (ValueError, TypeError):     # not the main thread, or a handler set outside Python
                logger.debug('could not restore the handler of %s', signum.name)
        self._previous_handlers = {}

    def on_batch_begin(self) -> None:
        """(Only with on_exception=True.) A step is running: its state is not consistent until on_batch_end."""
        self._between_steps = False

    def on_train_epoch_end(self) -> None:
        """(Only with on_exception=True.) The epoch's evaluation follows; a mid-epoch checkpoint no longer fits."""
        self._between_steps = False

    def on_batch_end(self) -> None:
        """The per-step check: one attribute read, unless a stop was requested (or in DDP, an agreement step)."""
        if self.save_on_exception:
            self._between_steps = True
        if self._group is None:
            if self._requested is None:
                return
        elif not self._stop_due:
            idx = self.train_loop_obj.total_iteration_idx
            # A rollback (TrainLoop.restart_from) moves every rank back alike: the next agreement comes at once.
            if idx < self._next_agreement and (self._agreed_at is None or idx > self._agreed_at[0]):
                return
            if not self._agreed_stop():
                return
        self._stop_due = True
        if self._inside_sharded_window():
            return
        self._checkpoint_and_stop()

    def on_eval_begin(self, dataset_info: Dict[str, Any]) -> None:
        """DDP / FSDP, a pass of the loop's own evaluation: the agreements on stopping inside it start with its first
        batch, at batches every rank has (the fewest batches of any rank: one all-reduce per pass)."""
        self._eval_index, self._eval_next, self._eval_limit = 0, 0, 0
        self._eval_stride, self._eval_agreed_at = 1, None
        loop = self.train_loop_obj
        if self._group is None or not dataset_info.get('interruptible'):
            return
        loader = {'train': loop.train_loader, 'validation': loop.validation_loader,
                  'test': loop.test_loader}.get(str(dataset_info.get('type')))
        try:
            batches = len(loader) if loader is not None else 0
        except TypeError:
            batches = 0         # not known in advance: this pass is not abandoned, the stop follows it
        fewest = torch.tensor([batches], dtype=torch.int64)
        dist.all_reduce(fewest, op=dist.ReduceOp.MIN, group=self._group)
        self._eval_limit = int(fewest[0])

    def on_eval_batch_begin(self, batch: Any, dataset_info: Dict[str, Any]) -> None:
        """In the loop's end-of-epoch / end-of-training evaluation: abandon the pass when a stop was asked for (in
        DDP / FSDP, agreed at batches about ``stop_within_s`` apart, as training steps are)."""
        loop = self.train_loop_obj
        if loop.interruptible_phase != EVALUATION or self.stop_reason is not None:
            return
        if self._group is None:
            if self._requested is None:
                return
        else:
            index, self._eval_index = self._eval_index, self._eval_index + 1
            if index != self._eval_next or index >= self._eval_limit or not self._agreed_stop_in_pass(index):
                return
        self._abandoned = EVALUATION
        raise TrainingInterrupted(self._requested or 'stop requested', phase=EVALUATION)

    def _agreed_stop_in_pass(self, index: int) -> bool:
        """DDP / FSDP, at an agreement batch of an evaluation pass: the training agreement's all-reduce of [stop
        flag, seconds per batch], over the same group, with the pass's own schedule."""
        now = time.monotonic()
        batch_s = 0.0
        if self._eval_agreed_at is not None:
            batch_s = (now - self._eval_agreed_at[1]) / max(index - self._eval_agreed_at[0], 1)
        values = torch.tensor([0.0 if self._requested is None else 1.0, batch_s], dtype=torch.float64)
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self._group)
        self._eval_stride = next_agreement_stride(self._eval_stride, float(values[1]), self.stop_within_s)
        self._eval_next = index + self._eval_stride
        self._eval_agreed_at = (index, now)
        stop = bool(values[0] > 0)
        if stop and self._requested is None:
            self.request_stop('another rank was asked to stop')
        return stop

    def on_epoch_end(self) -> None:
        """A stop asked for during the epoch's end (a checkpoint write, its metrics): stop now, with the checkpoint
        the saving callback has just written at the epoch's end (or one written now). DDP / FSDP: agreed by every rank
        (one all-reduce of a flag per epoch)."""
        stop = self._requested is not None
        if self._group is not None:
            flag = torch.tensor([1 if stop else 0], dtype=torch.int64)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
            stop = bool(flag[0])
            if stop and self._requested is None:
                self.request_stop('another rank was asked to stop')
        if stop:
            self._checkpoint_and_stop()

    def on_train_stopped(self, reason: BaseException) -> None:
        """After a stop that abandoned a phase (the loop has put its position back to the end of the last trained
        batch): write the checkpoint to continue from."""
        phase, self._abandoned = self._abandoned, None
        if phase is None or not isinstance(reason, TrainingInterrupted) or self.stop_reason is not None:
            return
        loop = self.train_loop_obj
        if phase == FETCH and loop.world_size > 1 and not self._every_rank_stopped_here(loop):
            self.stop_reason = self._requested or 'stop requested'
            return
        self._checkpoint_and_stop(raise_after=False, abandoned=phase)

    def _every_rank_stopped_here(self, loop: 'TrainLoop') -> bool:
        group, self._interrupt_group = self._interrupt_group, None      # once: a timed-out group is unusable
        agreed = agree_on_position(group, loop.total_iteration_idx) if group is not None else None
        if not agreed:
            logger.warning("%s (rank %d): the stop abandoned this rank's wait for batch %d, but not every rank "
                           'stopped there within %gs: no checkpoint is written (the last checkpoint is the resume '
                           'point)', type(self).__name__, loop.global_rank, loop.total_iteration_idx + 1,
                           self.fsdp_exception_timeout_s)
        return bool(agreed)

    def _inside_sharded_window(self) -> bool:
        """FSDP: a sharded checkpoint cannot hold the accumulated gradients of an open gradient-accumulation window
        (sharded_checkpoint.gradients_inside_window_error), so the stop waits for the window's update step (at most
        ``grad_accumulation - 1`` batches; the last batch of an epoch always updates). Every rank decides the same:
        they agreed on the step and count batches alike."""
        loop = self.train_loop_obj
        if loop.should_execute_optimizer_update() or not distributed.is_fsdp_model(loop.model):
            return False
        if not self._window_reported and loop.is_main_process():
            logger.warning('%s: batch %d is inside a gradient-accumulation window; under FSDP the checkpoint is '
                           'written after the window\'s optimizer update', self._requested or 'stop requested',
                           loop.total_iteration_idx)
        self._window_reported = True
        return True

    def _agreed_stop(self) -> bool:
        """DDP / FSDP, at an agreement step (the same on every rank): whether every rank stops after this step. One
        blocking all-reduce (MAX) over the gloo group of [stop flag, seconds per step since the previous agreement];
        from the slowest rank's step time every rank computes the same next agreement step."""
        idx = self.train_loop_obj.total_iteration_idx
        now = time.monotonic()
        step_s = 0.0 if self._agreed_at is None else (now - self._agreed_at[1]) / max(idx - self._agreed_at[0], 1)
        values = torch.tensor([0.0 if self._requested is None else 1.0, step_s], dtype=torch.float64)
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self._group)
        stop, slowest_step_s = bool(values[0] > 0), float(values[1])
        self._stride = next_agreement_stride(self._stride, slowest_step_s, self.stop_within_s, self.ddp_sync_every)
        self._next_agreement = idx + self._stride
        self._agreed_at = (idx, now)
        if stop and self._requested is None:
            self._requested = 'another rank was asked to stop'
        return stop

    def _checkpoint_and_stop(self, raise_after: bool = True, abandoned: Optional[str] = None) -> None:
        loop = self.train_loop_obj
        reason = self._requested or 'stop requested'
        self.stop_reason = reason
        at_epoch_end = loop.epochs_completed > loop.epoch
        if loop.is_main_process():
            where = f'at the end of epoch {loop.epoch}' if at_epoch_end else \
                f'after batch {loop.total_iteration_idx} (epoch {loop.epoch})'
            logger.warning('%s: %ssaving a checkpoint %s and stopping training', reason,
                           f'the {abandoned} was abandoned; ' if abandoned else '', where)
        self.checkpoint_path = self._save(loop)
        if self.checkpoint_path and self._requested_at is not None:
            self.stop_latency_s = time.monotonic() - self._requested_at
            if loop.is_main_process():
                logger.warning('%s: the checkpoint is durable %.2f s after the stop was asked for: %s', reason,
                               self.stop_latency_s, self.checkpoint_path)
        self._wait_for_uploads(loop)
        if self.checkpoint_path and loop.is_main_process():
            logger.warning('%s: checkpoint saved; continue with %s', reason, loop.how_to_resume())
        if raise_after:
            raise TrainingInterrupted(reason, f'{reason}: checkpoint saved, continue with {loop.how_to_resume()}'
                                      if self.checkpoint_path else None)

    def _save(self, loop: 'TrainLoop', all_ranks: Optional[bool] = None) -> Optional[str]:
        saver = find_checkpoint_callback(loop)
        if saver is None:
            if loop.is_main_process():
                logger.warning('%s: no checkpoint callback (ModelCheckpoint) is registered, so training stops '
                               'without a checkpoint', type(self).__name__)
            return None
        idx = loop.total_iteration_idx
        if loop.epochs_completed > loop.epoch:
            # At an epoch's end (the epoch and its evaluation complete): the epoch's own checkpoint, which the
            # saving callback may have just written (then it is only waited for).
            if saver.saved_at == (loop.epoch, None):
                saver.wait_for_pending_save()
                return saver.latest_checkpoint_path
            return saver.save_checkpoint(wait=True, all_ranks=all_ranks)
        if isinstance(saver, ModelIterationCheckpoint) and idx > 0 and idx % saver.save_frequency == 0 \
                and saver.saved_at == (loop.epoch, idx):
            saver.wait_for_pending_save()           # it saved after this very batch already (maybe in the background)
            return saver.latest_checkpoint_path
        # wait: the checkpoint (file, pointer, queued upload) is complete before its upload is waited for.
        return saver.save_checkpoint(iteration_idx=idx, wait=True, all_ranks=all_ranks)

    def _wait_for_uploads(self, loop: 'TrainLoop') -> None:
        experiment = loop.experiment
        if experiment is None or not loop.is_main_process():
            return
        deadline = time.monotonic() + self.upload_wait_s
        for uploader in list(experiment.uploaders.values()):
            failures = uploader.wait(max(deadline - time.monotonic(), 0.0))
            loop.upload_failures += failures

    def on_train_end(self) -> None:
        """Put the previous signal handlers back; with ``exit_code``, exit after a stop caused by a signal. Inside a
        SLURM job, after a stop caused by a signal: requeue the job (``slurm_signal``) and exit."""
        self._restore_handlers()
        self._finish_agreement()
        if self.stop_reason is not None and slurm.in_job():      # every rank stopped at the same step: all get here
            slurm.end_stopped_task(self._signals_seen, self.slurm_signal, self.train_loop_obj.how_to_resume(),
                                   self.exit_code if isinstance(self.exit_code, int) else None)
        signum = self.received_signal
        if self.exit_code is None or signum is None or self.stop_reason is None:
            return
        code = 128 + signum if self.exit_code == 'signal' else int(self.exit_code)
        loop = self.train_loop_obj
        loop.wait_for_uploads()
        logger.info('Exiting with status %d after %s', code, signal.Signals(signum).name)
        raise SystemExit(code)

    def on_exception(self, exception: BaseException) -> None:
        """Put the previous signal handlers back; with ``on_exception=True`` save a checkpoint when the exception
        came between two training steps."""
        self._restore_handlers()
        self._group = self._interrupt_group = None          # as at the end of a fit (_finish_agreement)
        if not self.save_on_exception or isinstance(exception, SystemExit) or self.checkpoint_path is not None:
            return
        loop = self.train_loop_obj
        if not self._between_steps:
            if loop.is_main_process():
                logger.warning('%s: %s was raised inside a training step or outside the epoch\'s batches; no '
                               'checkpoint is written (the last one is the resume point)', type(self).__name__,
                               type(exception).__name__)
            return
        fsdp = distributed.is_fsdp_model(loop.model)
        if fsdp and not self._sharded_save_agreed(loop, exception):
            return
        try:
            # DDP: the exception may not have reached the other ranks, so rank 0 saves alone (no gather). FSDP: every
            # rank agreed to take part above.
            self.checkpoint_path = self._save(loop, all_ranks=None if fsdp else False)
            if self.checkpoint_path:
                logger.warning('%s: fit failed with %s; saved a checkpoint after batch %d: %s', type(self).__name__,
                               type(exception).__name__, loop.total_iteration_idx, self.checkpoint_path)
        except Exception:
            logger.exception('%s: the checkpoint after the exception could not be written', type(self).__name__)

    def _sharded_save_agreed(self, loop: 'TrainLoop', exception: BaseException) -> bool:
        """FSDP: whether every rank takes part in saving after ``exception`` (see the class docstring). Logs why
        not, once, on the rank that knows it."""
        name = type(self).__name__
        if not loop.should_execute_optimizer_update():
            if loop.is_main_process():
                logger.warning("%s: %s was raised inside a gradient-accumulation window; under gpu_mode='fsdp' no "
                               'checkpoint is written (a sharded checkpoint cannot hold the accumulated gradients); '
                               'the last checkpoint is the resume point', name, type(exception).__name__)
            return False
        group, self._exception_group = self._exception_group, None     # once: a timed-out group is unusable
        if loop.world_size == 1:
            return True
        if group is None:       # the exception came before on_train_begin made the group
            return False
        agreed = agree_on_position(group, loop.total_iteration_idx)
        if agreed is None:
            logger.warning("%s (rank %d): %s was raised between two steps, after batch %d, but not every rank "
                           'reached on_exception between the same steps within fsdp_exception_timeout_s=%gs: no '
                           "checkpoint is written (a sharded checkpoint needs every rank's shards); the last "
                           'checkpoint is the resume point', name, loop.global_rank, type(exception).__name__,
                           loop.total_iteration_idx, self.fsdp_exception_timeout_s)
        elif not agreed and loop.is_main_process():
            logger.warning('%s: %s was raised on every rank, but after different batches: no checkpoint is written; '
                           'the last checkpoint is the resume point', name, type(exception).__name__)
        return bool(agreed)

    def _finish_agreement(self) -> None:
        # No process-group object outlives the fit here: one still referenced when the script's
        # destroy_process_group() has run is destroyed at interpreter exit, where gloo's threads can abort the
        # process ("terminate called without an active exception": 2 runs in 12 under torchrun before this).
        self._group = self._exception_group = self._interrupt_group = None


def next_agreement_stride(stride: int, step_s: float, within_s: float, most: Optional[int] = None) -> int:
    """The steps to the next agreement on stopping, after ``stride`` steps since the previous one at ``step_s``
    seconds per step on the slowest rank (0: not measured yet): as many as fit in ``within_s`` seconds, at least 1,
    at most ``2 * stride`` (an interval measured on few steps, or while the host ran ahead of the device, does not
    set a long one at once) and at most ``most`` when given. Every rank computes it from the same all-reduced
    numbers, so all reach the next agreement at the same step."""
    if not step_s > 0:
        return 1
    fit = within_s / step_s
    steps = 2 * stride if fit >= 2 * stride else max(int(fit), 1)
    return steps if most is None else min(steps, most)


def agree_on_position(group: Any, iteration_idx: int) -> Optional[bool]:
    """Every rank of ``group`` calls it with the batch it stopped after: True when all give the same, False when
    they differ, None when a rank does not call it within the group's timeout (gloo raises then; the group is not
    usable after)."""
    positions = torch.tensor([iteration_idx, -iteration_idx], dtype=torch.int64)
    try:
        dist.all_reduce(positions, op=dist.ReduceOp.MIN, group=group)
    except RuntimeError as error:      # gloo's timeout (a DistError is a RuntimeError)
        logger.debug('no agreement on saving after an exception: %s', error)
        return None
    return int(positions[0]) == -int(positions[1])      # min == max
