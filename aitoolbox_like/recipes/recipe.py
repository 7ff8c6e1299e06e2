"""Recipes: a whole training run described in one YAML file, checked before anything is built, then built.

A recipe (see docs/recipes.md)::

    imports: [components.py]          # python files (relative to the recipe) or module names, imported first
    seed: 0                            # torch, random and numpy seeded before anything is built
    vars: {batch_size: 64}             # free-form values for ${...} interpolation
    data: {name: digits_loaders, batch_size: ${vars.batch_size}}    # returns (train, validation, test) loaders
    model: {name: DigitsCNN}
    optimizer: {name: Adam, lr: 3.0e-3}                # built over model.parameters()
    criterion: {name: CrossEntropyLoss}
    loop: {name: TrainLoopCheckpoint, project_name: digits, ...}   # the TrainLoop (model, loaders, optimizer and
                                                                   # criterion are filled in from the sections)
    callbacks: [{name: EarlyStopping, monitor: val_loss, patience: 3}]
    schedulers: [{name: StepLR, step_size: 2}]         # torch schedulers (or scheduler callbacks)
    fit: {num_epochs: 8}                               # TrainLoop.fit's arguments

Every object is a mapping with ``name`` (a registered name or an import path ``package.module:Name``) and the
constructor's arguments next to it. YAML, interpolation (``${a.b}``, ``${oc.env:VAR,default}``) and
``key.path=value`` overrides are OmegaConf's; the checks of names, arguments and types against the constructors
are ours, and every problem is reported at once, by key path, in one :class:`RecipeError`.
"""
import collections.abc
import dataclasses
import difflib
import importlib
import inspect
import logging
import numbers
import os
import random
import sys
import types
import typing
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, Union

import numpy

from .registry import KINDS, LOOP_FILLED, UnknownNameError, close_matches_anywhere, lookup, lookup_any

logger = logging.getLogger(__name__)

#: The top-level keys of a recipe.
SECTIONS = ('imports', 'seed', 'vars', 'data', 'model', 'optimizer', 'criterion', 'loop', 'callbacks', 'schedulers',
            'fit')
#: Keys of a ``schedulers`` item that go to LRSchedulerCallback (next to the torch scheduler's own arguments).
SCHEDULER_WRAPPER_KEYS: Dict[str, Any] = {'interval': Literal['epoch', 'step'], 'monitor': Optional[str],
                                          'optimizer_idx': Optional[int]}
#: The ``fit`` arguments the recipe sets itself.
FIT_FILLED = ('callbacks', 'resume_from')
#: ``fit`` arguments of gpu_mode='dp' (TrainLoop's DataParallel fit).
DP_FIT_ARGS: Dict[str, Any] = {'dp_model_args': Optional[Dict[str, Any]]}
#: Files a recipe run writes into its experiment folder (through ``TrainLoop.experiment_files``).
RECIPE_FILE = 'recipe.yaml'
COMMAND_LINE_FILE = 'command_line.txt'


class RecipeError(ValueError):
    """Everything wrong with a recipe, found before anything trains: one ``'key.path: problem'`` line per error
    in ``errors``."""

    def __init__(self, errors: Sequence[str], source: Optional[str] = None) -> None:
        self.errors = list(errors)
        self.source = source
        where = f' {source}' if source else ''
        count = f'{len(self.errors)} error{"s" if len(self.errors) != 1 else ""}'
        super().__init__(f'recipe{where}: {count}\n' + '\n'.join(f'  {e}' for e in self.errors))


# ---------------------------------------------------------------------------------------------- key paths


def key_path(*parts: Union[str, int]) -> str:
    """``callbacks``, 2, ``patience`` -> ``callbacks[2].patience``."""
    text = ''
    for part in parts:
        if isinstance(part, int):
            text += f'[{part}]'
        else:
            text += f'.{part}' if text else part
    return text


def key_parts(key: str) -> List[Union[str, int]]:
    """An override key's parts: ``callbacks.2.patience`` and ``callbacks[2].patience`` both give
    ``['callbacks', 2, 'patience']``."""
    parts: List[Union[str, int]] = []
    for piece in key.replace('[', '.').replace(']', '').split('.'):
        if piece:
            parts.append(int(piece) if piece.isdigit() else piece)
    return parts


def normalize_key(key: str) -> str:
    """An override key as an error path: ``callbacks.2.patience`` and ``callbacks[2].patience`` both become
    ``callbacks[2].patience``."""
    return key_path(*key_parts(key))


def _describe_value(value: Any) -> str:
    if isinstance(value, dict):
        return 'a mapping'
    if isinstance(value, (list, tuple)):
        return 'a list'
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    return type(value).__qualname__


# ---------------------------------------------------------------------------------------------- types

_MAPPING_ORIGINS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
_LIST_ORIGINS = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.MutableSequence,
                 collections.abc.Iterable, collections.abc.Collection, collections.abc.Set)
_DEFAULT_TYPES = (bool, int, float, str, list, tuple, dict)


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


# ---------------------------------------------------------------------------------------------- signatures


def signature_of(target: Any) -> Optional[inspect.Signature]:
    """The constructor / call signature of ``target``, or None when Python cannot tell it (then nothing is
    checked)."""
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def type_hints_of(target: Any) -> Dict[str, Any]:
    """The annotations of ``target``'s parameters, evaluated. A class's are those of its ``__init__``. Names that
    only exist for the type checker (``if TYPE_CHECKING:``) make ``typing.get_type_hints`` fail: then each
    annotation is evaluated on its own and those that do not evaluate are left out."""
    function = target.__init__ if inspect.isclass(target) else target
    try:
        return typing.get_type_hints(function)
    except Exception:
        pass
    hints: Dict[str, Any] = {}
    signature = signature_of(target)
    namespace = getattr(inspect.getmodule(function), '__dict__', {})
    for parameter in (signature.parameters.values() if signature is not None else ()):
        annotation = parameter.annotation
        if annotation is inspect.Parameter.empty:
            continue
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, dict(namespace))      # an annotation string of the target's module
            except Exception:
                continue
        hints[parameter.name] = annotation
    return hints


def expected_type(parameter: inspect.Parameter, hints: Dict[str, Any]) -> Any:
    """What a parameter takes: its annotation, else the type of its default (when that is a plain value and not
    None), else None (anything)."""
    if parameter.name in hints:
        return hints[parameter.name]
    default = parameter.default
    if default is not inspect.Parameter.empty and default is not None and type(default) in _DEFAULT_TYPES:
        return type(default)
    return None


def recipe_parameters(target: Any, skip_first: bool = False,
                      filled: Sequence[str] = ()) -> Optional[List[inspect.Parameter]]:
    """The parameters a recipe gives by name (``skip_first``: the first is filled by the recipe, e.g. an
    optimizer's model parameters; ``filled``: named ones the recipe fills). None when the signature is unknown."""
    signature = signature_of(target)
    if signature is None:
        return None
    parameters = list(signature.parameters.values())
    if skip_first and parameters and parameters[0].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                            inspect.Parameter.POSITIONAL_OR_KEYWORD):
        parameters = parameters[1:]
    return [p for p in parameters if p.name not in filled]


def format_signature(target: Any, skip_first: bool = False, filled: Sequence[str] = ()) -> str:
    """``name=default, other`` for the recipe-visible parameters (functions as defaults by their name)."""
    parameters = recipe_parameters(target, skip_first, filled)
    if parameters is None:
        return '...'
    parts = []
    for p in parameters:
        prefixes: Dict[Any, str] = {inspect.Parameter.VAR_POSITIONAL: '*', inspect.Parameter.VAR_KEYWORD: '**'}
        prefix = prefixes.get(p.kind, '')
        if p.default is inspect.Parameter.empty:
            parts.append(prefix + p.name)
        else:
            default = p.default
            shown = getattr(default, '__qualname__', None) if callable(default) else None
            parts.append(f'{p.name}={shown or repr(default)}')
    return ', '.join(parts)


def summary_of(target: Any) -> str:
    """The first sentence of ``target``'s docstring (empty when it has none)."""
    doc = inspect.getdoc(target) or ''
    paragraph = ' '.join(doc.strip().split('\n\n', 1)[0].split())
    end = paragraph.find('. ')
    return paragraph[:end + 1] if end >= 0 else paragraph


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


class _Planner:
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
            self.error('seed', f'expected int, got {_describe_value(seed)}')
        if not isinstance(config.get('vars', {}), dict):
            self.error('vars', f'expected a mapping, got {_describe_value(config["vars"])}')
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
            self.error(key, f'expected a list of {{name: ..., <arguments>}} mappings, got {_describe_value(items)}')
            return []
        return items

    # ---- one object

    def target(self, spec: Any, kind: Optional[str], path: str) -> Tuple[Any, Dict[str, Any]]:
        """``(target, arguments)`` of a ``{name: ..., <arguments>}`` mapping; target None after an error. With
        ``kind`` None the name is looked up in every registry (a nested object)."""
        if not isinstance(spec, dict):
            self.error(path, f'expected a mapping {{name: ..., <arguments>}}, got {_describe_value(spec)}')
            return None, {}
        name = spec.get('name')
        arguments = {str(k): v for k, v in spec.items() if k != 'name'}
        if not isinstance(name, str) or not name:
            self.error(key_path(path, 'name') if 'name' in spec else path,
                       f'expected the name of a registered {kind or "class or function"} (or an import path '
                       f'package.module:Name), got {_describe_value(name) if "name" in spec else "no name key"}')
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
            self.error(path, f'expected {describe_type(tp)}, got {_describe_value(value)}')
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
        from ..train_loop import TrainLoop
        fit = self.config.get('fit')
        if fit is None:
            self.error('fit', 'missing: the recipe needs a fit section, e.g. {num_epochs: 10}')
            return {}
        if not isinstance(fit, dict):
            self.error('fit', f'expected a mapping of TrainLoop.fit arguments, got {_describe_value(fit)}')
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
    """The ``fit`` arguments ``ddp_launch.<name>`` (fit_ddp / fit_fsdp) adds, with their types."""
    from .. import ddp_launch
    launcher = getattr(ddp_launch, name)
    hints = type_hints_of(launcher)
    return {p.name: expected_type(p, hints) for p in recipe_parameters(launcher, skip_first=True) or ()
            if not p.name.startswith('_') and p.name not in ('num_epochs', 'num_iterations', 'callbacks',
                                                              'grad_accumulation')}


def _filled_from(key: str) -> str:
    return {'model': 'model', 'train_loader': 'data', 'validation_loader': 'data', 'test_loader': 'data',
            'optimizer': 'optimizer', 'criterion': 'criterion', 'callbacks': 'callbacks (and schedulers)',
            'resume_from': '`aitoolbox-like resume` command'}.get(key, key)


# ---------------------------------------------------------------------------------------------- the recipe


@dataclasses.dataclass
class Run:
    """What :meth:`Recipe.build` made: the loop, the callbacks (schedulers included) and ``fit``'s arguments."""

    loop: Any
    callbacks: List[Any]
    fit_kwargs: Dict[str, Any]

    def fit(self, resume_from: Any = None) -> Any:
        """``loop.fit(callbacks=..., resume_from=..., **fit_kwargs)``; returns the model."""
        return self.loop.fit(callbacks=self.callbacks, resume_from=resume_from, **self.fit_kwargs)


class Recipe:
    """A loaded recipe: the configuration with interpolations resolved and overrides applied.

    Args:
        config: the resolved configuration (plain dicts and lists).
        source: where it came from (for messages).
        base_dir: the folder python-file ``imports`` are relative to.
        override_keys: keys set by overrides (errors on them say so).
    """

    def __init__(self, config: Dict[str, Any], source: str = '<recipe>', base_dir: str = '.',
                 override_keys: Sequence[str] = ()) -> None:
        self.config = config
        self.source = source
        self.base_dir = os.path.abspath(base_dir)
        self.override_keys = list(override_keys)
        imports = config.get('imports')
        if isinstance(imports, list):
            # Saved recipes must find the files again from anywhere: python files become absolute paths.
            config['imports'] = [os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(item)))
                                 if isinstance(item, str) and _is_file_import(item) else item for item in imports]
        self._plan: Optional[RecipePlan] = None

    @classmethod
    def load(cls, path: Union[str, 'os.PathLike[str]'], overrides: Sequence[str] = ()) -> 'Recipe':
        """Read a recipe file, apply ``key.path=value`` overrides and resolve interpolations.

        Raises:
            RecipeError: the file does not read or parse, an override is malformed, an interpolation fails.
        """
        path = os.fspath(path)
        try:
            with open(path, encoding='utf-8') as f:
                text = f.read()
        except OSError as error:
            raise RecipeError([f'cannot read the recipe: {error.strerror or error}'], path) from None
        return cls.from_text(text, source=path, base_dir=os.path.dirname(os.path.abspath(path)), overrides=overrides)

    @classmethod
    def from_text(cls, text: str, source: str = '<recipe>', base_dir: str = '.',
                  overrides: Sequence[str] = ()) -> 'Recipe':
        """A recipe from YAML text (see :meth:`load`)."""
        from omegaconf import DictConfig, OmegaConf
        from omegaconf.errors import OmegaConfBaseException
        try:
            config = OmegaConf.create(text) if text.strip() else OmegaConf.create({})
        except Exception as error:          # yaml's parser errors, OmegaConf's own
            raise RecipeError([f'not valid YAML: {error}'], source) from None
        if not isinstance(config, DictConfig):
            raise RecipeError(['the recipe must be a mapping of sections (data:, model:, ...), got a list'], source)
        errors = []
        keys = []
        for item in overrides:
            key, sep, raw = item.partition('=')
            key = key.strip()
            if not sep or not key:
                errors.append(f'{item}: an override is key.path=value (e.g. optimizer.lr=1e-3)')
                continue
            try:
                # OmegaConf's own grammar types the value (3 -> int, [1, 2] -> list, null, 'quoted' -> str).
                parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f'value={raw}']))
                value = parsed['value'] if isinstance(parsed, dict) else raw
                OmegaConf.update(config, key, value, merge=True)
                keys.append(key)
            except (OmegaConfBaseException, ValueError, IndexError, KeyError, TypeError) as error:
                errors.append(f'{normalize_key(key)}: cannot set it from the command line '
                              f'({_omegaconf_message(error)})')
        if errors:
            raise RecipeError(errors, source)
        try:
            resolved = OmegaConf.to_container(config, resolve=True)
        except OmegaConfBaseException as error:
            where = getattr(error, 'full_key', None) or '<recipe>'
            raise RecipeError([f'{where}: {_omegaconf_message(error)}'], source) from None
        assert isinstance(resolved, dict)
        return cls({str(k): v for k, v in resolved.items()}, source, base_dir, keys)

    def to_yaml(self) -> str:
        """The resolved recipe as YAML (what ``aitoolbox-like show`` prints and a run saves as recipe.yaml)."""
        from omegaconf import OmegaConf
        return OmegaConf.to_yaml(OmegaConf.create(self.config))

    # ---- imports

    def import_modules(self) -> None:
        """Import the recipe's ``imports`` (their ``@register_*`` decorators run): a python file is imported by its
        module name with its folder put on ``sys.path`` (so processes spawned for DDP import it too and can
        unpickle its classes); anything else is a module name.

        Raises:
            RecipeError: a file is missing, its name is not a module name, another module of that name is
                imported already, or a module is not found. (An error inside the imported code is raised as it
                is, with its traceback.)
        """
        imports = self.config.get('imports')
        if imports is None:
            return
        if not isinstance(imports, list):
            raise RecipeError([f'imports: expected a list of python files or module names, got '
                               f'{_describe_value(imports)}'], self.source)
        errors = []
        for i, item in enumerate(imports):
            path = key_path('imports', i)
            if not isinstance(item, str) or not item:
                errors.append(f'{path}: expected a python file or a module name, got {_describe_value(item)}')
            elif _is_file_import(item):
                problem = _import_file(item)
                if problem:
                    errors.append(f'{path}: {problem}')
            else:
                try:
                    importlib.import_module(item)
                except ModuleNotFoundError as error:
                    if error.name is not None and item.startswith(error.name):
                        errors.append(f'{path}: no module named {error.name!r} (a python file must end in .py)')
                    else:
                        raise
        if errors:
            raise RecipeError(errors, self.source)

    # ---- check and build

    def plan(self) -> RecipePlan:
        """Import the ``imports``, then check everything (names, arguments, types, top-level keys) and return what
        to build.

        Raises:
            RecipeError: with every problem found, each as ``key.path: problem``.
        """
        if self._plan is None:
            self.import_modules()
            planner = _Planner(self.config, self.override_keys)
            plan = planner.plan()
            if plan is None:
                raise RecipeError(planner.errors, self.source)
            self._plan = plan
        return self._plan

    def validate(self) -> None:
        """Check the recipe (see :meth:`plan`); raises RecipeError."""
        self.plan()

    def build(self, hyperparams_defaults: Optional[Dict[str, Any]] = None) -> Run:
        """Seed, then build data, model, optimizer, criterion, loop, callbacks and schedulers, in this order (the
        order of a hand-written script, so the random initialisation is the same).

        Args:
            hyperparams_defaults: keys added to the loop's ``hyperparams`` dict (a tracking loop's) when absent.

        Raises:
            RecipeError: the recipe does not check, or the data function does not return three loaders.
        """
        plan = self.plan()
        if plan.seed is not None:
            seed_everything(plan.seed)
        loaders = plan.data.build()
        if not isinstance(loaders, (list, tuple)) or len(loaders) != 3:
            raise RecipeError([f'data: {_name_of(plan.data.target)} returned {_describe_value(loaders)}; it must '
                               f'return (train_loader, validation_loader, test_loader) (None for a missing one)'],
                              self.source)
        model = plan.model.build()
        optimizer = plan.optimizer.build(model.parameters())
        criterion = plan.criterion.build() if plan.criterion is not None else None
        loop_kwargs = {k: materialize(v) for k, v in plan.loop.kwargs.items()}
        if hyperparams_defaults and isinstance(loop_kwargs.get('hyperparams'), dict):
            for key, value in hyperparams_defaults.items():
                loop_kwargs['hyperparams'].setdefault(key, value)
        loop = plan.loop.target(model, *loaders, optimizer, criterion, **loop_kwargs)
        callbacks = [c.build() for c in plan.callbacks] + [s.build() for s in plan.schedulers]
        fit_kwargs = {k: materialize(v) for k, v in plan.fit.items()}
        return Run(loop, callbacks, fit_kwargs)


def _omegaconf_message(error: Exception) -> str:
    # OmegaConf appends "full_key: ... object_type=..." lines; the first line says what is wrong.
    return str(error).strip().split('\n', 1)[0]


def _name_of(target: Any) -> str:
    return getattr(target, '__qualname__', None) or repr(target)


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


def _is_file_import(item: str) -> bool:
    return item.endswith('.py') or '/' in item or os.sep in item


def _import_file(path: str) -> Optional[str]:
    """Import a python file by its module name, its folder first on sys.path; a problem as text, or None."""
    if not os.path.isfile(path):
        return f'no such python file: {path}'
    folder, file_name = os.path.split(os.path.abspath(path))
    module_name = file_name[:-3] if file_name.endswith('.py') else file_name
    if not module_name.isidentifier():
        return f'{file_name}: the file name must be a python module name (letters, digits, _)'
    existing = sys.modules.get(module_name)
    if existing is not None:
        existing_file = getattr(existing, '__file__', None)
        if existing_file and os.path.realpath(existing_file) == os.path.realpath(path):
            return None
        return f'a different module named {module_name!r} is imported already ({existing_file or "built in"}); ' \
               f'rename {file_name}'
    if folder not in sys.path:
        sys.path.insert(0, folder)
    importlib.import_module(module_name)
    return None


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), Python's ``random`` and NumPy with ``seed``."""
    import torch
    random.seed(seed)
    torch.manual_seed(seed)
    numpy.random.seed(seed % 2 ** 32)


def load_recipe(path: Union[str, 'os.PathLike[str]'], overrides: Sequence[str] = ()) -> Recipe:
    """:meth:`Recipe.load`: read, override, resolve (not checked yet: :meth:`Recipe.validate` / :meth:`Recipe.build`
    check)."""
    return Recipe.load(path, overrides)


def build_recipe(path: Union[str, 'os.PathLike[str]'], overrides: Sequence[str] = ()) -> Run:
    """Load, check and build a recipe file; ``build_recipe('digits.yaml').fit()`` trains it."""
    return Recipe.load(path, overrides).build()



def entry_signature(kind: str, target: Any) -> str:
    """The arguments a recipe gives ``target`` of registry ``kind``, with their defaults (what ``aitoolbox-like
    list`` and the generated reference show)."""
    from ..callbacks.abstract import AbstractCallback
    if kind == 'optimizer':
        return format_signature(target, skip_first=True)
    if kind == 'loop':
        return format_signature(target, filled=LOOP_FILLED)
    if kind == 'scheduler' and not (inspect.isclass(target) and issubclass(target, AbstractCallback)):
        own = format_signature(target, skip_first=True)
        wrapper = "interval='epoch', monitor=None, optimizer_idx=None"
        return f'{own}, {wrapper}' if own else wrapper
    return format_signature(target)


def reference_entries(kind: str, builtin_only: bool = False) -> List[Tuple[str, str, str]]:
    """``(name, arguments, first docstring line)`` of every name in the registry of ``kind``, sorted; with
    ``builtin_only``, of the names that need no registration only (not the ones this process registered)."""
    from .registry import get_registry
    registry = get_registry(kind)
    builtin = set(registry.builtin_names()) if builtin_only else None
    return [(name, entry_signature(kind, target), summary_of(target)) for name, target in registry.items()
            if builtin is None or name in builtin]
