"""TTModel-aware parallel wrappers (AIToolbox's ``torchtrain.parallel``).

A DistributedDataParallel wrapper hides the TTModel's ``get_loss`` / ``get_predictions`` and attributes behind
``.module``; :class:`TTParallelBase` puts them back on the wrapper, so code written against the TTModel
(``model.get_loss(...)``, ``model.some_attribute``) works on the wrapped model and its forward calls go through
the wrapper (for DDP: the gradient all-reduce). A DDP fit's loop trains through :class:`DDPFeed` and skips the
gradient all-reduce of accumulation micro-batches with :func:`skip_grad_sync`.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import types
from typing import TYPE_CHECKING, Any, ContextManager, Sequence, cast

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..model.feeds import current_one_pass, one_pass_evaluation

if TYPE_CHECKING:
    from ..model.feeds import AbstractModelFeedDefinition, BatchFeed, OnePass

logger = logging.getLogger(__name__)

DEFAULT_MODEL_METHODS = ('get_loss', 'get_loss_eval', 'get_predictions')


def _wrapped_module(wrapper: Any) -> Any:
    # Read through __dict__: this runs inside __getattr__, where a normal attribute read could recurse
    # (e.g. while a half-built object is unpickled or deep-copied).
    state = wrapper.__dict__
    modules = state.get('_modules')
    if modules is not None and 'module' in modules:
        return modules['module']
    return state.get('module')


class TTParallelBase:
    """Mixin for a parallel wrapper (an object whose ``module`` is the TTModel) that exposes the TTModel's API.

    - ``get_loss`` / ``get_loss_eval`` / ``get_predictions`` run the TTModel's own methods with ``self`` being
      the wrapper, so ``self(x)`` inside them goes through the wrapper's forward.
    - Any other attribute not found on the wrapper is looked up on the wrapped model at access time: its
      plain attributes and sub-modules as they are now, its other methods bound to the wrapper (so a helper
      method calling ``self(x)`` also goes through the wrapper).

    Because the look-up is live, AIToolbox's ``transfer_model_attributes`` list is not needed: every model
    attribute is reachable, and none is a stale copy.

    Args:
        module: the wrapped TTModel.
        default_model_methods: the TTModel methods the wrapper runs on itself (AIToolbox's argument; the
            default covers the loop's three).
    """

    def __init__(self, module: nn.Module, default_model_methods: Sequence[str] = DEFAULT_MODEL_METHODS) -> None:
        self.default_model_methods = tuple(default_model_methods)

    def _model_method(self, name: str) -> types.MethodType:
        module = _wrapped_module(self)
        method = getattr(type(module), name, None)
        if not isinstance(method, types.FunctionType):
            raise AttributeError(f'{type(self).__name__}: the wrapped model ({type(module).__qualname__}) has no '
                                 f'method {name}(); wrap a TTModel (or use ModelWrap, whose feed definition the '
                                 f'TrainLoop calls with the wrapper)')
        return types.MethodType(method, self)

    def get_loss(self, batch_data: Any, criterion: Any, device: Any) -> Any:
        """The wrapped TTModel's ``get_loss`` with the forward going through this wrapper."""
        return self._model_method('get_loss')(batch_data, criterion, device)

    def get_loss_eval(self, batch_data: Any, criterion: Any, device: Any) -> Any:
        """The wrapped TTModel's ``get_loss_eval`` with the forward going through this wrapper."""
        return self._model_method('get_loss_eval')(batch_data, criterion, device)

    def get_predictions(self, batch_data: Any, device: Any) -> Any:
        """The wrapped TTModel's ``get_predictions`` with the forward going through this wrapper."""
        return self._model_method('get_predictions')(batch_data, device)

    def one_pass_evaluation(self) -> OnePass | None:
        """The wrapped TTModel's ``get_loss_and_predictions`` with the forward going through this wrapper, when it
        gives what its evaluation methods give (``aitoolbox_like.model.current_one_pass``); else None."""
        method = current_one_pass(type(_wrapped_module(self)))
        return None if method is None else types.MethodType(method, self)

    def __getattr__(self, name: str) -> Any:
        parent_getattr = getattr(super(), '__getattr__', None)
        if parent_getattr is not None:
            try:
                return parent_getattr(name)
            except AttributeError:
                pass
        module = _wrapped_module(self)
        # Dunder look-ups (copy, pickle, numpy protocols) must see the wrapper as it is, not the model.
        if module is None or (name.startswith('__') and name.endswith('__')):
            raise AttributeError(f'{type(self).__name__!r} object has no attribute {name!r}')
        attr = inspect.getattr_static(type(module), name, None)
        if isinstance(attr, types.FunctionType):
            return types.MethodType(attr, self)
        return getattr(module, name)


class TTDistributedDataParallel(TTParallelBase, DistributedDataParallel):
    """``torch.nn.parallel.DistributedDataParallel`` for a TTModel: the TrainLoop wraps the model with it in
    ``gpu_mode='ddp'`` (pass DDP arguments with ``fit(..., ddp_model_args={...})``).

    ``get_loss`` / ``get_loss_eval`` / ``get_predictions`` and every attribute of the TTModel are available on
    the wrapper (see :class:`TTParallelBase`); the loss computed through it all-reduces the gradients.

    Args:
        module: the TTModel, already on its device.
        default_model_methods: see :class:`TTParallelBase`.
        **kwargs: arguments of ``DistributedDataParallel`` (``device_ids``, ``find_unused_parameters``, ...).
    """

    def __init__(self, module: nn.Module, default_model_methods: Sequence[str] = DEFAULT_MODEL_METHODS,
                 **kwargs: Any) -> None:
        DistributedDataParallel.__init__(self, module, **kwargs)
        TTParallelBase.__init__(self, module, default_model_methods)


class TTDataParallel(TTParallelBase, nn.DataParallel):
    """``torch.nn.DataParallel`` for a TTModel (AIToolbox's ``gpu_mode='dp'``): one process splits each batch
    over the visible GPUs; ``get_loss`` / ``get_predictions`` and the model's attributes stay reachable. Without
    GPUs it simply runs the model. ``TrainLoop(..., gpu_mode='dp')`` wraps the model itself; for several GPUs
    ``gpu_mode='ddp'`` (one process per GPU) is faster.

    Args:
        module: the TTModel to wrap.
        default_model_methods: the TTModel methods run through the wrapper.
        **kwargs: arguments of ``torch.nn.DataParallel`` (``device_ids``, ``output_device``, ``dim``).
    """

    def __init__(self, module: nn.Module, default_model_methods: Sequence[str] = DEFAULT_MODEL_METHODS,
                 **kwargs: Any) -> None:
        nn.DataParallel.__init__(self, module, **kwargs)
        TTParallelBase.__init__(self, module, default_model_methods)


# ---------------------------------------------------------------------------------------------- the loop's use


def skip_grad_sync(ddp_model: torch.nn.Module | None, skip: bool) -> ContextManager[Any]:
    """DDP's no_sync() when ``skip`` (a micro-batch that does not update the weights), else nothing."""
    # DataParallel (gpu_mode='dp') has no gradient synchronisation to skip.
    no_sync = getattr(ddp_model, 'no_sync', None) if skip else None
    if no_sync is not None:
        return no_sync()
    return contextlib.nullcontext()


class DDPFeed:
    """What the loop calls for losses and predictions during a DDP fit: the training loss goes through the
    DDP wrapper (gradient all-reduce); evaluation and predictions use the plain model, which needs no
    gradient synchronisation."""

    def __init__(self, ddp_model: torch.nn.Module, plain_feed: BatchFeed,
                 batch_model_feed_def: AbstractModelFeedDefinition | None = None) -> None:
        self.ddp_model = ddp_model
        self.plain_feed = plain_feed
        self.batch_model_feed_def = batch_model_feed_def

    def get_loss(self, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """The training loss, computed through the DDP wrapper (so backward all-reduces the gradients)."""
        if self.batch_model_feed_def is not None:
            return self.batch_model_feed_def.get_loss(self.ddp_model, batch_data, criterion, device)
        # Without a feed definition the model is a TTModel, which the launch wraps in TTDistributedDataParallel.
        return cast(TTDistributedDataParallel, self.ddp_model).get_loss(batch_data, criterion, device)

    def get_loss_eval(self, batch_data: Any, criterion: Any, device: torch.device) -> Any:
        """The evaluation loss, computed on the plain model."""
        return self.plain_feed.get_loss_eval(batch_data, criterion, device)

    def get_predictions(self, batch_data: Any, device: torch.device) -> tuple[Any, Any, dict[str, Any] | None]:
        """``(y_pred, y_true, metadata)`` of one batch, computed on the plain model."""
        return self.plain_feed.get_predictions(batch_data, device)

    def one_pass_evaluation(self) -> OnePass | None:
        """The plain model's one-pass evaluation (``aitoolbox_like.model.one_pass_evaluation``), if it has one."""
        return one_pass_evaluation(self.plain_feed)
