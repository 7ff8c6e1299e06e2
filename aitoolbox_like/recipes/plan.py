"""A recipe checked and planned: every section's name looked up, its arguments checked against the signature and
its values against the parameters' types (all problems collected, by key path), and what to build recorded as
:class:`Call` objects in a :class:`RecipePlan` (:class:`Planner`; :meth:`Recipe.plan` runs it)."""
import collections.abc
import dataclasses
import difflib
import inspect
import numbers
import types
import typing
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, Union

from .registry import KINDS, LOOP_FILLED, UnknownNameError, close_matches_anywhere, lookup, lookup_any
from .schema import (DP_FIT_ARGS, FIT_FILLED, SCHEDULER_WRAPPER_KEYS, SECTIONS, describe_value, key_path,
                     normalize_key)
from .signatures import expected_type, recipe_parameters, type_hints_of


# ---------------------------------------------------------------------------------------------- types

_MAPPING_ORIGINS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
_LIST_ORIGINS = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.MutableSequence,
                 collections.abc.Iterable, collections.abc.Collection, collections.abc.Set)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _expects_mapping(tp: Any) -> bool:
    """True when the parameter takes a mapping, so a mapping with ``name`` given to it stays a mapping."""
    if _is_union(tp):
        return any(_expects_mapping(a) for a in typing.get_args(tp))
    return tp in (dict, typing.Dict) or typing.get_origin(tp) in _MAPPING_ORIGINS


def _is_list_type(tp: Any) -> bool:
    return typing.get_origin(tp) in _LIST_ORIGINS or tp in (list, tuple, set, frozenset)


def _is_tuple_type(tp: Any) -> bool:
    return tp is tuple or typing.get_origin(tp) is tuple


def _item_types(list_type: Any, length: int) -> Optional[List[Any]]:
    """The type of each item of a list of ``length`` given to ``list_type``; None when the length is wrong (a
    fixed-size tuple)."""
    args = typing.get_args(list_type)
    if _is_tuple_type(list_type) and args and args[-1] is not Ellipsis:
        return list(args) if len(args) == length else None
    return [args[0] if args else None] * length


def _classes_in(tp: Any) -> List[type]:
    """The classes an annotation accepts (``Optional[X]`` -> [X]); empty when any object goes."""
    if _is_union(tp):
        return [c for a in typing.get_args(tp) for c in _classes_in(a)]
    if inspect.isclass(tp) and tp is not type(None) and typing.get_origin(tp) is None:
        return [tp]
    return []


def describe_type(tp: Any) -> str:
    """A readable name of an annotation: ``int``, ``int or None``, ``list of str``, ``'epoch' or 'step'``."""
    if tp is type(None) or tp is None:
        return 'None'
    if _is_union(tp):
        args = typing.get_args(tp)
        names = [describe_type(a) for a in args if a is not type(None)]
        return ' or '.join(dict.fromkeys(names + (['None'] if type(None) in args else [])))
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return ' or '.join(repr(a) for a in args)
    if origin in _MAPPING_ORIGINS or tp is dict:
        return 'mapping'
    if origin in _LIST_ORIGINS or tp in (list, tuple):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f'list of {len(args)} ({", ".join(describe_type(a) for a in args)})'
        return f'list of {describe_type(args[0])}' if args else 'list'
    if origin is collections.abc.Callable or tp is typing.Callable:
        return 'callable'
    if tp is numbers.Number or tp is numbers.Real:
        return 'number'
    if tp is numbers.Integral:
        return 'int'
    return getattr(tp, '__name__', None) or str(tp)


def type_matches(value: Any, tp: Any) -> bool:
    """Whether a plain recipe value (None, bool, int, float, str, list, mapping) fits the annotation ``tp``.

    bool is not an int; an int is accepted for a float; a YAML list is accepted for a list, tuple, set or
    sequence type (its items are checked). Annotations this cannot judge (Any, type variables, strings of
    unresolved names, callables, unknown generics) accept anything.
    """
    if tp is None or tp is Any or isinstance(tp, (typing.TypeVar, str, typing.ForwardRef)):
        return True
    if _is_union(tp):
        return any(type_matches(value, a) for a in typing.get_args(tp))
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if tp is type(None):
        return value is None
    if value is None:
        return False
    if tp is bool:
        return isinstance(value, bool)
    if tp is int or tp is numbers.Integral:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float or tp is numbers.Real or tp is numbers.Number:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if origin in _LIST_ORIGINS or tp in (list, tuple, set, frozenset):
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(type_matches(v, a) for v, a in zip(value, args))
        return not args or all(type_matches(v, args[0]) for v in value)
    if origin in _MAPPING_ORIGINS or tp is dict:
        if not isinstance(value, dict):
            return False
        return len(args) != 2 or all(type_matches(k, args[0]) and type_matches(v, args[1]) for k, v in value.items())
    if origin is collections.abc.Callable or tp is typing.Callable:
        return callable(value)
    if origin is not None:
        return isinstance(value, origin) if inspect.isclass(origin) else True
    if inspect.isclass(tp):
        return isinstance(value, tp)
    return True


# ---------------------------------------------------------------------------------------------- the plan


@dataclasses.dataclass
class Call:
    """One object the recipe builds: ``target(*positional, **kwargs)``; ``kwargs`` values may hold further
    Calls (nested objects), built first."""

    target: Any
    kwargs: Dict[str, Any]
    path: str

    def build(self, *positional: Any) -> Any:
        """Build the nested objects, then this one."""
        return self.target(*positional, **{k: materialize(v) for k, v in self.kwargs.items()})


def materialize(value: Any) -> Any:
    """A planned value with every :class:`Call` in it built."""
    if isinstance(value, Call):
        return value.build()
    if isinstance(value, list):
        return [materialize(v) for v in value]
    if isinstance(value, tuple):
        return tuple(materialize(v) for v in value)
    if isinstance(value, dict):
        return {k: materialize(v) for k, v in value.items()}
    return value


@dataclasses.dataclass
class RecipePlan:
    """A checked recipe: what to build, in order (see :meth:`Recipe.build`)."""

    seed: Optional[int]
    data: Call
    model: Call
    optimizer: Call
    criterion: Optional[Call]
    loop: Call
    callbacks: List[Call]
    schedulers: List[Call]
    fit: Dict[str, Any]


class Planner:
    """Checks a resolved recipe and plans its objects; collects every error instead of stopping at the first."""

    def __init__(self, config: Dict[str, Any], override_keys: Sequence[str]) -> None:
        self.config = config
        self.override_keys = [normalize_key(k) for k in override_keys]
        self.errors: List[str] = []

    def error(self, path: str, message: str) -> None:
        from_command_line = any(path == k or path.startswith((k + '.', k + '['))
                                or k.startswith((path + '.', path + '[')) for k in self.override_keys)
        self.errors.append(f'{path}: {message}{" (set on the command line)" if from_command_line else ""}')

    # ---- sections

    def plan(self) -> Optional[RecipePlan]:
        config = self.config
        for key in config:
            if key not in SECTIONS:
                close = difflib.get_close_matches(str(key), SECTIONS, n=1, cutoff=0.75)
                hint = f'did you mean {close[0]}? ' if close else ''
                self.error(str(key), f'unknown key; {hint}(a recipe has: {", ".join(SECTIONS)})')
        seed = config.get('seed')
        if seed is not None and not type_matches(seed, int):
            self.error('seed', f'expected int, got {describe_value(seed)}')
        if not isinstance(config.get('vars', {}), dict):
            self.error('vars', f'expected a mapping, got {describe_value(config["vars"])}')
        data = self.section('data', 'data')
        model = self.section('model', 'model')
        optimizer = self.section('optimizer', 'optimizer', skip_first=True)
        criterion = self.section('criterion', 'criterion', required=False)
        loop = self.section('loop', 'loop', filled=LOOP_FILLED, default_name='TrainLoop')
        callbacks = [c for c in (self.spec(item, 'callback', key_path('callbacks', i))
                                 for i, item in enumerate(self.section_list('callbacks'))) if c is not None]
        schedulers = [c for c in (self.scheduler(item, key_path('schedulers', i))
                                  for i, item in enumerate(self.section_list('schedulers'))) if c is not None]
        gpu_mode = loop.kwargs.get('gpu_mode', 'single') if loop is not None else 'single'
        fit = self.fit_section(gpu_mode)
        if self.errors:
            return None
        assert data is not None and model is not None and optimizer is not None and loop is not None
        return RecipePlan(seed, data, model, optimizer, criterion, loop, callbacks, schedulers, fit)

    def section(self, key: str, kind: str, required: bool = True, skip_first: bool = False,
                filled: Sequence[str] = (), default_name: Optional[str] = None) -> Optional[Call]:
        spec = self.config.get(key)
        if default_name is not None and (spec is None or isinstance(spec, dict) and 'name' not in spec):
            spec = {'name': default_name, **(spec or {})}
        if spec is None:
            if required:
                self.error(key, f'missing: the recipe needs a {key} section ({{name: ..., <arguments>}}; '
                                f'{KINDS[kind]})')
            return None
        return self.spec(spec, kind, key, skip_first=skip_first, filled=filled)

    def section_list(self, key: str) -> List[Any]:
        items = self.config.get(key)
        if items is None:
            return []
        if not isinstance(items, list):
            self.error(key, f'expected a list of {{name: ..., <arguments>}} mappings, got {describe_value(items)}')
            return []
        return items

    # ---- one object

    def target(self, spec: Any, kind: Optional[str], path: str) -> Tuple[Any, Dict[str, Any]]:
        """``(target, arguments)`` of a ``{name: ..., <arguments>}`` mapping; target None after an error. With
        ``kind`` None the name is looked up in every registry (a nested object)."""
        if not isinstance(spec, dict):
            self.error(path, f'expected a mapping {{name: ..., <arguments>}}, got {describe_value(spec)}')
            return None, {}
        name = spec.get('name')
        arguments = {str(k): v for k, v in spec.items() if k != 'name'}
        if not isinstance(name, str) or not name:
            self.error(key_path(path, 'name') if 'name' in spec else path,
                       f'expected the name of a registered {kind or "class or function"} (or an import path '
                       f'package.module:Name), got {describe_value(name) if "name" in spec else "no name key"}')
            return None, arguments
        try:
            if kind is not None:
                return lookup(kind, name), arguments
            found = lookup_any(name)
        except UnknownNameError as error:
            self.error(key_path(path, 'name'), str(error))
            return None, arguments
        targets = list({id(t): (k, t) for k, t in found}.values())
        if not targets:
            close = close_matches_anywhere(name)
            hint = f'; did you mean {", ".join(close)}?' if close else ''
            self.error(key_path(path, 'name'), f'unknown name {name!r}{hint} (or give an import path '
                                               f'package.module:Name)')
            return None, arguments
        if len(targets) > 1:
            self.error(key_path(path, 'name'), f'{name!r} names different objects in the registries '
                                               f'{", ".join(k for k, _ in targets)}; give its import path '
                                               f'package.module:Name')
            return None, arguments
        return targets[0][1], arguments

    def spec(self, spec: Any, kind: Optional[str], path: str, skip_first: bool = False,
             filled: Sequence[str] = ()) -> Optional[Call]:
        target, arguments = self.target(spec, kind, path)
        if target is None:
            return None
        return Call(target, self.arguments(target, arguments, path, skip_first, filled), path)

    def scheduler(self, spec: Any, path: str) -> Optional[Call]:
        from ..callbacks.abstract import AbstractCallback
        target, arguments = self.target(spec, 'scheduler', path)
        if target is None:
            return None
        if inspect.isclass(target) and issubclass(target, AbstractCallback):
            return Call(target, self.arguments(target, arguments, path), path)
        # A torch scheduler (or a function optimizer -> scheduler): LRSchedulerCallback builds it on the
        # loop's optimizer; interval / monitor / optimizer_idx are the callback's, the rest the scheduler's.
        from ..callbacks.train_schedule import LRSchedulerCallback
        wrapper: Dict[str, Any] = {'scheduler': target}
        for key, tp in SCHEDULER_WRAPPER_KEYS.items():
            if key in arguments:
                value = arguments.pop(key)
                wrapper[key] = self.value(value, tp, key_path(path, key))
        kwargs = self.arguments(target, arguments, path, skip_first=True)
        return Call(LRSchedulerCallback, {**wrapper, **kwargs}, path)

    def arguments(self, target: Any, arguments: Dict[str, Any], path: str, skip_first: bool = False,
                  filled: Sequence[str] = (), extra: Optional[Dict[str, Any]] = None,
                  open_kwargs: bool = True) -> Dict[str, Any]:
        """Check ``arguments`` against ``target``'s parameters (unknown, missing, wrong type) and plan them.
        ``extra``: more accepted keys and their types; ``open_kwargs=False``: a ``**kwargs`` of the target does not
        accept other keys."""
        parameters = recipe_parameters(target, skip_first)
        owner = getattr(target, '__qualname__', None) or repr(target)
        if parameters is None:          # no signature to check against: passed as they are
            return {k: self.value(v, None, key_path(path, k)) for k, v in arguments.items()}
        named = {p.name: p for p in parameters
                 if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
        takes_any = open_kwargs and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
        hints = type_hints_of(target)
        planned: Dict[str, Any] = {}
        for key, value in arguments.items():
            sub = key_path(path, key)
            if key in filled:
                self.error(sub, f'set by the recipe from its {_filled_from(key)} section; remove it here')
            elif key in named:
                planned[key] = self.value(value, expected_type(named[key], hints), sub, key)
            elif extra is not None and key in extra:
                planned[key] = self.value(value, extra[key], sub)
            elif takes_any:
                planned[key] = self.value(value, None, sub)
            else:
                choices = [n for n in named if n not in filled] + list(extra or ())
                close = difflib.get_close_matches(key, choices, n=1, cutoff=0.75)
                hint = f'did you mean {close[0]}? ' if close else ''
                self.error(sub, f'unknown argument of {owner}; {hint}its arguments: '
                                f'{", ".join(choices) if choices else "none"}')
        for name, parameter in named.items():
            if parameter.default is inspect.Parameter.empty and name not in arguments and name not in filled:
                self.error(key_path(path, name), f'missing: a required argument of {owner}')
        for parameter in parameters:
            if parameter.kind is inspect.Parameter.POSITIONAL_ONLY and parameter.default is inspect.Parameter.empty:
                self.error(path, f'{owner} takes {parameter.name!r} by position only; a recipe cannot build it '
                                 f'(register a function that takes it by name)')
        return planned

    def value(self, value: Any, tp: Any, path: str, parameter: Optional[str] = None) -> Any:
        """Check one argument against its type and plan it; lists and mappings are planned item by item.

        A ``{name: ...}`` mapping given to a parameter that does not take a mapping (by its annotation or its
        default) is a nested object when the parameter is annotated with a class (the name is looked up in every
        registry and must be a subclass), or, unannotated, when the parameter's name ends with a registry kind
        (``result_package``, ``val_result_package``, ``model``, ``optimizer``, ``criterion``, ``scheduler``,
        ``callback(s)``: looked up in that registry), or else when the name is registered or an import path.
        Otherwise the mapping is passed as it is.
        """
        kind = kind_of_parameter(parameter) if tp is None else None
        if isinstance(value, dict) and 'name' in value and not _expects_mapping(tp) and \
                (_classes_in(tp) or kind is not None or _resolves(value['name'])):
            return self.nested(value, tp, path, kind)
        members = list(typing.get_args(tp)) if _is_union(tp) else [tp]
        if isinstance(value, list) and any(isinstance(v, dict) and 'name' in v for v in value):
            list_type = next((m for m in members if _is_list_type(m)), None)
            item_types = _item_types(list_type, len(value)) if list_type is not None else \
                [None] * len(value) if tp is None or tp is Any else None
            if item_types is not None:
                planned = [self.value(v, t, key_path(path, i), parameter)
                           for i, (v, t) in enumerate(zip(value, item_types))]
                return tuple(planned) if _is_tuple_type(list_type) else planned
        if not type_matches(value, tp):
            self.error(path, f'expected {describe_type(tp)}, got {describe_value(value)}')
            return value
        if isinstance(value, dict):
            mapping_type = next((m for m in members if _expects_mapping(m)), None)
            if mapping_type is not None and len(typing.get_args(mapping_type)) == 2:
                value_type = typing.get_args(mapping_type)[1]
                return {k: self.value(v, value_type, key_path(path, str(k))) for k, v in value.items()}
        if isinstance(value, list):
            list_type = next((m for m in members if _is_list_type(m) and type_matches(value, m)), None)
            if _is_tuple_type(list_type):
                return tuple(value)          # YAML has lists only; torch takes betas=(0.9, 0.999) as a tuple
        return value

    def nested(self, spec: Dict[str, Any], tp: Any, path: str, kind: Optional[str] = None) -> Optional[Call]:
        target, arguments = self.target(spec, kind, path)
        if target is None:
            return None
        accepted = _classes_in(tp)
        if accepted and inspect.isclass(target) and not any(issubclass(target, c) for c in accepted):
            self.error(key_path(path, 'name'), f'expected {describe_type(tp)}, got {spec["name"]} '
                                               f'({target.__module__}.{target.__qualname__})')
            return None
        return Call(target, self.arguments(target, arguments, path), path)

    # ---- fit

    def fit_section(self, gpu_mode: Any) -> Dict[str, Any]:
        from ..engine.train_loop import TrainLoop
        fit = self.config.get('fit')
        if fit is None:
            self.error('fit', 'missing: the recipe needs a fit section, e.g. {num_epochs: 10}')
            return {}
        if not isinstance(fit, dict):
            self.error('fit', f'expected a mapping of TrainLoop.fit arguments, got {describe_value(fit)}')
            return {}
        by_mode = {'ddp': _launcher_arguments('fit_ddp'), 'fsdp': _launcher_arguments('fit_fsdp'), 'dp': DP_FIT_ARGS}
        extra = by_mode.get(gpu_mode, {})
        arguments = dict(fit)
        for key in list(arguments):
            modes = [mode for mode, accepted in by_mode.items() if key in accepted]
            if key not in extra and modes:
                del arguments[key]
                self.error(key_path('fit', key), f'only with loop.gpu_mode {" or ".join(map(repr, modes))} (the '
                                                 f'loop\'s gpu_mode is {gpu_mode!r})')
        planned = self.arguments(TrainLoop.fit, arguments, 'fit', skip_first=True, filled=FIT_FILLED, extra=extra,
                                 open_kwargs=False)
        epochs, iterations = planned.get('num_epochs', 0), planned.get('num_iterations', 0)
        if isinstance(epochs, int) and isinstance(iterations, int) and (epochs > 0) == (iterations > 0):
            self.error('fit', f'give exactly one of num_epochs and num_iterations (a number > 0), got '
                              f'num_epochs={epochs}, num_iterations={iterations}')
        return planned


def _launcher_arguments(name: str) -> Dict[str, Any]:
    """The ``fit`` arguments ``distributed.launch.<name>`` (fit_ddp / fit_fsdp) adds, with their types."""
    from ..engine import launch
    launcher = getattr(launch, name)
    hints = type_hints_of(launcher)
    return {p.name: expected_type(p, hints) for p in recipe_parameters(launcher, skip_first=True) or ()
            if not p.name.startswith('_') and p.name not in ('num_epochs', 'num_iterations', 'callbacks',
                                                              'grad_accumulation')}


def _filled_from(key: str) -> str:
    return {'model': 'model', 'train_loader': 'data', 'validation_loader': 'data', 'test_loader': 'data',
            'optimizer': 'optimizer', 'criterion': 'criterion', 'callbacks': 'callbacks (and schedulers)',
            'resume_from': '`aitoolbox-like resume` command'}.get(key, key)


def kind_of_parameter(parameter: Optional[str]) -> Optional[str]:
    """The registry kind an unannotated parameter takes, by its name: ``result_package``, ``val_result_package``,
    ``callbacks``... (a trailing ``s`` is ignored); None when the name does not say."""
    if not parameter:
        return None
    singular = parameter[:-1] if parameter.endswith('s') else parameter
    for kind in KINDS:
        if kind != 'data' and (singular == kind or singular.endswith('_' + kind)):
            return kind
    return None


def _resolves(name: Any) -> bool:
    """Whether ``name`` is a registered name (of any kind) or an import path that imports."""
    if not isinstance(name, str) or not name:
        return False
    try:
        return bool(lookup_any(name))
    except UnknownNameError:
        return False
