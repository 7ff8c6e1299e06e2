"""Image callbacks: batch image grids and prediction grids, to files and/or TensorBoard.

:class:`SaveBatchImages` needs torchvision (``pip install aitoolbox_like[vision]``);
:class:`PredictionVisualization` needs matplotlib (``pip install aitoolbox_like[plots]``).
Both run on rank 0 only and never call a collective: they draw their own batches from the loaders and run
the unwrapped model themselves, so the other ranks of a distributed run are not involved.
"""
import logging
import os
from typing import TYPE_CHECKING, Any, Callable, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from ..runtime._torchvision_compat import prepare_torchvision
from ._common import check_int, import_matplotlib, new_figure
from .abstract import AbstractExperimentCallback
from .tensorboard import experiment_log_dir, first_batch, unwrap_model

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from torch.utils.tensorboard import SummaryWriter

logger = logging.getLogger(__name__)

_IMAGE_KEYS = ('image', 'images', 'pixel_values', 'x', 'input', 'inputs')

#: Label -> display name: a sequence indexed by the label, or a mapping.
ClassNames = Union[Sequence[str], Mapping[int, str]]


def default_batch_images(batch: Any) -> Any:
    """The images of a batch: the batch itself (a tensor), its first element (a tuple / list batch) or its
    'image' / 'images' / 'pixel_values' / 'x' / 'input(s)' entry (a dict batch)."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, (list, tuple)) and batch:
        return batch[0]
    if isinstance(batch, dict):
        for key in _IMAGE_KEYS:
            if key in batch:
                return batch[key]
    raise ValueError(f'cannot find the images in a batch of type {type(batch).__qualname__}; pass '
                     f'batch_image_fn=<function batch -> (N, C, H, W) tensor>')


def _as_image_tensor(images: Any) -> torch.Tensor:
    if not isinstance(images, torch.Tensor):
        raise TypeError(f'batch_image_fn must return a tensor, got {type(images).__qualname__}')
    images = images.detach().cpu()
    if images.dim() == 3:
        images = images.unsqueeze(1)        # (N, H, W) grayscale
    if images.dim() != 4 or images.shape[1] not in (1, 3, 4):
        raise ValueError(f'images must be (N, C, H, W) with C in 1, 3, 4 or (N, H, W); got shape '
                         f'{tuple(images.shape)}. For flat inputs pass batch_image_fn, e.g. '
                         f'lambda batch: batch[0].view(-1, 1, 8, 8)')
    return images.float()


def _import_torchvision_utils() -> Any:
    prepare_torchvision()       # torchvision's CUDA build beside CPU torch (aitoolbox_like/runtime/_torchvision_compat.py)
    try:
        import torchvision.utils
    except ImportError as exc:
        raise ImportError('SaveBatchImages needs torchvision: pip install aitoolbox_like[vision]') from exc
    except RuntimeError as exc:
        # e.g. a CUDA torchvision build next to a CPU-only torch ('operator torchvision::nms does not exist')
        raise ImportError(f'torchvision is installed but cannot be imported ({exc}); install the torchvision build '
                          f'that matches your torch') from exc
    return torchvision.utils


class _ImageCallbackBase(AbstractExperimentCallback):
    """Shared set-up of the image callbacks: the epoch schedule, the image folder and the SummaryWriter."""

    def __init__(self, callback_name: str, every_n_epochs: int, batch_image_fn: Optional[Callable[[Any], Any]],
                 save_to_file: bool, save_to_tensorboard: bool, images_dir_name: str, project_name: Optional[str],
                 experiment_name: Optional[str], local_model_result_folder_path: Optional[str],
                 cloud_save_mode: Optional[str], bucket_name: Optional[str], cloud_dir_prefix: Optional[str]) -> None:
        super().__init__(callback_name, project_name, experiment_name, local_model_result_folder_path,
                         cloud_save_mode, bucket_name, cloud_dir_prefix, execution_order=97, device_idx_execution=0)
        check_int('every_n_epochs', every_n_epochs, 1)
        if not save_to_file and not save_to_tensorboard:
            raise ValueError(f'{callback_name}: save_to_file and save_to_tensorboard are both False, so nothing '
                             f'would be saved')
        self.every_n_epochs = every_n_epochs
        self.batch_image_fn = batch_image_fn or default_batch_images
        self.save_to_file = save_to_file
        self.save_to_tensorboard = save_to_tensorboard
        self.images_dir_name = images_dir_name
        self.tb_writer: Optional['SummaryWriter'] = None     # opened at the first TensorBoard write
        self.last_written_files: List[str] = []

    def on_train_loop_registration(self) -> None:
        """Infer the experiment folder."""
        self.try_infer_experiment_details(infer_cloud_details=True)

    def _due(self) -> bool:
        return self.train_loop_obj.epoch % self.every_n_epochs == 0

    @property
    def images_dir_path(self) -> str:
        """``<experiment folder>/<images_dir_name>``."""
        return os.path.join(self.experiment_dir_path, self.images_dir_name)

    def _writer(self) -> 'SummaryWriter':
        """A SummaryWriter on the same run folder as the TensorBoard callbacks, so the images show next to
        the curves."""
        if self.tb_writer is None:
            from .tensorboard import summary_writer_class
            log_dir = experiment_log_dir(self)
            os.makedirs(log_dir, exist_ok=True)
            self.tb_writer = summary_writer_class()(log_dir=log_dir)
        return self.tb_writer

    def _images_of(self, batch: Any) -> torch.Tensor:
        return _as_image_tensor(self.batch_image_fn(batch))

    def _finish(self, paths: List[str]) -> List[str]:
        if self.tb_writer is not None:
            self.tb_writer.flush()
        self.last_written_files = paths
        self.upload_experiment_files(paths)
        return paths

    def on_train_end(self) -> None:
        """Close the SummaryWriter (if one was opened)."""
        if self.tb_writer is not None:
            self.tb_writer.close()


class SaveBatchImages(_ImageCallbackBase):
    """The first train / validation batch as an image grid at the start of every k-th epoch (arguments: see
    ``__init__``)."""

    def __init__(self, num_images: int = 16, on_train_data: bool = True, on_val_data: bool = True,
                 every_n_epochs: int = 1, nrow: int = 8, normalize: bool = True,
                 batch_image_fn: Optional[Callable[[Any], Any]] = None, save_to_file: bool = True,
                 save_to_tensorboard: bool = False, images_dir_name: str = 'batch_images',
                 project_name: Optional[str] = None, experiment_name: Optional[str] = None,
                 local_model_result_folder_path: Optional[str] = None, cloud_save_mode: Optional[str] = None,
                 bucket_name: Optional[str] = None, cloud_dir_prefix: Optional[str] = None) -> None:
        """Save the first batch of the train / validation loader as an image grid at the start of each epoch.

        Shows what the model is fed, augmentations included. The batch comes from a fresh pass over the loader
        with the random state forked and restored, so training draws the same batches as without this callback
        (with a shuffling loader the saved batch is therefore not the one trained on first). Files:
        ``<experiment>/<images_dir_name>/<train|val>_epoch_<epoch>.png``; TensorBoard: images
        ``batch_images/<train|val>`` at step = epoch.

        Args:
            num_images (int): images per grid (from the first batch).
            on_train_data, on_val_data (bool): which loaders to show.
            every_n_epochs (int): save in epochs 0, k, 2k, ...
            nrow (int): images per grid row.
            normalize (bool): rescale the grid to [0, 1] (torchvision.utils.make_grid).
            batch_image_fn (callable or None): batch -> (N, C, H, W) or (N, H, W) tensor (default: see
                default_batch_images). Use a module-level function, not a lambda, for DDP (it is pickled).
            save_to_file, save_to_tensorboard (bool): where the grids go.
            images_dir_name (str): folder inside the experiment folder.
            project_name, experiment_name, local_model_result_folder_path, cloud_save_mode, bucket_name,
                cloud_dir_prefix: the experiment folder (see AbstractExperimentCallback).
        """
        super().__init__('Save batch images', every_n_epochs, batch_image_fn, save_to_file, save_to_tensorboard,
                         images_dir_name, project_name, experiment_name, local_model_result_folder_path,
                         cloud_save_mode, bucket_name, cloud_dir_prefix)
        if not on_train_data and not on_val_data:
            raise ValueError('SaveBatchImages: on_train_data and on_val_data are both False')
        self.num_images = num_images
        self.on_train_data = on_train_data
        self.on_val_data = on_val_data
        self.nrow = nrow
        self.normalize = normalize
        self._vutils = _import_torchvision_utils()

    def on_train_loop_registration(self) -> None:
        """Infer the experiment folder; check that a validation loader exists when its images are wanted."""
        super().on_train_loop_registration()
        if self.on_val_data and self.train_loop_obj.validation_loader is None:
            raise ValueError('SaveBatchImages(on_val_data=True) needs a validation_loader; pass on_val_data=False')

    def on_epoch_begin(self) -> None:
        """Save the grids in a due epoch."""
        if self._due():
            self.save_batch_images()

    def make_grid(self, batch: Any) -> torch.Tensor:
        """The image grid of a batch, as torchvision.utils.make_grid makes it."""
        images = self._images_of(batch)[:self.num_images]
        return self._vutils.make_grid(images, nrow=self.nrow, normalize=self.normalize)

    def save_batch_images(self) -> List[str]:
        """Save the grids of this epoch; returns the written file paths."""
        loop = self.train_loop_obj
        paths: List[str] = []
        for split, wanted, loader in (('train', self.on_train_data, loop.train_loader),
                                      ('val', self.on_val_data, loop.validation_loader)):
            if not wanted:
                continue
            grid = self.make_grid(first_batch(loader))
            if self.save_to_file:
                os.makedirs(self.images_dir_path, exist_ok=True)
                path = os.path.join(self.images_dir_path, f'{split}_epoch_{loop.epoch}.png')
                self._vutils.save_image(grid, path)
                paths.append(path)
            if self.save_to_tensorboard:
                self._writer().add_image(f'batch_images/{split}', grid, loop.epoch)
        return self._finish(paths)


class PredictionVisualization(_ImageCallbackBase):
    """A grid of validation images titled with predicted and true labels after every k-th epoch (arguments:
    see ``__init__``)."""

    def __init__(self, num_images: int = 16, every_n_epochs: int = 1, class_names: Optional[ClassNames] = None,
                 ncols: int = 4, batch_image_fn: Optional[Callable[[Any], Any]] = None, save_to_file: bool = True,
                 save_to_tensorboard: bool = False, images_dir_name: str = 'prediction_images',
                 project_name: Optional[str] = None, experiment_name: Optional[str] = None,
                 local_model_result_folder_path: Optional[str] = None, cloud_save_mode: Optional[str] = None,
                 bucket_name: Optional[str] = None, cloud_dir_prefix: Optional[str] = None) -> None:
        """For image classification: a grid of the first validation images titled with the predicted and the
        true label (green when right, red when wrong), after every k-th epoch.

        The predictions come from the model's own ``get_predictions`` on those batches (in eval mode, without
        gradients), computed on rank 0 only. Predictions of shape (N, C) become ``argmax``; (N,) floats are
        thresholded at 0.5; integer predictions are used as they are. Files:
        ``<experiment>/<images_dir_name>/predictions_epoch_<epoch>.png``; TensorBoard: figure ``predictions``.

        Args:
            num_images (int): number of validation images shown.
            every_n_epochs (int): after epochs 0, k, 2k, ...
            class_names (list or dict or None): label -> name for the titles.
            ncols (int): images per row.
            batch_image_fn (callable or None): batch -> images, as in SaveBatchImages.
            save_to_file, save_to_tensorboard (bool): where the figure goes.
            images_dir_name (str): folder inside the experiment folder.
            project_name, experiment_name, local_model_result_folder_path, cloud_save_mode, bucket_name,
                cloud_dir_prefix: the experiment folder (see AbstractExperimentCallback).
        """
        super().__init__('Prediction visualization', every_n_epochs, batch_image_fn, save_to_file,
                         save_to_tensorboard, images_dir_name, project_name, experiment_name,
                         local_model_result_folder_path, cloud_save_mode, bucket_name, cloud_dir_prefix)
        self.num_images = num_images
        self.class_names = class_names
        self.ncols = ncols
        self.last_predictions: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        import_matplotlib('PredictionVisualization')

    def on_train_loop_registration(self) -> None:
        """Infer the experiment folder; check that the TrainLoop has a validation loader."""
        super().on_train_loop_registration()
        if self.train_loop_obj.validation_loader is None:
            raise ValueError('PredictionVisualization needs a validation_loader in the TrainLoop')

    def on_epoch_end(self) -> None:
        """Draw the prediction grid in a due epoch."""
        if self._due():
            self.visualize_predictions()

    def predict_first_images(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(images, predicted labels, true labels)`` of the first num_images validation samples."""
        loop = self.train_loop_obj
        # A TTModel: its get_predictions is its own method, not a submodule (as torch.nn.Module types it).
        model: Any = unwrap_model(loop.model)
        feed = loop.batch_model_feed_def
        images: List[torch.Tensor] = []
        predicted: List[torch.Tensor] = []
        true: List[torch.Tensor] = []
        count = 0
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for batch in loop.validation_loader:
                    if feed is not None:
                        y_pred, y_true, _ = feed.get_predictions(model, batch, loop.device)
                    else:
                        y_pred, y_true, _ = model.get_predictions(batch, loop.device)
                    images.append(self._images_of(batch))
                    predicted.append(_to_labels(y_pred))
                    true.append(_to_labels(y_true))
                    count += images[-1].shape[0]
                    if count >= self.num_images:
                        break
        finally:
            model.train(was_training)
        n = self.num_images
        return torch.cat(images)[:n], torch.cat(predicted)[:n], torch.cat(true)[:n]

    def visualize_predictions(self) -> List[str]:
        """Draw and save this epoch's prediction grid; returns the written file paths."""
        loop = self.train_loop_obj
        images, predicted, true = self.predict_first_images()
        self.last_predictions = (predicted, true)
        fig = make_prediction_figure(images, predicted, true, self.class_names, self.ncols,
                                     title=f'Validation predictions after epoch {loop.epoch}')
        paths: List[str] = []
        if self.save_to_file:
            os.makedirs(self.images_dir_path, exist_ok=True)
            path = os.path.join(self.images_dir_path, f'predictions_epoch_{loop.epoch}.png')
            fig.savefig(path)
            paths.append(path)
        if self.save_to_tensorboard:
            self._writer().add_figure('predictions', fig, loop.epoch)
        return self._finish(paths)


def _to_labels(y: Any) -> torch.Tensor:
    y = torch.as_tensor(y).detach().cpu()
    if y.dim() > 1 and y.shape[1] > 1:
        return y.argmax(dim=1)
    y = y.reshape(-1)
    if y.is_floating_point():
        return (y > 0.5).long()
    return y.long()


def _label_name(label: int, class_names: Optional[ClassNames]) -> str:
    if class_names is None:
        return str(label)
    try:
        return str(class_names[label])
    except (IndexError, KeyError):
        return str(label)


def make_prediction_figure(images: torch.Tensor, predicted: torch.Tensor, true: torch.Tensor,
                           class_names: Optional[ClassNames] = None, ncols: int = 4,
                           title: Optional[str] = None) -> 'Figure':
    """A matplotlib Figure: one panel per image, titled ``pred: <p> / true: <t>`` (green right, red wrong)."""
    n = images.shape[0]
    ncols = max(1, min(ncols, n))
    nrows = max(1, -(-n // ncols))
    fig = new_figure(figsize=(2.2 * ncols, 2.4 * nrows + (0.4 if title else 0)), dpi=100)
    for i in range(nrows * ncols):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        ax.axis('off')
        if i >= n:
            continue
        image = images[i]
        low, high = image.min(), image.max()
        image = (image - low) / (high - low) if high > low else torch.zeros_like(image)
        if image.shape[0] == 1:
            ax.imshow(image[0].numpy(), cmap='gray', vmin=0, vmax=1)
        else:
            ax.imshow(image.permute(1, 2, 0).numpy())
        p, t = int(predicted[i]), int(true[i])
        ax.set_title(f'pred: {_label_name(p, class_names)} / true: {_label_name(t, class_names)}', fontsize=8,
                     color='green' if p == t else 'red')
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
