"""The reference of a registry: each name with the arguments a recipe gives it and the first sentence of its
documentation (``aitoolbox-like list`` and docs/recipes-reference.md)."""
import inspect
from typing import Any, List, Tuple

from .registry import LOOP_FILLED
from .signatures import format_signature, summary_of


def entry_signature(kind: str, target: Any) -> str:
    """The arguments a recipe gives ``target`` of registry ``kind``, with their defaults (what ``aitoolbox-like
    list`` and the generated reference show)."""
    from ..callbacks.abstract import AbstractCallback
    if kind == 'optimizer':
        return format_signature(target, skip_first=True)
    if kind == 'loop':
        return format_signature(target, filled=LOOP_FILLED)
    if kind == 'scheduler' and not (inspect.isclass(target) and issubclass(target, AbstractCallback)):
        own = format_signature(target, skip_first=True)
        wrapper = "interval='epoch', monitor=None, optimizer_idx=None"
        return f'{own}, {wrapper}' if own else wrapper
    return format_signature(target)


def reference_entries(kind: str, builtin_only: bool = False) -> List[Tuple[str, str, str]]:
    """``(name, arguments, first docstring line)`` of every name in the registry of ``kind``, sorted; with
    ``builtin_only``, of the names that need no registration only (not the ones this process registered)."""
    from .registry import get_registry
    registry = get_registry(kind)
    builtin = set(registry.builtin_names()) if builtin_only else None
    return [(name, entry_signature(kind, target), summary_of(target)) for name, target in registry.items()
            if builtin is None or name in builtin]
