"""The search space of a hyper-parameter search: ``PATH=SPEC`` parameters, parsed and checked against the recipe
before any trial runs.

A PATH is a recipe key path as in overrides (``optimizer.lr``, ``vars.batch_size``, ``callbacks.6.patience``); a
SPEC is one of::

    loguniform(a, b)      a float between a and b (0 < a < b), sampled on a log scale
    uniform(a, b)         a float between a and b (a < b)
    int(a, b)             an integer from a to b, both included (a < b)
    choice(v1, v2, ...)   one of the values; each is typed as an override value is (3 -> int, Adam -> text,
                          true -> bool, 'quoted' -> text)

:func:`check_inputs` reports every problem at once (:class:`TuneInputError`): a malformed SPEC, a bound the wrong
way round, an unknown PATH (with the close matches), a sampled value the recipe does not accept, and a ``monitor``
that no epoch of the recipe records.
"""
import dataclasses
import difflib
import fnmatch
import inspect
import logging
import math
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..callbacks.abstract import AbstractScheduler
from ..results.reporting import is_number
from ..adapters._trial_report import TuneInputError
from ..recipes.plan import Call
from ..recipes.recipe import Recipe
from ..recipes.schema import RecipeError, key_parts

logger = logging.getLogger(__name__)

#: The SPEC kinds, with the form the user writes.
SPEC_KINDS: Dict[str, str] = {
    'loguniform': 'loguniform(a,b)',
    'uniform': 'uniform(a,b)',
    'int': 'int(a,b)',
    'choice': 'choice(v1,v2,...)',
}
#: The optimisation directions.
MODES = ('min', 'max')

_SPEC = re.compile(r'^\s*([A-Za-z_]\w*)\s*\((.*)\)\s*$', re.S)

# History names that every epoch of a loop records itself (``val_loss`` needs a validation loader, which only the
# built data can tell; a recipe without one fails at the end of the first epoch); 'loss' only where the loop evaluates
# the training set (eval_train_set).
_LOOP_NAMES = ('accumulated_loss', 'loss', 'val_loss')
# A model whose get_loss returns a MultiLoss adds one name per loss next to the plain ones.
_MULTI_LOSS_PATTERNS = ('accumulated_loss_*', 'loss_*', 'val_loss_*')
# Built-in callbacks that add names to the history each epoch, and the patterns of those names.
_PRODUCERS: Dict[str, Tuple[str, ...]] = {
    'Timer': ('epoch_time', 'batches_per_sec', 'samples_per_sec'),
    'GradNormLogger': ('grad_norm', 'grad_norm_*'),
    'LRMonitor': ('lr', 'lr_*'),
    'ThroughputMonitor': ('throughput_*', 'step_time_p*', 'cuda_max_memory_allocated_mb'),
}
# Built-in callbacks known to add no name to the history (they read it, save, report or change the training). A
# callback in neither table, a user's in particular, may add any name: then the monitor is checked at the end of the
# first epoch instead. New built-in callbacks land there too until listed, which costs an epoch, never a wrong error.
_NON_PRODUCERS = frozenset({
    'EarlyStopping', 'ThresholdEarlyStopping', 'TerminateOnNaN', 'AllPredictionsSame', 'ProgressBar',
    'EmailNotification', 'LogUpload', 'ListRegisteredCallbacks', 'DataSubsetTestRun', 'ModelPerformancePrintReport',
    'ModelTrainHistoryPlot', 'ModelTrainHistoryFileWriter', 'TensorboardFullTracking', 'TensorboardHyperparameters',
    'TensorboardLearningRate', 'TensorboardModelGraph', 'TensorboardParameterHistograms', 'TensorboardTrainBatchLoss',
    'TensorboardTrainHistoryMetric', 'ModelCheckpoint', 'ModelIterationCheckpoint', 'ModelTrainEndSave',
    'PreemptionCheckpoint', 'ModelLoadContinueTraining', 'GradNormClip', 'GradValueClip', 'GradDistributionPlot',
    'GradientStatsPrint', 'ModelSummary', 'LRSchedulerCallback', 'MLflowTracking', 'WandBTracking',
    'DistributedSamplerSetEpoch', 'InMultiProcessDataLoad', 'BackboneFinetuning', 'PredictionVisualization',
    'SaveBatchImages', 'ExponentialMovingAverage', 'StochasticWeightAveraging', 'RayTrainReport', 'OptunaPruning',
})


@dataclasses.dataclass(frozen=True)
class Param:
    """One searched value: the recipe key ``path`` and how to sample it.

    Attributes:
        path: the recipe key path, as given (it also names the parameter in the study and in trials.csv).
        kind: ``'loguniform'``, ``'uniform'``, ``'int'`` or ``'choice'``.
        low, high: the bounds (both included) of the ranges; None for a choice.
        choices: the values of a choice; empty for the ranges.
        spec: the SPEC as given (for messages and the study's record of its search space).
    """

    path: str
    kind: str
    low: Optional[Union[int, float]] = None
    high: Optional[Union[int, float]] = None
    choices: Tuple[Any, ...] = ()
    spec: str = ''

    def candidates(self) -> List[Any]:
        """The values the recipe is checked with before any trial: both bounds, or every choice."""
        return list(self.choices) if self.kind == 'choice' else [self.low, self.high]

    def override(self, value: Any) -> str:
        """``PATH=value`` as a recipe override."""
        return override(self.path, value)


def override_text(value: Any) -> str:
    """A plain value as the text of a ``key.path=value`` override that gives exactly that value back (text is
    quoted, so ``'3'`` stays text and ``'true'`` is not a bool)."""
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if value is None:
        return 'null'
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f'a sampled value must be a number, text, a bool or None, got {type(value).__qualname__}')


def override(path: str, value: Any) -> str:
    """``path=value`` as a recipe override that gives exactly ``value`` back (:func:`override_text`)."""
    return f'{path}={override_text(value)}'


def _parse_values(text: str) -> List[Any]:
    """The comma-separated values of a SPEC, typed by the override grammar (OmegaConf's)."""
    from omegaconf import OmegaConf
    parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f'value=[{text}]']))
    values = parsed['value'] if isinstance(parsed, dict) else None
    if not isinstance(values, list):
        raise ValueError(f'cannot read the values {text!r}')
    return values


def parse_param(text: str) -> Param:
    """A ``PATH=SPEC`` parameter (as ``--param`` takes it).

    Raises:
        ValueError: the text is not ``PATH=SPEC``, or the SPEC is malformed (the message says how).
    """
    path, sep, spec = text.partition('=')
    if not sep or not path.strip() or not spec.strip():
        raise ValueError(f'{text}: a parameter is PATH=SPEC, e.g. optimizer.lr=loguniform(1e-4,1e-2)')
    return parse_spec(path.strip(), spec.strip())


def parse_spec(path: str, spec: str) -> Param:
    """The parameter ``path`` sampled as ``spec`` (see the module's documentation).

    Raises:
        ValueError: the SPEC is malformed, a bound is not a number (an integer for ``int``), the bounds are the wrong
            way round, a loguniform bound is not positive, or a choice is empty, repeats a value or holds a list.
    """
    where = f'{path}={spec}'
    match = _SPEC.match(spec)
    if match is None:
        raise ValueError(f'{where}: expected one of {", ".join(SPEC_KINDS.values())}')
    kind, arguments = match.group(1), match.group(2)
    if kind not in SPEC_KINDS:
        close = difflib.get_close_matches(kind, list(SPEC_KINDS), n=1, cutoff=0.6)
        hint = f'did you mean {close[0]}? ' if close else ''
        raise ValueError(f'{where}: unknown kind {kind!r}; {hint}expected one of {", ".join(SPEC_KINDS.values())}')
    try:
        values = _parse_values(arguments)
    except Exception as error:          # OmegaConf's / YAML's parser errors
        raise ValueError(f'{where}: cannot read the values ({str(error).splitlines()[0]})') from None
    if kind == 'choice':
        return _choice(path, spec, values)
    return _range(path, spec, kind, values)


def _choice(path: str, spec: str, values: List[Any]) -> Param:
    where = f'{path}={spec}'
    if not values:
        raise ValueError(f'{where}: a choice needs at least one value')
    for value in values:
        if isinstance(value, (list, dict)):
            raise ValueError(f'{where}: a choice holds numbers, text, true/false or null, got the '
                             f'{"list" if isinstance(value, list) else "mapping"} {value!r}')
    seen: List[Any] = []
    for value in values:
        if any(value == s and type(value) is type(s) for s in seen):
            raise ValueError(f'{where}: {override_text(value)} is given twice')
        seen.append(value)
    return Param(path, 'choice', choices=tuple(values), spec=spec)


def _range(path: str, spec: str, kind: str, values: List[Any]) -> Param:
    where = f'{path}={spec}'
    if len(values) != 2:
        raise ValueError(f'{where}: {kind} takes two bounds, {SPEC_KINDS[kind]}, got {len(values)} value'
                         f'{"s" if len(values) != 1 else ""}')
    low, high = values
    if kind == 'int':
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise ValueError(f'{where}: the bounds of int(a,b) are integers, got {low!r} and {high!r}')
    elif not all(is_number(v) and math.isfinite(v) for v in values):
        raise ValueError(f'{where}: the bounds are numbers, got {low!r} and {high!r}')
    if low > high:
        raise ValueError(f'{where}: the bounds are the wrong way round (low {low!r} > high {high!r}); write '
                         f'{kind}({high!r},{low!r})')
    if low == high:
        raise ValueError(f'{where}: both bounds are {low!r}; for a fixed value give the override {path}={low!r}')
    if kind == 'loguniform' and low <= 0:
        raise ValueError(f'{where}: the bounds of loguniform are > 0 (a log scale), got {low!r}; use uniform(a,b) '
                         f'for a range that includes 0 or negative values')
    return Param(path, kind, low=float(low) if kind != 'int' else low, high=float(high) if kind != 'int' else high,
                 spec=spec)


def parse_params(params: Union[Mapping[str, str], Sequence[str]]) -> List[Param]:
    """Parse every parameter, given as ``{PATH: SPEC}`` or as ``['PATH=SPEC', ...]``.

    Raises:
        TuneInputError: every malformed parameter and every PATH given twice, one line each.
    """
    parsed, errors = parse_params_and_errors(params)
    if errors:
        raise TuneInputError(errors)
    return parsed


def parse_params_and_errors(params: Union[Mapping[str, str], Sequence[str]]) -> Tuple[List[Param], List[str]]:
    """``(the parameters that parse, a line for each problem)``: :func:`parse_params` without raising, so that the
    rest of a search's input can be checked too before everything is reported."""
    if isinstance(params, str):
        return [], [f'params: expected PATH=SPEC strings or a {{PATH: SPEC}} mapping, got the text {params!r}; '
                    f'write [{params!r}]']
    items = [f'{k}={v}' for k, v in params.items()] if isinstance(params, Mapping) else list(params)
    errors: List[str] = []
    parsed: List[Param] = []
    for item in items:
        try:
            param = parse_param(item)
        except ValueError as error:
            errors.append(f'--param {error}')
            continue
        if any(_same_path(param.path, p.path) for p in parsed):
            errors.append(f'--param {param.path}: given twice')
            continue
        parsed.append(param)
    if not items:
        errors.append('--param: give at least one parameter to search, e.g. --param optimizer.lr=loguniform(1e-4,1e-2)')
    return parsed, errors


# ---------------------------------------------------------------------------------------------- key paths


def _same_path(a: str, b: str) -> bool:
    return key_parts(a) == key_parts(b)


_MISSING = object()


def _lookup(config: Any, parts: Sequence[Union[str, int]]) -> Any:
    node = config
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, dict) and str(part) in node:
            node = node[str(part)]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            return _MISSING
    return node


def _all_paths(node: Any, prefix: str = '') -> List[str]:
    """Every key path of a configuration, dotted (``callbacks.6.patience``)."""
    paths: List[str] = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        path = f'{prefix}.{key}' if prefix else str(key)
        paths.append(path)
        paths.extend(_all_paths(value, path))
    return paths


def _path_problem(config: Dict[str, Any], param: Param) -> Optional[str]:
    """Why ``param.path`` cannot be searched in ``config`` (None: it can, or it is new and the recipe check
    decides). A new key is fine where the recipe checks it (``optimizer.weight_decay``), not under ``vars``, whose
    keys only matter where something references them."""
    parts = key_parts(param.path)
    value = _lookup(config, parts)
    if isinstance(value, (dict, list)):
        return f'{param.path} is a {"section" if isinstance(value, dict) else "list"} of the recipe, not a value; ' \
               f'search one of its keys'
    if value is not _MISSING:
        return None
    parent = _lookup(config, parts[:-1])
    if parts[0] == 'vars' or not isinstance(parent, dict):
        same_depth = [p for p in _all_paths(config) if p.count('.') == len(parts) - 1]
        close = difflib.get_close_matches('.'.join(map(str, parts)), same_depth, n=2, cutoff=0.8)
        hint = f'; did you mean {", ".join(close)}?' if close else ''
        return f'{param.path}: unknown key path of the recipe{hint}'
    return None


# ---------------------------------------------------------------------------------------------- the checks


def check_inputs(recipe_path: str, overrides: Sequence[str], params: Sequence[Param], monitor: str,
                 mode: str) -> Recipe:
    """Check a search before any trial: the recipe with its overrides, every parameter's PATH, every value the
    recipe will be trained with (both bounds, every choice), ``mode``, and that an epoch records ``monitor``.
    Returns the recipe with the overrides (not yet the sampled values).

    Raises:
        RecipeError: the recipe (with its overrides) does not check.
        TuneInputError: every problem of the search itself, one line each.
    """
    errors: List[str] = []
    if mode not in MODES:
        errors.append(f'--mode {mode}: expected min or max (whether a smaller or a larger {monitor} is better)')
    recipe = Recipe.load(recipe_path, overrides)
    plan = recipe.plan()        # the recipe as given must check, as for `aitoolbox-like train`
    gpu_mode = plan.loop.kwargs.get('gpu_mode', 'single')
    if gpu_mode in ('ddp', 'fsdp'):
        errors.append(f'loop.gpu_mode: {gpu_mode!r} trains in processes of its own, which the trials of a search '
                      f'cannot report from; search with gpu_mode single (or dp)')
    for param in params:
        if any(_same_path(param.path, o.partition('=')[0].strip()) for o in overrides):
            errors.append(f'--param {param.path}: also set by the override {param.path}=...; give it once')
            continue
        problem = _path_problem(recipe.config, param)
        if problem is not None:
            errors.append(f'--param {problem}')
            continue
        errors.extend(_value_problems(recipe_path, overrides, param))
    monitor_problem = check_monitor(plan, monitor)
    if monitor_problem is not None:
        errors.append(monitor_problem)
    if errors:
        raise TuneInputError(errors, recipe.source)
    return recipe


def _value_problems(recipe_path: str, overrides: Sequence[str], param: Param) -> List[str]:
    """The recipe's complaints about each value ``param`` can take (checked one value at a time)."""
    problems: List[str] = []
    for value in param.candidates():
        try:
            Recipe.load(recipe_path, [*overrides, param.override(value)]).validate()
        except RecipeError as error:
            for line in error.errors:
                problems.append(f'--param {param.path}={param.spec}: with {param.override(value)}: '
                                f'{line.replace(" (set on the command line)", "")}')
    return problems


def _producer_patterns(call: Call) -> Optional[Tuple[str, ...]]:
    """The history names a planned callback adds each epoch (fnmatch patterns), or None when it cannot be told."""
    target = call.target
    name = getattr(target, '__name__', '')
    declared = getattr(target, 'history_names', None)       # AbstractCallback.history_names, a user's included
    if isinstance(declared, (tuple, list)):
        return tuple(declared)
    if not str(getattr(target, '__module__', '')).startswith('aitoolbox_like.'):
        return None
    if name in _NON_PRODUCERS or inspect.isclass(target) and issubclass(target, AbstractScheduler):
        return ()
    if name == 'ModelPerformanceEvaluation':
        package = call.kwargs.get('result_package')
        # A result package that declares its result names gives the exact history names; another, any name.
        results = getattr(package.target, 'metric_names', None) if isinstance(package, Call) else None
        results = tuple(results) if isinstance(results, (tuple, list)) and results else ('*',)
        patterns = []
        if call.kwargs.get('on_val_data', True):
            patterns += [f'val_{result}' for result in results]
        if call.kwargs.get('on_train_data', False):
            patterns += [f'train_{result}' for result in results]
        return tuple(patterns)
    return _PRODUCERS.get(name)


def epoch_names(plan: Any) -> Tuple[List[str], List[str], List[str]]:
    """What an epoch of a checked recipe (its :class:`~aitoolbox_like.recipes.RecipePlan`) records in the history:
    ``(names, patterns, unknown)``: the loop's own names, the fnmatch patterns of the names its callbacks add, and
    the key paths of the callbacks that may add names nobody can tell before training (a user's callback)."""
    end_auto_eval = plan.loop.kwargs.get('end_auto_eval', True)
    train_set = plan.loop.kwargs.get('eval_train_set')
    if train_set is None:       # the loop class's default (AIToolbox's loops evaluate the training set)
        train_set = getattr(plan.loop.target, 'EVAL_TRAIN_SET_DEFAULT', False)
    recorded = ('accumulated_loss',) if end_auto_eval is False else \
        ('accumulated_loss', 'loss', 'val_loss') if train_set else ('accumulated_loss', 'val_loss')
    names = [name for name in _LOOP_NAMES if name in recorded]
    patterns = [pattern for pattern in _MULTI_LOSS_PATTERNS if pattern[:-2] in recorded]
    unknown: List[str] = []
    for call in [*plan.callbacks, *plan.schedulers]:
        found = _producer_patterns(call)
        if found is None:
            unknown.append(f'{call.path} ({getattr(call.target, "__name__", call.target)})')
        else:
            patterns.extend(p for p in found if p not in patterns)
    return names, patterns, unknown


def check_monitor(plan: Any, monitor: str) -> Optional[str]:
    """None when an epoch of the recipe records ``monitor`` (or may: then it is checked at the end of the first
    epoch), else the problem, with what an epoch records and the close matches."""
    if not isinstance(monitor, str) or not monitor:
        return f'--monitor: expected the name of a history value, e.g. val_loss, got {monitor!r}'
    names, patterns, unknown = epoch_names(plan)
    if monitor in names or any(fnmatch.fnmatchcase(monitor, p) for p in patterns):
        return None
    if unknown:
        logger.info('--monitor %s is not among what an epoch of this recipe is known to record (%s); %s may record '
                    'it: it is checked at the end of the first epoch', monitor, ', '.join(names + patterns),
                    ', '.join(unknown))
        return None
    exact = names + [p for p in patterns if not any(c in p for c in '*?[')]
    close = difflib.get_close_matches(monitor, exact, n=2, cutoff=0.6) or \
        difflib.get_close_matches(monitor.lower(), exact, n=2, cutoff=0.5)
    hint = f'; did you mean {" or ".join(close)}?' if close else ''
    shown = names + [p.replace('*', '<name>') for p in patterns]
    return f'--monitor {monitor}: no epoch of this recipe records it{hint} (an epoch records {", ".join(shown)})'
