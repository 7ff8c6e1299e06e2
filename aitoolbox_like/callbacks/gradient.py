"""Gradient callbacks: clipping, statistics, distribution plots and norm logging.

They run in ``on_after_gradient_update(optimizer_idx)``, which the loop calls only on real optimizer updates
(after gradient accumulation), once per optimizer, with gradients already unscaled under fp16 and before
``zero_grad``. The loop unscales once for all callbacks, so several clipping callbacks work together with fp16
(AIToolbox unscaled again in every callback, which raises in torch).
"""
import logging
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Sequence

import torch

from .. import distributed
from ..storage.urls import cloud_scheme
from ._common import check_int, import_matplotlib, new_figure
from .abstract import AbstractCallback, AbstractExperimentCallback
from ..engine.handler import CollectiveInRankRestrictedCallbackError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..engine.train_loop import TrainLoop

logger = logging.getLogger(__name__)


def _optimizer_params(loop: 'TrainLoop', optimizer_idx: int) -> List[torch.nn.Parameter]:
    """Parameters that the optimizer being stepped updates (all model parameters for a duck-typed optimizer
    without param_groups)."""
    optimizer = loop.optimizers[optimizer_idx]
    groups = getattr(optimizer, 'param_groups', None)
    if groups is None:
        return list(loop.model.parameters())
    return [p for group in groups for p in group['params']]


def whole_tensor(callback: AbstractCallback, value: torch.Tensor) -> torch.Tensor:
    """The whole of ``value`` for ``callback`` to read: under FSDP (gpu_mode='fsdp') a DTensor shard is gathered
    from every process (``distributed.full_tensor``, a collective), otherwise ``value`` itself, at no cost.

    The callbacks that gather set ``collective_when_sharded = True``, so the FSDP launcher runs them on every rank
    and all ranks reach the gather together; one that still runs on a single rank (its gate not lifted) gets
    :class:`CollectiveInRankRestrictedCallbackError` here instead of a hang."""
    if distributed.is_dtensor(value) and callback.train_loop_obj.running_rank_restricted_callback is not None:
        raise CollectiveInRankRestrictedCallbackError(
            f'callback {callback.callback_name!r} ({type(callback).__name__}) runs only on rank '
            f'{callback.device_idx_execution} but needs whole parameters or gradients of the FSDP model, which every '
            f'rank must gather together; it would hang. Set its device_idx_execution=None (and keep its writing on '
            f'train_loop_obj.is_main_process()), or give its class collective_when_sharded = True.')
    return distributed.full_tensor(value)


def _whole_flat(callback: AbstractCallback, grad: torch.Tensor) -> torch.Tensor:
    return whole_tensor(callback, grad.detach()).reshape(-1)


def _layer_gradient(callback: AbstractCallback, layer: Any) -> Optional[torch.Tensor]:
    """The gradient to inspect for one entry of ``model_layers_extract_def(model)``: a parameter's own gradient,
    a module's ``weight`` gradient (as AIToolbox), or all of a weight-less module's gradients flattened. Under FSDP
    the whole gradient, gathered from every rank (every rank calls this at the same update)."""
    if isinstance(layer, torch.Tensor):
        return None if layer.grad is None else _whole_flat(callback, layer.grad)
    weight = getattr(layer, 'weight', None)
    if isinstance(weight, torch.Tensor):
        return None if weight.grad is None else _whole_flat(callback, weight.grad)
    grads = [_whole_flat(callback, p.grad) for p in layer.parameters() if p.grad is not None]
    return torch.cat(grads) if grads else None


class GradientCallbackBase(AbstractCallback):
    """Base of the gradient callbacks; marks the loop as using gradient callbacks (``grad_cb_used``) for code
    that reads that AIToolbox flag."""

    def on_train_loop_registration(self) -> None:
        """Set the loop's ``grad_cb_used``."""
        self.train_loop_obj.grad_cb_used = True


class GradValueClip(GradientCallbackBase):
    """Clip every gradient element to [-max_grad_value, max_grad_value] before each optimizer step; with several
    optimizers each step clips only that optimizer's parameters."""

    def __init__(self, max_grad_value: float) -> None:
        super().__init__('Gradient value clipping')
        if max_grad_value <= 0:
            raise ValueError(f'GradValueClip: max_grad_value must be > 0, got {max_grad_value!r}')
        self.max_grad_value = max_grad_value

    def on_after_gradient_update(self, optimizer_idx: int) -> None:
        """Clip the gradients of the parameters of the optimizer about to step."""
        params = _optimizer_params(self.train_loop_obj, optimizer_idx)
        torch.nn.utils.clip_grad_value_(params, self.max_grad_value)


class GradNormClip(GradientCallbackBase):
    """Rescale the gradients so that their total norm is at most ``max_grad_norm`` before each optimizer step;
    with several optimizers each step clips only that optimizer's parameters.

    Args:
        max_grad_norm (float): the largest allowed total norm.
        **kwargs: further ``torch.nn.utils.clip_grad_norm_`` arguments (norm_type, error_if_nonfinite, foreach).
    """

    def __init__(self, max_grad_norm: float, **kwargs: Any) -> None:
        super().__init__('Gradient norm clipping')
        if max_grad_norm <= 0:
            raise ValueError(f'GradNormClip: max_grad_norm must be > 0, got {max_grad_norm!r}')
        self.max_grad_norm = max_grad_norm
        self.kwargs = kwargs

    def on_after_gradient_update(self, optimizer_idx: int) -> None:
        """Clip the gradient norm of the parameters of the optimizer about to step."""
        params = _optimizer_params(self.train_loop_obj, optimizer_idx)
        torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm, **self.kwargs)


def _gradient_stats(grad: torch.Tensor) -> torch.Tensor:
    grad = grad.float()
    return torch.stack([grad.mean(), grad.std(unbiased=False) if grad.numel() > 1 else grad.new_zeros(()),
                        torch.linalg.vector_norm(grad), (grad == 0).float().mean()])


class GradientStatsPrint(GradientCallbackBase):
    """Print mean, std, L2 norm and fraction of zeros of chosen layers' gradients.

    The gradients are those of the epoch's last optimizer update, captured before zero_grad (AIToolbox read them
    at epoch end, after zero_grad, and printed "None" on torch 2). The statistics are computed on the device and
    read once per reported epoch.

    Runs on rank 0 only, except under FSDP (gpu_mode='fsdp'): there it runs on every rank, and the ranks gather the
    chosen layers' whole gradients together at each captured update; the main process alone computes, prints and
    keeps ``last_stats``, which are the statistics of the whole gradients, as in one process.

    Args:
        model_layers_extract_def (callable): ``model -> list of layers`` (modules or parameters).
        stats_eval_freq (int): report every this many epochs.
        on_every_grad_update (bool): also report after every optimizer update (a host sync per update).
    """

    STAT_NAMES = ('mean', 'std', 'norm', 'zero_fraction')
    # Read by the FSDP launcher (distributed/launch.py): under gpu_mode='fsdp' gradients are sharded and gathering them is a
    # collective, so the launcher then runs this callback on every rank (device_idx_execution=None).
    collective_when_sharded = True

    def __init__(self, model_layers_extract_def: Callable[[Any], Iterable[Any]], stats_eval_freq: int = 1,
                 on_every_grad_update: bool = False) -> None:
        super().__init__('Print model gradient stats', device_idx_execution=0)
        if not callable(model_layers_extract_def):
            raise TypeError('GradientStatsPrint: model_layers_extract_def must be a function model -> list of layers')
        check_int('stats_eval_freq', stats_eval_freq, 1, who='GradientStatsPrint')
        self.model_layers_extract_def = model_layers_extract_def
        self.stats_eval_freq = stats_eval_freq
        self.on_every_grad_update = on_every_grad_update
        self._captured: Optional[List[Optional[torch.Tensor]]] = None
        self.last_stats: Optional[List[Optional[Dict[str, float]]]] = None

    def on_train_loop_registration(self) -> None:
        """Set the loop's ``grad_cb_used`` only with on_every_grad_update, as AIToolbox did."""
        # Code written for AIToolbox reads the flag as "a callback works on every gradient update"; the
        # epoch-end report alone did not set it there. Our loop dispatches by overridden hooks, not by the flag.
        if self.on_every_grad_update:
            self.train_loop_obj.grad_cb_used = True

    def on_epoch_begin(self) -> None:
        """Forget the previous epoch's gradients."""
        self._captured = None

    def on_after_gradient_update(self, optimizer_idx: int) -> None:
        """Capture the statistics at the epoch's last update (or every update with on_every_grad_update)."""
        # At optimizer 0 no optimizer has stepped or zeroed yet, so every layer's gradient is there.
        if optimizer_idx != 0:
            return
        loop = self.train_loop_obj
        due = loop.epoch % self.stats_eval_freq == 0 and loop.is_last_batch
        if not (due or self.on_every_grad_update):
            return
        layers = self.model_layers_extract_def(loop.model)
        # Every rank running this gathers (the same layers at the same update); of several ranks running it (FSDP),
        # the main process alone reports.
        gradients = [_layer_gradient(self, layer) for layer in layers]
        if self.device_idx_execution is None and not loop.is_main_process():
            return
        self._captured = [None if g is None else _gradient_stats(g) for g in gradients]
        if self.on_every_grad_update:
            self._report(f'epoch {loop.epoch}, batch {loop.iteration}')

    def on_epoch_end(self) -> None:
        """Print the captured statistics in a reported epoch."""
        loop = self.train_loop_obj
        if loop.epoch % self.stats_eval_freq == 0 and self._captured is not None:
            self._report(f'end of epoch {loop.epoch}')

    def _report(self, where: str) -> None:
        captured = self._captured
        assert captured is not None, 'reported only after a capture'
        values = [None if s is None else s.tolist() for s in captured]
        self.last_stats = [None if v is None else dict(zip(self.STAT_NAMES, v)) for v in values]
        # A report the user asked for by adding this callback, so it goes to stdout.
        print(f'---> Model layers gradients stats ({where})')
        for i, stats in enumerate(self.last_stats):
            if stats is None:
                print(f'Layer {i}: no gradient')
            else:
                print(f"Layer {i} grads: mean {stats['mean']:.6g}; std {stats['std']:.6g}; norm {stats['norm']:.6g}; "
                      f"ratio of zero gradients {stats['zero_fraction']:.4g}")


class GradDistributionPlot(AbstractExperimentCallback):
    """Histogram of chosen layers' gradients for every epoch, saved under
    ``<experiment dir>/results/<grad_plots_dir_name>/epoch_<k>/layer_<i>.png`` (AIToolbox's layout), or one
    ``gradients.pdf`` per epoch folder.

    The gradients are those of the epoch's last optimizer update, captured before zero_grad (AIToolbox read them
    after zero_grad and plotted nothing on torch 2). Needs matplotlib (``pip install aitoolbox_like[plots]``).

    Runs on rank 0 only, except under FSDP (gpu_mode='fsdp'): there it runs on every rank, and the ranks gather the
    chosen layers' whole gradients together at each epoch's last update; the main process alone plots and uploads.

    Args:
        model_layers_extract_def (callable): ``model -> list of layers`` (modules or parameters).
        grad_plots_dir_name (str): folder inside the experiment folder.
        file_format (str): 'png' (one image per layer) or 'pdf' (one multi-page file per epoch).
        project_name: experiment folder (inferred from a tracking TrainLoop, else defaults).
        experiment_name: experiment folder (inferred from a tracking TrainLoop, else defaults).
        local_model_result_folder_path: experiment folder (inferred from a tracking TrainLoop, else defaults).
        cloud_save_mode: 's3' / 'aws_s3' / 'aws' (or a Google Cloud Storage or Azure mode: 'gcs', 'azure') also
            uploads the plots to ``s3://<bucket>/<prefix>/<project>/<experiment>_<timestamp>/results/
            <grad_plots_dir_name>/...`` (``gs://``, ``az://``) in the background.
        bucket_name: the bucket (Azure: container; with cloud_save_mode).
        cloud_dir_prefix: key prefix in the bucket (with cloud_save_mode).
        bins (int): histogram bins.
    """

    # Read by the FSDP launcher (distributed/launch.py): gathering sharded gradients is a collective, so under gpu_mode='fsdp'
    # the launcher runs this callback on every rank.
    collective_when_sharded = True

    def __init__(self, model_layers_extract_def: Callable[[Any], Iterable[Any]],
                 grad_plots_dir_name: str = 'grad_distribution', file_format: str = 'png',
                 project_name: Optional[str] = None, experiment_name: Optional[str] = None,
                 local_model_result_folder_path: Optional[str] = None, cloud_save_mode: Optional[str] = None,
                 bucket_name: Optional[str] = None, cloud_dir_prefix: Optional[str] = None, bins: int = 100) -> None:
        super().__init__('Gradient distribution plotter', project_name, experiment_name,
                         local_model_result_folder_path, cloud_save_mode, bucket_name, cloud_dir_prefix,
                         device_idx_execution=0)
        if file_format not in ('png', 'pdf'):
            raise ValueError(f"GradDistributionPlot: file_format must be 'png' or 'pdf', got {file_format!r}")
        if not callable(model_layers_extract_def):
            raise TypeError('GradDistributionPlot: model_layers_extract_def must be a function model -> list of layers')
        self.model_layers_extract_def = model_layers_extract_def
        self.grad_plots_dir_name = grad_plots_dir_name
        self.file_format = file_format
        self.bins = bins
        self._captured: Optional[List[Optional[torch.Tensor]]] = None
        self.last_gradients: Optional[List[Any]] = None      # the flattened gradients last plotted (numpy, per layer)
        self.saved_plot_paths: List[str] = []

    def on_train_loop_registration(self) -> None:
        """Check that matplotlib is installed; infer the experiment (an unknown cloud_save_mode is refused)."""
        import_matplotlib('GradDistributionPlot')     # fail at registration, not after the first epoch
        self.try_infer_experiment_details(infer_cloud_details=True)
        cloud_scheme(self.cloud_save_mode)

    def on_epoch_begin(self) -> None:
        """Forget the previous epoch's gradients."""
        self._captured = None

    def on_after_gradient_update(self, optimizer_idx: int) -> None:
        """Copy the chosen layers' gradients at the epoch's last update."""
        loop = self.train_loop_obj
        if optimizer_idx != 0 or not loop.is_last_batch:
            return
        layers = self.model_layers_extract_def(loop.model)
        gradients = [_layer_gradient(self, layer) for layer in layers]     # every rank running this gathers
        if self.device_idx_execution is None and not loop.is_main_process():
            return
        # A device copy: the loop's zero_grad (set_to_none or in place) must not change what we plot.
        self._captured = [None if g is None else g.clone() for g in gradients]

    def on_epoch_end(self) -> None:
        """Plot (and upload) the captured gradients."""
        if self._captured is None:
            return
        gradients = [None if g is None else g.float().cpu().numpy() for g in self._captured]
        self._captured = None
        self.last_gradients = gradients
        paths = self.plot_gradients(gradients)
        self.saved_plot_paths.extend(paths)
        self.upload_experiment_files(paths)

    def plot_gradients(self, gradients: Sequence[Any]) -> List[str]:
        """Save the histograms of ``gradients`` (flattened numpy arrays or None, per layer) in this epoch's
        folder; returns the written file paths."""
        epoch_dir = os.path.join(self.experiment_dir_path, 'results', self.grad_plots_dir_name,
                                 f'epoch_{self.train_loop_obj.epoch}')
        os.makedirs(epoch_dir, exist_ok=True)
        figures = [self._figure(i, grad) for i, grad in enumerate(gradients)]
        if self.file_format == 'png':
            paths: List[str] = []
            for i, fig in enumerate(figures):
                path = os.path.join(epoch_dir, f'layer_{i}.png')
                fig.savefig(path)
                paths.append(path)
            return paths
        from matplotlib.backends.backend_pdf import PdfPages
        path = os.path.join(epoch_dir, 'gradients.pdf')
        with PdfPages(path) as pdf:
            for fig in figures:
                pdf.savefig(fig)
        return [path]

    def _figure(self, layer_idx: int, grad: Any) -> 'Figure':
        fig = new_figure(figsize=(6, 4))
        ax = fig.add_subplot()
        if grad is None:
            ax.text(0.5, 0.5, 'no gradient', ha='center', va='center')
        else:
            ax.hist(grad, bins=self.bins)
        ax.set_title(f'Layer {layer_idx} gradients, epoch {self.train_loop_obj.epoch}')
        ax.set_xlabel('gradient value')
        ax.set_ylabel('count')
        fig.tight_layout()
        return fig


class GradNormLogger(AbstractCallback):
    """Gradient norm into the train history: ``'grad_norm'`` is the mean over the epoch's optimizer updates of the
    total gradient norm of all model parameters (unscaled, before clipping callbacks); with ``per_layer`` also
    ``'grad_norm_<module name>'`` for every module that owns parameters directly.

    Norms stay on the device during the epoch and are read once at its end.

    Args:
        norm_type (float): the p of the p-norm (2.0; ``float('inf')`` for the max-norm).
        per_layer (bool): also log one norm per module.
    """

    def __init__(self, norm_type: float = 2., per_layer: bool = False) -> None:
        # Before the clipping callbacks (order 0): the logged norm is the one clipping acts on.
        super().__init__('Gradient norm logger', execution_order=-1)
        self.norm_type = float(norm_type)
        self.per_layer = per_layer
        self._sums: Optional[torch.Tensor] = None
        self._count = 0
        self._names: Optional[List[str]] = None                 # set in on_train_begin, as are the next two
        self._params: Optional[List[torch.nn.Parameter]] = None
        self._layer_indices: Optional[List[List[int]]] = None

    def on_train_begin(self) -> None:
        """Collect the parameters (and, with per_layer, the modules owning them)."""
        model = self.train_loop_obj.model
        self._params = list(model.parameters())
        # Each layer is a list of indices into _params, so a parameter's norm is computed once per update and
        # shared by the total norm ('' = every parameter) and its module's norm.
        self._names = ['']
        self._layer_indices = [list(range(len(self._params)))]
        if self.per_layer:
            position = {id(p): i for i, p in enumerate(self._params)}
            for name, module in model.named_modules():
                own = [position[id(p)] for p in module.parameters(recurse=False)]
                if own:
                    self._names.append(name)
                    self._layer_indices.append(own)

    def on_epoch_begin(self) -> None:
        """Reset the epoch's sums."""
        self._sums = None
        self._count = 0

    def _layer_norm(self, param_norms: Sequence[Optional[torch.Tensor]], indices: Sequence[int],
                    device: torch.device) -> torch.Tensor:
        norms = [norm for norm in (param_norms[i] for i in indices) if norm is not None]
        if not norms:
            return torch.zeros((), device=device)
        return torch.linalg.vector_norm(torch.stack(norms), self.norm_type).to(device)

    def on_after_gradient_update(self, optimizer_idx: int) -> None:
        """Add this update's norms (on the device) to the epoch's sums."""
        # At optimizer 0 nothing has been stepped, clipped for later optimizers, or zeroed yet.
        if optimizer_idx != 0:
            return
        params, layer_indices = self._params, self._layer_indices
        assert params is not None and layer_indices is not None, 'set in on_train_begin'
        device = self.train_loop_obj.device
        # Under FSDP a gradient is a DTensor shard: full_tensor() completes its norm over every rank (this
        # callback runs on every rank).
        param_norms = [None if p.grad is None else
                       distributed.full_tensor(torch.linalg.vector_norm(p.grad.detach().float(), self.norm_type))
                       for p in params]
        norms = torch.stack([self._layer_norm(param_norms, indices, device) for indices in layer_indices])
        self._sums = norms if self._sums is None else self._sums + norms
        self._count += 1

    def on_epoch_end(self) -> None:
        """Write the epoch's mean norms into the train history."""
        if self._sums is None:
            return
        names = self._names
        assert names is not None, 'set in on_train_begin'
        loop = self.train_loop_obj
        means = (self._sums / self._count).tolist()
        for name, value in zip(names, means):
            loop.insert_metric_result_into_history('grad_norm' if not name else f'grad_norm_{name}', value)
