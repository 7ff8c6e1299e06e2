"""Rewrite the import lines of SG's callback modules, and nothing else.

Each ``import`` / ``from ... import`` statement (at any depth: SG imports inside functions too) is replaced by
imports of the same names from where they come here, on the statement's first line (blank lines keep the line
numbers, so tracebacks point at SG's own lines):

* SG's callback API (``Callback``, ``PhaseCallback``, ``PhaseContext``, ``Phase``, ``multi_process_safe``)
  -> ``aitoolbox_like.adapters.supergradients``, the adapter under check;
* a class of another SG callback module -> that module's rewritten copy;
* SG's pure-data modules (its object names, time units) -> their copies, unchanged;
* any other SuperGradients name (its logger factory, registries, helpers, model-zoo utilities) ->
  ``tools.sg_check.stand_ins``, which has small equivalents or a placeholder that fails when used;
* a third-party module that imports here stays as it is; one that does not (OpenCV, ONNX, ...) becomes a
  placeholder from ``stand_ins`` that fails, naming the module, when used. NumPy 2 becomes NumPy with the 1.x
  aliases SG 3.7.1 uses (it requires numpy<=1.23); a Matplotlib from 3.9 on becomes ``matplotlib.pyplot`` with the
  ``cm.get_cmap(name, lut)`` SG's drawing helpers call (3.9 removed it; SG allows any matplotlib>=3.3.4).

Every class body, function body, decorator and expression stays byte for byte as published.
"""
import ast
import importlib
from typing import Callable, Dict, List, Optional, Tuple

from ..callback_check import imported_names_text, rewrite_imports

ADAPTER = 'aitoolbox_like.adapters.supergradients'
STAND_INS = 'tools.sg_check.stand_ins'
# The names SG's callbacks import from SG's callback API and the adapter provides.
ADAPTER_NAMES = {'Callback', 'PhaseCallback', 'PhaseContext', 'Phase', 'multi_process_safe'}
ADAPTER_SOURCES = ('super_gradients.training.utils.callbacks', 'super_gradients.common.environment.ddp_utils')


def importable(module: str) -> bool:
    """Whether ``module`` imports in this environment (torchvision built for another torch raises RuntimeError)."""
    try:
        importlib.import_module(module)
    except Exception:
        return False
    return True


def pyplot_lacks_get_cmap() -> bool:
    """Whether Matplotlib here is 3.9 or newer (``matplotlib.cm.get_cmap`` removed); False without Matplotlib."""
    try:
        import matplotlib.cm
    except Exception:
        return False
    return not hasattr(matplotlib.cm, 'get_cmap')


def numpy_is_2() -> bool:
    import numpy
    return int(numpy.__version__.split('.')[0]) >= 2


class Rewriter:
    """Rewrites import statements of one module.

    Args:
        copies: dotted SG module -> the dotted name of its copy here (the callback modules and SG's data modules).
        classes_of: class name -> the dotted name of the rewritten callback module defining it.
        can_import: whether a third-party module imports here.
        numpy_2: whether NumPy here is 2.x (None: the installed one's).
        old_pyplot: whether ``import matplotlib.pyplot as ...`` gets the stand-in with ``cm.get_cmap`` (None: when the
            installed Matplotlib lacks it).
    """

    def __init__(self, copies: Dict[str, str], classes_of: Dict[str, str],
                 can_import: Callable[[str], bool] = importable, numpy_2: Optional[bool] = None,
                 old_pyplot: Optional[bool] = None) -> None:
        self.copies = copies
        self.classes_of = classes_of
        self.can_import = can_import
        self.numpy_2 = numpy_is_2() if numpy_2 is None else numpy_2
        self.old_pyplot = pyplot_lacks_get_cmap() if old_pyplot is None else old_pyplot

    def _target_of(self, module: str, name: str) -> str:
        if name in ADAPTER_NAMES and module.startswith(ADAPTER_SOURCES):
            return ADAPTER
        if module in self.copies:
            return self.copies[module]
        if name in self.classes_of:
            return self.classes_of[name]
        return STAND_INS

    def _from(self, node: ast.ImportFrom) -> Optional[str]:
        module = node.module or ''
        if node.level:
            raise ValueError(f'relative import at line {node.lineno}: not expected in SG\'s wheel')
        if not module.startswith('super_gradients'):
            if self.can_import(module.split('.')[0]) and self.can_import(module):
                return None
            return f'from {STAND_INS} import {imported_names_text(node.names)}'
        groups: Dict[str, List[ast.alias]] = {}
        for alias in node.names:
            groups.setdefault(self._target_of(module, alias.name), []).append(alias)
        return '; '.join(f'from {target} import {imported_names_text(aliases)}' for target, aliases in groups.items())

    def _import(self, node: ast.Import) -> Optional[str]:
        parts, changed = [], False
        for alias in node.names:
            top = alias.name.split('.')[0]
            if top == 'numpy' and self.numpy_2:
                parts.append(f'from {STAND_INS} import numpy_1 as {alias.asname or "numpy"}')
                changed = True
            elif alias.name == 'matplotlib.pyplot' and alias.asname and self.old_pyplot:
                parts.append(f'from {STAND_INS} import pyplot_3_8 as {alias.asname}')
                changed = True
            elif top.startswith('super_gradients') or not self.can_import(alias.name):
                bound = alias.asname or top
                parts.append(f'from {STAND_INS} import {alias.name.replace(".", "__")} as {bound}')
                changed = True
            else:
                parts.append(f'import {alias.name}' + (f' as {alias.asname}' if alias.asname else ''))
        return '; '.join(parts) if changed else None

    def rewrite(self, source: str) -> Tuple[str, List[Tuple[int, str]]]:
        """The module's source with its imports rewritten, and (line, new import) for each rewritten one."""
        return rewrite_imports(source, self._from, self._import)
