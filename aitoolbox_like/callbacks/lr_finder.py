"""The learning-rate range test (Leslie Smith's "LR finder", as in fastai and Lightning).

:func:`find_lr` trains a copy of the loop's model and optimizer for a few steps while the learning rate grows from
``start_lr`` to ``end_lr``, records the loss of every step, suggests a learning rate and plots the curve. The loop
itself is left exactly as it was: its model, optimizer, RNG state and history are not touched (the sweep runs on
deep copies, and the RNG state is captured before and restored after). :class:`LRFinder` runs it as a callback at
the start of training and sets the suggested learning rate.

The suggestion is the learning rate where the smoothed loss falls fastest: the most negative slope of the
smoothed loss against ``log10(lr)`` (central differences, as ``numpy.gradient``), ignoring the first
``skip_start`` and the last ``skip_end`` recorded steps (fastai's "steepest" / Lightning's rule). The loss is
smoothed with a bias-corrected exponential moving average (``beta``); the sweep stops early once the smoothed loss
exceeds ``diverge_threshold`` times its minimum, or is not finite.
"""
import copy
import dataclasses
import logging
import math
import os
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Sequence

import torch

from ..engine import loop_state
from ..runtime.amp import AmpPolicy
from ..model.feeds import ModelWrap, resolve_model
from ..model.multi_loss_optim import MultiLoss, MultiOptimizer
from ._common import new_figure
from .abstract import AbstractCallback

if TYPE_CHECKING:
    from ..engine.train_loop import TrainLoop

logger = logging.getLogger(__name__)

DEFAULT_PLOT_NAME = 'lr_finder.png'


@dataclasses.dataclass
class LRFinderResult:
    """What :func:`find_lr` found.

    Attributes:
        lrs: the learning rate of every step made.
        losses: the training loss of every step.
        smoothed_losses: the bias-corrected moving average of the losses.
        suggestion: the suggested learning rate, or None when too few steps were made.
        plot_path: where the plot was written, or None.
    """
    lrs: List[float]
    losses: List[float]
    smoothed_losses: List[float]
    suggestion: Optional[float]
    plot_path: Optional[str] = None


def lr_schedule(start_lr: float, end_lr: float, num_steps: int, mode: str = 'exp') -> List[float]:
    """The learning rates of the sweep: geometric ('exp') or evenly spaced ('linear') from start_lr to end_lr."""
    if num_steps == 1:
        return [start_lr]
    if mode == 'exp':
        ratio = end_lr / start_lr
        return [start_lr * ratio ** (i / (num_steps - 1)) for i in range(num_steps)]
    return [start_lr + (end_lr - start_lr) * i / (num_steps - 1) for i in range(num_steps)]


def suggest_lr(lrs: Sequence[float], smoothed_losses: Sequence[float], skip_start: int = 10,
               skip_end: int = 5) -> Optional[float]:
    """The learning rate of steepest descent of the smoothed loss against log10(lr), among the points left after
    dropping ``skip_start`` first and ``skip_end`` last ones; None when fewer than 3 points are left."""
    end = len(lrs) - skip_end
    xs = [math.log10(lr) for lr in lrs[skip_start:end]]
    ys = list(smoothed_losses[skip_start:end])
    if len(xs) < 3:
        return None
    slopes = []
    for i in range(len(xs)):
        lo, hi = max(i - 1, 0), min(i + 1, len(xs) - 1)
        slopes.append((ys[hi] - ys[lo]) / (xs[hi] - xs[lo]) if xs[hi] != xs[lo] else 0.)
    best = min(range(len(slopes)), key=lambda i: slopes[i])
    return float(lrs[skip_start + best])


def _set_lr(optimizer: Any, lr: float) -> None:
    optimizers = optimizer.optimizer_list if isinstance(optimizer, MultiOptimizer) else [optimizer]
    for opt in optimizers:
        for group in opt.param_groups:
            group['lr'] = lr


def _batches(loader: Any) -> Iterator[Any]:
    """The loader's batches, starting over when it runs out."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError('find_lr: the train loader yielded no batches')


def _scalar_loss(loss: Any) -> torch.Tensor:
    if isinstance(loss, MultiLoss):
        return torch.stack([v.reshape(()) for v in loss.values()]).sum()
    return loss


def plot_lr_finder(result: LRFinderResult, path: str) -> Optional[str]:
    """Draw the loss against the learning rate (log scale) with the suggestion marked, as a PNG at ``path``;
    returns the path, or None (with a warning) when matplotlib is not installed."""
    try:
        fig = new_figure(figsize=(6, 4))
    except ImportError:
        logger.warning('find_lr: matplotlib is not installed, so no plot is drawn (pip install aitoolbox_like[plots])')
        return None
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(result.lrs, result.losses, alpha=0.3, label='loss')
    ax.plot(result.lrs, result.smoothed_losses, label='smoothed loss')
    if result.suggestion is not None:
        ax.axvline(result.suggestion, color='red', linestyle='--', label=f'suggestion {result.suggestion:.2e}')
    ax.set_xscale('log')
    ax.set_xlabel('learning rate')
    ax.set_ylabel('loss')
    ax.legend()
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fig.savefig(path)
    return path


def find_lr(loop: 'TrainLoop', start_lr: float = 1e-7, end_lr: float = 10., num_steps: int = 100,
            mode: str = 'exp', beta: float = 0.98, diverge_threshold: Optional[float] = 4.,
            skip_start: int = 10, skip_end: int = 5, plot: bool = True,
            plot_path: Optional[str] = None) -> LRFinderResult:
    """Run the learning-rate range test on a copy of the loop's model and optimizer.

    Every step takes the next batch of the train loader (starting over when it runs out), computes the model's
    training loss (``get_loss``, under the loop's mixed precision), backpropagates and steps the copied optimizer
    with every param group's learning rate set to the step's rate. Gradient accumulation is not used. The loop's
    model, optimizer, RNG state (torch, CUDA, Python, NumPy, the train loader's generators) and history are
    exactly as before afterwards.

    Args:
        loop: the TrainLoop (its model, optimizer, criterion and train loader are used; the model is moved to
            ``loop.device`` as fit would).
        start_lr (float): the first learning rate.
        end_lr (float): the last learning rate.
        num_steps (int): the number of steps (at most; divergence stops earlier).
        mode (str): 'exp' (geometric steps) or 'linear'.
        beta (float): smoothing of the loss (bias-corrected exponential moving average), in [0, 1).
        diverge_threshold (float or None): stop once the smoothed loss exceeds this times its minimum; None never.
        skip_start (int): first steps ignored by the suggestion.
        skip_end (int): last steps ignored by the suggestion.
        plot (bool): draw the curve as a PNG.
        plot_path (str or None): where; None: ``lr_finder.png`` in the loop's experiment folder when it has one,
            else in the working directory.

    Returns:
        LRFinderResult: the learning rates, losses, smoothed losses, suggestion and plot path.
    """
    if not 0 < start_lr < end_lr:
        raise ValueError(f'find_lr: need 0 < start_lr < end_lr, got start_lr={start_lr}, end_lr={end_lr}')
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f'find_lr: num_steps must be an int >= 1, got {num_steps!r}')
    if mode not in ('exp', 'linear'):
        raise ValueError(f"find_lr: mode must be 'exp' or 'linear', got {mode!r}")
    if not 0. <= beta < 1.:
        raise ValueError(f'find_lr: beta must be in [0, 1), got {beta}')
    if loop.train_loader is None or loop.optimizer is None:
        raise ValueError('find_lr needs the TrainLoop to have a train_loader and an optimizer')
    if loop.world_size > 1:
        raise RuntimeError('find_lr runs in a single process; run it before a distributed fit')

    lrs = lr_schedule(start_lr, end_lr, num_steps, mode)
    # Copied together, so the copied optimizer holds the copied model's parameters.
    model, optimizer = copy.deepcopy((loop.model, loop.optimizer))
    for opt in optimizer.optimizer_list if isinstance(optimizer, MultiOptimizer) else [optimizer]:
        # An LR scheduler may have wrapped the original's step() in an instance attribute bound to the original;
        # the copy uses its class's step().
        vars(opt).pop('step', None)
    model.to(loop.device)
    model.train()
    if loop.batch_model_feed_def is not None:
        model, feed = resolve_model(ModelWrap(model, loop.batch_model_feed_def))
    else:
        model, feed = resolve_model(model)
    criterion = loop.criterion
    # The precision the loop resolved (use_amp=True on CPU is full precision there, without a second warning).
    amp = AmpPolicy(False if loop.precision == 'fp32' else (loop.amp_scaler_init or loop.precision), loop.device)

    rng = loop_state.capture_rng_state(loop)
    tried: List[float] = []
    losses: List[float] = []
    smoothed: List[float] = []
    try:
        average, best = 0., math.inf
        batches = _batches(loop.train_loader)
        for step, lr in enumerate(lrs):
            _set_lr(optimizer, lr)
            batch = next(batches)
            with amp.autocast():
                loss = _scalar_loss(feed.get_loss(batch, criterion, loop.device))
            amp.scale(loss).backward()
            optimizers = optimizer.optimizer_list if isinstance(optimizer, MultiOptimizer) else [optimizer]
            for opt in optimizers:
                amp.step(opt)
                opt.zero_grad()
            amp.update(optimizers, [True] * len(optimizers))
            value = float(loss.detach())     # the sweep reads each loss: it decides when to stop
            average = beta * average + (1. - beta) * value
            smooth = average / (1. - beta ** (step + 1))
            tried.append(lr)
            losses.append(value)
            smoothed.append(smooth)
            if not math.isfinite(smooth):
                logger.info('find_lr: the loss is not finite at lr=%.3g; stopping', lr)
                break
            best = min(best, smooth)
            if diverge_threshold is not None and step > 0 and smooth > diverge_threshold * best:
                logger.info('find_lr: the loss diverged at lr=%.3g; stopping', lr)
                break
    finally:
        loop_state.restore_rng_state(loop, rng)
        del model, optimizer

    suggestion = suggest_lr(tried, smoothed, skip_start, skip_end)
    if suggestion is None:
        logger.warning('find_lr: only %d steps were recorded (skip_start=%d, skip_end=%d), too few to suggest a '
                       'learning rate; widen the range or make more steps', len(tried), skip_start, skip_end)
    else:
        logger.info('find_lr: suggested learning rate %.3g', suggestion)
    result = LRFinderResult(tried, losses, smoothed, suggestion)
    if plot:
        if plot_path is None:
            folder = loop.experiment.claim() if loop.experiment is not None else os.getcwd()
            plot_path = os.path.join(folder, DEFAULT_PLOT_NAME)
        result.plot_path = plot_lr_finder(result, plot_path)
    return result


class LRFinder(AbstractCallback):
    """Run :func:`find_lr` at the start of training and, with ``set_lr=True``, start training at the suggested
    learning rate: it becomes the base rate of every param group of every optimizer (a group a scheduler callback
    drives keeps the schedule's current factor, and the scheduler's ``base_lrs`` follow).

    The sweep runs only when training starts from scratch (``total_iteration_idx == -1``), not when a fit resumes
    or continues. Its result is ``callback.result``. Single process only (a distributed fit raises at
    registration). Execution order -100: before the callbacks that read the learning rate in on_train_begin.

    ``start_lr``, ``end_lr``, ``num_steps``, ``mode``, ``beta``, ``diverge_threshold``, ``skip_start``,
    ``skip_end``, ``plot`` and ``plot_path`` are :func:`find_lr`'s arguments.

    Args:
        set_lr (bool): set the suggested learning rate on the optimizer(s).
    """

    def __init__(self, start_lr: float = 1e-7, end_lr: float = 10., num_steps: int = 100, mode: str = 'exp',
                 beta: float = 0.98, diverge_threshold: Optional[float] = 4., skip_start: int = 10,
                 skip_end: int = 5, set_lr: bool = True, plot: bool = True, plot_path: Optional[str] = None) -> None:
        super().__init__('Learning-rate range test', execution_order=-100)
        self.start_lr = start_lr
        self.end_lr = end_lr
        self.num_steps = num_steps
        self.mode = mode
        self.beta = beta
        self.diverge_threshold = diverge_threshold
        self.skip_start = skip_start
        self.skip_end = skip_end
        self.set_lr = set_lr
        self.plot = plot
        self.plot_path = plot_path
        #: the result of the sweep, once it ran.
        self.result: Optional[LRFinderResult] = None

    def on_train_loop_registration(self) -> None:
        """Refuse a distributed fit (each rank would suggest its own rate)."""
        if self.train_loop_obj.world_size > 1:
            raise RuntimeError('LRFinder runs in a single process: call find_lr(loop) before the distributed fit '
                               'and set the learning rate yourself')

    def on_train_begin(self) -> None:
        """Run the sweep (fresh runs only) and set the suggestion."""
        loop = self.train_loop_obj
        if loop.total_iteration_idx >= 0:
            logger.info('LRFinder: training continues from batch %d, so the range test is skipped',
                        loop.total_iteration_idx + 1)
            return
        self.result = find_lr(loop, self.start_lr, self.end_lr, self.num_steps, self.mode, self.beta,
                              self.diverge_threshold, self.skip_start, self.skip_end, self.plot, self.plot_path)
        suggestion = self.result.suggestion
        if self.set_lr and suggestion is not None:
            self.apply_lr(suggestion)

    def apply_lr(self, lr: float) -> None:
        """Make ``lr`` the base learning rate of every param group: a group driven by a scheduler (which has an
        ``initial_lr``) keeps its current factor of the base rate, and the schedulers' ``base_lrs`` follow."""
        loop = self.train_loop_obj
        for optimizer in loop.optimizers:
            for group in optimizer.param_groups:
                base = group.get('initial_lr', group['lr'])
                group['lr'] = lr if base == 0 else group['lr'] * (lr / base)
                if 'initial_lr' in group:
                    group['initial_lr'] = lr
        for callback in loop.get_schedulers():
            scheduler = getattr(callback, 'scheduler', None)
            groups = getattr(getattr(scheduler, 'optimizer', None), 'param_groups', None)
            if scheduler is not None and hasattr(scheduler, 'base_lrs') and groups is not None:
                scheduler.base_lrs = [group.get('initial_lr', group['lr']) for group in groups]
        logger.info('LRFinder: training starts with learning rate %.3g', lr)
