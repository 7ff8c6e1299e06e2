"""Rewrite the import lines of Orca's callback modules, and nothing else.

Each ``import`` / ``from ... import`` statement (at any depth: Orca imports inside functions too) naming BigDL is
replaced by imports of the same names from where they come here, on the statement's first line (blank lines keep
the line numbers, so tracebacks point at Orca's own lines):

* Orca's callback API (``bigdl.orca.learn.pytorch.callbacks`` and its ``base`` module, also as ``from .base``)
  -> ``aitoolbox_like.adapters.orca``, the adapter under check;
* another module of the callbacks package -> its rewritten copy;
* any other BigDL name (``bigdl.dllib``'s ``invalidInputError``, ``bigdl.orca.data.file``'s file helpers) ->
  ``tools.orca_check.stand_ins``, which has small local equivalents.

Third-party imports (torch, tqdm, wandb, TensorBoard's writer) stay as they are: a module whose library is missing
does not import, and its classes are reported as not run, with the reason. Every class body, function body and
expression stays byte for byte as published.
"""
import ast
from typing import Dict, List, Optional, Tuple

from ..callback_check import imported_names_text, rewrite_imports

ADAPTER = 'aitoolbox_like.adapters.orca'
STAND_INS = 'tools.orca_check.stand_ins'
PACKAGE = 'bigdl.orca.learn.pytorch.callbacks'
ADAPTER_MODULES = (PACKAGE, PACKAGE + '.base')


class Rewriter:
    """Rewrites the BigDL import statements of one module of Orca's callbacks package.

    Args:
        copies: dotted module of the package -> the dotted name of its rewritten copy here.
    """

    def __init__(self, copies: Dict[str, str]) -> None:
        self.copies = copies

    @staticmethod
    def absolute(node: ast.ImportFrom) -> str:
        """The imported module's dotted name (a relative import is relative to the callbacks package)."""
        if not node.level:
            return node.module or ''
        parts = PACKAGE.split('.')
        base = parts[:len(parts) - node.level + 1]
        return '.'.join(base + ([node.module] if node.module else []))

    def target(self, module: str) -> Optional[str]:
        if module in ADAPTER_MODULES:
            return ADAPTER
        if module in self.copies:
            return self.copies[module]
        if module == 'bigdl' or module.startswith('bigdl.'):
            return STAND_INS
        return None

    def _from(self, node: ast.ImportFrom) -> Optional[str]:
        target = self.target(self.absolute(node))
        return None if target is None else f'from {target} import {imported_names_text(node.names)}'

    def _import(self, node: ast.Import) -> Optional[str]:
        parts, changed = [], False
        for alias in node.names:
            if alias.name == 'bigdl' or alias.name.startswith('bigdl.'):
                bound = alias.asname or alias.name.split('.')[0]
                parts.append(f'from {STAND_INS} import {alias.name.replace(".", "__")} as {bound}')
                changed = True
            else:
                parts.append(f'import {alias.name}' + (f' as {alias.asname}' if alias.asname else ''))
        return '; '.join(parts) if changed else None

    def rewrite(self, source: str) -> Tuple[str, List[Tuple[int, str]]]:
        """The module's source with its BigDL imports rewritten, and (line, new import) for each rewritten one."""
        return rewrite_imports(source, self._from, self._import)
