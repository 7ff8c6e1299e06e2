"""The package's house in figures: its rooms (top-level modules and folders of aitoolbox_like), their floors (import
layers), the imports that run back up (part of a circle between rooms), and the largest files.

    python tools/house.py [--root PATH] [--largest N]

A room is a top-level module (``train_loop``) or folder (``callbacks``) of the package. Room A imports room B when a
module of A imports a module of B, at module level or inside a function (it runs all the same), or under
``if TYPE_CHECKING:`` (it does not run, but A's code is written against B all the same: the picture would lie
without it); ``--run-time-only`` leaves those out. Rooms that import each other, directly or round a longer
circle, share a floor's worth of knots: each import between two rooms of one circle is an import that runs back up
(there is no order in which all of them point down). A floor is a room's height in the graph of the others: 0 for a
room that imports no other, else one more than the highest room it imports (a circle counts as one room).
"""
import argparse
import ast
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Set, Tuple

PACKAGE = 'aitoolbox_like'


def room_of(module: str) -> str:
    """``aitoolbox_like.callbacks.basic`` -> ``callbacks``; ``aitoolbox_like`` (the package itself) -> ``__init__``."""
    parts = module.split('.')
    return parts[1] if len(parts) > 1 else '__init__'


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix('').parts)
    if parts[-1] == '__init__':
        parts = parts[:-1]
    return '.'.join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == 'TYPE_CHECKING') or \
        (isinstance(test, ast.Attribute) and test.attr == 'TYPE_CHECKING')


def imported_modules(path: Path, module: str, is_package: bool, type_checking: bool = True) -> Set[str]:
    """The aitoolbox_like modules ``path`` imports, those under ``if TYPE_CHECKING:`` too unless ``type_checking``
    is False."""
    tree = ast.parse(path.read_text())
    base = module.split('.') if is_package else module.split('.')[:-1]
    found: Set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not type_checking:
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names if alias.name.split('.')[0] == PACKAGE)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    target = base[:len(base) - child.level + 1]
                    name = '.'.join(target + ([child.module] if child.module else []))
                else:
                    name = child.module or ''
                if name.split('.')[0] == PACKAGE:
                    found.add(name)
                    found.update(f'{name}.{alias.name}' for alias in child.names)
            visit(child)

    visit(tree)
    return found


def room_graph(root: Path, type_checking: bool = True) -> Dict[Tuple[str, str], List[str]]:
    """``{(room, imported room): [importing module, ...]}`` over the package at ``root`` (the folder holding
    aitoolbox_like/)."""
    package = root / PACKAGE
    modules = {module_name(p, root): p for p in package.rglob('*.py')}
    edges: Dict[Tuple[str, str], List[str]] = defaultdict(list)
    for module, path in sorted(modules.items()):
        for target in imported_modules(path, module, path.name == '__init__.py', type_checking):
            # 'from .x import name' names a module or an attribute: the longest known module prefix is the target.
            parts = target.split('.')
            while parts and '.'.join(parts) not in modules:
                parts.pop()
            if not parts:
                continue
            a, b = room_of(module), room_of('.'.join(parts))
            # The package's __init__ is its entrance (it re-exports), not a room.
            if a != b and '__init__' not in (a, b):
                edges[(a, b)].append(module)
    return edges


def strongly_connected(nodes: Set[str], edges: Set[Tuple[str, str]]) -> List[Set[str]]:
    """Tarjan's algorithm: the circles (components of more than one room) and the single rooms."""
    graph: Dict[str, List[str]] = defaultdict(list)
    for a, b in edges:
        graph[a].append(b)
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[Set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.add(top)
                if top == node:
                    break
            components.append(component)

    for node in sorted(nodes):
        if node not in index:
            connect(node)
    return components


def figures(root: Path, largest: int = 10, type_checking: bool = True) -> Dict[str, object]:
    edges = room_graph(root, type_checking)
    package = root / PACKAGE
    rooms = {p.stem if p.is_file() else p.name for p in package.iterdir()
             if (p.is_file() and p.suffix == '.py' and p.name != '__init__.py') or
             (p.is_dir() and (p / '__init__.py').exists())}
    pairs = set(edges)
    components = strongly_connected(rooms, pairs)
    component_of = {room: i for i, component in enumerate(components) for room in component}
    up = sorted((a, b) for a, b in pairs if component_of[a] == component_of[b])
    # Floors of the condensed graph (Tarjan gives components in reverse topological order: imported ones first).
    floor_of_component: Dict[int, int] = {}
    for i, component in enumerate(components):
        below = [floor_of_component[component_of[b]] for a, b in pairs
                 if a in component and component_of[b] != i]
        floor_of_component[i] = 1 + max(below) if below else 0
    floors = {room: floor_of_component[component_of[room]] for room in rooms}
    sizes = sorted(((len(p.read_text().splitlines()), str(p.relative_to(root))) for p in package.rglob('*.py')),
                   reverse=True)
    init_logic = sorted(str(p.relative_to(root)) for p in package.rglob('__init__.py') if _has_logic(p))
    return {'rooms': len(rooms), 'floors': max(floors.values()) + 1, 'circles': [sorted(c) for c in components
                                                                                 if len(c) > 1],
            'imports_up': [(a, b, sorted(set(edges[(a, b)]))) for a, b in up], 'floor_of': floors,
            'largest': sizes[:largest], 'init_with_logic': init_logic,
            'lines': sum(s for s, _ in sizes)}


def _has_logic(path: Path) -> bool:
    """An ``__init__.py`` with more than imports, ``__all__``, docstrings and constants: a def or class."""
    tree = ast.parse(path.read_text())
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and
               node.name not in ('__getattr__', '__dir__') for node in tree.body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--root', default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument('--largest', type=int, default=10)
    parser.add_argument('--run-time-only', action='store_true', help='leave out imports under TYPE_CHECKING')
    args = parser.parse_args()
    result = figures(Path(args.root), args.largest, type_checking=not args.run_time_only)
    print(f"{result['rooms']} rooms on {result['floors']} floors; {len(result['imports_up'])} imports run back up "
          f"(room pairs in a circle); {result['lines']} lines")
    for circle in result['circles']:
        print('circle: ' + ' <-> '.join(circle))
    for a, b, modules in result['imports_up']:
        print(f'  up: {a} -> {b}   ({", ".join(modules)})')
    by_floor: Dict[int, List[str]] = defaultdict(list)
    for room, floor in result['floor_of'].items():
        by_floor[floor].append(room)
    for floor in sorted(by_floor, reverse=True):
        print(f'floor {floor}: {", ".join(sorted(by_floor[floor]))}')
    print('largest files: ' + ', '.join(f'{path} {size}' for size, path in result['largest']))
    print(f"__init__.py with logic: {', '.join(result['init_with_logic']) or 'none'}")


if __name__ == '__main__':
    main()
