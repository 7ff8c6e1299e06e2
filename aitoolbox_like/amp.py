"""Mixed-precision policy: which autocast dtype, and whether a GradScaler is needed."""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, ContextManager

import torch


class AmpPolicy:
    """Resolve ``use_amp`` for a device.

    use_amp: False (off), True or 'fp16' (float16 autocast + GradScaler, CUDA only), 'bf16'
    (bfloat16 autocast, no scaler needed, works on CPU and CUDA), or a dict of GradScaler arguments
    (fp16 with a custom scaler, as in AIToolbox).
    """

    def __init__(self, use_amp: bool | str | dict[str, Any] | None, device: torch.device | str) -> None:
        device = torch.device(device)
        scaler_kwargs: dict[str, Any] = {}
        # An explicit 'fp16' (our name) asks for float16 itself; True and a dict are AIToolbox's "AMP if possible".
        explicit_fp16 = use_amp == 'fp16'
        #: Why training cannot run with the requested precision (fit raises it before the first step), or None.
        self.unavailable: str | None = None
        if isinstance(use_amp, dict):
            scaler_kwargs, use_amp = dict(use_amp), 'fp16'
        if use_amp is True:
            use_amp = 'fp16'
        if use_amp in (False, None):
            use_amp = None
        if use_amp not in (None, 'fp16', 'bf16'):
            raise ValueError(f"use_amp must be False, True/'fp16', 'bf16' or a dict of GradScaler arguments, "
                             f"got {use_amp!r}")
        if use_amp == 'fp16' and device.type != 'cuda':
            if explicit_fp16:
                self.unavailable = (f"use_amp='fp16' (float16 with a GradScaler) needs a CUDA device, but the loop "
                                    f"runs on {device}. Use use_amp='bf16' for mixed precision on CPU, or "
                                    f"use_amp=True to train in float16 where CUDA is available and in full "
                                    f"precision elsewhere.")
            else:
                # AIToolbox's behaviour, kept so one script runs on a laptop and on a GPU box alike: the GradScaler
                # and float16 autocast are CUDA features, so without CUDA the loop trains in full precision.
                warnings.warn(f"use_amp=True (float16 with a GradScaler) needs a CUDA device, but the loop runs on "
                              f"{device}: training in full precision. Use use_amp='bf16' for mixed precision on "
                              f"CPU.", UserWarning, stacklevel=3)
            use_amp, scaler_kwargs = None, {}
        self.mode = use_amp
        self.device_type = device.type
        dtypes: dict[str | None, torch.dtype] = {'fp16': torch.float16, 'bf16': torch.bfloat16}
        self.dtype = dtypes.get(use_amp)
        # Always a GradScaler (disabled unless fp16) so callbacks can rely on loop.amp_scaler existing.
        self.scaler = torch.amp.GradScaler(device.type if device.type == 'cuda' else 'cpu',
                                           enabled=use_amp == 'fp16', **scaler_kwargs)

    @property
    def enabled(self) -> bool:
        """True when autocast is on (fp16 or bf16)."""
        return self.mode is not None

    @property
    def uses_scaler(self) -> bool:
        """True for fp16, where losses must be scaled through ``scaler`` before backward."""
        return self.mode == 'fp16'

    def autocast(self) -> ContextManager[Any]:
        """The context the forward pass runs in: ``torch.autocast`` for the mode, or a no-op."""
        if self.mode is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)
