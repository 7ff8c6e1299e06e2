"""``save_image`` for SG example code that saves batches (``from torchvision.utils import save_image``)."""
import math
from typing import Any

import torch

from ...runtime._torchvision_compat import prepare_torchvision


def save_image(tensor: Any, fp: Any, nrow: int = 8, padding: int = 2, normalize: bool = False) -> None:
    """``torchvision.utils.save_image`` when torchvision can be imported; otherwise the same grid (images of a
    ``(B, C, H, W)`` or ``(C, H, W)`` tensor, values in [0, 1], or min-max scaled with ``normalize``) written with
    Pillow. For SG example code that saves batches (``from torchvision.utils import save_image``)."""
    prepare_torchvision()       # torchvision's CUDA build beside CPU torch (aitoolbox_like/runtime/_torchvision_compat.py)
    try:
        from torchvision.utils import save_image as tv_save_image
    except Exception:       # not installed, or a build that does not match torch
        tv_save_image = None
    if tv_save_image is not None:
        tv_save_image(tensor, fp, nrow=nrow, padding=padding, normalize=normalize)
        return
    from PIL import Image
    images = torch.as_tensor(tensor).detach().float().cpu()
    if images.dim() == 2:
        images = images.unsqueeze(0)
    if images.dim() == 3:
        images = images.unsqueeze(0)
    if images.size(1) == 1:
        images = images.expand(-1, 3, -1, -1)
    if normalize:
        # torchvision's arithmetic (Python floats for the range), so that both write the same bytes
        low, high = float(images.min()), float(images.max())
        images = images.sub(low).div(max(high - low, 1e-5))
    count, channels, height, width = images.shape
    grid = images[0]        # torchvision's make_grid pads only a grid of several images
    if count > 1:
        columns = min(nrow, count)
        rows = math.ceil(count / columns)
        grid = torch.zeros(channels, rows * (height + padding) + padding, columns * (width + padding) + padding)
        for i in range(count):
            top, left = (i // columns) * (height + padding) + padding, (i % columns) * (width + padding) + padding
            grid[:, top:top + height, left:left + width] = images[i]
    array = grid.mul(255).add(0.5).clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
    Image.fromarray(array).save(fp)
