"""The published super-gradients wheel: download it (``pip download --no-deps``: no install, no dependencies),
verify it, and find SG's callback classes in it.

A callback class is a class of the wheel whose base is SG's ``Callback`` / ``PhaseCallback`` (imported from
SuperGradients) or another such class, found on the source with ``ast`` (nothing of the wheel is imported here).
``base_callbacks.py`` itself, where ``Callback``, ``PhaseCallback`` and SG's dispatcher ``CallbackHandler`` live,
is what the adapter replaces, so its classes are not counted.
"""
import ast
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Set

from .. import callback_check
from ..callback_check import CallbackModule
from ..published_wheel import PublishedWheel

SG_VERSION = '3.7.1'
WHEEL_NAME = f'super_gradients-{SG_VERSION}-py3-none-any.whl'
WHEEL_SHA256 = 'f4ebf2f551399f77070609da15efb2cfaf90392a38be4be8b1d4eab0d9c47381'
# SG's callback API: what the adapter provides in place of these modules.
BASE_MODULE = 'super_gradients/training/utils/callbacks/base_callbacks.py'
ROOT_CLASSES = {'Callback', 'PhaseCallback'}


_WHEEL = PublishedWheel('sg-check', 'super-gradients', SG_VERSION, WHEEL_NAME, WHEEL_SHA256)
default_cache = _WHEEL.default_cache
fetch_wheel = _WHEEL.fetch


def read_sources(wheel: Path) -> Dict[str, str]:
    """path -> source of every .py file of the wheel."""
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name).decode('utf-8') for name in archive.namelist()
                if name.startswith('super_gradients/') and name.endswith('.py')}


def _sg_imported_names(tree: ast.Module) -> Set[str]:
    """Names a module imports from SuperGradients (any depth: SG imports inside functions too)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('super_gradients'):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def find_callback_modules(sources: Dict[str, str]) -> List[CallbackModule]:
    """The wheel's modules that define SG callback classes, and those classes (to a fixpoint over subclasses)."""
    return callback_check.find_callback_modules(sources, ROOT_CLASSES, _sg_imported_names, skip={BASE_MODULE})


def module_source(sources: Dict[str, str], dotted: str) -> Optional[str]:
    return sources.get(dotted.replace('.', '/') + '.py')
