"""The layering rules of docs/architecture.md, checked on the source: no import cycle between modules at run time
(imports inside functions included), imports between the package's rooms point down (type-only ones included, so the
picture of the house tells the truth), the engine lies below the callback library and names it only by the paths it
imports at use (a fit's default callbacks, the adapters of other libraries' callbacks), importing TrainLoop loads no callback library, no module reaches into
another module's _private names, only storage/ names a cloud backend, and no package's __init__.py holds logic
(tools/house.py measures the rooms)."""
import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / 'aitoolbox_like'
# Third-party private attributes we cannot avoid, each explained where it is used.
ALLOWED_THIRD_PARTY_PRIVATES = {
    ('aitoolbox_like.distributed.data', '_num_samples'),
    ('aitoolbox_like.callbacks.tensorboard', '_get_file_writer'),
    ('aitoolbox_like.storage.s3', '_request_signer'),
    ('aitoolbox_like.storage.s3', '_credentials'),
    # pytorch-accelerated's RunHistory moves its epoch only by these two, which its own Trainer calls.
    ('aitoolbox_like.adapters.pytorch_accelerated', '_set_epoch'),
    ('aitoolbox_like.adapters.pytorch_accelerated', '_increment_epoch'),
    # os._exit is public (the documented way to end a process without interpreter clean-up).
    ('aitoolbox_like.engine.launch', '_exit'),
    ('aitoolbox_like.distributed.slurm', '_exit'),
    ('aitoolbox_like.callbacks.health', '_exit'),
    # sys._current_frames() is documented (the sys module's docs) as the way to read another thread's stack.
    ('aitoolbox_like.callbacks.health', '_current_frames'),
    # torch's batched copy, which torch.optim's own foreach implementations use; torch has no public one.
    ('aitoolbox_like.checkpoint.files', '_foreach_copy_'),
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


def _walk(tree, type_checking):
    """Every node of the module; the ``if TYPE_CHECKING:`` blocks (for the type checker only) when asked."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node)
                     if type_checking or not _is_type_checking_block(child))


def _imports(module, tree, type_checking=False):
    package = module if MODULES[module].name == '__init__.py' else module.rsplit('.', 1)[0]
    for node in _walk(tree, type_checking):
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


def _graph(type_checking=False):
    return {module: set(_imports(module, ast.parse(path.read_text()), type_checking))
            for module, path in MODULES.items()}


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


def _house():
    spec = importlib.util.spec_from_file_location('house', PACKAGE.parent / 'tools' / 'house.py')
    house = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(house)
    return house.figures(PACKAGE.parent)


def test_rooms_import_only_rooms_below_them_type_only_imports_included():
    # Rooms are the package's top-level modules and folders (tools/house.py).
    figures = _house()
    assert figures['circles'] == [] and figures['imports_up'] == [], figures['imports_up']


def test_the_engine_lies_below_the_callback_library_and_names_it_only_by_the_paths_it_imports_at_use():
    figures = _house()
    assert figures['floor_of']['engine'] < figures['floor_of']['callbacks']
    offenders = [(module, target) for module, targets in _graph(type_checking=True).items()
                 if module.startswith('aitoolbox_like.engine') for target in targets
                 if target.split('.')[:2] in (['aitoolbox_like', 'callbacks'], ['aitoolbox_like', 'adapters'])]
    assert offenders == []
    # The library's names in the engine: the function a fit adds its default callbacks with, and the adapters of
    # other libraries' callbacks (adapters/, above the callbacks); each names a function that exists.
    from aitoolbox_like.callbacks.defaults import add_default_callbacks
    from aitoolbox_like.adapters.pytorch_accelerated import adopt_callbacks
    from aitoolbox_like.engine import handler, train_loop
    named = [(module, node.value) for module, path in MODULES.items() if module.startswith('aitoolbox_like.engine')
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Constant)
             and isinstance(node.value, str) and node.value.startswith(('aitoolbox_like.callbacks',
                                                                         'aitoolbox_like.adapters'))]
    assert sorted(named) == sorted([('aitoolbox_like.engine.handler', path)
                                    for path in handler.FOREIGN_CALLBACK_ADAPTERS.values()]
                                   + [('aitoolbox_like.engine.train_loop', train_loop.DEFAULT_CALLBACKS)])
    assert handler.import_object(train_loop.DEFAULT_CALLBACKS) is add_default_callbacks
    assert handler.import_object(handler.FOREIGN_CALLBACK_ADAPTERS['pytorch_accelerated']) is adopt_callbacks
    assert all(callable(handler.import_object(path)) for path in handler.FOREIGN_CALLBACK_ADAPTERS.values())


def test_importing_the_loop_loads_the_engine_and_no_callback_library():
    code = ('import sys; from aitoolbox_like import TrainLoop; '
            'print(" ".join(sorted(m for m in sys.modules if m.startswith("aitoolbox_like"))))')
    loaded = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout.split()
    assert 'aitoolbox_like.engine.train_loop' in loaded
    above = ('aitoolbox_like.callbacks', 'aitoolbox_like.tracking', 'aitoolbox_like.recipes', 'aitoolbox_like.tuning',
             'aitoolbox_like.adapters', 'aitoolbox_like.model_predict', 'aitoolbox_like.engine.launch')
    assert [m for m in loaded if m.startswith(above)] == []


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


def test_package_entrances_hold_no_logic():
    assert _house()['init_with_logic'] == []     # an __init__.py only imports and re-exports


# Modules (not packages) that may only re-export: the design's documented entrance, TrainLoop and the tracking loops
# together (AIToolbox's train_loop package offers them so).
REEXPORT_ENTRANCES = {'aitoolbox_like.train_loop'}


def _defines_something(tree):
    """A def, a class, or an assignment other than ``__all__`` at module level."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(not (isinstance(t, ast.Name) and t.id == '__all__') for t in targets):
                return True
    return False


def test_no_module_only_re_exports_outside_compat():
    """A module whose code is all imports is a second path to names defined elsewhere: one path per name (compat/
    serves AIToolbox's, and packages' __init__.py offer their room's names)."""
    offenders = [module for module, path in sorted(MODULES.items())
                 if path.name != '__init__.py' and not module.startswith('aitoolbox_like.compat')
                 and module not in REEXPORT_ENTRANCES and module != 'aitoolbox_like.__main__'
                 and not _defines_something(ast.parse(path.read_text()))]
    assert offenders == []
