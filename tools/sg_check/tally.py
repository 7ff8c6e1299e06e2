"""The check's bookkeeping: SG's expectations, which SG classes ran, and the calls the adapter made."""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Set

import numpy as np


@dataclass
class Expectation:
    test: str
    expected: Any
    actual: Any = None
    rtol: Optional[float] = None      # None: equal, as SG's assertListEqual / assertEqual
    atol: float = 0.0
    error: Optional[str] = None

    @property
    def holds(self) -> bool:
        if self.error is not None or self.actual is None:
            return False
        if self.rtol is None and not self.atol:
            return self.actual == self.expected
        expected, actual = np.asarray(self.expected, dtype=float), np.asarray(self.actual, dtype=float)
        return expected.shape == actual.shape and bool(np.allclose(actual, expected, rtol=self.rtol or 0.0,
                                                                  atol=self.atol))

    def describe(self) -> str:
        if self.error is not None:
            return f'{self.test}: failed before its value: {self.error}'
        state = 'holds' if self.holds else 'does NOT hold'
        return f'{self.test}: {state} (expected {_short(self.expected)}, got {_short(self.actual)})'


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 160 else text[:150] + '...' + text[-10:]


@dataclass
class Tally:
    """Which SG classes ran, the first error of each that did not, and the expectations."""
    sg_modules: Set[str]
    ran: Set[str] = field(default_factory=set)
    errors: Dict[str, str] = field(default_factory=dict)
    expectations: List[Expectation] = field(default_factory=list)

    def sg_classes(self, cls: type) -> List[str]:
        return [k.__name__ for k in cls.__mro__ if k.__module__ in self.sg_modules]


class Watch:
    """Counts the SG method calls the adapter makes on each SG callback of a fit (instance attributes wrapping
    the methods: the adapter calls them by name)."""

    def __init__(self, tally: Tally, method_names: Sequence[str]) -> None:
        self.tally = tally
        self.method_names = method_names
        self.calls: Dict[int, int] = {}
        self.callbacks: List[Any] = []

    def __call__(self, callbacks: List[Any]) -> None:
        for callback in callbacks:
            if self.tally.sg_classes(type(callback)):
                self.callbacks.append(callback)
                for name in self.method_names:
                    method = getattr(callback, name, None)
                    if callable(method):
                        setattr(callback, name, self._counting(callback, method))

    def _counting(self, callback: Any, method: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[id(callback)] = self.calls.get(id(callback), 0) + 1
            return method(*args, **kwargs)
        return counted

    def credit(self) -> None:
        """After a completed fit: every SG class (and SG base) of a callback whose methods were called ran."""
        for callback in self.callbacks:
            if self.calls.get(id(callback)):
                self.tally.ran.update(self.tally.sg_classes(type(callback)))
