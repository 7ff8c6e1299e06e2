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

from ..callback_check import Unavailable, placeholder  # noqa: F401  (Unavailable: what a use of a placeholder raises)

logger = logging.getLogger(__name__)


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


# ---- matplotlib.pyplot with cm.get_cmap(name, lut), which Matplotlib 3.9 removed (SG's colour mappings call it) ----

class _ColourMaps(types.ModuleType):
    """``matplotlib.cm`` with the ``get_cmap(name, lut)`` of Matplotlib before 3.9."""

    def __getattr__(self, name: str) -> Any:
        import matplotlib.cm
        return getattr(matplotlib.cm, name)

    @staticmethod
    def get_cmap(name: Any = None, lut: Optional[int] = None) -> Any:
        import matplotlib
        colour_map = matplotlib.colormaps[name or matplotlib.rcParams['image.cmap']]
        return colour_map if lut is None else colour_map.resampled(lut)


class _PyPlot38(types.ModuleType):
    """``matplotlib.pyplot`` (imported when first used) whose ``cm`` has the old ``get_cmap``."""
    cm = _ColourMaps('matplotlib.cm', 'matplotlib.cm with get_cmap(name, lut)')

    def __getattr__(self, name: str) -> Any:
        import matplotlib.pyplot
        return getattr(matplotlib.pyplot, name)


pyplot_3_8 = _PyPlot38('matplotlib.pyplot', "matplotlib.pyplot with Matplotlib 3.8's cm.get_cmap(name, lut)")


# ---- SG's helpers of ExtremeBatchCaseVisualizationCallback (device, DDP gathers), with SG's behaviour ------------

class _DeviceConfig:
    """SG's ``device_config``: the device its metrics are moved to (CUDA when there is one)."""

    @property
    def device(self) -> str:
        return 'cuda' if torch.cuda.is_available() else 'cpu'


device_config = _DeviceConfig()


def infer_model_device(model: torch.nn.Module) -> Optional[torch.device]:
    """The device of the model's first parameter (or buffer), None without either."""
    for tensor in list(model.parameters()) + list(model.buffers()):
        return tensor.device
    return None


def tensor_container_to_device(obj: Any, device: Any, non_blocking: bool = True, detach: bool = False) -> Any:
    """Tensors inside tuples, lists and mappings moved to ``device`` (detached with ``detach``), structure kept."""
    if isinstance(obj, torch.Tensor):
        return (obj.detach() if detach else obj).to(device, non_blocking=non_blocking)
    if isinstance(obj, (tuple, list)):
        return type(obj)(tensor_container_to_device(x, device, non_blocking, detach) for x in obj)
    if isinstance(obj, dict):
        return {key: tensor_container_to_device(value, device, non_blocking, detach) for key, value in obj.items()}
    return obj


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def maybe_all_reduce_tensor_average(tensor: torch.Tensor) -> torch.Tensor:
    """The mean over the processes of a distributed run; the tensor itself otherwise."""
    if not _distributed():
        return tensor
    total = tensor.clone()
    torch.distributed.all_reduce(total)
    return total / torch.distributed.get_world_size()


def maybe_all_gather_as_list(inputs: Any) -> list:
    """Every process's ``inputs``, in rank order (``[inputs]`` in one process)."""
    if not _distributed():
        return [inputs]
    gathered: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, inputs)
    return gathered


# ---- torchvision's draw_segmentation_masks, for a torchvision that does not import here ----------------------------

_COLOURS = {'green': (0, 128, 0), 'red': (255, 0, 0), 'blue': (0, 0, 255), 'white': (255, 255, 255),
            'black': (0, 0, 0), 'yellow': (255, 255, 0)}


def draw_segmentation_masks(image: torch.Tensor, masks: torch.Tensor, alpha: float = 0.8, colors: Any = None
                            ) -> torch.Tensor:
    """``torchvision.utils.draw_segmentation_masks``: a uint8 ``(3, H, W)`` image with each boolean mask of ``masks``
    (``(N, H, W)`` or ``(H, W)``) blended in its colour (a name or an RGB tuple) with weight ``alpha``."""
    if masks.dim() == 2:
        masks = masks[None]
    names = colors if isinstance(colors, (list, tuple)) and not isinstance(colors[0], int) else [colors] * len(masks)
    painted = image.to(torch.float64).clone()
    for mask, colour in zip(masks.bool(), names):      # a later mask covers an earlier one
        painted[:, mask] = torch.tensor(_COLOURS[colour] if isinstance(colour, str) else colour,
                                        dtype=torch.float64)[:, None]
    return (image.to(torch.float64) * (1 - alpha) + painted * alpha).to(torch.uint8)
