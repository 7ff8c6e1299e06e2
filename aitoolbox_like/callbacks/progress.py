"""How long and how far: Timer (times, throughput and an optional wall-time budget) and ProgressBar (re-exported
by :mod:`.basic`)."""
import logging
import time
from typing import Any, List, Optional

from .abstract import AbstractCallback
from .preemption import PreemptionCheckpoint, find_preemption_callback

# The logger keeps the name of the module these callbacks were split from (basic), which logging set-ups name.
logger = logging.getLogger('aitoolbox_like.callbacks.basic')


class Timer(AbstractCallback):
    """Wall time and training throughput per epoch, into the train history.

    History keys: ``'epoch_time'`` (seconds from on_epoch_begin to this callback's on_epoch_end, including the
    end-of-epoch evaluation), ``'train_time'`` (seconds from the first batch to the end of the last one),
    ``'batches_per_sec'`` and, when the loader has a batch_size, ``'samples_per_sec'`` (training samples of this
    process per train_time second). Times are host clock readings and never sync the device, so on a GPU the
    last few queued steps may be counted in the evaluation instead of train_time.

    Args:
        max_duration_s (float or None): a wall-time budget for the fit, counted from its ``on_train_begin`` (a
            resumed fit gets a new budget). Once it is spent, training stops at the end of the current step the way
            a preemption signal stops it: a full mid-epoch checkpoint through the loop's checkpoint callback (when
            there is one), a bounded wait for its upload, then ``StopTraining`` (see
            :class:`~aitoolbox_like.callbacks.preemption.PreemptionCheckpoint`, whose registered instance is used;
            in DDP the ranks agree on the step). ``fit(resume_from='latest')`` then continues.
    """

    def __init__(self, max_duration_s: Optional[float] = None) -> None:
        super().__init__('Epoch timer')
        if max_duration_s is not None and (isinstance(max_duration_s, bool) or not max_duration_s > 0):
            raise ValueError(f'max_duration_s must be a number of seconds > 0 or None, got {max_duration_s!r}')
        self.max_duration_s = max_duration_s
        self._epoch_start: Optional[float] = None
        self._train_start: Optional[float] = None
        self._train_end: Optional[float] = None
        self._deadline: Optional[float] = None
        self._stopper: Optional[PreemptionCheckpoint] = None      # a PreemptionCheckpoint not registered itself

    def hooks_in_use(self) -> List[str]:
        hooks = super().hooks_in_use()
        budget_hooks = ('on_train_begin', 'on_train_end')
        return hooks if self.max_duration_s is not None else [h for h in hooks if h not in budget_hooks]

    def on_train_begin(self) -> None:
        """(Only with max_duration_s.) Start the fit's wall-time budget."""
        loop = self.train_loop_obj
        self._stopper = None
        if find_preemption_callback(loop) is None:
            # No registered one (preemption_safe=False, or no checkpoint callback): use one without signals, not
            # registered, that this timer drives itself.
            stopper = PreemptionCheckpoint(signals=())
            stopper.train_loop_obj = loop
            stopper.on_train_begin()
            self._stopper = stopper
        assert self.max_duration_s is not None
        self._deadline = time.monotonic() + self.max_duration_s

    def on_epoch_begin(self) -> None:
        """Start the epoch clock."""
        self._epoch_start = time.perf_counter()
        self._train_start = None

    def on_batch_begin(self) -> None:
        """Start the training clock at the epoch's first batch."""
        if self._train_start is None:
            self._train_start = time.perf_counter()

    def on_batch_end(self) -> None:
        """Note the end of the latest batch; past the time budget, checkpoint and stop."""
        self._train_end = time.perf_counter()
        deadline = self._deadline
        if deadline is not None and time.monotonic() >= deadline:
            self._deadline = None
            reason = f'the time budget of {self.max_duration_s} s (Timer(max_duration_s)) is spent'
            registered = self._stopper or find_preemption_callback(self.train_loop_obj)
            assert registered is not None, 'found or made at on_train_begin'
            # A registered PreemptionCheckpoint checkpoints and stops in its own on_batch_end, after this one.
            registered.request_stop(reason)
        if self._stopper is not None:
            self._stopper.on_batch_end()       # in DDP every step, so that the ranks agree on the stop

    def on_train_end(self) -> None:
        """(Only with max_duration_s.) Close the budget."""
        self._deadline = None
        if self._stopper is not None:
            self._stopper.on_train_end()
            self._stopper = None

    def on_epoch_end(self) -> None:
        """Write the epoch's times and throughput into the train history."""
        loop = self.train_loop_obj
        now = time.perf_counter()
        epoch_start = self._epoch_start
        assert epoch_start is not None, 'on_epoch_begin runs before on_epoch_end'
        loop.insert_metric_result_into_history('epoch_time', now - epoch_start)
        num_batches = len(loop.loss_batch_accum)
        if self._train_start is None or num_batches == 0:
            return
        train_end = self._train_end
        assert train_end is not None, 'on_batch_end ran after the on_batch_begin that started the clock'
        train_time = max(train_end - self._train_start, 1e-9)
        loop.insert_metric_result_into_history('train_time', train_time)
        loop.insert_metric_result_into_history('batches_per_sec', num_batches / train_time)
        samples = self._num_samples(loop.train_loader, num_batches)
        if samples is not None:
            loop.insert_metric_result_into_history('samples_per_sec', samples / train_time)

    @staticmethod
    def _num_samples(loader: Any, num_batches: int) -> Optional[int]:
        batch_size = getattr(loader, 'batch_size', None)
        if not isinstance(batch_size, int):
            return None
        samples = num_batches * batch_size
        try:
            full_epoch = num_batches == len(loader)
            sampler_len = len(loader.sampler)
        except (TypeError, AttributeError):
            return samples
        # A full epoch without drop_last ends with a smaller batch: the sampler knows the exact count.
        if full_epoch and not getattr(loader, 'drop_last', False) and samples - batch_size < sampler_len <= samples:
            return sampler_len
        return samples


class ProgressBar(AbstractCallback):
    """A tqdm bar per epoch, with the epoch's metrics in the postfix at the end of the epoch.

    The TrainLoop adds one on the main process when its ``progress_bar`` is on (default: when stderr is
    a terminal). The running loss is shown every ``loss_refresh_steps`` steps; reading it is a host
    sync, so it is never done per step (0 disables it).
    """

    def __init__(self, loss_refresh_steps: int = 50, leave: bool = True) -> None:
        super().__init__('Progress bar', execution_order=97, device_idx_execution=0)
        self.loss_refresh_steps = loss_refresh_steps
        self.leave = leave
        self._bar: Any = None     # the epoch's tqdm bar

    def on_epoch_begin(self) -> None:
        """Open the epoch's bar."""
        from tqdm.auto import tqdm
        loop = self.train_loop_obj
        try:
            total = len(loop.train_loader)
        except TypeError:
            total = None
        total_epochs = f'/{loop.num_epochs}' if loop.num_epochs else ''
        self._bar = tqdm(total=total, desc=f'Epoch {loop.epoch + 1}{total_epochs}', leave=self.leave,
                         dynamic_ncols=True)

    def on_batch_end(self) -> None:
        """Advance the bar (and show the running loss every ``loss_refresh_steps`` steps)."""
        if self._bar is None:
            return
        self._bar.update(1)
        n = self.loss_refresh_steps
        if n and self._bar.n % n == 0 and self.train_loop_obj.loss_batch_accum:
            last = self.train_loop_obj.loss_batch_accum[-1]
            self._bar.set_postfix(loss=f'{float(last.total() if hasattr(last, "total") else last):.4g}',
                                  refresh=False)

    def on_epoch_end(self) -> None:
        """Show the epoch's metrics and close the bar."""
        if self._bar is None:
            return
        history = self.train_loop_obj.train_history
        epoch = self.train_loop_obj.epoch
        postfix = {name: f'{value:.4g}' for name in history
                   if isinstance(value := history.value_in_epoch(name, epoch), float)}
        self._bar.set_postfix(postfix)
        self._close()

    def on_train_end(self) -> None:
        """Close a bar left open."""
        # A StopTraining inside an epoch skips on_epoch_end; do not leave the bar open.
        self._close()

    def on_exception(self, exception: BaseException) -> None:
        """Close a bar left open."""
        self._close()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
