"""Mixed precision: which autocast dtype, whether a GradScaler is needed, and the GradScaler's part of a training
step (scale the loss, unscale the gradients once, step, update) with whether each step changed the weights."""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence
from typing import Any, ContextManager

import torch


# Full precision: the forward pass runs in a context that does nothing (one object, entered once per step).
_NO_AUTOCAST = contextlib.nullcontext()


class AmpPolicy:
    """``use_amp`` resolved for a device, and the GradScaler steps of the loop's updates.

    use_amp: False (off), True or 'fp16' (float16 autocast + GradScaler, CUDA only), 'bf16'
    (bfloat16 autocast, no scaler needed, works on CPU and CUDA), or a dict of GradScaler arguments
    (fp16 with a custom scaler, as in AIToolbox).

    Under fp16 the GradScaler skips an update whose gradients are not finite. It calls ``optimizer.step()`` only when
    they are, which a post-step hook counts (:meth:`step` says whether the update was applied, without a host sync);
    a fused optimizer gets the inf flag inside ``step()``, which GradScaler then always calls, so its skipped update
    shows only as a lower loss scale after :meth:`update` (one host sync per update, only for fused optimizers).
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
        #: True when autocast is on (fp16 or bf16).
        self.enabled = use_amp is not None
        #: True for fp16, where losses are scaled through ``scaler`` before backward (read at every step: an attribute).
        self.uses_scaler = use_amp == 'fp16'
        self.device_type = device.type
        dtypes: dict[str | None, torch.dtype] = {'fp16': torch.float16, 'bf16': torch.bfloat16}
        self.dtype = dtypes.get(use_amp)
        # Always a GradScaler (disabled unless fp16) so callbacks can rely on loop.amp_scaler existing.
        self.scaler = torch.amp.GradScaler(device.type if device.type == 'cuda' else 'cpu',
                                           enabled=use_amp == 'fp16', **scaler_kwargs)
        self._step_counters: dict[int, tuple[Any, list[int] | None]] = {}   # id(optimizer) -> (it, its steps)
        self._last_scale: float | None = None

    def autocast(self) -> ContextManager[Any]:
        """The context the forward pass runs in: ``torch.autocast`` for the mode, or a no-op."""
        if self.mode is None:
            return _NO_AUTOCAST
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def scale(self, loss: Any) -> Any:
        """``loss`` as backward() takes it: multiplied by the loss scale under fp16 (a MultiLoss scales each loss)."""
        if not self.uses_scaler:
            return loss
        return self.scaler.scale(loss) if isinstance(loss, torch.Tensor) else loss.scale(self.scaler)

    def unscale(self, optimizers: Sequence[Any]) -> None:
        """Under fp16, divide the gradients of ``optimizers`` by the loss scale, once per update, so that callbacks
        see and clip the real gradients."""
        if self.uses_scaler:
            for optimizer in optimizers:
                self.scaler.unscale_(optimizer)

    def step(self, optimizer: Any) -> bool:
        """``optimizer.step()`` (through the GradScaler under fp16); whether it changed the weights."""
        if not self.uses_scaler:
            optimizer.step()
            return True
        entry = self._step_counters.get(id(optimizer))
        if entry is None or entry[0] is not optimizer:
            register = getattr(optimizer, 'register_step_post_hook', None)
            counter: list[int] | None = None
            if callable(register):
                counter = [0]
                register(lambda opt, args, kwargs, counter=counter: counter.__setitem__(0, counter[0] + 1))
            entry = self._step_counters[id(optimizer)] = (optimizer, counter)
        counter = entry[1]
        before = counter[0] if counter is not None else None
        self.scaler.step(optimizer)
        return counter is None or counter[0] != before

    def update(self, optimizers: Sequence[Any], applied: list[bool]) -> None:
        """The end of an update under fp16: the GradScaler's new loss scale; the fused optimizers whose update it
        skipped are marked in ``applied`` (indexed like ``optimizers``)."""
        if not self.uses_scaler:
            return
        fused = [bool(getattr(o, 'defaults', {}).get('fused')) for o in optimizers]
        if any(fused) and self._last_scale is None:
            # The first update has no earlier scale to compare with: read it before update() (one sync, once).
            self._last_scale = self.scaler.get_scale()
        self.scaler.update()
        if any(fused):
            scale = self.scaler.get_scale()
            skipped = self._last_scale is not None and scale < self._last_scale
            self._last_scale = scale
            for idx, is_fused in enumerate(fused):
                if is_fused and skipped:
                    applied[idx] = False
