"""The model contract the TrainLoop trains: how a batch becomes a loss and predictions."""
from __future__ import annotations

import functools
import logging
import sys
import types
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional, Protocol, cast

import torch
from torch import nn

logger = logging.getLogger(__name__)


def _to_device(data: Any, device: torch.device | str) -> Any:
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=True)
    if isinstance(data, (list, tuple)):
        return type(data)(_to_device(el, device) for el in data)
    if isinstance(data, dict):
        return {k: _to_device(v, device) for k, v in data.items()}
    move = getattr(data, 'to', None)
    if callable(move) and not isinstance(data, type):
        return move(device)     # AIToolbox calls .to(device) on whatever a batch holds (a user's batch class)
    return data


class TTModel(nn.Module, ABC):
    """An nn.Module that also says how to compute the loss and predictions of one batch."""

    @abstractmethod
    def get_loss(self, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """Return the training loss of one batch (a scalar tensor, or a MultiLoss)."""

    def get_loss_eval(self, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """Loss used for evaluation; the training loss unless a model needs something else."""
        return self.get_loss(batch_data, criterion, device)

    @abstractmethod
    def get_predictions(self, batch_data: Any, device: torch.device) -> tuple[Any, Any, dict[str, Any] | None]:
        """Return ``(y_pred, y_true, metadata)`` for one batch; metadata is a dict of lists or None."""

    # Optional: ``get_loss_and_predictions(batch_data, criterion, device) -> (loss, y_pred, y_true, metadata)``, what
    # get_loss_eval and get_predictions return for the batch, from one forward pass. A model that defines it is
    # evaluated in one pass where the loop needs both (the end-of-epoch validation loss and a metric's predictions);
    # TTBasicModel defines it. See one_pass_evaluation for when a subclass's own get_loss / get_predictions win.


def _inputs_to_device(inputs: Sequence[Any], device: torch.device | str) -> list[Any]:
    # The per-step path: plain tensors skip the generic recursion.
    return [x.to(device, non_blocking=True) if type(x) is torch.Tensor else _to_device(x, device) for x in inputs]


def _describe_batch(batch_data: Any) -> str:
    return ', '.join(f'tensor {tuple(x.shape)}' if isinstance(x, torch.Tensor) else type(x).__qualname__
                     for x in batch_data)


def _dict_batch_error(who: str, batch_data: Mapping[Any, Any]) -> TypeError:
    """The error for a dict batch (a Hugging Face model's) given to a model that splits a batch into
    ``(*inputs, target)``: iterating a dict gives its keys, which would reach ``forward`` as strings."""
    kind = type(batch_data).__qualname__
    return TypeError(f'{who} splits a batch into (*inputs, target), but this batch is a {kind} '
                     f'with the keys {sorted(map(str, batch_data))}: for a model called as model(**batch) that '
                     f'computes its own loss (a Hugging Face transformers model), use '
                     f'aitoolbox_like.model.huggingface.HFModelWrap(model) with criterion=None; for another model, a '
                     f'ModelWrap with a feed definition that unpacks the dict')


def _forward_inputs(model: Any, inputs: Sequence[Any], batch_data: Any) -> Any:
    """``model(*inputs)``, with a wrong number of batch elements for ``forward`` named as such (instead of a
    TypeError from deep inside torch's module call), and a dict batch named as one."""
    try:
        return model(*inputs)
    except Exception as error:
        if isinstance(batch_data, Mapping):
            raise _dict_batch_error(type(model).__qualname__, batch_data) from error
        if not isinstance(error, TypeError):
            raise
        explained = _batch_shape_error(error, inputs, batch_data)
        if explained is error:
            raise
        raise explained from error


def _batch_shape_error(error: TypeError, inputs: Sequence[Any], batch_data: Any) -> TypeError:
    """What a TypeError of ``forward(*inputs)`` means for a TTBasicModel: the batch's elements do not match
    ``forward`` (then said so), or anything else (``error`` itself)."""
    text = str(error)
    if 'forward()' not in text or not ('positional argument' in text or 'missing' in text):
        return error
    return TypeError(f'TTBasicModel feeds every element of a batch but the last to forward() and uses the last as '
                     f'the target. This batch held {len(batch_data)} elements ({_describe_batch(batch_data)}), so '
                     f'forward() was called with {len(inputs)} input(s) and failed: {text}. Make the data set '
                     f'return (inputs..., target) matching forward(), or subclass TTModel and write get_loss / '
                     f'get_predictions to use the batch as it is')


class TTBasicModel(TTModel):
    """A TTModel for the common case: the last element of the batch is the target and every other
    element is a positional input of ``forward``."""

    def get_loss(self, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """``criterion(self(*inputs), target)`` where the batch is ``(*inputs, target)``."""
        # The training step's path, written out: plain tensors move without the generic recursion (and without the
        # call to .to() when already there: prefetched to the GPU, or on the CPU), and the forward call is made here
        # rather than through _forward_inputs.
        *inputs, target = batch_data
        moved = [(x if x.device == device else x.to(device, non_blocking=True)) if type(x) is torch.Tensor
                 else _to_device(x, device) for x in inputs]
        try:
            predicted = self(*moved)
        except Exception as error:
            # Only when forward failed: a dict batch (a Hugging Face model's) or a batch that does not match
            # forward's arguments, named as such.
            if isinstance(batch_data, Mapping):
                raise _dict_batch_error(type(self).__qualname__, batch_data) from error
            if not isinstance(error, TypeError):
                raise
            explained = _batch_shape_error(error, moved, batch_data)
            if explained is error:
                raise
            raise explained from error
        if type(target) is torch.Tensor:
            target = target if target.device == device else target.to(device, non_blocking=True)
        else:
            target = _to_device(target, device)
        return criterion(predicted, target)

    def get_predictions(self, batch_data: Any, device: torch.device) -> tuple[Any, Any, dict[str, Any] | None]:
        """``(self(*inputs), target, {})`` where the batch is ``(*inputs, target)`` (a tensor output detached)."""
        *inputs, target = batch_data
        predicted = _forward_inputs(self, _inputs_to_device(inputs, device), batch_data)
        return (predicted.detach() if isinstance(predicted, torch.Tensor) else predicted), target, {}

    def get_loss_and_predictions(self, batch_data: Any, criterion: Any,
                                 device: torch.device) -> tuple[Any, Any, Any, dict[str, Any] | None]:
        """What ``get_loss_eval`` and ``get_predictions`` give for the batch, from one forward:
        ``(criterion(self(*inputs), target), self(*inputs), target, {})``."""
        *inputs, target = batch_data
        predicted = _forward_inputs(self, _inputs_to_device(inputs, device), batch_data)
        loss = criterion(predicted, _to_device(target, device))
        return loss, (predicted.detach() if isinstance(predicted, torch.Tensor) else predicted), target, {}


class TTBasicMultiGPUModel(TTBasicModel):
    """A TTBasicModel whose training loss is computed inside ``forward``.

    ``get_loss`` calls ``self(*inputs, targets=targets, criterion=criterion)``: every batch element but the
    last is an input, the last is the target. Computing the loss inside ``forward`` means each device of a
    multi-device wrapper returns only a scalar loss instead of its whole output (AIToolbox's reason for this
    class; with ``gpu_mode='ddp'`` it works the same and costs nothing extra). ``get_predictions`` calls
    ``self(*inputs)`` as TTBasicModel does.

    ``forward`` must accept the two keywords and end like::

        def forward(self, x, targets=None, criterion=None):
            predictions = self.net(x)
            if criterion is not None:
                return criterion(predictions, targets)
            return predictions
    """

    def get_loss(self, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """The loss computed by ``forward``: ``self(*inputs, targets=target, criterion=criterion)``.

        Raises:
            TypeError: the batch is a dict (a Hugging Face model's batch): the error names HFModelWrap.
        """
        if isinstance(batch_data, Mapping):
            raise _dict_batch_error(type(self).__qualname__, batch_data)
        *inputs, target = batch_data
        return self(*_inputs_to_device(inputs, device), targets=_to_device(target, device), criterion=criterion)


class MultiGPUModelWrap(TTBasicMultiGPUModel):
    """Make a plain ``nn.Module`` (whose ``forward`` returns predictions) trainable by the TrainLoop without
    writing a TTModel: the batch is ``(*inputs, target)`` and the loss is ``criterion(model(*inputs), target)``,
    computed inside ``forward`` (see :class:`TTBasicMultiGPUModel`).

    Use it instead of ModelWrap when the model needs no feed definition. The wrapped model is
    ``self.model``, so saved state_dict keys start with ``model.`` (as in AIToolbox).

    Args:
        model: the network; any ``nn.Module`` (a TTModel too: only its ``forward`` is used).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f'MultiGPUModelWrap: model must be a torch.nn.Module, got {type(model).__qualname__}')
        self.model = model

    def forward(self, *input_data: Any, targets: Any = None, criterion: Any = None) -> Any:
        """The wrapped model's output on ``input_data``, or ``criterion(output, targets)`` when a criterion is
        given (the training loss)."""
        predictions = self.model(*input_data)
        if criterion is not None:
            return criterion(predictions, targets)
        return predictions


class AbstractModelFeedDefinition(ABC):
    """How a plain nn.Module is fed a batch, for models that cannot subclass TTModel."""

    @abstractmethod
    def get_loss(self, model: nn.Module, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """Return the training loss of ``model`` on one batch (a scalar tensor, or a MultiLoss)."""

    def get_loss_eval(self, model: nn.Module, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """Loss used for evaluation; the training loss unless the model needs something else."""
        return self.get_loss(model, batch_data, criterion, device)

    @abstractmethod
    def get_predictions(self, model: nn.Module, batch_data: Any,
                        device: torch.device) -> tuple[Any, Any, dict[str, Any] | None]:
        """Return ``(y_pred, y_true, metadata)`` of ``model`` for one batch; metadata is a dict or None."""

    # Optional, as on TTModel: ``get_loss_and_predictions(model, batch_data, criterion, device) -> (loss, y_pred,
    # y_true, metadata)`` from one forward pass, for one evaluation pass where the loop needs both.


class ModelWrap:
    """Adapt a plain nn.Module: ``ModelWrap(model, batch_model_feed_def)``; the TrainLoop trains
    ``model`` and asks ``batch_model_feed_def`` for losses and predictions."""

    def __init__(self, model: nn.Module, batch_model_feed_def: AbstractModelFeedDefinition) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f'ModelWrap: model must be a torch.nn.Module, got {type(model).__qualname__}')
        missing = [m for m in ('get_loss', 'get_predictions') if not callable(getattr(batch_model_feed_def, m, None))]
        if missing:
            raise TypeError(f'ModelWrap: batch_model_feed_def ({type(batch_model_feed_def).__qualname__}) has no '
                            f'{" or ".join(missing)}; subclass aitoolbox_like.model.AbstractModelFeedDefinition')
        self.model = model
        self.batch_model_feed_def = batch_model_feed_def


class BatchFeed(Protocol):
    """What the TrainLoop calls to turn a batch into a loss or predictions: a TTModel, or a ModelWrap's
    feed definition bound to its model."""

    def get_loss(self, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """The training loss of one batch."""

    def get_loss_eval(self, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """The evaluation loss of one batch."""

    def get_predictions(self, batch_data: Any, device: torch.device) -> tuple[Any, Any, dict[str, Any] | None]:
        """``(y_pred, y_true, metadata)`` of one batch."""


class _BoundFeedDefinition:
    """Gives a wrapped model the TTModel call shape so the loop has one code path."""

    def __init__(self, model: nn.Module, feed_def: AbstractModelFeedDefinition) -> None:
        self._model = model
        self._feed_def = feed_def

    def get_loss(self, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        return self._feed_def.get_loss(self._model, batch_data, criterion, device)

    def get_loss_eval(self, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        get_loss_eval = getattr(self._feed_def, 'get_loss_eval', None) or self._feed_def.get_loss
        return get_loss_eval(self._model, batch_data, criterion, device)

    def get_predictions(self, batch_data: Any, device: torch.device) -> tuple[Any, Any, dict[str, Any] | None]:
        return self._feed_def.get_predictions(self._model, batch_data, device)

    def one_pass_evaluation(self) -> OnePass | None:
        method = current_one_pass(type(self._feed_def))
        return None if method is None else functools.partial(method, self._feed_def, self._model)


#: ``(batch_data, criterion, device) -> (loss, y_pred, y_true, metadata)``: a feed's evaluation in one forward.
OnePass = Callable[[Any, Any, torch.device], tuple[Any, Any, Any, 'dict[str, Any] | None']]


def _defined_in(cls: type, name: str) -> type | None:
    return next((klass for klass in cls.__mro__ if name in vars(klass)), None)


def current_one_pass(cls: type) -> Any:
    """The ``get_loss_and_predictions`` function of ``cls`` when it still gives what the class's own evaluation
    methods give, else None: it must be defined in the class that defines ``get_loss_eval`` and
    ``get_predictions`` (and ``get_loss``, when ``get_loss_eval`` is the default that calls it), or below it. So a
    subclass of TTBasicModel that writes its own ``get_loss`` is evaluated with it, in two passes, until it also
    writes ``get_loss_and_predictions``."""
    combined = _defined_in(cls, 'get_loss_and_predictions')
    if combined is None:
        return None
    needed = ['get_predictions', 'get_loss_eval']
    eval_owner = _defined_in(cls, 'get_loss_eval')
    if eval_owner in (None, TTModel, AbstractModelFeedDefinition):     # the default get_loss_eval calls get_loss
        needed.append('get_loss')
    for name in needed:
        owner = _defined_in(cls, name)
        if owner is not None and not issubclass(combined, owner):
            return None
    return vars(combined)['get_loss_and_predictions']


def one_pass_evaluation(feed: Any) -> OnePass | None:
    """How ``feed`` (what the loop turns batches into losses and predictions with) gives the evaluation loss and the
    predictions of a batch from one forward pass, or None when it cannot (the loop then makes two passes): a
    TTModel's ``get_loss_and_predictions`` (see :func:`current_one_pass`), the feed definition's for a ModelWrap;
    the loop's own wrappers (compiled, DDP, DataParallel) answer for what they wrap."""
    if isinstance(feed, TTModel):
        method = current_one_pass(type(feed))
        return None if method is None else types.MethodType(method, feed)
    wrapped = getattr(feed, 'one_pass_evaluation', None)
    if callable(wrapped):
        return cast(Optional[OnePass], wrapped())
    method = current_one_pass(type(feed))
    return None if method is None else types.MethodType(method, feed)


FEED_METHODS = ('get_loss', 'get_loss_eval', 'get_predictions')


def compiled_original(model: Any) -> nn.Module | None:
    """The module ``torch.compile`` wrapped when ``model`` is what ``torch.compile(module)`` returned (an
    ``OptimizedModule``); None for anything else."""
    # torch has no public name for the class nor for the wrapped module. If torch._dynamo was never imported,
    # nothing was compiled (and reading sys.modules keeps this check from importing it).
    eval_frame = sys.modules.get('torch._dynamo.eval_frame')
    optimized_module = getattr(eval_frame, 'OptimizedModule', None)
    if optimized_module is None or not isinstance(model, optimized_module):
        return None
    # The wrapped module is the OptimizedModule's one child, registered as '_orig_mod' (the name torch documents
    # for it in torch.compile's state_dict keys); read through the public get_submodule.
    return model.get_submodule('_orig_mod')


class CompiledFeed:
    """The feed of a ``torch.compile``'d model: the TTModel's (or ModelWrap feed definition's) methods run with
    the compiled module in place of the model, so ``self(x)`` inside ``get_loss`` / ``get_predictions`` goes
    through the compiled forward. Attribute reads and writes on the compiled module reach the original one
    (``OptimizedModule`` forwards them), so the model's methods see their own attributes. As with the parallel
    wrappers (parallel.TTParallelBase), ``self`` is not an instance of the model's class there, so these methods
    should not call ``super()``; other methods they call through ``self`` run on the original module, whose
    forward is not compiled.

    Args:
        original: the module that was compiled (the one the loop trains and saves).
        compiled_module: ``torch.compile(original)``.
        feed_def: a ModelWrap's feed definition, or None for a TTModel.
    """

    def __init__(self, original: nn.Module, compiled_module: nn.Module,
                 feed_def: AbstractModelFeedDefinition | None = None) -> None:
        self.original = original
        self.compiled_module = compiled_module
        self.feed_def = feed_def
        self._feed: BatchFeed
        if feed_def is not None:
            self._feed = _BoundFeedDefinition(compiled_module, feed_def)
            return
        methods: dict[str, Any] = {}
        for name in FEED_METHODS:
            method = getattr(type(original), name, None)
            if name == 'get_loss_eval' and method is TTModel.get_loss_eval:
                # TTModel's default calls self.get_loss, which the compiled module resolves to the original's.
                methods[name] = methods['get_loss']
                continue
            if isinstance(method, types.FunctionType):
                methods[name] = types.MethodType(method, compiled_module)
            else:       # not a plain method (rare): the model's own, whose forward then runs uncompiled
                logger.warning('%s.%s is not a plain method; it runs on the uncompiled model',
                               type(original).__qualname__, name)
                methods[name] = getattr(original, name)
        self._feed = cast(BatchFeed, types.SimpleNamespace(**methods))

    def get_loss(self, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """The training loss, computed through the compiled module."""
        return self._feed.get_loss(batch_data, criterion, device)

    def get_loss_eval(self, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """The evaluation loss, computed through the compiled module."""
        return self._feed.get_loss_eval(batch_data, criterion, device)

    def get_predictions(self, batch_data: Any, device: torch.device) -> tuple[Any, Any, dict[str, Any] | None]:
        """``(y_pred, y_true, metadata)`` of one batch, computed through the compiled module."""
        return self._feed.get_predictions(batch_data, device)

    def one_pass_evaluation(self) -> OnePass | None:
        """The model's (or feed definition's) one-pass evaluation, through the compiled module."""
        if self.feed_def is not None:
            method = current_one_pass(type(self.feed_def))
            return None if method is None else functools.partial(method, self.feed_def, self.compiled_module)
        method = current_one_pass(type(self.original))
        return None if method is None else types.MethodType(method, self.compiled_module)


def resolve_model(model: Any, compile_options: dict[str, Any] | None = None) -> tuple[nn.Module, BatchFeed]:
    """Return ``(nn.Module to train, object with get_loss/get_loss_eval/get_predictions)``.

    A ``torch.compile``'d model (``torch.compile(tt_model)``, or a ModelWrap of a compiled module) is unwrapped:
    the module returned is the original, so its state_dict keys have no ``_orig_mod.`` prefix, and the feed
    (a :class:`CompiledFeed`) runs the forward passes through the compiled module. With ``compile_options`` (a
    dict of ``torch.compile`` keyword arguments) a model that is not compiled yet is compiled here.
    """
    feed_def = model.batch_model_feed_def if isinstance(model, ModelWrap) else None
    candidate = model.model if isinstance(model, ModelWrap) else model
    original = compiled_original(candidate)
    if original is not None:
        if compile_options is not None:
            logger.warning('the model is already torch.compile\'d; the TrainLoop\'s compile options %s are not '
                           'applied', compile_options)
        compiled = candidate
    elif compile_options is not None:
        original, compiled = None, None
        if isinstance(candidate, nn.Module):
            original, compiled = candidate, torch.compile(candidate, **compile_options)
    else:
        compiled = None
    if original is None or compiled is None:
        return _resolve_plain(model)
    module, _ = _resolve_plain(ModelWrap(original, feed_def) if feed_def is not None else original)
    return module, CompiledFeed(original, compiled, feed_def)


def _resolve_plain(model: Any) -> tuple[nn.Module, BatchFeed]:
    if isinstance(model, ModelWrap):
        return model.model, _BoundFeedDefinition(model.model, model.batch_model_feed_def)
    if isinstance(model, TTModel):
        return model, model
    if isinstance(model, nn.Module) and all(callable(getattr(model, m, None)) for m in ('get_loss', 'get_predictions')):
        # A module with the TTModel methods without subclassing it: AIToolbox's TTDataParallel(model) wrapper.
        return model, cast(BatchFeed, model)
    name = type(model).__qualname__
    if isinstance(model, nn.Module):
        # Constructed freely: a callback may own the step and the evaluation's forward (Orca's MainCallback);
        # otherwise the loop says what is missing when it first needs a loss (fit checks it before the first step).
        return model, PlainModuleFeed(model)
    raise TypeError(f'model must be a TTModel, TTBasicModel or ModelWrap, got {name}')


class PlainModuleFeed:
    """The feed of a plain ``torch.nn.Module`` (no TTModel methods, no ModelWrap): nothing says how a batch becomes
    a loss, so each method raises the TypeError naming the ways to say it. A callback that owns the training step
    and gives the evaluation its feed (``loop.evaluation.feed``: Orca's MainCallback) trains such a model."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def error(self) -> TypeError:
        """What to do about it."""
        return TypeError(f'model is a plain torch.nn.Module ({type(self.model).__qualname__}); the TrainLoop needs to '
                         f'know how to get a loss from a batch: subclass aitoolbox_like.TTModel (define get_loss and '
                         f'get_predictions), subclass aitoolbox_like.TTBasicModel (the last batch element is the '
                         f'target), wrap it with aitoolbox_like.ModelWrap(model, feed_definition), or give fit a '
                         f'callback that computes the loss (BigDL Orca\'s MainCallback: '
                         f'aitoolbox_like.adapters.orca.MainCallback)')

    def get_loss(self, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """Raises :meth:`error`."""
        raise self.error()

    def get_loss_eval(self, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """Raises :meth:`error`."""
        raise self.error()

    def get_predictions(self, batch_data: Any, device: torch.device) -> tuple[Any, Any, dict[str, Any] | None]:
        """Raises :meth:`error`."""
        raise self.error()
