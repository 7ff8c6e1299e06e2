"""Type aliases shared by the annotated public API (typing only; nothing here runs at training time)."""
from __future__ import annotations

import os
from typing import Union

#: A filesystem path given as a string or a path-like object (``pathlib.Path``).
StrPath = Union[str, 'os.PathLike[str]']
