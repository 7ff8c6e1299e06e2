"""Registries: what a recipe names, by kind (callback, model, data, optimizer, scheduler, criterion,
result_package, loop).

A recipe says ``{name: EarlyStopping, patience: 3}``; ``EarlyStopping`` is looked up in the registry of the
section's kind. Built-in names need no registration (they are collected the first time a registry is asked):

- ``callback``: every public callback class of ``aitoolbox_like.callbacks.*`` and ``aitoolbox_like.adapters.*``;
- ``optimizer``: every ``torch.optim.Optimizer`` subclass in ``torch.optim``;
- ``scheduler``: every LR scheduler of ``torch.optim.lr_scheduler`` (a recipe drives it through
  :class:`~aitoolbox_like.callbacks.train_schedule.LRSchedulerCallback`) and our scheduler callbacks;
- ``criterion``: every loss of ``torch.nn`` (the classes whose names end in ``Loss``);
- ``result_package``: the result packages of ``aitoolbox_like.results``;
- ``loop``: ``TrainLoop`` and the tracking loops;
- ``model``, ``data``: none; register yours.

Your own classes and functions either get a name with a decorator::

    @register_model
    class DigitsCNN(TTModel): ...

    @register_data(name='digits')
    def digits_loaders(batch_size=64): ...

or are named in a recipe by their import path, ``package.module:Name``, with no registration at all.
"""
import difflib
import importlib
import inspect
import logging
import pkgutil
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

logger = logging.getLogger(__name__)

#: Every registry kind, with what its entries are.
KINDS: Dict[str, str] = {
    'callback': 'callback classes (AbstractCallback subclasses)',
    'model': 'models: TTModel / nn.Module classes or functions returning one',
    'data': 'data: functions (or classes) returning the (train, validation, test) loaders',
    'optimizer': 'optimizer classes, built over the model parameters',
    'scheduler': 'learning-rate schedules: torch schedulers (driven by LRSchedulerCallback) and scheduler callbacks',
    'criterion': 'loss functions (criteria) passed to the model\'s get_loss',
    'result_package': 'result packages (AbstractResultPackage subclasses)',
    'loop': 'TrainLoop classes',
}

#: Parameters a recipe fills itself, per kind: the first parameter of an optimizer (the model parameters) and of
#: a torch scheduler (the optimizer), and a loop's model, loaders, optimizer and criterion.
#: torch.optim.lr_scheduler classes that are not registered: the base class, and those built from other schedulers.
TORCH_SCHEDULERS_LEFT_OUT = ('LRScheduler', 'ChainedScheduler', 'SequentialLR')
LOOP_FILLED = ('model', 'train_loader', 'validation_loader', 'test_loader', 'optimizer', 'criterion')


class UnknownNameError(LookupError):
    """A name that no registry holds (or an import path that does not import); the message lists the close
    matches."""

    def __init__(self, message: str, kind: Optional[str] = None, name: Optional[str] = None,
                 close_matches: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.kind = kind
        self.name = name
        self.close_matches = list(close_matches)


def _same_definition(a: Any, b: Any) -> bool:
    """The same class or function defined again (its module executed a second time, e.g. a file loaded twice by
    path): same module and qualified name."""
    return (getattr(a, '__module__', None), getattr(a, '__qualname__', None)) == \
        (getattr(b, '__module__', None), getattr(b, '__qualname__', None))


class Registry:
    """Names of one kind -> the class or function they build.

    Args:
        kind: one of :data:`KINDS`.
        builtins: fills the registry with the built-in names; run the first time the registry is used.
    """

    def __init__(self, kind: str, builtins: Optional[Callable[['Registry'], None]] = None) -> None:
        self.kind = kind
        self._entries: Dict[str, Any] = {}
        self._builtins = builtins
        self._builtin_names: List[str] = []
        self._lock = threading.RLock()

    def _ensure_builtins(self) -> None:
        with self._lock:
            if self._builtins is not None:
                load, self._builtins = self._builtins, None
                load(self)
                self._builtin_names = list(self._entries)

    def register(self, target: Any, name: Optional[str] = None) -> Any:
        """Put ``target`` (a class or function) under ``name`` (default: its ``__name__``); returns ``target``.

        Registering a name again with another object is an error, unless it is the same definition executed again
        (same module and qualified name): the newer one then replaces it.
        """
        if not callable(target):
            raise TypeError(f'register_{self.kind}: expected a class or function, got {type(target).__qualname__}')
        name = name if name is not None else getattr(target, '__name__', None)
        if not isinstance(name, str) or not name or ':' in name:
            raise ValueError(f'register_{self.kind}: give a name (a non-empty string without ":"), got {name!r}')
        self._ensure_builtins()     # a name taken by a built-in is refused now, not at the first lookup
        with self._lock:
            old = self._entries.get(name)
            if old is not None and old is not target and not _same_definition(old, target):
                raise ValueError(f'register_{self.kind}: the name {name!r} is taken by {_qualified(old)}; register '
                                 f'{_qualified(target)} under another name (name=...)')
            self._entries[name] = target
        return target

    def get(self, name: str) -> Any:
        """The class or function registered as ``name``, or the one the import path ``package.module:Name`` names.

        Raises:
            UnknownNameError: the name is not registered (the message lists close matches), or the import path
                does not import.
        """
        if ':' in name:
            return import_path(name)
        self._ensure_builtins()
        with self._lock:
            if name in self._entries:
                return self._entries[name]
            close = difflib.get_close_matches(name, list(self._entries), n=3, cutoff=0.75)
            if not close:
                lowered = name.lower()
                close = [n for n in self._entries if lowered in n.lower()][:5]
        hint = f'; did you mean {", ".join(close)}?' if close else \
            f'; see `aitoolbox-like list {self.kind}` for the registered names'
        raise UnknownNameError(f'unknown {self.kind} {name!r}{hint} (or give an import path package.module:Name)',
                               self.kind, name, close)

    def __contains__(self, name: object) -> bool:
        self._ensure_builtins()
        return name in self._entries

    def names(self) -> List[str]:
        """Every registered name, sorted."""
        self._ensure_builtins()
        with self._lock:
            return sorted(self._entries)

    def builtin_names(self) -> List[str]:
        """The names that need no registration, sorted."""
        self._ensure_builtins()
        return sorted(self._builtin_names)

    def items(self) -> Iterator[Tuple[str, Any]]:
        """``(name, target)`` pairs, sorted by name."""
        self._ensure_builtins()
        with self._lock:
            entries = dict(self._entries)
        return iter(sorted(entries.items()))


def _qualified(target: Any) -> str:
    return f'{getattr(target, "__module__", "?")}.{getattr(target, "__qualname__", repr(target))}'


def import_path(path: str) -> Any:
    """The object an import path ``package.module:Name`` (or ``package.module:Outer.Inner``) names.

    Raises:
        UnknownNameError: the module does not import or has no such attribute.
    """
    module_name, _, attribute = path.partition(':')
    if not module_name or not attribute:
        raise UnknownNameError(f'{path!r} is not an import path; write package.module:Name', name=path)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise UnknownNameError(f'{path!r}: cannot import {module_name!r} ({type(error).__name__}: {error})',
                               name=path) from error
    for part in attribute.split('.'):
        if not hasattr(obj, part):
            public = [n for n in dir(obj) if not n.startswith('_')]
            close = difflib.get_close_matches(part, public, n=5, cutoff=0.6)
            hint = f'; did you mean {", ".join(close)}?' if close else ''
            raise UnknownNameError(f'{path!r}: {_qualified(obj) if not inspect.ismodule(obj) else module_name} '
                                   f'has no attribute {part!r}{hint}', name=path, close_matches=close)
        obj = getattr(obj, part)
    return obj


# ---------------------------------------------------------------------------------------------- built-ins


def _public_classes(module: Any, base: Any) -> Iterator[Tuple[str, Any]]:
    for name, obj in sorted(vars(module).items()):
        if not name.startswith('_') and inspect.isclass(obj) and issubclass(obj, base) and obj is not base:
            yield name, obj


def callback_modules() -> List[Any]:
    """Every module of ``aitoolbox_like.callbacks`` and of the packages :data:`.plugins.CALLBACK_PACKAGES` names
    (``aitoolbox_like.adapters``), imported now (none imports an optional package at import time, so this works
    without the extras). A module that fails to import anyway is left out with a warning."""
    from .. import callbacks
    from .plugins import CALLBACK_PACKAGES
    modules = []
    for package in (callbacks, *(importlib.import_module(name) for name in CALLBACK_PACKAGES)):
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
            if info.name.startswith('_'):
                continue
            try:
                modules.append(importlib.import_module(f'{package.__name__}.{info.name}'))
            except ImportError as error:
                logger.warning('%s.%s does not import (%s); its callbacks are not registered', package.__name__,
                               info.name, error)
    return modules


def _builtin_callbacks(registry: Registry) -> None:
    from ..callbacks.abstract import AbstractCallback
    for module in callback_modules():
        for name, cls in _public_classes(module, AbstractCallback):
            if cls.__module__ == module.__name__ and not name.startswith('Abstract'):
                registry.register(cls, name)


def _builtin_optimizers(registry: Registry) -> None:
    import torch
    for name, cls in _public_classes(torch.optim, torch.optim.Optimizer):
        registry.register(cls, name)


def _builtin_schedulers(registry: Registry) -> None:
    from torch.optim import lr_scheduler
    from ..callbacks.abstract import AbstractScheduler
    for name, cls in _public_classes(lr_scheduler, (lr_scheduler.LRScheduler, lr_scheduler.ReduceLROnPlateau)):
        # Left out: the base class, and the two that combine scheduler objects already built on the optimizer
        # (a recipe cannot write those; a scheduler callback with warm-up covers the usual use).
        if name not in TORCH_SCHEDULERS_LEFT_OUT:
            registry.register(cls, name)
    for name, cls in CALLBACKS.items():
        if inspect.isclass(cls) and issubclass(cls, AbstractScheduler):
            registry.register(cls, name)


def _builtin_criteria(registry: Registry) -> None:
    from torch import nn
    for name, cls in _public_classes(nn, nn.Module):
        if name.endswith('Loss'):
            registry.register(cls, name)


def _builtin_result_packages(registry: Registry) -> None:
    from .. import results as result_package
    from ..results.abstract import AbstractResultPackage
    for name in result_package.__all__:
        cls = getattr(result_package, name)
        if inspect.isclass(cls) and issubclass(cls, AbstractResultPackage) and not name.startswith('Abstract'):
            registry.register(cls, name)


def _builtin_loops(registry: Registry) -> None:
    from ..tracking import TrainLoopCheckpoint, TrainLoopCheckpointEndSave, TrainLoopEndSave
    from ..engine.train_loop import TrainLoop
    for cls in (TrainLoop, TrainLoopCheckpoint, TrainLoopEndSave, TrainLoopCheckpointEndSave):
        registry.register(cls)


CALLBACKS = Registry('callback', _builtin_callbacks)
MODELS = Registry('model')
DATA = Registry('data')
OPTIMIZERS = Registry('optimizer', _builtin_optimizers)
SCHEDULERS = Registry('scheduler', _builtin_schedulers)
CRITERIA = Registry('criterion', _builtin_criteria)
RESULT_PACKAGES = Registry('result_package', _builtin_result_packages)
LOOPS = Registry('loop', _builtin_loops)

#: Every registry by kind.
REGISTRIES: Dict[str, Registry] = {r.kind: r for r in (CALLBACKS, MODELS, DATA, OPTIMIZERS, SCHEDULERS, CRITERIA,
                                                        RESULT_PACKAGES, LOOPS)}


def get_registry(kind: str) -> Registry:
    """The registry of ``kind`` (one of :data:`KINDS`)."""
    try:
        return REGISTRIES[kind]
    except KeyError:
        close = difflib.get_close_matches(kind, list(REGISTRIES), n=3)
        hint = f'; did you mean {", ".join(close)}?' if close else ''
        raise UnknownNameError(f'unknown registry kind {kind!r}{hint} (kinds: {", ".join(REGISTRIES)})') from None


def lookup(kind: str, name: str) -> Any:
    """The class or function ``name`` (a registered name or an import path) in the registry of ``kind``."""
    return get_registry(kind).get(name)


def lookup_any(name: str) -> List[Tuple[str, Any]]:
    """``(kind, target)`` for every registry that holds ``name`` (or ``[('import', target)]`` for an import
    path); empty when none does."""
    if ':' in name:
        return [('import', import_path(name))]
    return [(kind, registry.get(name)) for kind, registry in REGISTRIES.items() if name in registry]


def close_matches_anywhere(name: str) -> List[str]:
    """Registered names of any kind close to ``name``."""
    every = sorted({n for registry in REGISTRIES.values() for n in registry.names()})
    return difflib.get_close_matches(name, every, n=3, cutoff=0.75)


def _decorator(kind: str) -> Callable[..., Any]:
    registry = REGISTRIES[kind]

    def register(target: Any = None, *, name: Optional[str] = None) -> Any:
        if isinstance(target, str):             # @register_x('name')
            name, target = target, None
        if target is None:
            return lambda obj: registry.register(obj, name)
        return registry.register(target, name)

    register.__name__ = f'register_{kind}'
    register.__qualname__ = register.__name__
    register.__doc__ = (f'Register a class or function in the {kind} registry ({KINDS[kind]}): ``@register_{kind}``, '
                        f'``@register_{kind}(name=\'other_name\')`` or ``register_{kind}(obj, name=...)``. '
                        f'Returns the object unchanged.')
    return register


register_callback = _decorator('callback')
register_model = _decorator('model')
register_data = _decorator('data')
register_optimizer = _decorator('optimizer')
register_scheduler = _decorator('scheduler')
register_criterion = _decorator('criterion')
register_result_package = _decorator('result_package')
register_loop = _decorator('loop')
