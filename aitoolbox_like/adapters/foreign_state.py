"""The state of other libraries' callbacks in the loop's checkpoints, taken from their attributes.

pytorch-accelerated's, SuperGradients' and Orca's callbacks keep their state in plain attributes (an early-stopping
counter, a best value and its epoch, a torch scheduler, a run history) and have no ``state_dict``: their libraries
never resume a callback. The adapters save them as they are, without asking the callbacks' authors for anything:
:func:`capture` encodes an object's attributes into what a ``weights_only`` checkpoint holds (numbers, strings,
tensors, lists and dicts, with a small mark of what each was), and :func:`restore` puts them back into the callback
of the resumed run, after its library's own reset hooks ran.

What is saved of an attribute:

- numbers, strings, None, tensors, NumPy arrays and scalars, enums, ``random.Random``: the value;
- lists, tuples, sets, deques and dicts (any ``dict`` subclass: ``defaultdict``, ``OrderedDict``): their items,
  restored into the container the callback holds (so what else refers to it sees the values too);
- an object with ``state_dict`` / ``load_state_dict`` (a module, an optimizer, a torch scheduler, a GradScaler):
  its ``state_dict()``, loaded into the object the resumed callback holds;
- any other object with a ``__dict__`` (a run history, a meter): its attributes, the same way, into the object the
  resumed callback holds;
- references to the loop's own objects (the loop, its model and its parameters, optimizers, criterion, loaders,
  history) and to other callbacks: never (the loop saves those); functions, methods and classes: never (they are
  settings the script builds again); resources a callback opens again itself (progress bars, files, TensorBoard and
  W&B writers, locks, threads, loggers): never;
- anything else cannot be saved: the adapters name it (:func:`unsaveable`) when the fit starts.

A setting changed for the resumed run wins: each callback's attributes are also recorded when it is registered
(``initial``), and an attribute holding a setting (numbers, strings, enums and containers of them) whose value at
registration differs from the one recorded by the saved run keeps the new value (a warning names it); every other
attribute (tensors, modules, objects: built at random or filled by training) continues from the checkpoint.
"""
import collections
import enum
import logging
import random
import types
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

import numpy as np
import torch

logger = logging.getLogger(__name__)

#: What never travels in a checkpoint: references the loop saves itself, settings the script builds again.
SKIP = object()

# Modules of the objects a callback opens again itself when its run starts (the encoding skips them).
_RESOURCE_MODULES = ('tqdm', 'io', '_io', 'threading', '_thread', 'logging', 'socket', 'subprocess', 'queue',
                     'multiprocessing', 'concurrent', 'torch.utils.tensorboard', 'tensorboardX', 'wandb', 'mlflow',
                     'tempfile')
_CALLABLES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.BuiltinMethodType,
              types.LambdaType, types.ModuleType, type)
_MAX_DEPTH = 8


class Unsaveable(Exception):
    """An attribute holds an object the checkpoint cannot hold (its type in the message)."""


def _is_resource(value: Any) -> bool:
    module = type(value).__module__ or ''
    return module.startswith(_RESOURCE_MODULES) or isinstance(value, (types.GeneratorType, types.CoroutineType))


def _is_setting(value: Any) -> bool:
    """Functions, classes, modules, partials and other plain callables the script builds again."""
    if isinstance(value, _CALLABLES):
        return True
    import functools
    import operator
    if isinstance(value, functools.partial) or type(value).__module__ == 'operator' \
            or isinstance(value, (operator.attrgetter, operator.itemgetter, operator.methodcaller)):
        return True
    return False


class Encoder:
    """Encodes attribute values for a checkpoint (see the module docstring).

    Args:
        references: ids of objects that are the loop's (or another owner's) and never saved here.
        is_reference: more objects to leave out, by a test (another library's callbacks, say).
    """

    def __init__(self, references: Iterable[Any] = (), is_reference: Optional[Callable[[Any], bool]] = None) -> None:
        self.references: Set[int] = {id(obj) for obj in references if obj is not None}
        self.is_reference = is_reference
        self.unsaveable: List[str] = []

    def attributes(self, obj: Any, skip_names: Iterable[str] = ()) -> Dict[str, Any]:
        """``{name: encoded}`` of ``obj``'s attributes (those that are saved); what cannot be saved is listed in
        ``unsaveable`` (``'name (type)'``)."""
        skip = set(skip_names)
        encoded: Dict[str, Any] = {}
        for name, value in sorted(vars(obj).items()):
            if name in skip:
                continue
            try:
                item = self.encode(value, 0, set())
            except Unsaveable as error:
                self.unsaveable.append(f'{name} ({error})')
                continue
            if item is not SKIP:
                encoded[name] = item
        return encoded

    def encode(self, value: Any, depth: int, seen: Set[int]) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)) and not isinstance(value, enum.Enum):
            return value
        if id(value) in self.references or (self.is_reference is not None and self.is_reference(value)):
            return SKIP
        if isinstance(value, torch.Tensor):
            return {'kind': 'tensor', 'value': value.detach().to('cpu', copy=True)}
        if isinstance(value, enum.Enum):
            return {'kind': 'enum', 'value': value.name}
        if isinstance(value, np.ndarray):
            if value.dtype == object:
                raise Unsaveable('a NumPy array of objects')
            return {'kind': 'ndarray', 'value': torch.from_numpy(np.array(value, copy=True))}
        if isinstance(value, np.generic):
            return {'kind': 'numpy', 'value': value.item(), 'dtype': str(value.dtype)}
        if isinstance(value, random.Random):
            return {'kind': 'random', 'value': _plain(value.getstate())}
        if _is_setting(value) or _is_resource(value):
            return SKIP
        if depth >= _MAX_DEPTH:
            raise Unsaveable(f'{type(value).__qualname__} nested deeper than {_MAX_DEPTH} levels')
        if id(value) in seen:
            raise Unsaveable(f'{type(value).__qualname__} that contains itself')
        seen = seen | {id(value)}
        if isinstance(value, dict):
            items, skipped = [], []
            for key, item in value.items():
                if not isinstance(key, (str, int, float, bool)) and key is not None:
                    raise Unsaveable(f'a dict keyed by {type(key).__qualname__}')
                encoded = self.encode(item, depth + 1, seen)
                (skipped.append(key) if encoded is SKIP else items.append([key, encoded]))
            return {'kind': 'dict', 'value': items, 'skipped': skipped}
        if isinstance(value, (list, tuple, set, frozenset, collections.deque)):
            sequence = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else list(value)
            encoded_items = [self.encode(item, depth + 1, seen) for item in sequence]
            if any(item is SKIP for item in encoded_items):
                return SKIP     # a list of references or settings (callbacks, functions) is a setting
            kind = {list: 'list', tuple: 'tuple', set: 'set', frozenset: 'frozenset'}.get(type(value), None)
            if isinstance(value, collections.deque):
                return {'kind': 'deque', 'value': encoded_items, 'maxlen': value.maxlen}
            if kind is None:
                kind = 'tuple' if isinstance(value, tuple) else 'list'
            return {'kind': kind, 'value': encoded_items}
        state_dict, load = getattr(value, 'state_dict', None), getattr(value, 'load_state_dict', None)
        if callable(state_dict) and callable(load):
            try:
                state = state_dict()
            except Exception as error:      # the object's own method failed: say so, save the rest
                raise Unsaveable(f'{type(value).__qualname__} whose state_dict() failed: {error}') from None
            return {'kind': 'state_dict', 'type': _qualname(value), 'value': self.encode(state, depth + 1, seen)}
        if hasattr(value, '__dict__') and not isinstance(value, torch.nn.Module):
            attributes: Dict[str, Any] = {}
            skipped_names = []
            for name, item in sorted(vars(value).items()):
                encoded = self.encode(item, depth + 1, seen)
                (skipped_names.append(name) if encoded is SKIP else attributes.__setitem__(name, encoded))
            return {'kind': 'object', 'type': _qualname(value), 'value': attributes, 'skipped': skipped_names}
        raise Unsaveable(type(value).__qualname__)


def _qualname(value: Any) -> str:
    return f'{type(value).__module__}.{type(value).__qualname__}'


def _plain(value: Any) -> Any:
    """A tuple of tuples (random.Random's state) as lists."""
    return [_plain(item) for item in value] if isinstance(value, (tuple, list)) else value


def _tupled(value: Any) -> Any:
    return tuple(_tupled(item) for item in value) if isinstance(value, list) else value


def decode(encoded: Any, current: Any) -> Any:
    """The value of ``encoded``, put into ``current`` (the resumed callback's object) where it is a container or
    an object of the same kind, so that other holders of that object see it; returns the value to assign."""
    if not isinstance(encoded, dict):
        return encoded
    kind = encoded['kind']
    value: Any = encoded.get('value')
    if kind == 'tensor':
        if isinstance(current, torch.Tensor) and current.shape == value.shape and current.dtype == value.dtype:
            with torch.no_grad():
                current.copy_(value)
            return current
        return value.to(current.device) if isinstance(current, torch.Tensor) else value
    if kind == 'enum':
        return type(current)[value] if isinstance(current, enum.Enum) else current
    if kind == 'ndarray':
        return value.numpy().copy()
    if kind == 'numpy':
        return np.dtype(encoded['dtype']).type(value)
    if kind == 'random':
        generator = current if isinstance(current, random.Random) else random.Random()
        generator.setstate(_tupled(value))
        return generator
    if kind == 'dict':
        target = current if isinstance(current, dict) else {}
        keep = set(encoded['skipped'])
        saved = {key: item for key, item in value}
        for key in [key for key in target if key not in saved and key not in keep]:
            del target[key]
        for key, item in saved.items():
            target[key] = decode(item, target.get(key))
        return target
    if kind in ('list', 'tuple', 'set', 'frozenset', 'deque'):
        old = list(current) if isinstance(current, (list, tuple, collections.deque)) else []
        items = [decode(item, old[i] if i < len(old) and len(old) == len(value) else None)
                 for i, item in enumerate(value)]
        if kind == 'list':
            if isinstance(current, list):
                current[:] = items
                return current
            return items
        if kind == 'deque':
            if isinstance(current, collections.deque) and current.maxlen == encoded['maxlen']:
                current.clear()
                current.extend(items)
                return current
            return collections.deque(items, maxlen=encoded['maxlen'])
        return {'tuple': tuple, 'set': set, 'frozenset': frozenset}[kind](items)
    if kind == 'state_dict':
        load = getattr(current, 'load_state_dict', None)
        if callable(load) and _qualname(current) == encoded['type']:
            load(decode(value, None))
            return current
        logger.warning('a saved %s state was not restored: the resumed callback holds %s there', encoded['type'],
                       'nothing' if current is None else _qualname(current))
        return current
    if kind == 'object':
        if current is None or _qualname(current) != encoded['type'] or not hasattr(current, '__dict__'):
            logger.warning('a saved %s was not restored: the resumed callback holds %s there', encoded['type'],
                           'nothing' if current is None else _qualname(current))
            return current
        attributes = vars(current)
        for name, item in value.items():
            attributes[name] = decode(item, attributes.get(name))
        return current
    raise ValueError(f'unknown encoded kind {kind!r} in a callback state')


def is_setting(encoded: Any) -> bool:
    """Whether an encoded value can be a setting the script chose: numbers, strings, None, enums and containers of
    them. Tensors, arrays, objects and ``state_dict`` objects are state (built at random, or filled by training):
    only those are restored whatever their value at registration."""
    if not isinstance(encoded, dict):
        return not isinstance(encoded, torch.Tensor)
    kind = encoded['kind']
    if kind == 'enum':
        return True
    if kind == 'dict':
        return all(is_setting(item) for _, item in encoded['value'])
    if kind in ('list', 'tuple', 'set', 'frozenset'):
        return all(is_setting(item) for item in encoded['value'])
    return False


def same(a: Any, b: Any) -> bool:
    """Whether two encoded values are equal (tensors by value)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape \
            and a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b) or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)
    except Exception:
        return False


def capture(obj: Any, encoder: Encoder, skip_names: Iterable[str] = ()) -> Dict[str, Any]:
    """``obj``'s attributes for a checkpoint (the encoder lists what it could not save)."""
    return encoder.attributes(obj, skip_names)


def restore(obj: Any, saved: Dict[str, Any], saved_initial: Optional[Dict[str, Any]],
            initial: Optional[Dict[str, Any]], who: str) -> List[str]:
    """Put ``saved`` (what :func:`capture` gave) back into ``obj``'s attributes; an attribute whose value at
    registration (``initial``) differs from the saved run's (``saved_initial``) keeps its present value, as a
    setting changed for this run. Returns the names kept that way (a warning names them)."""
    attributes = vars(obj)
    kept = []
    for name, encoded in saved.items():
        if saved_initial is not None and initial is not None and name in saved_initial and name in initial \
                and is_setting(initial[name]) and not same(saved_initial[name], initial[name]):
            kept.append(name)
            continue
        attributes[name] = decode(encoded, attributes.get(name))
    if kept:
        logger.warning('%s: %s set otherwise than in the checkpoint\'s run; the new value%s kept, the rest of its '
                       'state continues from the checkpoint', who, ', '.join(kept), 's are' if len(kept) > 1 else ' is')
    return kept


def loop_references(loop: Any) -> List[Any]:
    """The loop's own objects, which its checkpoint saves itself: the loop, its models (and their parameters and
    buffers), optimizers, criterion, loaders, history, handler and experiment."""
    objects: List[Any] = [loop, loop.model, loop.ddp_model, loop.compiled_model, loop.optimizer, loop.criterion,
                          loop.train_loader, loop.validation_loader, loop.test_loader, loop.train_history,
                          loop.callbacks_handler, loop.experiment, loop.message_service, loop.evaluation]
    if loop.optimizer is not None:
        objects += list(loop.optimizers)
    model = loop.model
    if isinstance(model, torch.nn.Module):
        objects += list(model.parameters()) + list(model.buffers())
    return objects


class ForeignState:
    """The checkpointed state of one foreign callback: its attributes at registration (``initial``), what is saved
    of them, and the restore waiting for the library's reset hooks.

    Args:
        name: how messages name the callback.
        skip_names: attributes never saved (an adapter's own bookkeeping).
    """

    def __init__(self, name: str, skip_names: Iterable[str] = ()) -> None:
        self.name = name
        self.skip_names: Tuple[str, ...] = tuple(skip_names)
        self.initial: Optional[Dict[str, Any]] = None
        self.pending: Optional[Dict[str, Any]] = None
        self.warned: Set[str] = set()

    def record_initial(self, obj: Any, encoder: Encoder) -> None:
        """The attributes as the script built them (at registration, before any hook ran)."""
        if self.initial is None:
            self.initial = capture(obj, encoder, self.skip_names)

    def state(self, obj: Any, encoder: Encoder) -> Dict[str, Any]:
        """``{'attributes': ..., 'initial': ...}`` for the checkpoint; what cannot be saved is named once."""
        attributes = capture(obj, encoder, self.skip_names)
        self.name_unsaveable(encoder.unsaveable)
        encoder.unsaveable = []
        return {'attributes': attributes, 'initial': self.initial or {}}

    def name_unsaveable(self, names: List[str]) -> None:
        new = [name for name in names if name not in self.warned]
        if new:
            self.warned.update(new)
            logger.warning('%s: %s cannot be saved in a checkpoint; a resumed run starts %s anew', self.name,
                           ', '.join(new), 'them' if len(new) > 1 else 'it')

    def apply(self, obj: Any, state: Dict[str, Any]) -> None:
        """Restore ``state`` (what :meth:`state` gave) into ``obj`` now."""
        restore(obj, state.get('attributes', {}), state.get('initial'), self.initial, self.name)


def unsaveable(obj: Any, encoder: Encoder, skip_names: Iterable[str] = ()) -> List[str]:
    """The attributes of ``obj`` a checkpoint cannot hold (``'name (type)'``)."""
    encoder.unsaveable = []
    capture(obj, encoder, skip_names)
    names, encoder.unsaveable = encoder.unsaveable, []
    return names
