"""The check's bookkeeping: Orca's expectations and which Orca classes ran (tools/published_wheel.py's Watch tells)."""
from dataclasses import dataclass, field
from typing import Dict, List, Set

from ..callback_check import Expectation


@dataclass
class Tally:
    """Which Orca classes ran, the first error of each that did not, and the expectations."""
    orca_modules: Set[str]
    ran: Set[str] = field(default_factory=set)
    errors: Dict[str, str] = field(default_factory=dict)
    expectations: List[Expectation] = field(default_factory=list)

    def orca_classes(self, cls: type) -> List[str]:
        return [k.__name__ for k in cls.__mro__ if k.__module__ in self.orca_modules]
