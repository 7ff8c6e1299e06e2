"""The check's bookkeeping: Orca's expectations and which Orca classes ran (tools/published_wheel.py's Watch tells)."""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set


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
