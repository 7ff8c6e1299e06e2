"""torchvision built for CUDA beside a CPU-only torch: made importable.

Where the package index offers torchvision only as a CUDA build (PyPI's Linux x86_64 wheels are, and the machines
this project is developed on reach no other), installing it beside the CPU build of torch gives a torchvision whose
C++ extension cannot load. Its import then stops at ``torch.library.register_fake('torchvision::nms')`` with
``RuntimeError: operator torchvision::nms does not exist``, and so does torchmetrics' (which imports torchvision
whenever it is installed). Declaring the schemas of the two ops torchvision registers from Python first is enough for
its Python parts (transforms, datasets, models, utils); its C++ ops (``torchvision.ops.nms``, ``roi_align``, ...)
stay unavailable and raise torchvision's own "Couldn't load custom C++ ops" error, as they would anyway.

Applied in two places, and only when torch has no CUDA and the installed torchvision is a CUDA build:

* by the library itself, right before it imports torchvision (SaveBatchImages, the SG adapter's ``save_image``), in
  any environment: torchvision and torchmetrics then import for the rest of the process;
* in the venv the Makefile builds, by a startup hook (``aitoolbox_like-torchvision-cpu.pth``, written by
  tools/cpu_torchvision.py) that loads this file and calls :func:`install_import_hook`, so that a user's own
  ``import torchvision`` or ``from torchmetrics import Accuracy`` works there too, with or without this package.

The hook runs at every interpreter start of that venv: this module imports only what Python has loaded by then, and
torch only when torchvision is first looked for.
"""
from __future__ import annotations

import os
import re
import sys
from importlib.machinery import ModuleSpec, PathFinder

# typing is not loaded at interpreter start (importing it would cost every start of the venv a few milliseconds).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional, Sequence

LOGGER_NAME = 'aitoolbox_like.torchvision_compat'
_VERSION = re.compile(r'''^__version__\s*=\s*['"]([^'"]+)['"]''', re.MULTILINE)

# The torch.library.Library holding the two schemas: the schemas live only as long as it does.
_declared: Optional[Any] = None


def installed_cuda_torchvision() -> Optional[str]:
    """The version of the installed torchvision (``'0.28.0+cu130'``) when it is a CUDA build, else None (not
    installed, or a CPU build). Read from its version.py, without importing it."""
    # PathFinder looks on sys.path only, past the import hook below (and any other finder on sys.meta_path).
    spec = PathFinder.find_spec('torchvision')
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        try:
            with open(os.path.join(folder, 'version.py'), encoding='utf-8') as file:
                match = _VERSION.search(file.read())
        except OSError:
            continue
        if match is not None:
            return match.group(1) if '+cu' in match.group(1) else None
    return None


def prepare_torchvision() -> None:
    """Declare torchvision's ``nms`` and ``qnms`` op schemas when torch has no CUDA and the installed torchvision is
    a CUDA build, so that torchvision (and torchmetrics) can be imported; nothing otherwise. Call it before
    torchvision's first import in the process; later calls do nothing."""
    global _declared
    if _declared is not None or 'torchvision' in sys.modules:
        return
    version = installed_cuda_torchvision()
    if version is None:
        return
    import torch
    if torch.version.cuda is not None:
        return
    try:
        library = torch.library.Library('torchvision', 'DEF')
    except RuntimeError:
        # Declared already in this process: by the startup hook's copy of this module, or by torchvision itself.
        return
    library.define('nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')
    library.define('qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')
    _declared = library
    import logging
    logging.getLogger(LOGGER_NAME).info(
        'torchvision %s is a CUDA build and torch %s a CPU one: declared torchvision::nms and ::qnms so that '
        'torchvision imports; its C++ ops are unavailable', version, torch.__version__)


class _PrepareBeforeTorchvision:
    """An entry of ``sys.meta_path`` that prepares torchvision when it is first looked for, then steps aside; it
    finds nothing itself."""

    def find_spec(self, name: str, path: Optional[Sequence[str]] = None,
                  target: Optional[object] = None) -> Optional[ModuleSpec]:
        if name == 'torchvision':
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            try:
                prepare_torchvision()
            except Exception as exc:
                # The import goes on and fails or succeeds as it would without the hook.
                import logging
                logging.getLogger(LOGGER_NAME).warning('could not prepare torchvision for a CPU-only torch: %r', exc)
        return None


def install_import_hook() -> None:
    """Prepare torchvision (:func:`prepare_torchvision`) whenever it is first imported in this process, whoever
    imports it. The startup hook of the Makefile's venv calls this; it costs nothing until torchvision is looked for."""
    if 'torchvision' not in sys.modules and not any(type(f).__name__ == _PrepareBeforeTorchvision.__name__
                                                    for f in sys.meta_path):
        sys.meta_path.insert(0, _PrepareBeforeTorchvision())
