"""The check's bookkeeping: Orca's expectations, which Orca classes ran, and the Orca method calls the adapter made."""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Set


@dataclass
class Expectation:
    test: str
    expected: Any
    actual: Any = None
    error: Optional[str] = None

    @property
    def holds(self) -> bool:
        return self.error is None and self.actual is not None and self.actual == self.expected

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
    """Which Orca classes ran, the first error of each that did not, and the expectations."""
    orca_modules: Set[str]
    ran: Set[str] = field(default_factory=set)
    errors: Dict[str, str] = field(default_factory=dict)
    expectations: List[Expectation] = field(default_factory=list)

    def orca_classes(self, cls: type) -> List[str]:
        return [k.__name__ for k in cls.__mro__ if k.__module__ in self.orca_modules]


class Watch:
    """Counts the Orca method calls the adapter makes on each Orca callback of a fit (instance attributes wrapping
    the methods: the adapter calls them by name)."""

    def __init__(self, tally: Tally, method_names: Sequence[str]) -> None:
        self.tally = tally
        self.method_names = method_names
        self.calls: Dict[int, int] = {}
        self.callbacks: List[Any] = []

    def __call__(self, callbacks: Sequence[Any]) -> List[Any]:
        for callback in callbacks:
            if self.tally.orca_classes(type(callback)):
                self.callbacks.append(callback)
                for name in self.method_names:
                    method = getattr(callback, name, None)
                    if callable(method):
                        setattr(callback, name, self._counting(callback, method))
        return list(callbacks)

    def _counting(self, callback: Any, method: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[id(callback)] = self.calls.get(id(callback), 0) + 1
            return method(*args, **kwargs)
        return counted

    def credit(self) -> None:
        """After a completed fit: every Orca class of a callback whose methods were called ran."""
        for callback in self.callbacks:
            if self.calls.get(id(callback)):
                self.tally.ran.update(self.tally.orca_classes(type(callback)))
