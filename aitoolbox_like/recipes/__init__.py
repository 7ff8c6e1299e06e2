"""Recipes: whole experiments described in YAML, built from registered names, run from the command line.

    aitoolbox-like train RECIPE.yaml key.path=value ...     (or python -m aitoolbox_like train ...)
    aitoolbox-like resume EXPERIMENT_FOLDER_OR_S3_URI
    aitoolbox-like show RECIPE.yaml
    aitoolbox-like callbacks

See docs/recipes.md. The core (train_loop, experiment, ...) never imports this package.
"""
from .plan import RecipePlan
from .recipe import Recipe, Run, build_recipe, load_recipe, seed_everything
from .registry import (KINDS, REGISTRIES, Registry, UnknownNameError, get_registry, import_path, lookup,
                       register_callback, register_criterion, register_data, register_loop, register_model,
                       register_optimizer, register_result_package, register_scheduler)
from .schema import COMMAND_LINE_FILE, RECIPE_FILE, RecipeError

__all__ = [
    'Recipe', 'RecipeError', 'RecipePlan', 'Run', 'load_recipe', 'build_recipe', 'seed_everything',
    'RECIPE_FILE', 'COMMAND_LINE_FILE',
    'KINDS', 'REGISTRIES', 'Registry', 'UnknownNameError', 'get_registry', 'import_path', 'lookup',
    'register_callback', 'register_model', 'register_data', 'register_optimizer', 'register_scheduler',
    'register_criterion', 'register_result_package', 'register_loop',
]
