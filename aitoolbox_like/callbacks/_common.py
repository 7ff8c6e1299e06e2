"""Small helpers shared by the callback modules (argument checks, metric direction, matplotlib figures)."""
# The metric and figure helpers live with the reporters (the core), which draw the same plots; the callbacks
# use them from here.
from typing import Optional

from ..experiment.reporting import import_matplotlib, is_number, lower_is_better, new_figure  # noqa: F401


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
