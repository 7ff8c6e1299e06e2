"""The module -> tests map: for each module of aitoolbox_like, the test files that use it, so that a contributor who
changes a module finds the tests to run (``make test-area AREA="<the files>"``).

    .venv/bin/python tools/test_map.py            # prints the map made from the tests today
    .venv/bin/python tools/test_map.py --update   # writes it to tests/test_map.txt

A test file uses a module when it imports it or a name it defines (``from aitoolbox_like import TrainLoop`` counts
for ``engine/train_loop.py``, where TrainLoop is defined; AIToolbox's paths count for the module that serves them),
or names it by its dotted path in a string (``monkeypatch.setattr('aitoolbox_like.x.y', ...)``, ``python -m
aitoolbox_like.x``). Helper scripts a test runs (tests/**/ddp_scripts, tests/compat/scripts, ...) count as test files
of their own. tests/project/test_test_map.py checks that the checked-in map is the one the tests make today and that
every module of more than ``MIN_LINES`` lines has a test file (``THROUGH`` names, for the modules a user only
reaches through the loop, the tests that exercise them).
"""
import argparse
import ast
import importlib
import re
import sys
import types
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'aitoolbox_like'
TESTS = ROOT / 'tests'
MAP_FILE = TESTS / 'test_map.txt'
#: A module of more lines than this needs at least one test file that uses it.
MIN_LINES = 100
# A dotted path in a string: aitoolbox_like.x.y (a module, or a module and a name).
_DOTTED = re.compile(r'(?<![\w.])aitoolbox_like(?:\.[A-Za-z_]\w*)+')

# Modules no test imports, as the user reaches them only through the loop or a public class: the test files that
# exercise them, each with a word that file must contain (so the entry cannot outlive the tests it names).
THROUGH: Dict[str, Tuple[str, List[str]]] = {
    'aitoolbox_like/adapters/orca/builtin_callbacks.py': ('MaxstepsCallback', ['tests/adapters/test_orca.py']),
    'aitoolbox_like/callbacks/_common.py': ('EarlyStopping', ['tests/callbacks/test_basic.py']),
    'aitoolbox_like/callbacks/_mlflow_sender.py': ('MLflow', ['tests/callbacks/test_mlflow.py']),
    'aitoolbox_like/checkpoint/sharded/writing.py': ('fsdp', ['tests/distributed/test_fsdp_checkpoints.py']),
    'aitoolbox_like/engine/evaluation.py': ('one_pass', ['tests/engine/test_evaluation.py']),
    'aitoolbox_like/engine/loop_state/build.py': ('resume_from', ['tests/saving/test_resume.py']),
    'aitoolbox_like/engine/loop_state/locate.py': ('resume_from', ['tests/saving/test_resume.py']),
    'aitoolbox_like/engine/loop_state/restore.py': ('resume_from', ['tests/saving/test_resume.py']),
    'aitoolbox_like/engine/loop_state/resume.py': ('resume_from', ['tests/saving/test_resume.py']),
    'aitoolbox_like/experiment/run_folder.py': ('claim', ['tests/saving/test_cloud_experiment.py']),
    'aitoolbox_like/recipes/plan.py': ('build', ['tests/recipes/test_recipe.py']),
    'aitoolbox_like/results/conversion.py': ('numpy', ['tests/results/test_result_package.py']),
    'aitoolbox_like/runtime/_torchvision_compat.py': ('torchvision', ['tests/project/test_install.py']),
    'aitoolbox_like/tuning/results.py': ('results', ['tests/tuning/test_tune.py']),
}

HEADER = """\
# Module -> the test files that use it (tools/test_map.py writes this file; tests/project/test_test_map.py checks it).
# Run a module's tests: make test-area AREA="<the files after the colon>".
"""


def package_modules() -> Dict[str, Path]:
    """``{dotted module: file}`` of the package, AIToolbox's vendored shims (compat/_shim) left out."""
    found = {}
    for path in sorted(PACKAGE.rglob('*.py')):
        if '_shim' in path.parts or '__pycache__' in path.parts:
            continue
        parts = list(path.relative_to(ROOT).with_suffix('').parts)
        if parts[-1] == '__init__':
            parts = parts[:-1]
        found['.'.join(parts)] = path
    return found


def _defining_module(dotted: str, modules: Dict[str, Path]) -> Optional[str]:
    """The package module that ``dotted`` (a module, or a module then names) stands for, resolved by import so that
    re-exports and AIToolbox's paths count for the module that defines the name."""
    parts = dotted.split('.')
    if dotted in _RESOLVED:
        return _RESOLVED[dotted]
    _RESOLVED[dotted] = _resolve(parts, modules)
    return _RESOLVED[dotted]


_RESOLVED: Dict[str, Optional[str]] = {}


def _resolve(parts: List[str], modules: Dict[str, Path]) -> Optional[str]:
    for cut in range(len(parts), 0, -1):
        try:
            module = obj = importlib.import_module('.'.join(parts[:cut]))
        except Exception:       # not a module, or an optional extra missing: try a shorter prefix
            continue
        for name in parts[cut:]:
            child = getattr(obj, name, None)
            if child is None:
                break
            obj = child
        if isinstance(obj, types.ModuleType):
            name = obj.__name__
        else:
            name = getattr(obj, '__module__', None) or ''
        if name in modules:
            return name
        return module.__name__ if module.__name__ in modules else None
    return None


def modules_used(path: Path, modules: Dict[str, Path]) -> Set[str]:
    """The package modules one test file uses."""
    source = path.read_text()
    dotted: Set[str] = set(_DOTTED.findall(source))
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = ast.Module(body=[], type_ignores=[])
    bound: Dict[str, str] = {}         # a local name -> the dotted path it was imported as
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split('.')[0] == 'aitoolbox_like':
                    dotted.add(alias.name)
                    if alias.asname:
                        bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module \
                and node.module.split('.')[0] == 'aitoolbox_like':
            dotted.add(node.module)
            for alias in node.names:
                if alias.name != '*':
                    dotted.add(f'{node.module}.{alias.name}')
                    bound[alias.asname or alias.name] = f'{node.module}.{alias.name}'
    # module.name where module is an imported module of ours (sharded_checkpoint.full_state counts for the file
    # that defines full_state).
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            dotted.add(f'{bound[node.value.id]}.{node.attr}')
    used = {_defining_module(name, modules) for name in dotted}
    return {module for module in used if module}


def test_files() -> List[Path]:
    return sorted(path for path in TESTS.rglob('*.py') if '__pycache__' not in path.parts
                  and path.name != '__init__.py' and 'gpu' not in path.relative_to(TESTS).parts[:1])


def build_map() -> Dict[str, List[str]]:
    """``{module file (relative): [test file (relative), ...]}`` for every module of the package."""
    sys.path.insert(0, str(ROOT))
    modules = package_modules()
    users: Dict[str, Set[str]] = defaultdict(set)
    for path in test_files():
        for module in modules_used(path, modules):
            users[module].add(str(path.relative_to(ROOT)))
    mapping = {str(modules[module].relative_to(ROOT)): sorted(users[module]) for module in sorted(modules)}
    for module, (_, tests) in THROUGH.items():
        mapping[module] = sorted(set(mapping.get(module, [])) | set(tests))
    return mapping


def render(mapping: Dict[str, List[str]]) -> str:
    return HEADER + ''.join(f"{module}: {' '.join(tests)}\n" for module, tests in sorted(mapping.items()))


def untested(mapping: Dict[str, List[str]]) -> List[str]:
    """Modules of more than MIN_LINES lines that no test file uses."""
    return [module for module, tests in sorted(mapping.items())
            if not tests and len((ROOT / module).read_text().splitlines()) > MIN_LINES]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--update', action='store_true', help=f'write the map to {MAP_FILE.relative_to(ROOT)}')
    args = parser.parse_args()
    text = render(build_map())
    if args.update:
        MAP_FILE.write_text(text)
    else:
        sys.stdout.write(text)
    missing = untested(build_map())
    if missing:
        print(f'{len(missing)} modules of more than {MIN_LINES} lines have no test file: {", ".join(missing)}',
              file=sys.stderr)


if __name__ == '__main__':
    main()
