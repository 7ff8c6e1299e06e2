"""The check's bookkeeping: SG's expectations and which SG classes ran (tools/published_wheel.py's Watch tells)."""
from dataclasses import dataclass, field
from typing import Dict, List, Set

from ..callback_check import Expectation


@dataclass
class Tally:
    """Which SG classes ran, the first error of each that did not, and the expectations."""
    sg_modules: Set[str]
    ran: Set[str] = field(default_factory=set)
    errors: Dict[str, str] = field(default_factory=dict)
    expectations: List[Expectation] = field(default_factory=list)

    def sg_classes(self, cls: type) -> List[str]:
        return [k.__name__ for k in cls.__mro__ if k.__module__ in self.sg_modules]
