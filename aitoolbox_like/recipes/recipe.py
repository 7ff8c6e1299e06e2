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

This module loads, checks and builds a recipe (:class:`Recipe`); the pieces it uses are modules of their own:
``schema`` (sections, key paths, RecipeError), ``signatures`` (what a class or function accepts), ``plan`` (the
checks, and what to build) and ``reference`` (a registry's names with their arguments).
"""
import dataclasses
import importlib
import logging
import os
import random
import sys
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy

from .plan import Planner, RecipePlan, materialize
from .schema import RecipeError, describe_value, key_path, normalize_key

logger = logging.getLogger(__name__)


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
                               f'{describe_value(imports)}'], self.source)
        errors = []
        for i, item in enumerate(imports):
            path = key_path('imports', i)
            if not isinstance(item, str) or not item:
                errors.append(f'{path}: expected a python file or a module name, got {describe_value(item)}')
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
            planner = Planner(self.config, self.override_keys)
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
            raise RecipeError([f'data: {_name_of(plan.data.target)} returned {describe_value(loaders)}; it must '
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
