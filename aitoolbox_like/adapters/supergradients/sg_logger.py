"""``context.sg_logger``: SuperGradients' logger interface (``add_scalar``, ``add_images``, ``add_text``, ...) over the
loop's own logging, so SG callbacks that write into SG's logger run unchanged.

Where each kind of data goes:

* scalars: the TensorBoard writer of the loop's TensorBoard callback (any registered callback with an open
  ``tb_writer``, e.g. ``TensorboardTrainHistoryMetric``), and :attr:`SGLogger.scalars`; a scalar logged against an
  epoch (SG's ``EpochNumber`` time unit) also goes into the training history under its tag, once per epoch;
* images: that TensorBoard writer; without one, PNG files under ``<experiment folder>/sg_logger/`` when the loop has
  an experiment folder; the latest batch of each tag is kept in :attr:`SGLogger.images` either way;
* text and configurations: the TensorBoard writer, :attr:`SGLogger.texts` and the ``logging`` module;
* checkpoints (``add_checkpoint``): ``torch.save`` into ``context.ckpt_dir``.

As SG's logger, it writes in the main process only (``ddp_silent_mode`` processes write nothing).
"""
import json
import logging
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from ... import distributed

if TYPE_CHECKING:
    from ...engine.train_loop import TrainLoop

logger = logging.getLogger(__name__)


class UnavailableFieldError(AttributeError):
    """An SG callback read a PhaseContext field that has no counterpart here (``checkpoint_params``, ...)."""


class NoExperimentFolderError(UnavailableFieldError):
    """An SG callback asked for the checkpoint folder (``context.ckpt_dir``, ``sg_logger.local_dir()``) of a loop
    that has no experiment folder; the message says how to give it one."""


NO_EXPERIMENT = ('the TrainLoop has no experiment folder (SG\'s checkpoints directory): give it one with a callback '
                 'that saves, e.g. aitoolbox_like.callbacks.model_save.ModelCheckpoint, or train with a tracking loop, '
                 'e.g. aitoolbox_like.tracking.TrainLoopCheckpoint')


def experiment_folder(loop: 'TrainLoop', what: str) -> str:
    """The loop's experiment folder, or :class:`NoExperimentFolderError` naming ``what`` and the fix."""
    experiment = loop.experiment
    if experiment is None:
        raise NoExperimentFolderError(f'{what}: {NO_EXPERIMENT}')
    return str(experiment.dir_path)


def step_of(global_step: Any) -> Tuple[Optional[int], bool]:
    """(the step as a number, whether it counts epochs) of SG's ``global_step``: an int, None, or one of SG's time
    units (``EpochNumber(e)``, ``GlobalBatchStepNumber(n)``: objects with ``get_value()`` and ``get_name()``)."""
    if global_step is None:
        return None, False
    if callable(getattr(global_step, 'get_value', None)):
        name = global_step.get_name() if callable(getattr(global_step, 'get_name', None)) else ''
        return int(global_step.get_value()), name == 'epoch'
    return int(global_step), False


def _hwc_uint8(images: Any, data_format: str) -> np.ndarray:
    """Images as an ``(N, H, W, C)`` uint8 array, from any of SG's data formats (NCHW, NHWC, CHW, HWC, HW, ...)."""
    array = images.detach().cpu().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    layout = data_format.upper()
    if 'N' not in layout:
        array, layout = array[None], 'N' + layout
    if 'C' not in layout:
        array, layout = array[..., None], layout + 'C'
    array = np.transpose(array, [layout.index(axis) for axis in 'NHWC'])
    if array.dtype != np.uint8:
        array = (np.clip(array.astype(np.float64), 0, 1) * 255 + 0.5).astype(np.uint8)
    return array


class SGLogger:
    """SuperGradients' logger (``AbstractSGLogger``'s methods) over the loop: ``context.sg_logger``. See the module
    docstring for where each kind of data goes.

    Attributes:
        scalars (dict): ``{tag: [(step, value), ...]}``, every scalar logged.
        images (dict): ``{tag: (step, images)}``, the latest images of each tag as an ``(N, H, W, C)`` uint8 array.
        texts (dict): ``{tag: text}``, the latest text (and configuration, as JSON) of each tag.

    Args:
        loop (TrainLoop): the loop whose TensorBoard callback, history and experiment folder it writes to.
    """

    def __init__(self, loop: 'TrainLoop') -> None:
        self.loop = loop
        self.scalars: Dict[str, List[Tuple[Optional[int], float]]] = {}
        self.images: Dict[str, Tuple[Optional[int], np.ndarray]] = {}
        self.texts: Dict[str, str] = {}
        self.objects: Dict[str, Any] = {}
        self._said_images_stay_in_memory = False

    # ---- where it writes --------------------------------------------------------------------------------------

    def tensorboard_writer(self) -> Any:
        """The open SummaryWriter of the loop's first TensorBoard callback, or None."""
        for callback in self.loop.callbacks:
            writer = getattr(callback, 'tb_writer', None)
            if writer is not None:
                return writer
        return None

    @staticmethod
    def _writes() -> bool:
        return distributed.is_main_process()

    # ---- SG's methods -----------------------------------------------------------------------------------------

    def add(self, tag: str, obj: Any, global_step: Optional[int] = None) -> None:
        """Keep any object under ``tag`` (:attr:`objects`); SG's own logger does nothing more with it."""
        if self._writes():
            self.objects[tag] = obj

    def add_config(self, tag: str, config: Dict[str, Any]) -> None:
        """The configuration as JSON text (TensorBoard text, :attr:`texts`)."""
        self.add_text(tag, json.dumps(config, indent=2, sort_keys=True, default=repr))

    def add_scalar(self, tag: str, scalar_value: Any, global_step: Any = None) -> None:
        """A scalar: TensorBoard, :attr:`scalars`, and the history when ``global_step`` is an ``EpochNumber``."""
        if not self._writes():
            return
        step, per_epoch = step_of(global_step)
        value = float(scalar_value.item() if isinstance(scalar_value, torch.Tensor) else scalar_value)
        self.scalars.setdefault(tag, []).append((step, value))
        writer = self.tensorboard_writer()
        if writer is not None:
            writer.add_scalar(tag, value, global_step=step)
        if per_epoch:
            history = self.loop.train_history
            epoch = self.loop.epoch if step is None else step
            if history.value_in_epoch(tag, epoch) is None:
                history.insert_single_result_into_history(tag, value, epoch=epoch)

    def add_scalars(self, tag_scalar_dict: Dict[str, Any], global_step: Any = None) -> None:
        """Each ``{tag: value}`` as :meth:`add_scalar`."""
        for tag, value in tag_scalar_dict.items():
            self.add_scalar(tag, value, global_step)

    def add_image(self, tag: str, image: Any, data_format: str = 'CHW', global_step: Any = None) -> None:
        """One image (a tensor, an array or a PIL image), as :meth:`add_images`."""
        if hasattr(image, 'convert') and not isinstance(image, (np.ndarray, torch.Tensor)):     # a PIL image
            image, data_format = np.asarray(image.convert('RGB')), 'HWC'
        self.add_images(tag, image, data_format=data_format.upper().replace('N', ''), global_step=global_step)

    def add_images(self, tag: str, images: Any, data_format: str = 'NCHW', global_step: Any = None) -> None:
        """Images (values in [0, 255] as uint8 or [0, 1] as floats): TensorBoard, else PNG files in the experiment
        folder; the latest of each tag in :attr:`images`."""
        if not self._writes():
            return
        step, _ = step_of(global_step)
        array = _hwc_uint8(images, data_format)
        self.images[tag] = (step, array)
        writer = self.tensorboard_writer()
        if writer is not None:
            writer.add_images(tag, array, global_step=step, dataformats='NHWC')
        elif self.loop.experiment is not None:
            self._save_pngs(tag, step, array)
        elif not self._said_images_stay_in_memory:
            self._said_images_stay_in_memory = True
            logger.info('sg_logger: no TensorBoard callback and no experiment folder: images are kept in '
                        'context.sg_logger.images only')

    def _save_pngs(self, tag: str, step: Optional[int], array: np.ndarray) -> None:
        from PIL import Image
        folder = os.path.join(experiment_folder(self.loop, 'sg_logger'), 'sg_logger', *tag.split('/'))
        os.makedirs(folder, exist_ok=True)
        for i, image in enumerate(array):
            pixels = image[..., 0] if image.shape[-1] == 1 else image
            Image.fromarray(pixels).save(os.path.join(folder, f'step_{step if step is not None else 0}_{i}.png'))

    def add_histogram(self, tag: str, values: Any, bins: Union[str, np.ndarray, list, int] = 'auto',
                      global_step: Any = None) -> None:
        """A histogram: TensorBoard only (nothing else here keeps histograms)."""
        writer = self.tensorboard_writer()
        if writer is not None and self._writes():
            data = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
            writer.add_histogram(tag, data, global_step=step_of(global_step)[0],
                                 bins='tensorflow' if isinstance(bins, str) and bins == 'auto' else bins)

    def add_text(self, tag: str, text_string: str, global_step: Any = None) -> None:
        """Text: TensorBoard, :attr:`texts`, and the log at INFO."""
        if not self._writes():
            return
        self.texts[tag] = text_string
        logger.info('sg_logger %s: %s', tag, text_string)
        writer = self.tensorboard_writer()
        if writer is not None:
            writer.add_text(tag, text_string, global_step=step_of(global_step)[0])

    def add_checkpoint(self, tag: str, state_dict: Dict[str, Any], global_step: Any = None) -> None:
        """``torch.save(state_dict)`` as ``<ckpt_dir>/<tag>``."""
        if not self._writes():
            return
        folder = os.path.join(experiment_folder(self.loop, 'sg_logger.add_checkpoint'), 'checkpoint_model')
        os.makedirs(folder, exist_ok=True)
        torch.save(state_dict, os.path.join(folder, tag if tag.endswith(('.pth', '.pt')) else f'{tag}.pth'))

    def add_file(self, file_name: Optional[str] = None) -> None:
        """Nothing to do: files in the experiment folder are uploaded with it (when the loop uploads)."""

    def upload(self) -> None:
        """Flush; uploads are the experiment's (when the loop uploads)."""
        self.flush()

    def flush(self) -> None:
        """Flush the TensorBoard writer."""
        writer = self.tensorboard_writer()
        if writer is not None:
            writer.flush()

    def close(self) -> None:
        """Flush; the TensorBoard callback closes its own writer."""
        self.flush()

    def local_dir(self) -> str:
        """The experiment folder (SG: the run's local folder)."""
        return experiment_folder(self.loop, 'sg_logger.local_dir()')

    def download_remote_ckpt(self, ckpt_name: str, *args: Any, **kwargs: Any) -> None:
        """Not here: continue a run with ``fit(resume_from=...)``."""
        raise NotImplementedError('sg_logger.download_remote_ckpt: continue a run with loop.fit(resume_from=...) '
                                  '(docs/saving-and-resuming.md)')

    def __repr__(self) -> str:
        return f'SGLogger(tensorboard={self.tensorboard_writer() is not None}, scalars={len(self.scalars)})'
