"""The check's bookkeeping: SG's expectations and which SG classes ran (tools/published_wheel.py's Watch tells)."""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set

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
