"""TrainingHistory: per-metric lists of values, one entry per time the metric was computed."""
from __future__ import annotations

import copy
import logging
from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import Any

logger = logging.getLogger(__name__)


class TrainingHistory:
    """Dict-like record of a training run: ``history['val_loss']`` is a list with one value per epoch
    in which it was computed.

    Besides the values, the history remembers the epoch of each value (``get_epochs(metric)``), so
    that metrics computed only every k epochs can be plotted and compared without guessing.
    As in AIToolbox, ``history[name] = value`` APPENDS a value; ``history[name]`` returns the list.

    ``steps`` holds per-step records, one dict per recorded training step (``{'step': global batch index, 'epoch':
    ..., 'loss': ..., 'lr': ...}``), when a callback keeps them (StepHistory); empty otherwise. They are saved with
    the history in checkpoints, and are not among its per-epoch names.
    """

    def __init__(self, has_validation: bool = True, strict_content_check: bool = False) -> None:
        self.strict_content_check = strict_content_check
        self.has_validation = has_validation
        self.train_history = self._empty_history()
        self._epochs: dict[str, list[int]] = {}
        self.current_epoch = 0   # the TrainLoop keeps this up to date; it labels new values
        self.steps: list[dict[str, Any]] = []

    def _empty_history(self) -> dict[str, list[Any]]:
        history: dict[str, list[Any]] = {'loss': [], 'accumulated_loss': []}
        if self.has_validation:
            history['val_loss'] = []
        return history

    @property
    def empty_train_history(self) -> dict[str, list[Any]]:
        """A fresh history dict with only the default metrics (``loss``, ``accumulated_loss``, ``val_loss``)."""
        return self._empty_history()

    def insert_single_result_into_history(self, metric_name: str, metric_result: Any, epoch: int | None = None) -> None:
        """Append ``metric_result`` to ``metric_name``'s list, labelled with ``epoch`` (default: ``current_epoch``)."""
        self.train_history.setdefault(metric_name, []).append(metric_result)
        self._epochs.setdefault(metric_name, []).append(self.current_epoch if epoch is None else epoch)

    def value_in_epoch(self, metric_name: str, epoch: int) -> Any:
        """The value of ``metric_name`` recorded in ``epoch``, or None when it was not computed then (e.g.
        evaluation every k epochs): a rule reading it must not count an older value again."""
        values = self.train_history.get(metric_name)
        if not values or self._epochs.get(metric_name, [None])[-1] != epoch:
            return None
        return values[-1]

    def get_epochs(self, metric_name: str) -> list[int]:
        """Epoch index of each value of ``metric_name`` (same length as ``history[metric_name]``)."""
        return list(self._epochs.get(metric_name, []))

    def get_train_history(self) -> dict[str, list[Any]]:
        """The underlying ``{metric: [values]}`` dict (not a copy)."""
        return self.train_history

    def get_train_history_dict(self, flatten_dict: bool = False) -> dict[str, list[Any]]:
        """The history dict; ``flatten_dict=True`` expands dict-valued metrics (see :meth:`flatten_history`)."""
        if self.train_history == self._empty_history():
            logger.warning('Train History dict is empty')
        if not flatten_dict:
            return self.train_history
        return self.flatten_history(self.train_history)

    @staticmethod
    def flatten_history(history: Mapping[str, list[Any]]) -> dict[str, list[Any]]:
        """Expand metrics whose values are dicts into one list per key: ``{'f1': [{'a': 1}]}`` becomes
        ``{'f1_a': [1]}``. Works on any Python 3 (AIToolbox's used collections.Mapping, gone in 3.10)."""
        flat: dict[str, list[Any]] = {}
        for name, values in history.items():
            if values and all(isinstance(v, Mapping) for v in values):
                for sub_name in dict.fromkeys(k for v in values for k in v):
                    flat[f'{name}_{sub_name}'] = [copy.deepcopy(v.get(sub_name)) for v in values]
            else:
                flat[name] = copy.deepcopy(values)
        return flat

    def wrap_pre_prepared_history(self, history: dict[str, list[Any]]) -> TrainingHistory:
        """Adopt an existing ``{metric: [values]}`` dict (value i is taken as epoch i); returns ``self``."""
        self.train_history = history
        self._epochs = {name: list(range(len(values))) for name, values in history.items()}
        return self

    def get_epoch_from_history(self, epoch: int) -> dict[str, Any]:
        """The values recorded in one epoch: ``{metric: value}``."""
        return {name: self.train_history[name][self._epochs[name].index(epoch)]
                for name in self.train_history if epoch in self._epochs.get(name, [])}

    def lengths(self) -> dict[str, int]:
        """How many values each metric has now: a mark that :meth:`drop_after` goes back to."""
        return {name: len(values) for name, values in self.train_history.items()}

    def drop_after(self, lengths: Mapping[str, int]) -> None:
        """Forget the values recorded since :meth:`lengths` returned ``lengths`` (a metric new since then is
        left with no values, as before). The loop does it when a stop abandons an evaluation: what it recorded
        is recorded again when the resumed run evaluates."""
        for name, values in self.train_history.items():
            keep = lengths.get(name, 0)
            del values[keep:]
            del self._epochs.setdefault(name, [])[keep:]
        for name in [name for name, values in self.train_history.items()
                     if not values and name not in lengths and name not in self._empty_history()]:
            del self.train_history[name]
            self._epochs.pop(name, None)

    # ---- checkpoint state ----
    def state_dict(self) -> dict[str, Any]:
        """Values, their epochs, ``current_epoch`` and the step records, for a checkpoint."""
        state = {'train_history': _copy_lists(self.train_history), 'epochs': _copy_lists(self._epochs),
                 'current_epoch': self.current_epoch}
        if self.steps:
            state['steps'] = copy.deepcopy(self.steps)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (deep copies, so the checkpoint dict stays untouched)."""
        self.train_history = copy.deepcopy(state['train_history'])
        self._epochs = copy.deepcopy(state['epochs'])
        self.current_epoch = state.get('current_epoch', 0)
        self.steps = copy.deepcopy(list(state.get('steps', [])))

    # ---- dict protocol ----
    def __getitem__(self, metric_name: str) -> list[Any]:
        return self.train_history[metric_name]

    def __setitem__(self, metric_name: str, metric_result: Any) -> None:
        self.insert_single_result_into_history(metric_name, metric_result)

    def __contains__(self, metric_name: object) -> bool:
        return metric_name in self.train_history

    def __iter__(self) -> Iterator[str]:
        return iter(self.train_history)

    def __len__(self) -> int:
        return len(self.train_history)

    def keys(self) -> KeysView[str]:
        """Metric names, as ``dict.keys()``."""
        return self.train_history.keys()

    def values(self) -> ValuesView[list[Any]]:
        """Per-metric value lists, as ``dict.values()``."""
        return self.train_history.values()

    def items(self) -> ItemsView[str, list[Any]]:
        """``(metric, values)`` pairs, as ``dict.items()``."""
        return self.train_history.items()

    def get(self, metric_name: str, default: Any = None) -> Any:
        """The value list of ``metric_name``, or ``default`` when it was never recorded."""
        return self.train_history.get(metric_name, default)

    def qa_check_history_records(self) -> None:
        """Check that every metric has as many values as the others (a history wrapped from a dict may not).

        Raises:
            ValueError: records of different lengths with ``strict_content_check``; else a warning is logged
        """
        lengths = {name: len(values) for name, values in self.train_history.items()}
        if len(set(lengths.values())) > 1:
            message = f'Training history records differ in length: {lengths}'
            if self.strict_content_check:
                raise ValueError(message)
            logger.warning(message)

    def add_history_dict(self, other: Mapping[str, Any]) -> None:
        """Append each value of ``other`` (``{metric: value}``) to its metric's list, as one more record

        Raises:
            TypeError: ``other`` is not a dict
        """
        if not isinstance(other, dict):
            raise TypeError(f'Only a dict of metric values can be added to a TrainingHistory; got {type(other).__name__}')
        for name, value in other.items():
            self.insert_single_result_into_history(name, value)

    def __add__(self, other: Mapping[str, Any]) -> TrainingHistory:
        """A copy of this history with the values of the dict ``other`` appended (AIToolbox's ``history + dict``)"""
        combined = copy.deepcopy(self)
        combined.add_history_dict(other)
        return combined

    def __radd__(self, other: Mapping[str, Any]) -> TrainingHistory:
        return self.__add__(other)

    def __iadd__(self, other: Mapping[str, Any]) -> TrainingHistory:
        self.add_history_dict(other)
        return self

    def __str__(self) -> str:
        return str(self.train_history)

    def __repr__(self) -> str:
        return f'TrainingHistory({self.train_history!r})'


# What a history value usually is: copied by reference, as deepcopy would return it.
_IMMUTABLE = frozenset((int, float, bool, str, type(None)))


def _copy_lists(lists: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """``copy.deepcopy(lists)`` for a dict of lists of values, without deepcopy's per-value work where a value is a
    number or a string (every save copies the whole history)."""
    memo: dict[int, Any] = {}
    return {name: [value if type(value) in _IMMUTABLE else copy.deepcopy(value, memo) for value in values]
            for name, values in lists.items()}
