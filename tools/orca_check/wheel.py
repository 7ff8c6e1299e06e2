"""The published bigdl-orca wheel: download it (``pip download --no-deps``: nothing installed, no dependencies),
verify it, and find Orca's PyTorch callback classes in it.

A callback class is a class of ``bigdl/orca/learn/pytorch/callbacks/*.py`` whose base is Orca's ``Callback``
(imported from the callbacks package or its ``base`` module) or another such class, found on the source with
``ast`` (nothing of the wheel is imported here). ``base.py``, where ``Callback`` lives, is what the adapter replaces,
and ``__init__.py`` only re-exports, so their classes are not counted.
"""
import ast
import zipfile
from pathlib import Path
from typing import Dict, List, Set

from .. import callback_check
from ..callback_check import CallbackModule
from ..published_wheel import PublishedWheel

ORCA_VERSION = '2.4.0'
WHEEL_NAME = f'bigdl_orca-{ORCA_VERSION}-py3-none-manylinux1_x86_64.whl'
WHEEL_SHA256 = 'db02665304c39eeb28ea90bb0d231c7f09925931743ea4a4b089d0e92517e9a9'
PACKAGE = 'bigdl.orca.learn.pytorch.callbacks'
FOLDER = PACKAGE.replace('.', '/') + '/'
# What the adapter provides in place of these modules of the package.
REPLACED = {FOLDER + 'base.py', FOLDER + '__init__.py'}
ROOT_CLASSES = {'Callback'}


# The manylinux wheel whatever this machine is: only its Python sources are read.
_WHEEL = PublishedWheel('orca-check', 'bigdl-orca', ORCA_VERSION, WHEEL_NAME, WHEEL_SHA256, platform='manylinux1_x86_64')
default_cache = _WHEEL.default_cache
fetch_wheel = _WHEEL.fetch

# Orca 2.2.0: its callbacks were Keras-style (on_epoch_end(epoch, logs), ...); the check runs its own ones too.
ORCA22_VERSION = '2.2.0'
_WHEEL22 = PublishedWheel('orca-check', 'bigdl-orca', ORCA22_VERSION,
                          f'bigdl_orca-{ORCA22_VERSION}-py3-none-manylinux1_x86_64.whl',
                          '2f922fbb1ba9af7462fa0d39d067728a32815765b811c4e0b3bdcf38a4ed683f', platform='manylinux1_x86_64')
fetch_wheel22 = _WHEEL22.fetch


def read_sources(wheel: Path) -> Dict[str, str]:
    """path -> source of every .py file of the callbacks package."""
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name).decode('utf-8') for name in archive.namelist()
                if name.startswith(FOLDER) and name.endswith('.py')}


def _callback_names(tree: ast.Module) -> Set[str]:
    """Names a module imports from Orca's callbacks package or its base module (any depth, relative or not)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ''
            if (node.level == 1 and module in ('', 'base')) or module in (PACKAGE, PACKAGE + '.base'):
                names.update(alias.asname or alias.name for alias in node.names)
    return names


def find_callback_modules(sources: Dict[str, str]) -> List[CallbackModule]:
    """The package's modules that define Orca callback classes, and those classes (to a fixpoint over subclasses)."""
    return callback_check.find_callback_modules(sources, ROOT_CLASSES, _callback_names, skip=REPLACED)
