"""SG's ``Trainer.train`` as far as callbacks see it, over ``TrainLoop.fit``.

What SG's trainer does before its epochs (super_gradients/training/sg_trainer/sg_trainer.py, ``train``), in its
order: the training params over SG's defaults; the user's ``phase_callbacks``; the warm-up callback of
``warmup_mode`` built from the training params; ``MetricsUpdateCallback`` at the training, validation and test
batch ends; the LR callback of ``lr_mode`` built by SG's own ``create_lr_scheduler_callback``; an SGD optimizer
whose one parameter group SG names ``'default'``; and a context holding the training params. Then the epochs:
here ``TrainLoop.fit``, which drives the SG callbacks through the adapter.
"""
import ast
from typing import Any, Callable, Dict, List, Optional

import torch

from aitoolbox_like import TrainLoop

from . import stand_ins


def sg_default_training_params(sources: Dict[str, str]) -> Dict[str, Any]:
    """SG's DEFAULT_TRAINING_PARAMS, read from the wheel's training/params.py (a literal dict)."""
    tree = ast.parse(sources['super_gradients/training/params.py'])
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, 'id', None) == 'DEFAULT_TRAINING_PARAMS'
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError('DEFAULT_TRAINING_PARAMS not found in the wheel')


class AttributeDict(dict):
    """SG's training params for an adapter without its own ``TrainingParams`` (attribute and dict access)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_dict(self) -> Dict[str, Any]:
        return dict(self)


class Trainer:
    """Builds and runs SG callbacks as SG's trainer does, on a TrainLoop.

    Args:
        sg: the rewritten SG callback modules (``sg.callbacks``: SG's callbacks.py).
        adapter: the adapter module under check.
        defaults: SG's default training params.
    """

    def __init__(self, sg: Any, adapter: Any, defaults: Dict[str, Any]) -> None:
        self.sg = sg
        self.adapter = adapter
        self.defaults = defaults
        self.params_class = getattr(adapter, 'TrainingParams', None) or AttributeDict

    def training_params(self, params: Dict[str, Any]) -> Any:
        return self.params_class({**self.defaults, **params})

    def build(self, params: Dict[str, Any], model: torch.nn.Module, train_loader: Any) -> Dict[str, Any]:
        """The optimizer and the callback list of SG's trainer for ``params``."""
        sg, adapter = self.sg.callbacks, self.adapter
        training_params = self.training_params(params)
        optimizer_params = dict(training_params.optimizer_params)
        optimizer = torch.optim.SGD([{'params': list(model.parameters()), 'name': 'default'}],
                                    lr=training_params.initial_lr, **optimizer_params)
        callbacks: List[Any] = [self.context_filler(training_params)]
        callbacks += list(training_params.phase_callbacks or [])
        warmup = training_params.warmup_mode
        if isinstance(warmup, str):
            warmup = stand_ins.LR_WARMUP_CLS_DICT[warmup]
        if warmup is None:
            raise RuntimeError('warmup_mode has to be either a name of a mode (str) or a subclass of PhaseCallback')
        callbacks.append(warmup(train_loader_len=len(train_loader), net=model, training_params=training_params,
                                update_param_groups=False, **training_params.to_dict()))
        metrics_update = getattr(sg, 'MetricsUpdateCallback')
        callbacks += [metrics_update(adapter.Phase.TRAIN_BATCH_END), metrics_update(adapter.Phase.VALIDATION_BATCH_END),
                      metrics_update(adapter.Phase.TEST_BATCH_END)]
        if training_params.lr_mode is not None:
            callbacks.append(sg.create_lr_scheduler_callback(
                lr_mode=training_params.lr_mode, train_loader=train_loader, net=model,
                training_params=training_params, update_param_groups=False, optimizer=optimizer))
        return {'optimizer': optimizer, 'callbacks': callbacks, 'training_params': training_params}

    def context_filler(self, training_params: Any) -> Any:
        """An SG callback giving the run's context SG's training params, as SG's trainer builds its context."""
        class TrainerContext(self.adapter.Callback):
            def on_training_start(self, context: Any) -> None:
                context.update_context(training_params=training_params,
                                       lr_warmup_epochs=training_params.lr_warmup_epochs)
        return TrainerContext()

    def train(self, params: Dict[str, Any], model: torch.nn.Module, criterion: Any, train_loader: Any,
              valid_loader: Any, test_loader: Any = None, watch: Optional[Callable[[List[Any]], None]] = None,
              on_loop: Optional[Callable[[TrainLoop], None]] = None) -> 'Run':
        """Build as SG's trainer builds, then ``TrainLoop.fit(num_epochs=max_epochs)``."""
        built = self.build(params, model, train_loader)
        return self.fit(built, model, criterion, train_loader, valid_loader, test_loader, watch, on_loop)

    @staticmethod
    def fit(built: Dict[str, Any], model: torch.nn.Module, criterion: Any, train_loader: Any, valid_loader: Any,
            test_loader: Any = None, watch: Optional[Callable[[List[Any]], None]] = None,
            on_loop: Optional[Callable[[TrainLoop], None]] = None) -> 'Run':
        """Fit what ``build`` built: ``watch`` sees the callbacks, ``on_loop`` the loop, before the fit."""
        if watch is not None:
            watch(built['callbacks'])
        loop = TrainLoop(model, train_loader, valid_loader, test_loader, built['optimizer'], criterion,
                         progress_bar=False)
        if on_loop is not None:
            on_loop(loop)
        run = Run(loop, built['callbacks'])
        run.fit(built['training_params'].max_epochs)
        return run


class Run:
    """A TrainLoop with SG's callbacks; ``fit(n)`` trains until ``n`` epochs are done (a second call continues the
    run: SG's resume, as the loop does it in one process)."""

    def __init__(self, loop: TrainLoop, callbacks: List[Any]) -> None:
        self.loop = loop
        self.callbacks = callbacks

    def fit(self, num_epochs: int) -> None:
        self.loop.fit(num_epochs=num_epochs, callbacks=self.callbacks)

    @property
    def lr(self) -> float:
        return float(self.loop.optimizer.param_groups[0]['lr'])


class ParamsTrainer:
    """The same runs through the adapter's own ``TrainingParamsCallback``: what a user moving an SG setup over does
    (the TrainLoop's plain SGD optimizer, its one parameter group unnamed; the training params in one callback;
    ``fit(num_epochs=max_epochs)``). The warm-ups and schedules are then the adapter's, checked against the same
    numbers of SG's tests as SG's own classes.

    Args:
        adapter: the adapter module under check.
    """

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter

    def train(self, params: Dict[str, Any], model: torch.nn.Module, criterion: Any, train_loader: Any,
              valid_loader: Any, test_loader: Any = None, watch: Optional[Callable[[List[Any]], None]] = None,
              on_loop: Optional[Callable[[TrainLoop], None]] = None) -> 'Run':
        """``TrainLoop.fit(num_epochs=max_epochs, callbacks=[TrainingParamsCallback(params)])``."""
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5, **dict(params.get('optimizer_params') or {}))
        setup = self.adapter.TrainingParamsCallback(params)
        if watch is not None:
            watch(list(params.get('phase_callbacks') or []))
        loop = TrainLoop(model, train_loader, valid_loader, test_loader, optimizer, criterion, progress_bar=False)
        if on_loop is not None:
            on_loop(loop)
        run = ParamsRun(loop, [setup])
        run.fit(setup.training_params.max_epochs)
        return run


class ParamsRun(Run):
    """A run through ``TrainingParamsCallback``: continuing it to ``n`` epochs sets ``max_epochs`` to ``n`` first, as
    SG's resume test trains again with a larger ``max_epochs``."""

    def fit(self, num_epochs: int) -> None:
        self.callbacks[0].training_params.max_epochs = num_epochs
        self.loop.fit(num_epochs=num_epochs, callbacks=self.callbacks)
