"""The registries: built-in names without registration, user registration, import paths, close-match errors."""
import inspect

import pytest
import torch
from torch import nn

from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.callbacks.basic import EarlyStopping
from aitoolbox_like.callbacks.train_schedule import CosineScheduler
from aitoolbox_like.recipes import UnknownNameError, lookup, register_callback, register_model
from aitoolbox_like.recipes.registry import REGISTRIES, Registry, callback_modules
from aitoolbox_like.results import ClassificationResultPackage
from aitoolbox_like.tracking import TrainLoopCheckpoint
from aitoolbox_like.train_loop import TrainLoop


def test_builtin_names_need_no_registration():
    assert lookup('callback', 'EarlyStopping') is EarlyStopping
    assert lookup('optimizer', 'Adam') is torch.optim.Adam
    assert lookup('scheduler', 'StepLR') is torch.optim.lr_scheduler.StepLR
    assert lookup('scheduler', 'CosineScheduler') is CosineScheduler        # our scheduler callbacks too
    assert lookup('criterion', 'CrossEntropyLoss') is nn.CrossEntropyLoss
    assert lookup('result_package', 'ClassificationResultPackage') is ClassificationResultPackage
    assert lookup('loop', 'TrainLoop') is TrainLoop
    assert lookup('loop', 'TrainLoopCheckpoint') is TrainLoopCheckpoint


def test_every_callback_class_torch_optimizer_and_loss_is_registered():
    callbacks = set(REGISTRIES['callback'].names())
    for module in callback_modules():
        for name, cls in vars(module).items():
            if inspect.isclass(cls) and issubclass(cls, AbstractCallback) and cls.__module__ == module.__name__ \
                    and not name.startswith(('_', 'Abstract')):
                assert name in callbacks, f'{module.__name__}.{name}'
    # Modules whose callbacks use optional packages (mlflow, wandb) are listed without importing those packages.
    assert {'MLflowTracking', 'WandBTracking', 'TensorboardFullTracking'} <= callbacks
    optimizers = {n for n, c in vars(torch.optim).items()
                  if inspect.isclass(c) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer}
    assert optimizers <= set(REGISTRIES['optimizer'].names())
    losses = {n for n, c in vars(nn).items() if n.endswith('Loss') and inspect.isclass(c)}
    assert losses <= set(REGISTRIES['criterion'].names())
    assert {'StepLR', 'OneCycleLR', 'ReduceLROnPlateau', 'CosineAnnealingLR'} <= set(REGISTRIES['scheduler'].names())


def test_unknown_names_list_the_close_matches():
    with pytest.raises(UnknownNameError) as info:
        lookup('callback', 'EarlyStoping')
    assert "unknown callback 'EarlyStoping'; did you mean EarlyStopping" in str(info.value)
    assert info.value.close_matches[0] == 'EarlyStopping'
    with pytest.raises(UnknownNameError, match="did you mean Adam"):
        lookup('optimizer', 'adam')
    with pytest.raises(UnknownNameError, match='unknown registry kind'):
        lookup('callbacks', 'EarlyStopping')


def test_import_paths_need_no_registration():
    assert lookup('callback', 'aitoolbox_like.callbacks.basic:EarlyStopping') is EarlyStopping
    assert lookup('model', 'torch.nn:Linear') is nn.Linear
    with pytest.raises(UnknownNameError, match="has no attribute 'EarlyStop'; did you mean EarlyStopping"):
        lookup('callback', 'aitoolbox_like.callbacks.basic:EarlyStop')
    with pytest.raises(UnknownNameError, match="cannot import 'no_such_module_xyz'"):
        lookup('model', 'no_such_module_xyz:Model')


def test_decorators_register_and_refuse_a_taken_name():
    registry = Registry('model')

    class Net(nn.Module):
        pass

    assert registry.register(Net) is Net
    assert registry.get('Net') is Net
    registry.register(Net, 'other_name')
    assert registry.get('other_name') is Net

    class Other(nn.Module):
        pass

    with pytest.raises(ValueError, match="the name 'Net' is taken"):
        registry.register(Other, 'Net')


def test_module_decorators_and_a_module_executed_again():
    @register_model(name='recipes_test_net')
    class Net(nn.Module):
        pass

    assert lookup('model', 'recipes_test_net') is Net

    @register_model(name='recipes_test_net')      # the same definition again (a file loaded twice): replaces it
    class Net(nn.Module):                           # noqa: F811
        pass

    assert lookup('model', 'recipes_test_net') is Net
    with pytest.raises(ValueError, match="the name 'EarlyStopping' is taken by aitoolbox_like.callbacks.basic"):
        @register_callback
        class EarlyStopping(AbstractCallback):       # noqa: F811  (a user callback named like a built-in one)
            pass


def test_the_core_does_not_import_the_recipes_package():
    import ast
    from pathlib import Path
    package = Path(__file__).resolve().parent.parent.parent / 'aitoolbox_like'
    offenders = []
    for path in package.rglob('*.py'):
        relative = path.relative_to(package)
        if relative.parts[0] in ('recipes', 'tuning', 'adapters') or relative.name == '__main__.py':
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [f'{"." * node.level}{node.module or ""}'] + [a.name for a in node.names] \
                if isinstance(node, ast.ImportFrom) else []
            if any(name.split('.')[-1] == 'recipes' or '.recipes' in name or name.startswith('recipes')
                   for name in names):
                offenders.append(f'{relative}:{node.lineno}')
    assert offenders == []
