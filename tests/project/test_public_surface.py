"""Every documented name stays where it is documented.

The public surface is every module path and ``module:Name`` that something promises to users:

* README.md, docs/**/*.md and, when present, ../shared/DESIGN.md (beside the checkout in CI): ``from
  aitoolbox_like.x import A, B`` / ``import aitoolbox_like.x`` statements and dotted references such as
  ``aitoolbox_like.callbacks.basic.EarlyStopping``, ``python -m aitoolbox_like.x`` or ``::: aitoolbox_like.x``,
  in code blocks, inline code and prose alike;
* the docstrings of aitoolbox_like/** (the same patterns, so ``>>>`` examples and Sphinx roles count);
* every module-level ``__all__`` of a public aitoolbox_like module;
* the AIToolbox alias table (aitoolbox_like/compat/aliases.py: each key as ``aitoolbox_like.<key>``, with the
  names it lists) and the AIToolbox 1.8.0 names of tests/compat/aitoolbox_1_8_0_api.json, renamed. An
  ``aitoolbox.x`` path mentioned in the documentation counts as ``aitoolbox_like.x`` (the migration promise).
  tests/compat/test_aliases.py checks what this file does not: the same names under ``aitoolbox.`` after
  ``compat.install()``, and that both paths give the very same objects;
* tests/project/public_surface.txt, the checked-in memory: a name that disappears from both the documentation and the
  code still fails here. A name that is documented but missing from it fails test_snapshot_lists_every_promise.

Each entry is checked in-process by ``import module`` / ``from module import Name`` (then getattr for a dotted
``Name.attr``), so a failure names the entry and every file:line that promised it.

Adding to the snapshot, deliberately (it only adds; remove a line by hand, and only when the name is meant to go):

    .venv/bin/python tests/project/test_public_surface.py --update

``.venv/bin/python tests/project/test_public_surface.py`` prints the surface collected today with its sources.
"""
import ast
import importlib
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / 'aitoolbox_like'
SNAPSHOT = ROOT / 'tests' / 'project' / 'public_surface.txt'
API_JSON = ROOT / 'tests' / 'compat' / 'aitoolbox_1_8_0_api.json'
# Outside the repository; in CI the shared folder sits beside the checkout. Counted when present only.
DESIGN = ROOT.parent / 'shared' / 'DESIGN.md'

# Dotted paths (after renaming aitoolbox -> aitoolbox_like) that documentation mentions without promising them.
# A path is excluded with everything below it. Keep this short: each entry needs a reason.
EXCLUDED = {
    'aitoolbox_like.kerastrain': 'migrating-from-aitoolbox.md says aitoolbox.kerastrain is not provided',
    'aitoolbox_like.X': 'a placeholder for "any path" in the compat docstrings',
    'aitoolbox_like.train_state': 'the `kind` string stored in train-state files (saving-and-resuming.md), '
                                  'not a module',
}

# The pip extra that brings each optional dependency, to say what is missing when a module needs one.
EXTRAS = {'boto3': 's3', 'tensorboard': 'tensorboard', 'matplotlib': 'plots', 'torchvision': 'vision',
          'sklearn': 'metrics', 'torchmetrics': 'metrics', 'wandb': 'wandb', 'mlflow': 'mlflow',
          'optuna': 'tune', 'ray': 'ray', 'rouge_score': 'nlp', 'nltk': 'nlp', 'sacrebleu': 'nlp', 'scipy': 'nlp'}

# A dotted path rooted at aitoolbox or aitoolbox_like. The look-behind keeps file names out
# (migrating-from-aitoolbox.md, ./aitoolbox_like.x) and trailing punctuation is not part of a component.
_DOTTED = re.compile(r'(?<![\w\-/.])(aitoolbox(?:_like)?)((?:\.[A-Za-z_]\w*)+)')
# "from aitoolbox_like.x import A, B as C" on one line, or with the names in parentheses over several lines.
_FROM_IMPORT = re.compile(r'(?<![\w.])from\s+(aitoolbox(?:_like)?(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n`;]*)')
_NAME = re.compile(r'\s*([A-Za-z_]\w*)')


def _renamed(dotted: str) -> str:
    # Documentation of AIToolbox paths promises them under aitoolbox_like (the alias table's second way).
    return 'aitoolbox_like' + dotted[len('aitoolbox'):] if dotted.split('.')[0] == 'aitoolbox' else dotted


def _excluded(dotted: str) -> bool:
    return any(dotted == path or dotted.startswith(path + '.') for path in EXCLUDED)


def _alias_modules() -> Dict[str, object]:
    from aitoolbox_like.compat.aliases import MODULES
    return MODULES


def _is_module(dotted: str) -> bool:
    """Whether a dotted path names a module: a file of the package or a key of the alias table. Decided from
    the source tree, not by importing, so that a module that stopped importing still splits the same way."""
    parts = dotted.split('.')
    if parts[0] != 'aitoolbox_like':
        return False
    if len(parts) == 1:
        return True
    if '.'.join(parts[1:]) in _alias_modules():
        return True
    path = ROOT.joinpath(*parts)
    return path.with_suffix('.py').is_file() or (path / '__init__.py').is_file()


def _entry(dotted: str) -> str:
    """'aitoolbox_like.callbacks.basic.EarlyStopping' -> 'aitoolbox_like.callbacks.basic:EarlyStopping': the
    longest module prefix, then the name (and any attribute chain below it)."""
    parts = dotted.split('.')
    for cut in range(len(parts), 0, -1):
        if _is_module('.'.join(parts[:cut])):
            rest = '.'.join(parts[cut:])
            return '.'.join(parts[:cut]) + (f':{rest}' if rest else '')
    return dotted       # not under aitoolbox_like: cannot happen for the paths _DOTTED finds


class Surface:
    """Entries ('module' or 'module:Name') and, for each, where it was promised ('file:line')."""

    def __init__(self) -> None:
        self.sources: Dict[str, List[str]] = defaultdict(list)

    def add(self, entry: str, source: str) -> None:
        if source not in self.sources[entry]:
            self.sources[entry].append(source)

    def add_dotted(self, dotted: str, source: str) -> None:
        dotted = _renamed(dotted)
        if not _excluded(dotted):
            self.add(_entry(dotted), source)

    def scan_text(self, text: str, where: str, first_line: int = 1) -> None:
        """Import statements and dotted references anywhere in a document or docstring."""
        def source(offset: int) -> str:
            return f'{where}:{first_line + text.count(chr(10), 0, offset)}'

        for match in _DOTTED.finditer(text):
            self.add_dotted(match.group(1) + match.group(2), source(match.start()))
        for match in _FROM_IMPORT.finditer(text):
            module = _renamed(match.group(1))
            names = re.sub(r'#[^\n]*', '', match.group(2)).strip('()')
            for item in names.split(','):
                # the leading identifier: "A as B" is A; prose after an inline import is dropped
                name = _NAME.match(item)
                if name and name.group(1) != 'as':
                    self.add_dotted(f'{module}.{name.group(1)}', source(match.start()))


def _relative(path: Path) -> str:
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return '../' + path.relative_to(ROOT.parent).as_posix()


def _markdown_files() -> List[Path]:
    files = [ROOT / 'README.md'] + sorted((ROOT / 'docs').rglob('*.md'))
    return files + ([DESIGN] if DESIGN.is_file() else [])


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _is_private(module: str) -> bool:
    return any(part.startswith('_') for part in module.split('.')[1:])


def _scan_python_file(surface: Surface, path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    where = _relative(path)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                surface.scan_text(first.value.value, where, first.lineno)
    module = _module_name(path)
    if _is_private(module) or module.endswith('__main__'):
        return      # private modules' __all__ promise nothing; __main__ modules run when imported
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        if not any(isinstance(target, ast.Name) and target.id == '__all__' for target in targets):
            continue
        try:
            names = ast.literal_eval(node.value)
        except ValueError:
            # computed __all__ (aitoolbox_like/__init__.py adds the alias table's names): ask the module
            try:
                names = importlib.import_module(module).__all__
            except Exception:       # noqa: BLE001 - the module itself then fails its own entry below
                names = []
        surface.add(module, f'{where}:{node.lineno}')
        for name in names:
            surface.add(f'{module}:{name}', f'{where}:{node.lineno} (__all__)')


def _scan_alias_table(surface: Surface) -> None:
    # Each key is a module under aitoolbox_like; a dict value lists the names that module offers.
    path = PACKAGE / 'compat' / 'aliases.py'
    lines = path.read_text().splitlines()

    def line_of(key: str) -> int:
        # the line where the key opens its entry; keys built in a comprehension fall back to MODULES' line
        return next((i for i, line in enumerate(lines, 1) if re.match(rf"\s*'{re.escape(key)}'\s*:", line)),
                    next(i for i, line in enumerate(lines, 1) if line.startswith('MODULES')))

    for key, value in _alias_modules().items():
        module = f'aitoolbox_like.{key}'.rstrip('.')
        source = f'{_relative(path)}:{line_of(key)}'
        surface.add(module, source)
        for name in value if isinstance(value, dict) else ():
            surface.add(f'{module}:{name}', source)
    # The names of AIToolbox 1.8.0 modules that alias one of our modules whole (value a module name) are not in
    # the table: they are whatever AIToolbox offered there, recorded in the API file.
    lines_json = API_JSON.read_text().splitlines()
    for module, names in json.loads(API_JSON.read_text()).items():
        line = next(i for i, text in enumerate(lines_json, 1) if f'"{module}"' in text)
        source = f'{_relative(API_JSON)}:{line}'
        surface.add(_renamed(module), source)
        for name in names:
            surface.add(f'{_renamed(module)}:{name}', source)


def collect() -> Surface:
    """The surface as the documentation and the code state it today (without the snapshot)."""
    surface = Surface()
    for path in _markdown_files():
        surface.scan_text(path.read_text(), _relative(path))
    for path in sorted(PACKAGE.rglob('*.py')):
        _scan_python_file(surface, path)
    _scan_alias_table(surface)
    return surface


def read_snapshot() -> List[str]:
    return [line.strip() for line in SNAPSHOT.read_text().splitlines() if line.strip()] if SNAPSHOT.is_file() else []


def _surface_with_snapshot(collected: Surface) -> Surface:
    surface = Surface()
    for entry, sources in collected.sources.items():
        for source in sources:
            surface.add(entry, source)
    for number, entry in enumerate(read_snapshot(), 1):
        surface.add(entry, f'{_relative(SNAPSHOT)}:{number}')
    return surface


def check(entry: str) -> Optional[str]:
    """None when the entry imports as promised, else why not."""
    module, _, name = entry.partition(':')
    try:
        if not name:
            importlib.import_module(module)
            return None
        first, *attributes = name.split('.')
        # exactly what user code does: also finds a submodule that is not yet an attribute of its package
        namespace: Dict[str, object] = {}
        exec(f'from {module} import {first} as value', namespace)       # noqa: S102 - fixed, checked identifiers
        value = namespace['value']
        for attribute in attributes:
            value = getattr(value, attribute)
        return None
    except ModuleNotFoundError as exc:
        missing = (exc.name or '').split('.')[0]
        if missing and missing not in ('aitoolbox_like', 'aitoolbox'):
            extra = EXTRAS.get(missing)
            hint = f' (pip install aitoolbox_like[{extra}])' if extra else ''
            return (f'needs the optional dependency {missing!r}, not installed in this environment{hint}; '
                    f'install it to check this entry: {exc}')
        return f'ModuleNotFoundError: {exc}'
    except Exception as exc:        # noqa: BLE001 - any failure to import is the finding
        return f'{type(exc).__name__}: {exc}'


COLLECTED = collect()
SURFACE = _surface_with_snapshot(COLLECTED)


@pytest.fixture(autouse=True)
def _work_in_tmp_dir():
    """Overrides conftest's per-test temporary working folder: the import checks write nothing, and ~500 of
    those folders cost more than the checks themselves."""
    yield


@pytest.mark.parametrize('entry', sorted(SURFACE.sources))
def test_documented_name_imports(entry):
    error = check(entry)
    if error is not None:
        promised = '\n  '.join(SURFACE.sources[entry])
        pytest.fail(f'{entry} does not import: {error}\npromised by:\n  {promised}', pytrace=False)


def test_snapshot_lists_every_promise():
    # The snapshot is the memory: whatever is promised today must be in it, so that deleting the promise and
    # the code together still fails test_documented_name_imports.
    snapshot = read_snapshot()
    assert snapshot == sorted(set(snapshot)), f'{_relative(SNAPSHOT)} must be sorted, one entry per line'
    missing = sorted(set(COLLECTED.sources) - set(snapshot))
    assert not missing, (f'{len(missing)} documented names are not in {_relative(SNAPSHOT)}; if they are meant '
                         f'to be public, run `.venv/bin/python tests/project/test_public_surface.py --update`:\n  '
                         + '\n  '.join(missing))


def test_a_removed_name_fails(monkeypatch):
    # The check must see a name that is gone, not just a module that is gone.
    import aitoolbox_like.callbacks.basic as basic
    assert check('aitoolbox_like.callbacks.basic:EarlyStopping') is None
    monkeypatch.delattr(basic, 'EarlyStopping')
    assert 'EarlyStopping' in check('aitoolbox_like.callbacks.basic:EarlyStopping')
    assert check('aitoolbox_like.no_such_module').startswith('ModuleNotFoundError')


def test_a_missing_optional_extra_is_named(tmp_path, monkeypatch):
    # Not a skip: the entry fails and says which extra to install to check it.
    (tmp_path / 'needs_boto3.py').write_text('import boto3\nThing = 1\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, 'boto3', None)         # import boto3 now raises ModuleNotFoundError
    error = check('needs_boto3:Thing')
    assert "optional dependency 'boto3'" in error and 'aitoolbox_like[s3]' in error


def _main(argv: List[str]) -> int:
    if argv == ['--update']:
        snapshot = set(read_snapshot())
        added = sorted(set(collect().sources) - snapshot)
        SNAPSHOT.write_text(''.join(f'{entry}\n' for entry in sorted(snapshot | set(added))))
        print(f'{len(added)} entries added to {_relative(SNAPSHOT)}' + ''.join(f'\n  {e}' for e in added))
        return 0
    if argv:
        print(__doc__)
        return 2
    for entry, sources in sorted(_surface_with_snapshot(collect()).sources.items()):
        print(entry, ' '.join(sources))
    return 0


if __name__ == '__main__':
    sys.exit(_main(sys.argv[1:]))
