"""Small helpers shared by the callback modules (argument checks, metric direction, matplotlib figures)."""
# The metric and figure helpers live with the reporters (the core), which draw the same plots; the callbacks
# use them from here.
import difflib
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..results.reporting import as_number, import_matplotlib, is_number, lower_is_better, new_figure  # noqa: F401


def missing_monitor_message(who: str, monitor: str, names: List[str], epoch: int) -> str:
    """What to say when ``monitor`` has no value after epoch ``epoch``: the names the history has, and the closest
    one (ignoring case: 'val_acc' finds 'val_Accuracy')."""
    by_lower = {name.lower(): name for name in names}
    close = difflib.get_close_matches(monitor.lower(), list(by_lower), n=1, cutoff=0.6)
    hint = f' Did you mean {by_lower[close[0]]!r}?' if close else ''
    return (f'{who} monitors {monitor!r}, but epoch {epoch} ended without a value for it; the history has '
            f'{", ".join(repr(n) for n in sorted(names)) or "nothing yet"}.{hint} Until it appears nothing is '
            f'decided by it (pass monitor= one of these names, or add the callback that computes it).')


def check_int(name: str, value: object, minimum: int = 1, allow_none: bool = False,
              who: Optional[str] = None) -> Optional[int]:
    """Raise ValueError unless ``value`` is an int (not a bool) >= ``minimum`` (or None with allow_none)."""
    if value is None and allow_none:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        prefix = f'{who}: ' if who else ''
        raise ValueError(f'{prefix}{name} must be an int >= {minimum}{" or None" if allow_none else ""}, '
                         f'got {value!r}')
    return value


def learning_rates(loop: Any) -> List[List[float]]:
    """The learning rate of every param group of every optimizer the loop steps (Python floats: no device read)."""
    return [[float(group['lr']) for group in getattr(optimizer, 'param_groups', []) if 'lr' in group]
            for optimizer in loop.optimizers]


class StepLearningRates:
    """The learning rates the update of each recorded step used: read when the step begins (before a scheduler
    moves them for the next update), taken when that step's loss is read."""

    def __init__(self) -> None:
        self.pending: Dict[int, List[List[float]]] = {}

    def record(self, loop: Any) -> None:
        """Keep the learning rates of the step beginning now (``loop.total_iteration_idx``)."""
        self.pending[loop.total_iteration_idx] = learning_rates(loop)

    def take(self, step: int) -> Optional[List[List[float]]]:
        """The learning rates recorded for ``step`` (None when it was not recorded), forgotten here."""
        return self.pending.pop(step, None)

    def take_named(self, step: int) -> Dict[str, float]:
        """The learning rates recorded for ``step`` as ``{'learning_rate/group_<i>': lr}`` (TensorBoard's names;
        ``learning_rate/optimizer_<k>_group_<i>`` with several optimizers), ``{}`` when it was not recorded."""
        lrs = self.take(step) or []
        return {(f'learning_rate/optimizer_{k}_group_{i}' if len(lrs) > 1 else f'learning_rate/group_{i}'): lr
                for k, groups in enumerate(lrs) for i, lr in enumerate(groups)}


class BatchLossReader:
    """Reads the loop's per-batch training losses of the current epoch on the host, in blocks: every call copies the
    losses not read yet in one transfer (one host-device sync per call, however many steps it covers), so loggers
    of batch losses cost no sync per step.
    """

    def __init__(self) -> None:
        self._losses: Optional[List[Any]] = None
        self._read = 0
        self._sums: Dict[str, float] = {}
        self._count = 0

    def read_new(self, loop: Any) -> List[Tuple[int, Dict[str, float], Dict[str, float]]]:
        """For each batch of this epoch not read yet: ``(global step, {name: loss}, {name: running mean of the
        epoch})``; name 'loss' for a single loss, the MultiLoss names otherwise."""
        accum = loop.loss_batch_accum
        if accum is not self._losses:       # the loop starts a new list every epoch
            self._losses, self._read, self._sums, self._count = accum, 0, {}, 0
        pending = accum[self._read:]
        if not pending:
            return []
        first_step = loop.total_iteration_idx - len(accum) + 1 + self._read
        if hasattr(pending[0], 'keys'):     # MultiLoss: one series per loss
            names = list(pending[0].keys())
            rows = torch.stack([torch.stack([loss[n].detach().reshape(()).double() for n in names])
                                for loss in pending]).tolist()
        else:
            names = ['loss']
            rows = torch.stack([loss.detach().reshape(()).double() for loss in pending]).unsqueeze(1).tolist()
        self._read = len(accum)
        result = []
        for offset, row in enumerate(rows):
            self._count += 1
            values = dict(zip(names, row))
            for name, value in values.items():
                self._sums[name] = self._sums.get(name, 0.0) + value
            result.append((first_step + offset, values, {n: self._sums[n] / self._count for n in names}))
        return result

    def __getstate__(self) -> Dict[str, Any]:
        # Pickled with its callback (DDP launch): the epoch's loss list stays behind.
        return dict(self.__dict__, _losses=None)
