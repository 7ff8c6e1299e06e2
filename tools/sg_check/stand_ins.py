"""What SG's callback modules import from the rest of SuperGradients, and from libraries not installed here.

SG's callback classes use a few SG utilities besides the callback API: a logger factory, the registries their
decorators fill, ``get_param``, ``unwrap_model``. Those get small equivalents here (SG's behaviour for what the
callbacks use), so the classes import and run unchanged. Everything else SG's modules import (its model-zoo
visualisation and detection utilities, Deci's platform client, OpenCV, ONNX, torchmetrics / torchvision when
they do not import) is a placeholder: importing it works, using it raises :class:`Unavailable`, naming it.
Any name not defined here is such a placeholder (module ``__getattr__``).
"""
import logging
import types
from typing import Any, Callable, Dict, Optional

import numpy
import torch

logger = logging.getLogger(__name__)


class Unavailable(RuntimeError):
    """A placeholder of something SG's callbacks import and this environment does not have was used."""


class _Placeholder(type):
    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith('__'):
            raise AttributeError(attr)
        raise Unavailable(f'{cls.__name__}.{attr}: {cls.__name__} is not available here ({cls.why})')

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise Unavailable(f'{cls.__name__}(...): {cls.__name__} is not available here ({cls.why})')


def placeholder(name: str, why: str) -> type:
    """A class (usable in annotations and isinstance) whose every use raises :class:`Unavailable`."""
    return _Placeholder(name, (), {'why': why})


def __getattr__(name: str) -> Any:
    if name.startswith('__'):
        raise AttributeError(name)
    dotted = name.replace('__', '.')
    return placeholder(dotted, 'a SuperGradients name outside its callback modules, or a library not installed')


# ---- SG utilities the callback classes use, with SG's behaviour for those uses ------------------------------------

def get_logger(logger_name: str, *args: Any, **kwargs: Any) -> logging.Logger:
    """SG's ``get_logger``: a logging logger."""
    return logging.getLogger(logger_name)


def resolve_param(param_name: str, factory: Any) -> Callable[[Callable], Callable]:
    """SG's decorator turning a config entry into an object; here the check passes objects."""
    return lambda function: function


class MetricsFactory:
    """SG's factory for ``resolve_param`` (unused: the check passes metric objects)."""


def _registry(registry: Dict[str, Any]) -> Callable[..., Callable[[Any], Any]]:
    def register(name: Optional[str] = None, deprecated_name: Optional[str] = None) -> Callable[[Any], Any]:
        def decorator(cls: Any) -> Any:
            registry[name or cls.__name__] = cls
            if deprecated_name:
                registry[deprecated_name] = cls
            return cls
        return decorator
    return register


CALLBACKS: Dict[str, Any] = {}
LR_SCHEDULERS_CLS_DICT: Dict[str, Any] = {}
LR_WARMUP_CLS_DICT: Dict[str, Any] = {}
register_callback = _registry(CALLBACKS)
register_lr_scheduler = _registry(LR_SCHEDULERS_CLS_DICT)
register_lr_warmup = _registry(LR_WARMUP_CLS_DICT)

# SG's registry of torch schedulers for lr_mode={name: {...}} (super_gradients/common/registry/registry.py).
_schedulers = torch.optim.lr_scheduler
TORCH_LR_SCHEDULERS = {name: getattr(_schedulers, name) for name in (
    'StepLR', 'LambdaLR', 'MultiStepLR', 'ConstantLR', 'CosineAnnealingLR', 'CosineAnnealingWarmRestarts',
    'CyclicLR', 'ExponentialLR', 'ReduceLROnPlateau', 'LinearLR')}


def get_param(params: Any, name: str, default_val: Any = None) -> Any:
    """SG's ``get_param`` for an exact name: from a mapping or an object, else ``default_val``."""
    if isinstance(params, dict):
        return params.get(name, default_val)
    return getattr(params, name, default_val)


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """SG's ``unwrap_model``: the module inside DataParallel / DistributedDataParallel."""
    wrappers = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    return model.module if isinstance(model, wrappers) else model


# ---- NumPy with the 1.x aliases SG 3.7.1 uses (it requires numpy<=1.23; NumPy 2 removed these) --------------------

_NUMPY_1_ALIASES = {'Inf': numpy.inf, 'Infinity': numpy.inf, 'NaN': numpy.nan, 'float_': numpy.float64,
                    'complex_': numpy.complex128, 'bool8': numpy.bool_, 'int0': numpy.intp}


class _NumPy1(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name in _NUMPY_1_ALIASES:
            return _NUMPY_1_ALIASES[name]
        return getattr(numpy, name)


numpy_1 = _NumPy1('numpy', 'NumPy, with the NumPy 1.x aliases SuperGradients 3.7.1 uses')
