"""The layering rules of docs/architecture.md, checked on the source: no import cycle (imports inside functions
included), the core never imports a callback module except the callback framework and the one module that adds
default callbacks, no module reaches into another module's _private names, no two rooms of the house import each
other, no module grows past 600 lines, and no package's __init__.py holds logic (tools/house.py measures)."""
import ast
import os
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / 'aitoolbox_like'
# Modules above the callback libraries: the loops with callbacks pre-registered (tracking.py, and train_loop.py
# which offers them beside TrainLoop), AIToolbox's predictor, the recipes (which build callbacks by name), the search
# over recipes (which adds its trials' callbacks), and the AIToolbox alias layer (matched by prefix below).
ABOVE_CALLBACKS = {'aitoolbox_like.tracking', 'aitoolbox_like.train_loop', 'aitoolbox_like.model_predict',
                   'aitoolbox_like.__main__'}
ABOVE_CALLBACKS_PACKAGES = ('aitoolbox_like.recipes', 'aitoolbox_like.tuning', 'aitoolbox_like.integrations')
# Third-party private attributes we cannot avoid, each explained where it is used.
ALLOWED_THIRD_PARTY_PRIVATES = {
    ('aitoolbox_like.distributed', '_num_samples'),
    ('aitoolbox_like.callbacks.tensorboard_base', '_get_file_writer'),
    ('aitoolbox_like.storage.s3', '_request_signer'),
    ('aitoolbox_like.storage.s3', '_credentials'),
    # os._exit is public (the documented way to end a process without interpreter clean-up).
    ('aitoolbox_like.ddp_launch', '_exit'),
    ('aitoolbox_like.slurm', '_exit'),
}


def _modules():
    found = {}
    for path in PACKAGE.rglob('*.py'):
        if '_shim' in path.parts:
            continue
        name = '.'.join(path.relative_to(PACKAGE.parent).with_suffix('').parts)
        found[name[:-len('.__init__')] if name.endswith('.__init__') else name] = path
    return found


MODULES = _modules()


def _is_type_checking_block(node):
    return isinstance(node, ast.If) and 'TYPE_CHECKING' in ast.unparse(node.test)


def _is_lazy_reexport(node, parent):
    """A module-level ``__getattr__`` (PEP 562) re-exports names for the module's callers (e.g. the tracking loops
    at aitoolbox_like.train_loop, their documented path): its imports run only when a caller asks for such a name,
    after the module is loaded, so they are not dependencies of the module's own code."""
    return isinstance(parent, ast.Module) and isinstance(node, ast.FunctionDef) and node.name == '__getattr__'


def _walk_runtime(tree):
    """Every node that can execute at run time as part of the module's own code (``if TYPE_CHECKING:`` blocks are
    for the type checker only; lazy re-exports serve callers)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node)
                     if not _is_type_checking_block(child) and not _is_lazy_reexport(child, node))


def _imports(module, tree):
    package = module if MODULES[module].name == '__init__.py' else module.rsplit('.', 1)[0]
    for node in _walk_runtime(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split('.')[:len(package.split('.')) - node.level + 1] if node.level else []
            target = '.'.join(base + ([node.module] if node.module else [])) if node.level else node.module
            submodules = [f'{target}.{alias.name}' for alias in node.names if f'{target}.{alias.name}' in MODULES]
            # `from . import x` imports the submodule x; only a name import depends on the package's own code.
            targets = submodules if len(submodules) == len(node.names) else [target] + submodules
        else:
            continue
        for target in targets:
            while target not in MODULES and '.' in target:
                target = target.rsplit('.', 1)[0]
            if target in MODULES and target != module:
                yield target


def _graph():
    return {module: set(_imports(module, ast.parse(path.read_text()))) for module, path in MODULES.items()}


def test_no_import_cycle():
    graph = _graph()
    cycles = []
    state = {}

    def visit(module, trail):
        state[module] = 'open'
        for target in sorted(graph[module]):
            if state.get(target) == 'open':
                cycles.append(trail[trail.index(target):] + [target])
            elif target not in state:
                visit(target, trail + [target])
        state[module] = 'done'

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_core_does_not_import_callback_libraries():
    offenders = []
    for module, targets in _graph().items():
        if module.startswith('aitoolbox_like.callbacks') or module.startswith('aitoolbox_like.compat') \
                or module in ABOVE_CALLBACKS or module.startswith(ABOVE_CALLBACKS_PACKAGES):
            continue
        for target in targets:
            if target == 'aitoolbox_like.callbacks' or target.startswith('aitoolbox_like.callbacks.'):
                offenders.append((module, target))
    assert offenders == []


def test_no_access_to_another_module_s_private_names():
    offenders = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        own = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id in ('self', 'cls'):
                own.add(node.attr)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name)
                                                          and node.value.id in ('self', 'cls')):
                names = [] if node.attr in own else [node.attr]
            else:
                continue
            for name in names:
                if name.startswith('_') and not name.startswith('__') \
                        and (module, name) not in ALLOWED_THIRD_PARTY_PRIVATES:
                    offenders.append((module, node.lineno, name))
    assert offenders == []


# The cloud backends: only aitoolbox_like.storage picks one (storage.urls, by URL or cloud_save_mode); every other
# module asks it for a storage, so adding a cloud changes no module outside storage/.
STORAGE_BACKENDS = {'aitoolbox_like.storage.s3', 'aitoolbox_like.storage.gcs', 'aitoolbox_like.storage.azure'}


def test_no_module_outside_storage_imports_a_backend():
    offenders = []
    for module, path in MODULES.items():
        if module == 'aitoolbox_like.storage' or module.startswith('aitoolbox_like.storage.'):
            continue
        tree = ast.parse(path.read_text())
        package = module if path.name == '__init__.py' else module.rsplit('.', 1)[0]
        for node in ast.walk(tree):     # type-checking imports included: naming a backend's type names it too
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split('.')[:len(package.split('.')) - node.level + 1] if node.level else []
                target = '.'.join(base + ([node.module] if node.module else [])) if node.level else node.module
                targets = [target] + [f'{target}.{alias.name}' for alias in node.names]
            else:
                continue
            offenders += [(module, node.lineno, t) for t in targets if t in STORAGE_BACKENDS]
    assert offenders == []


# ---------------------------------------------------------------------------------------------- the house


def _house():
    import importlib.util
    spec = importlib.util.spec_from_file_location('house', PACKAGE.parent / 'tools' / 'house.py')
    house = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(house)
    return house.figures(PACKAGE.parent)


def test_no_room_of_the_package_imports_one_that_imports_it_back():
    # Rooms are the package's top-level modules and folders (tools/house.py): imports between them only point down.
    figures = _house()
    assert figures['circles'] == [] and figures['imports_up'] == [], figures['imports_up']


def test_package_entrances_hold_no_logic():
    figures = _house()
    assert figures['init_with_logic'] == []     # an __init__.py only imports and re-exports
