"""The loop's mistakes named with their fix, in one place, called only where something is wrong or about to be.

- What fit checks before it trains: unknown keyword arguments (with the closest accepted name), and the pieces fit
  is about to use (loaders, criterion, optimizer, precision). Construction accepts None pieces (AIToolbox code
  builds loops that way), so these checks run at the start of fit.
- What a failed training step meant (:func:`explain_step_failure`), and a loss that is not a tensor
  (:func:`loss_to_record`): the step calls them only when it failed or its loss is unusual, so they cost nothing
  per step.
"""
import difflib
import functools
import inspect
import numbers
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, ParamSpec

import torch

from ..model.feeds import PlainModuleFeed, TTBasicModel
from .callback import AbstractCallback

if TYPE_CHECKING:
    from .train_loop import TrainLoop

P = ParamSpec('P')


def launcher_parameters(launcher: Callable[..., Any]) -> List[str]:
    """The keyword arguments a distributed launcher (distributed.launch.fit_ddp / fit_fsdp) takes besides fit's own."""
    skip = {'train_loop_obj', 'num_epochs', 'num_iterations', 'callbacks', 'grad_accumulation'}
    return [name for name in inspect.signature(launcher).parameters if name not in skip and not name.startswith('_')]


# Where each is imported from, for the messages (the engine itself imports none of them).
_PTA_ADAPTER = 'from aitoolbox_like.adapters.pytorch_accelerated'
_SG_ADAPTER = 'from aitoolbox_like.adapters.supergradients'
_ORCA_ADAPTER = 'from aitoolbox_like.adapters.orca'
_LOADER = ("the data and the batch size are the DataLoaders' (DataLoader(dataset, batch_size=..., shuffle=True) "
           "given to TrainLoop(model, train_loader, validation_loader, ...))")

#: Keyword arguments of other libraries' trainers given to fit, and where each belongs here.
FOREIGN_FIT_KEYWORDS: Dict[str, str] = {
    'create_scheduler_fn': f"pytorch-accelerated's scheduler factory is AcceleratedCallbacks' argument: "
                           f"fit(callbacks=[AcceleratedCallbacks(create_scheduler_fn=...), ...]) ({_PTA_ADAPTER})",
    'per_device_batch_size': f"pytorch-accelerated's per_device_batch_size: {_LOADER}",
    'train_dataset': f"pytorch-accelerated's train_dataset: {_LOADER}",
    'eval_dataset': f"pytorch-accelerated's eval_dataset: {_LOADER}",
    'train_dataloader_kwargs': f"pytorch-accelerated's train_dataloader_kwargs: {_LOADER}",
    'eval_dataloader_kwargs': f"pytorch-accelerated's eval_dataloader_kwargs: {_LOADER}",
    'collate_fn': "the collate function is the DataLoader's: DataLoader(dataset, collate_fn=...)",
    'gradient_accumulation_steps': "pytorch-accelerated's gradient_accumulation_steps is fit(grad_accumulation=...)",
    'max_num_train_steps': "pytorch-accelerated's max_num_train_steps is fit(num_iterations=...) (in batches)",
    'gradient_clip_value': "gradient clipping is a callback: fit(callbacks=[GradValueClip(max_grad_value)]) "
                           "(aitoolbox_like.callbacks.gradient)",
    'reset_run_history': "pytorch-accelerated's run history starts anew at every fit (a resumed fit continues it)",
    'training_params': f"SuperGradients' training_params go to TrainingParamsCallback: "
                       f"fit(num_epochs=training_params['max_epochs'], callbacks=[TrainingParamsCallback("
                       f"training_params), ...]) ({_SG_ADAPTER})",
    'data': f"Orca's fit(data=..., epochs=..., batch_size=...) is Estimator's: Estimator.from_torch(model=..., "
            f"optimizer=..., loss=...).fit(data=..., epochs=...) ({_ORCA_ADAPTER}); TrainLoop.fit trains the loaders "
            f"the TrainLoop was given",
    'validation_data': f"Orca's validation_data is Estimator.fit's ({_ORCA_ADAPTER}); TrainLoop validates on its "
                       f"validation_loader",
    'max_steps': f"Orca's max_steps is Estimator.fit's ({_ORCA_ADAPTER}); TrainLoop.fit(num_iterations=...) counts "
                 f"batches",
}

#: Keyword arguments of other libraries' trainer constructors given to TrainLoop, and where each belongs.
FOREIGN_INIT_KEYWORDS: Dict[str, str] = {
    'callbacks': "callbacks are fit's: loop.fit(num_epochs=..., callbacks=[...]) (pytorch-accelerated's "
                 "Trainer(callbacks=...) and SuperGradients' phase_callbacks included)",
    'loss_func': "pytorch-accelerated's loss_func is the criterion: TrainLoop(model, train_loader, validation_loader, "
                 "test_loader, optimizer, criterion)",
    'run_history': "pytorch-accelerated's run history is the PTA callbacks' trainer.run_history; the loop's is "
                   "loop.train_history",
}

#: Methods of other libraries' trainers called on a TrainLoop, and what they are here.
FOREIGN_METHODS: Dict[str, str] = {
    'train': "TrainLoop trains with fit(num_epochs=..., callbacks=[...]) over the loaders it was given "
             "(pytorch-accelerated's Trainer.train(train_dataset, num_epochs, eval_dataset, per_device_batch_size, "
             "create_scheduler_fn): " + _LOADER + f"; create_scheduler_fn goes to AcceleratedCallbacks, {_PTA_ADAPTER})",
    'evaluate': "TrainLoop evaluates with evaluate_loss_on_validation_set() / evaluate_loss_on_test_set(), "
                "predict_on_validation_set(), or evaluate_model_loss(loader) for any loader (pytorch-accelerated's "
                "Trainer.evaluate(dataset))",
}


def foreign_method_error(owner: str, name: str) -> AttributeError:
    """The AttributeError for ``name`` missing on a TrainLoop: what it is here when another library's trainer
    has it (:data:`FOREIGN_METHODS`)."""
    hint = FOREIGN_METHODS.get(name)
    if hint is None:
        return AttributeError(f'{owner!r} object has no attribute {name!r}')
    return AttributeError(f'{owner!r} object has no attribute {name!r}: {hint}')


class ForeignMethod:
    """A class attribute standing for another library's trainer method the loop does not have
    (:data:`FOREIGN_METHODS`): reading it raises the AttributeError that says what it is here. A descriptor, not a
    ``__getattr__`` on the loop: a class with ``__getattr__`` makes every attribute read of its instances about four
    times slower in CPython 3.11 (its reads are no longer specialized), and the step reads the loop's attributes."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: Optional[type] = None) -> Any:
        raise foreign_method_error(owner.__name__ if owner is not None else type(obj).__name__, self.name)


def names_foreign_keywords(init: Callable[P, None]) -> Callable[P, None]:
    """Wrap a loop's ``__init__`` so that a keyword another library's trainer takes and the loop does not
    (:data:`FOREIGN_INIT_KEYWORDS`) is refused by name, with where it belongs; the signature seen by ``inspect``
    (and by the tracking loops, the recipes and the docs' checks) stays ``init``'s."""
    own = set(inspect.signature(init).parameters)

    @functools.wraps(init)
    def checked(*args: P.args, **kwargs: P.kwargs) -> None:
        foreign = [name for name in kwargs if name in FOREIGN_INIT_KEYWORDS and name not in own]
        if foreign:
            owner = type(args[0]).__name__ if args else 'TrainLoop'
            raise TypeError(f'{owner}() got unexpected keyword argument(s) ' + '; '.join(
                f'{name!r}: {FOREIGN_INIT_KEYWORDS[name]}' for name in foreign))
        init(*args, **kwargs)
    return checked


def check_fit_keywords(loop: 'TrainLoop', kwargs: Dict[str, Any]) -> None:
    """Unknown keyword arguments first (a misspelt ``epochs=1`` must not be reported as a missing num_epochs),
    each with the closest accepted name, or where it belongs when another library's trainer takes it; then the
    callbacks a distributed fit builds its data with."""
    if not kwargs:
        return
    from .launch import fit_ddp, fit_fsdp      # the launchers' own signatures say what they accept
    own = ['num_epochs', 'num_iterations', 'callbacks', 'grad_accumulation', 'resume_from']
    by_mode = {'ddp': launcher_parameters(fit_ddp), 'fsdp': launcher_parameters(fit_fsdp),
               'dp': ['dp_model_args'], 'single': []}
    accepted = own + by_mode.get(loop.gpu_mode, [])
    anywhere = set(accepted).union(*by_mode.values())
    unknown = [name for name in kwargs if name not in anywhere]
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, accepted, n=1, cutoff=0.6)
            if name in FOREIGN_FIT_KEYWORDS:
                hints.append(f'{name!r} ({FOREIGN_FIT_KEYWORDS[name]})')
            else:
                hints.append(f'{name!r} (did you mean {close[0]!r}?)' if close else repr(name))
        raise TypeError(f'fit() got unexpected keyword argument(s) {", ".join(hints)}; fit accepts '
                        f'{", ".join(accepted)}')
    elsewhere = sorted(name for name in kwargs if name not in accepted)
    if elsewhere:
        modes = sorted({mode for mode, names in by_mode.items() for name in elsewhere if name in names})
        raise TypeError(f'fit() got unexpected arguments {elsewhere}; these are only accepted with '
                        f'gpu_mode={" or ".join(repr(m) for m in modes)} (this TrainLoop has '
                        f'gpu_mode={loop.gpu_mode!r})')
    data_load = kwargs.get('in_process_data_load')
    if data_load is not None and not isinstance(data_load, AbstractCallback) and not (
            isinstance(data_load, (list, tuple)) and all(isinstance(cb, AbstractCallback) for cb in data_load)):
        raise TypeError(f'in_process_data_load must be a callback (e.g. InMultiProcessDataLoad(...)) or a list of '
                        f'them, got {type(data_load).__qualname__}')


def check_fit_inputs(loop: 'TrainLoop', amp_unavailable: Optional[str], final: bool,
                 need_train_loader: bool = False) -> None:
    """What fit is about to use, checked before the first step so that a mistake never costs an epoch.
    Construction accepts None pieces (AIToolbox code builds loops that way), so the checks live here.
    ``final`` is the last check before the first batch: pieces a callback could still have set
    (the optimizer) must exist by then."""
    for name in ('train_loader', 'validation_loader', 'test_loader'):
        loader = getattr(loop, name)
        if isinstance(loader, torch.Tensor):
            # A tensor iterates row by row, so training would feed single samples to the model and fail there.
            raise TypeError(f'{name} is a torch.Tensor of shape {tuple(loader.shape)}, not a loader of batches: '
                            f'wrap the inputs and targets, e.g. DataLoader(TensorDataset(x, y), batch_size=32)')
        if loader is not None and (not hasattr(loader, '__iter__') or isinstance(loader, (str, bytes))):
            raise TypeError(f'{name} must be an iterable of batches (e.g. a torch DataLoader) or None, got '
                            f'{type(loader).__qualname__}: TrainLoop(model, train_loader, validation_loader, '
                            f'test_loader, optimizer, criterion)')
    criterion = loop.criterion
    if isinstance(criterion, type):
        # Called on the predictions, a loss class would build a module from them and fail deep in torch
        # ("Boolean value of Tensor with more than one value is ambiguous").
        raise TypeError(f'criterion is the class {criterion.__qualname__}, not a loss: pass an instance, e.g. '
                        f'{criterion.__qualname__}() (note the parentheses)')
    if amp_unavailable is not None:
        raise ValueError(amp_unavailable)
    feed = loop.batch_feed
    if final and isinstance(getattr(feed, 'plain_feed', feed), PlainModuleFeed) and loop.train_step_owner is None:
        raise PlainModuleFeed(loop.model).error()
    if need_train_loader and loop.train_loader is None:
        raise ValueError("fit() needs a train_loader, but the TrainLoop was given train_loader=None: pass a "
                         "DataLoader as the TrainLoop's second argument (with gpu_mode='ddp' it may instead be "
                         "built in each process: fit(..., in_process_data_load=InMultiProcessDataLoad(...)))")
    if final and loop.criterion is None and isinstance(loop.model, TTBasicModel) \
            and type(loop.model).get_loss is TTBasicModel.get_loss:
        raise ValueError(f'{type(loop.model).__qualname__} is a TTBasicModel, whose get_loss calls the criterion, '
                         f'but the TrainLoop has criterion=None: pass one as the sixth argument (e.g. '
                         f'nn.CrossEntropyLoss())')
    optimizer = loop.optimizer
    if optimizer is None:
        if final:
            raise ValueError('fit() needs an optimizer, but the TrainLoop has optimizer=None: pass one as the '
                             "TrainLoop's fifth argument, e.g. torch.optim.SGD(model.parameters(), lr=0.1), or set "
                             'train_loop_obj.optimizer from a callback before training starts '
                             '(on_train_loop_registration or on_train_begin)')
        return
    if isinstance(optimizer, type):
        raise TypeError(f'optimizer is the class {optimizer.__qualname__}, not an optimizer: pass an instance, '
                        f'e.g. {optimizer.__qualname__}(model.parameters(), lr=...)')
    missing = [m for m in ('step', 'zero_grad') if not callable(getattr(optimizer, m, None))]
    if missing:
        raise TypeError(f'optimizer ({type(optimizer).__qualname__}) has no {" or ".join(missing)}(); pass a '
                        f'torch.optim optimizer or aitoolbox_like.MultiOptimizer([...])')
    own = {id(p) for p in loop.model.parameters()}
    held = [id(p) for o in loop.optimizers for g in getattr(o, 'param_groups', ()) for p in g['params']]
    if own and held and not own.intersection(held):
        raise ValueError(f'the optimizer ({type(optimizer).__qualname__}) holds none of the model\'s parameters: '
                         f'it was built for another model (or a copy); build it from this one, e.g. '
                         f'torch.optim.SGD(model.parameters(), lr=...)')


def explain_step_failure(error: Exception, loop: 'TrainLoop') -> Optional[Exception]:
    """The error a user should see when the standard training step failed with ``error``: a common mistake in the
    model's get_loss named with its fix (its ``__cause__`` is ``error``), or None when ``error`` says it best.
    ``loop.loss`` is the loss get_loss returned (or one from an earlier step when get_loss itself failed)."""
    loss, name = loop.loss, loss_function_name(loop)
    explained: Optional[Exception] = None
    if isinstance(error, TypeError) and loop.criterion is None and "'NoneType' object is not callable" in str(error):
        explained = TypeError(f'{name} called the criterion, but the TrainLoop has criterion=None: pass one as the '
                              f'TrainLoop\'s sixth argument (e.g. nn.CrossEntropyLoss())')
    elif isinstance(error, RuntimeError) and isinstance(loss, torch.Tensor):
        if loss.dim() > 0 and loss.numel() != 1:
            explained = ValueError(f'{name} returned a loss of shape {tuple(loss.shape)}; return a scalar (e.g. '
                                   f'criterion with reduction=\'mean\', or loss.mean())')
        elif not loss.requires_grad and torch.is_grad_enabled():
            explained = RuntimeError(f'{name} returned a loss that is not connected to the parameters (it does not '
                                     f'require grad), so backward() cannot reach them: return the loss tensor itself, '
                                     f'not loss.detach() or a tensor built from loss.item(), and compute it outside '
                                     f'torch.no_grad()')
    if explained is not None:
        explained.__cause__ = error
    return explained


def loss_to_record(loss: Any, loop: 'TrainLoop', from_custom_step: bool = False) -> Any:
    """What the epoch's mean loss is computed from, for a loss that is not a tensor: a MultiLoss or a duck-typed
    loss detached, else its number (read now: AIToolbox users return objects that only support backward()), or None
    when it has none. The standard step cannot backpropagate None or a Python number: a TypeError says what to
    return instead (a custom ``train_step`` did its own backward, so its number is recorded)."""
    try:
        return loss.detach()
    except AttributeError:
        if from_custom_step:
            pass
        elif loss is None:
            raise TypeError(f'{loss_function_name(loop)} returned None; it must return the loss tensor, e.g. '
                            f'"return criterion(self(x), y)" (is its return statement missing?)') from None
        if isinstance(loss, numbers.Number):
            raise TypeError(f'{loss_function_name(loop)} returned the Python number {loss!r}; return the loss '
                            f'tensor itself (not loss.item()), so that backward() can reach the parameters') from None
    return loss_value(loss)


def loss_value(loss: Any) -> Optional[float]:
    """The number of a loss object that is not a tensor, or None when it cannot be read. Reading it syncs with the
    device, but only for such losses."""
    for read in (lambda: loss.item(), lambda: float(loss)):
        try:
            return float(read())
        except (AttributeError, TypeError, ValueError):
            continue
    return None


def loss_function_name(loop: 'TrainLoop') -> str:
    """``Model.get_loss`` (or ``FeedDefinition.get_loss`` for a ModelWrap), as the messages name it."""
    feed_def = loop.batch_model_feed_def
    owner = feed_def if feed_def is not None else loop.model
    return f'{type(owner).__qualname__}.get_loss'
