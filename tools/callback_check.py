"""What the checks of another library's published callback classes share (tools/sg_check, tools/orca_check).

Each check finds the library's callback classes in its wheel's sources, rewrites their modules' import lines to
point at our adapter and at local stand-ins, runs them, and reports which ran and which of the library's own
expectations hold. The library-specific parts (which imports count, where each goes, the scenarios) stay in each
check; this module holds the mechanics that are the same for all:

* :func:`find_callback_modules`: the classes derived, directly or through each other, from the library's root
  callback classes, found on the source with ``ast`` (nothing of the wheel is imported);
* :func:`rewrite_imports`: a module's source with some import statements replaced in place, line numbers kept;
* :func:`placeholder` and :class:`Unavailable`: a name with no stand-in, failing (naming itself) when used;
* :class:`Expectation`: one of the library's expectations and the value the check got;
* :func:`report`: the classes and expectations printed, and the verdict against the figures reached before.
"""
import ast
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Dict, List, Optional, Set, Tuple


@dataclass
class CallbackModule:
    path: str                                   # in the wheel
    source: str
    classes: List[str] = field(default_factory=list)    # its callback classes, in source order

    @property
    def stem(self) -> str:
        return Path(self.path).stem


def _base_names(node: ast.ClassDef) -> List[str]:
    return [base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ''
            for base in node.bases]


def find_callback_modules(sources: Dict[str, str], roots: Collection[str],
                          imported_names: Callable[[ast.Module], Set[str]],
                          skip: Collection[str] = ()) -> List[CallbackModule]:
    """The modules of ``sources`` (path -> source, less ``skip``) that define callback classes, and those classes:
    a class whose base is one of ``roots`` or an already found class, imported into its module (``imported_names``
    of the module's tree: the names it imports from the library) or defined there. Repeated to a fixpoint, so a
    subclass of a subclass in another module counts."""
    parsed = {path: ast.parse(text) for path, text in sources.items() if path not in skip}
    imported = {path: imported_names(tree) for path, tree in parsed.items()}
    classes = {path: [node for node in tree.body if isinstance(node, ast.ClassDef)] for path, tree in parsed.items()}
    known: Set[str] = set(roots)
    found: Dict[str, List[str]] = {}
    changed = True
    while changed:
        changed = False
        for path, nodes in classes.items():
            local = {node.name for node in nodes}
            for node in nodes:
                if node.name in found.get(path, []):
                    continue
                if any(name in known and (name in imported[path] or name in local) for name in _base_names(node)):
                    found.setdefault(path, []).append(node.name)
                    known.add(node.name)
                    changed = True
    modules = []
    for path in sorted(found):
        order = [node.name for node in classes[path]]
        modules.append(CallbackModule(path, sources[path], sorted(found[path], key=order.index)))
    return modules


def rewrite_imports(source: str, replace_from: Callable[[ast.ImportFrom], Optional[str]],
                    replace_import: Callable[[ast.Import], Optional[str]]) -> Tuple[str, List[Tuple[int, str]]]:
    """``source`` with each import statement (at any depth) that ``replace_from`` / ``replace_import`` gives a
    replacement for replaced by it on the statement's first line, blank lines after it, so that every other line
    keeps its number (tracebacks point at the library's own lines); and (line, new import) for each replaced one."""
    lines = source.splitlines(keepends=True)
    edits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            new = replace_from(node)
        elif isinstance(node, ast.Import):
            new = replace_import(node)
        else:
            continue
        if new is not None:
            edits.append((node.lineno, node.end_lineno or node.lineno, node.col_offset, node.end_col_offset, new))
    for start, end, col, end_col, new in sorted(edits, reverse=True):
        first, rest = lines[start - 1], lines[end - 1][end_col or 0:].strip()
        if first[:col].strip() or (rest and not rest.startswith('#')):
            raise ValueError(f'line {start}: an import shares its line with other code')
        lines[start - 1:end] = [first[:col] + new + '\n'] + ['\n'] * (end - start)
    return ''.join(lines), [(start, new) for start, _, _, _, new in sorted(edits)]


def imported_names_text(names: List[ast.alias]) -> str:
    """The ``a as b, c`` part of an import statement."""
    return ', '.join(alias.name + (f' as {alias.asname}' if alias.asname else '') for alias in names)


class Unavailable(RuntimeError):
    """A placeholder was used: something the library's callbacks import has no stand-in in this environment."""


class _Placeholder(type):
    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith('__'):
            raise AttributeError(attr)
        raise Unavailable(f'{cls.__name__}.{attr}: {cls.__name__} is not available here ({cls.why})')

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise Unavailable(f'{cls.__name__}(...): {cls.__name__} is not available here ({cls.why})')


def placeholder(name: str, why: str) -> type:
    """A class (usable in annotations and isinstance) whose every use raises :class:`Unavailable`."""
    return _Placeholder(name, (), {'why': why})


@dataclass
class Expectation:
    """One of the library's expectations: equal (``rtol`` None and no ``atol``, as ``assertEqual``) or close."""
    test: str
    expected: Any
    actual: Any = None
    rtol: Optional[float] = None
    atol: float = 0.0
    error: Optional[str] = None

    @property
    def holds(self) -> bool:
        if self.error is not None or self.actual is None:
            return False
        if self.rtol is None and not self.atol:
            return self.actual == self.expected
        import numpy as np
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


def report(library: str, check: str, expectations_title: str, classes: List[Tuple[CallbackModule, str]], tally: Any,
           not_run: Dict[str, str], import_errors: Dict[str, str], min_classes: int, min_expectations: int,
           started: float) -> int:
    """Print each class of the library (runs / not run and why / does not run and its error) and each expectation,
    then the closing count line; the exit status: 1 when fewer classes ran or fewer expectations held than the
    minimums (the figures reached before). ``tally``: the check's Tally (``ran``, ``errors``, ``expectations``)."""
    print(f'\n{library} callback classes:')
    for module, name in classes:
        if name in tally.ran:
            state = 'runs'
        elif name in not_run:
            state = f'not run: {not_run[name]}'
            if module.stem in import_errors:
                state += f' ({import_errors[module.stem]})'
        elif module.stem in import_errors:
            state = f'does not run: {import_errors[module.stem]}'
        elif name in tally.errors:
            state = f'does not run: {tally.errors[name]}'
        else:
            state = f'not run: no scenario for it in tools/{check.replace("-", "_")}/scenarios.py'
        print(f'  {module.stem}.{name}: {state}')
    print(f'\n{expectations_title}:')
    for expectation in tally.expectations:
        print(f'  {expectation.describe()}')
    ran = sum(name in tally.ran for _, name in classes)
    holding = sum(expectation.holds for expectation in tally.expectations)
    print(f'\n({time.monotonic() - started:.0f} s)')
    failed = []
    if ran < min_classes:
        failed.append(f'{ran} classes run, fewer than the {min_classes} reached before')
    if holding < min_expectations:
        failed.append(f'{holding} expectations hold, fewer than the {min_expectations} reached before')
    for reason in failed:
        print(f'{check}: {reason}')
    print(f'{ran} of {len(classes)} {library} callback classes run; {holding} of {len(tally.expectations)} '
          f'{library} expectations hold')
    return 1 if failed else 0
