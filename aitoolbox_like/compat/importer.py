"""The import hook that serves AIToolbox's module paths from the alias table (:mod:`.aliases`): a finder on
``sys.meta_path`` for ``aitoolbox_like.<AIToolbox path>`` (always) and ``aitoolbox.<path>`` (once :func:`install`
ran), the modules made of AIToolbox's names, and the AIToolbox names our own modules offer where an AIToolbox
package stood (``aitoolbox_like`` and ``aitoolbox_like.experiment``). The finder is registered, and those names
added, when this module is imported (:mod:`aitoolbox_like.compat` imports it, and ``import aitoolbox_like`` that).
"""
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any, Dict, List, Optional, Sequence

from .aliases import EXTENDED_OWN_MODULES, MODULES, Target, Unsupported

AITOOLBOX = 'aitoolbox'
OWN = 'aitoolbox_like'
# The unsupported stand-in classes are documented as aitoolbox_like.compat's, where they were made before this module.
_PUBLIC_MODULE = 'aitoolbox_like.compat'
# Holds a stand-in ``aitoolbox`` package: spawned processes (DDP, DataLoader workers) re-import the user's
# script before any of our code runs, and find it through the sys.path they inherit.
_SHIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), '_shim')


class AIToolboxShadowingError(RuntimeError):
    """A real ``aitoolbox`` package is installed; aliasing it would hide it."""


def _is_package(key: str) -> bool:
    prefix = f'{key}.' if key else ''
    return any(k.startswith(prefix) and k != key for k in MODULES)


def _resolve(name: str, target: Target, alias: str) -> Any:
    if isinstance(target, Unsupported):
        return _unsupported(name, target.reason, alias)
    return getattr(importlib.import_module(target), name)


_UNSUPPORTED_CLASSES: Dict[str, type] = {}


def _unsupported(name: str, reason: str, alias: str) -> type:
    """A class standing for an AIToolbox name we do not implement: it imports (and can be subclassed), and
    using it raises. One class per name, whichever path (aitoolbox.X or aitoolbox_like.X) reached it."""
    if name not in _UNSUPPORTED_CLASSES:
        def refuse(*args: Any, **kwargs: Any) -> None:
            raise NotImplementedError(f'{name}: {reason}')
        _UNSUPPORTED_CLASSES[name] = type(name, (), {'__init__': refuse, '__doc__': f'Not supported: {reason}',
                                                     '__module__': _PUBLIC_MODULE})
    return _UNSUPPORTED_CLASSES[name]


class _NamesModule(types.ModuleType):
    """An AIToolbox module made of names that live in our modules; each is imported on first use."""

    def __init__(self, name: str, names: Dict[str, Target]) -> None:
        super().__init__(name, f'AIToolbox module {name!r}, provided by aitoolbox_like (see aitoolbox_like.compat)')
        self.__names = names
        self.__all__ = sorted(names)

    def __getattr__(self, attr: str) -> Any:
        try:
            target = self.__names[attr]
        except KeyError:
            raise AttributeError(f'module {self.__name__!r} has no attribute {attr!r}') from None
        value = _resolve(attr, target, self.__name__)
        setattr(self, attr, value)
        return value

    def __dir__(self) -> List[str]:
        return sorted(set(super().__dir__()) | set(self.__names))


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, key: str) -> None:
        self.key = key
        self._own_spec: Optional[importlib.machinery.ModuleSpec] = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        target = MODULES[self.key]
        if isinstance(target, str):
            module = importlib.import_module(target)
            self._own_spec = module.__spec__
            return module
        return _NamesModule(spec.name, target)

    def exec_module(self, module: types.ModuleType) -> None:
        # The import system stamps the alias spec on the module it is handed; our own module keeps its own.
        if self._own_spec is not None:
            module.__spec__ = self._own_spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds AIToolbox module paths under the given roots ('aitoolbox', 'aitoolbox_like')."""

    def __init__(self) -> None:
        self.roots = {OWN}

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[types.ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        root, _, key = fullname.partition('.')
        if root not in self.roots or key not in MODULES:
            return None
        if root == OWN and (key in EXTENDED_OWN_MODULES or key == ''):
            return None      # our own module; it offers AIToolbox's extra names too (_offer_extra_names)
        if root == OWN and MODULES[key] == fullname:
            return None      # our own module stands at AIToolbox's path (aitoolbox_like.nlp): the normal import
        return importlib.util.spec_from_loader(fullname, _AliasLoader(key), is_package=_is_package(key))


_FINDER = _AliasFinder()


def _register_finder() -> None:
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def extra_attribute(own_module: str, name: str) -> Any:
    """For our modules that stand where an AIToolbox package was (``aitoolbox_like`` and
    ``aitoolbox_like.experiment``): the AIToolbox name ``name`` they also offer, imported on first use."""
    key = next(k for k, v in EXTENDED_OWN_MODULES.items() if v == own_module)
    names = MODULES[key]
    assert isinstance(names, dict)
    if name not in names:
        raise AttributeError(f'module {own_module!r} has no attribute {name!r}')
    return _resolve(name, names[name], own_module)


def extra_names(own_module: str) -> List[str]:
    key = next(k for k, v in EXTENDED_OWN_MODULES.items() if v == own_module)
    names = MODULES[key]
    return sorted(names) if isinstance(names, dict) else []


def _real_aitoolbox_location() -> Optional[str]:
    """Where an installed AIToolbox lives, if any (our stand-in does not count)."""
    search_path = [p for p in sys.path if os.path.abspath(p or '.') != _SHIM_DIR]
    spec = importlib.machinery.PathFinder.find_spec(AITOOLBOX, search_path)
    if spec is None:
        return None
    return spec.origin or ', '.join(spec.submodule_search_locations or [])


def alias_module(fullname: str) -> types.ModuleType:
    """The module an AIToolbox path resolves to, built without the import system (for the stand-in package)."""
    root, _, key = fullname.partition('.')
    spec = importlib.util.spec_from_loader(fullname, _AliasLoader(key), is_package=_is_package(key))
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)      # type: ignore[union-attr]
    return module


def install(force: bool = False) -> None:
    """Make ``import aitoolbox...`` resolve to aitoolbox_like in this process and in processes it spawns.

    Args:
        force: alias ``aitoolbox`` even when a real AIToolbox is installed (which it then hides).

    Raises:
        AIToolboxShadowingError: a real ``aitoolbox`` is installed and ``force`` is False.
    """
    if AITOOLBOX in _FINDER.roots:
        return
    real = None if force else _real_aitoolbox_location()
    if real is not None:
        raise AIToolboxShadowingError(
            f'a real AIToolbox is installed ({real}); aitoolbox_like.compat will not hide it. Uninstall it '
            f'(pip uninstall aitoolbox), or pass force=True (python -m aitoolbox_like.compat --force script.py) '
            f'to run the script on aitoolbox_like anyway.')
    loaded = [name for name in sys.modules if name == AITOOLBOX or name.startswith(AITOOLBOX + '.')]
    if loaded and not force:
        raise AIToolboxShadowingError(f'{loaded[0]!r} is already imported in this process; install() must run '
                                      f'before the first "import aitoolbox"')
    _FINDER.roots.add(AITOOLBOX)
    _register_finder()
    if _SHIM_DIR not in sys.path:
        sys.path.append(_SHIM_DIR)


def uninstall() -> None:
    """Undo :func:`install`: ``aitoolbox`` no longer resolves to aitoolbox_like (modules already imported
    under that name are forgotten)."""
    _FINDER.roots.discard(AITOOLBOX)
    while _SHIM_DIR in sys.path:
        sys.path.remove(_SHIM_DIR)
    for name in [n for n in sys.modules if n == AITOOLBOX or n.startswith(AITOOLBOX + '.')]:
        del sys.modules[name]


def is_installed() -> bool:
    """True when ``import aitoolbox`` resolves to aitoolbox_like in this process."""
    return AITOOLBOX in _FINDER.roots


def _offer_extra_names(own_module: str) -> None:
    """Make our module ``own_module``, which stands where an AIToolbox package stood, offer the names that package
    also exported (AIToolbox's ``aitoolbox.experiment`` exported a few result packages), each imported on first use
    (a module ``__getattr__``, PEP 562). Done here, not in that module: only compat knows AIToolbox's layout."""
    module = importlib.import_module(own_module)

    def offer(name: str) -> Any:
        value = extra_attribute(own_module, name)
        setattr(module, name, value)
        return value

    setattr(module, '__getattr__', offer)


def _extend_own_modules() -> None:
    for own_module in EXTENDED_OWN_MODULES.values():
        # The package itself (AIToolbox's top level) offers them in its own __init__: it is being imported now.
        if own_module != OWN:
            _offer_extra_names(own_module)


_register_finder()
_extend_own_modules()
