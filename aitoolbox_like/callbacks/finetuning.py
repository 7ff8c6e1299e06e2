"""Training-stage callbacks: freeze a backbone and unfreeze it at an epoch (Lightning's BackboneFinetuning), and a
generic switch that changes the run at the start of an epoch (SuperGradients' TrainingStageSwitch).

Both change the optimizer (or other pieces of the loop) during training, so both keep what they did in their
``state_dict()`` and redo it in ``load_state_dict()``: a resumed run's checkpoint is applied with the callbacks'
state first and the optimizer state afterwards (loop_state.apply_checkpoint), so the saved optimizer state fits
the rebuilt parameter groups.
"""
import copy
import logging
import numbers
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Union

import torch
from torch import nn

from ._common import check_int
from .abstract import AbstractCallback

if TYPE_CHECKING:
    from ..engine.train_loop import TrainLoop

logger = logging.getLogger(__name__)

#: Where the backbone is: an attribute name of the model (dotted for nested ones, e.g. ``'encoder.body'``), or a
#: function ``model -> module``.
BackboneSpec = Union[str, Callable[[nn.Module], nn.Module]]

# Per-parameter-group lists that torch schedulers keep (LambdaLR, MultiplicativeLR, CyclicLR, ReduceLROnPlateau, and
# every LRScheduler's base_lrs / _last_lr). Learning-rate lists get the reference group's value times the factor,
# the others the reference group's value. Named explicitly: a scheduler's other lists (SequentialLR's milestones)
# are not per group even when their length happens to match.
_SCALED_GROUP_LISTS = ('base_lrs', 'max_lrs', 'min_lrs')
_COPIED_GROUP_LISTS = ('lr_lambdas', 'base_momentums', 'max_momentums')
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def _scaled(value: Any, factor: float) -> Any:
    if isinstance(value, torch.Tensor):
        return value * factor
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return value * factor
    return copy.deepcopy(value)


def extend_scheduler_for_new_group(scheduler: Any, optimizer: Any, reference_group: int = 0,
                                   lr_factor: float = 1.0) -> None:
    """Make a torch scheduler built on ``optimizer`` drive a parameter group added to it after the scheduler was
    built (``optimizer.add_param_group``): torch schedulers keep per-group lists (``base_lrs``, LambdaLR's
    ``lr_lambdas``, ReduceLROnPlateau's ``min_lrs``, ...) that otherwise stay one entry short.

    The new group (the last one) follows ``reference_group`` scaled by ``lr_factor``: its base learning rate is the
    reference's times ``lr_factor`` and it gets the reference's lambda, so a LambdaLR keeps the new group's rate at
    ``lr_factor`` times the reference's; chainable schedules (StepLR, ExponentialLR, ...) multiply every group's
    current rate anyway. Idempotent: lists that already cover every group are left alone (a scheduler whose state was
    loaded from a checkpoint taken after the group was added). Chained / sequential schedulers are handled through
    their sub-schedulers. A scheduler on another optimizer is left alone.
    """
    for inner in getattr(scheduler, '_schedulers', None) or ():
        extend_scheduler_for_new_group(inner, optimizer, reference_group, lr_factor)
    groups: List[Dict[str, Any]] = optimizer.param_groups
    if getattr(scheduler, 'optimizer', None) is not optimizer:
        return
    num_groups = len(groups)
    for name in _SCALED_GROUP_LISTS + _COPIED_GROUP_LISTS:
        values = getattr(scheduler, name, None)
        if isinstance(values, list) and len(values) == num_groups - 1:
            reference = values[reference_group]
            values.append(_scaled(reference, lr_factor) if name in _SCALED_GROUP_LISTS else reference)
    last_lr = getattr(scheduler, '_last_lr', None)
    if isinstance(last_lr, list) and len(last_lr) == num_groups - 1:
        lr = groups[-1]['lr']
        last_lr.append(lr.clone() if isinstance(lr, torch.Tensor) else lr)


class BackboneFinetuning(AbstractCallback):
    """Train the head first with the backbone frozen, then unfreeze the backbone at an epoch and train it with a
    smaller learning rate (Lightning's BackboneFinetuning).

    Build the optimizer over the head only (the parameters outside the backbone). At the start of training the
    backbone is frozen (``requires_grad=False``); at the start of epoch ``unfreeze_backbone_at_epoch`` its
    parameters become trainable and are added to the optimizer as a new parameter group whose learning rate is the
    current learning rate of group 0 times ``backbone_lr_factor``.

    - Scheduler callbacks on that optimizer follow: their per-group lists are extended for the new group (see
      :func:`extend_scheduler_for_new_group`), so a LambdaLR-based schedule keeps the backbone at
      ``backbone_lr_factor`` times the head's rate and chainable ones (StepLR, ExponentialLR) decay both groups.
      LRMonitor writes ``lr_0_0`` / ``lr_0_1`` from that epoch on (``lr`` while there is one group).
    - Gradient callbacks (clipping, norm logging) see the backbone's gradients once it trains.
    - Checkpoints hold the extra group; on resume, ``load_state_dict`` re-adds it before the optimizer state is
      loaded, so a run resumed after the unfreeze epoch continues exactly.

    Args:
        unfreeze_backbone_at_epoch (int): the epoch (0-based) at whose start the backbone is unfrozen.
        backbone (str or callable): the model's attribute holding the backbone (dotted for nested attributes), or a
            function ``model -> module``.
        backbone_lr_factor (float): the backbone group's learning rate is group 0's current one times this factor
            (and its ``initial_lr`` / base learning rate group 0's times this factor).
        train_bn (bool): also train the backbone's BatchNorm parameters after unfreezing; with False they stay
            frozen (their running statistics still update in train mode, as in Lightning).
        optimizer_idx (int): with a MultiOptimizer, the optimizer that gets the backbone group.
    """

    def __init__(self, unfreeze_backbone_at_epoch: int = 10, backbone: BackboneSpec = 'backbone',
                 backbone_lr_factor: float = 0.1, train_bn: bool = True, optimizer_idx: int = 0) -> None:
        # Before the schedulers and LRMonitor (order 0): the epoch's schedule and logged rates include the new group.
        super().__init__('Backbone finetuning', execution_order=-5)
        check_int('unfreeze_backbone_at_epoch', unfreeze_backbone_at_epoch, 0, who='BackboneFinetuning')
        check_int('optimizer_idx', optimizer_idx, 0, who='BackboneFinetuning')
        self.unfreeze_backbone_at_epoch: int = unfreeze_backbone_at_epoch
        if not isinstance(backbone, str) and not callable(backbone):
            raise TypeError(f'BackboneFinetuning: backbone must be an attribute name of the model or a function '
                            f'model -> module, got {type(backbone).__qualname__}')
        if isinstance(backbone_lr_factor, bool) or not isinstance(backbone_lr_factor, numbers.Real) \
                or backbone_lr_factor < 0:
            raise ValueError(f'BackboneFinetuning: backbone_lr_factor must be a number >= 0, got '
                             f'{backbone_lr_factor!r}')
        self.backbone: BackboneSpec = backbone
        self.backbone_lr_factor: float = float(backbone_lr_factor)
        self.train_bn: bool = train_bn
        self.optimizer_idx: int = optimizer_idx
        self.unfrozen: bool = False

    # ---- the backbone -------------------------------------------------------------------------

    def backbone_module(self) -> nn.Module:
        """The backbone module of the loop's model."""
        model = self.train_loop_obj.model
        if callable(self.backbone) and not isinstance(self.backbone, str):
            module = self.backbone(model)
        else:
            module = model
            for name in self.backbone.split('.'):
                if not hasattr(module, name):
                    raise AttributeError(f'BackboneFinetuning: the model ({type(model).__qualname__}) has no '
                                         f'attribute {self.backbone!r}; pass backbone=<attribute name> or a '
                                         f'function model -> module')
                module = getattr(module, name)
        if not isinstance(module, nn.Module):
            raise TypeError(f'BackboneFinetuning: the backbone must be an nn.Module, got {type(module).__qualname__}')
        return module

    def backbone_parameters(self) -> List[nn.Parameter]:
        """The parameters the backbone group trains, in module order (without BatchNorm's when ``train_bn`` is
        False)."""
        module = self.backbone_module()
        if self.train_bn:
            return list(module.parameters())
        batch_norm = {id(p) for m in module.modules() if isinstance(m, _BATCH_NORMS)
                      for p in m.parameters(recurse=False)}
        return [p for p in module.parameters() if id(p) not in batch_norm]

    def _optimizer(self) -> Any:
        optimizers = self.train_loop_obj.optimizers
        if self.optimizer_idx >= len(optimizers):
            raise ValueError(f'BackboneFinetuning: optimizer_idx={self.optimizer_idx} but the TrainLoop has '
                             f'{len(optimizers)} optimizer(s)')
        optimizer = optimizers[self.optimizer_idx]
        if not callable(getattr(optimizer, 'add_param_group', None)):
            raise TypeError(f'BackboneFinetuning needs a torch optimizer (with add_param_group), got '
                            f'{type(optimizer).__qualname__}')
        return optimizer

    def _held_backbone_params(self, optimizer: Any) -> int:
        held = {id(p) for group in optimizer.param_groups for p in group['params']}
        return sum(id(p) in held for p in self.backbone_module().parameters())

    # ---- stages ---------------------------------------------------------------------------------

    def freeze(self) -> None:
        """Freeze every backbone parameter (``requires_grad=False``)."""
        for param in self.backbone_module().parameters():
            param.requires_grad_(False)

    def unfreeze(self) -> None:
        """Make the backbone trainable and add its parameter group (once: nothing happens when the optimizer already
        holds the backbone), then extend the scheduler callbacks for it."""
        optimizer = self._optimizer()
        params = self.backbone_parameters()
        if self._held_backbone_params(optimizer):
            self.unfrozen = True
            return
        for param in params:
            param.requires_grad_(True)
        factor = self.backbone_lr_factor
        reference = optimizer.param_groups[0]
        optimizer.add_param_group({'params': params, 'lr': _scaled(reference['lr'], factor)})
        group = optimizer.param_groups[-1]
        # Keys a scheduler wrote into the existing groups (initial_lr, OneCycleLR's max_lr / min_lr, ...), scaled
        # like the learning rate when they are rates.
        for key, value in reference.items():
            if key not in group:
                group[key] = _scaled(value, factor) if key.endswith('lr') else copy.deepcopy(value)
        for callback in self.train_loop_obj.get_schedulers():
            scheduler = getattr(callback, 'scheduler', None)
            if scheduler is not None:
                extend_scheduler_for_new_group(scheduler, optimizer, 0, factor)
        self.unfrozen = True
        logger.info('BackboneFinetuning: backbone unfrozen at epoch %d (%d parameter tensors, lr factor %g)',
                    self.train_loop_obj.epoch, len(params), factor)

    # ---- hooks ----------------------------------------------------------------------------------

    def on_train_begin(self) -> None:
        """Freeze the backbone, unless it was already unfrozen (a resumed run past the unfreeze epoch); refuse an
        optimizer that already holds backbone parameters."""
        if self.unfrozen:
            return
        optimizer = self._optimizer()
        if self._held_backbone_params(optimizer):
            raise ValueError('BackboneFinetuning: the optimizer already holds backbone parameters; build it over the '
                             'head only (the parameters outside the backbone), e.g. torch.optim.Adam(model.head'
                             '.parameters()): the callback adds the backbone group at unfreeze_backbone_at_epoch')
        self.freeze()

    def on_epoch_begin(self) -> None:
        """Unfreeze at ``unfreeze_backbone_at_epoch`` (or the first epoch after it when a run starts later)."""
        if not self.unfrozen and self.train_loop_obj.epoch >= self.unfreeze_backbone_at_epoch:
            self.unfreeze()

    # ---- checkpoints ----------------------------------------------------------------------------

    @property
    def state_key(self) -> str:
        """``BackboneFinetuning`` plus the optimizer index when it is not 0."""
        name = type(self).__name__
        return name if self.optimizer_idx == 0 else f'{name}_optimizer{self.optimizer_idx}'

    def state_dict(self) -> Dict[str, Any]:
        """Whether the backbone was unfrozen."""
        return {'unfrozen': self.unfrozen}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Re-add the backbone group when the checkpoint was taken after the unfreeze (idempotent: it may run twice
        in a mid-epoch resume). Runs before the optimizer state is loaded, which then fits the groups and restores
        the backbone group's learning rate."""
        if state_dict.get('unfrozen'):
            self.unfreeze()

    def __repr__(self) -> str:
        return (f'BackboneFinetuning(unfreeze_backbone_at_epoch={self.unfreeze_backbone_at_epoch}, '
                f'backbone={self.backbone!r}, backbone_lr_factor={self.backbone_lr_factor})')


class StageSwitch(AbstractCallback):
    """Call ``fn(train_loop)`` once, at the start of epoch ``epoch``: the way to change the optimizer, its parameter
    groups or learning rates, the criterion or the loaders for a new stage of training (SuperGradients'
    TrainingStageSwitch).

    What ``fn`` may change, and when it takes effect: ``loop.optimizer`` (its groups and learning rates, or another
    optimizer of the same class: from the next update), ``loop.criterion`` (the next batch), ``loop.train_loader``
    (this epoch already: the epoch's iterator is opened just after on_epoch_begin), ``loop.validation_loader`` (this
    epoch's end-of-epoch evaluation).

    On resume: the checkpoint records that the switch happened, and ``load_state_dict`` calls ``fn(loop)`` again
    (``reapply_on_resume=True``) before the optimizer state is loaded, so a run resumed after the switch rebuilds
    the new stage first and the saved optimizer state then fits it. So ``fn`` must rebuild everything from the loop
    (not depend on ``loop.epoch``, which is not yet restored then) and must not draw random numbers in a way that
    matters (the checkpoint's RNG state is restored after it). A checkpoint stores the optimizer's *state*, not its
    class: a switch to another optimizer class cannot be resumed by this loop yet (the checkpoint is checked against
    the loop's optimizer class before callbacks' states load), so keep the class and change its parameter groups
    or hyperparameters.

    Args:
        epoch (int): the epoch (0-based) at whose start ``fn`` runs (or the first epoch of a fit that starts later).
        fn (callable): ``fn(train_loop)``.
        reapply_on_resume (bool): call ``fn`` again when a checkpoint taken after the switch is loaded.
        name (str or None): a readable name (and the checkpoint key's suffix; default ``'E<epoch>'``).
    """

    def __init__(self, epoch: int, fn: Callable[['TrainLoop'], Any], reapply_on_resume: bool = True,
                 name: Optional[str] = None) -> None:
        super().__init__(f'Stage switch {name or f"at epoch {epoch}"}', execution_order=-5)
        check_int('epoch', epoch, 0, who='StageSwitch')
        self.epoch: int = epoch
        if not callable(fn):
            raise TypeError(f'StageSwitch: fn must be a function fn(train_loop), got {type(fn).__qualname__}')
        self.fn = fn
        self.reapply_on_resume = reapply_on_resume
        self.name = name or f'E{epoch}'
        self.switched: bool = False

    def switch(self) -> None:
        """Call ``fn(train_loop)`` (once)."""
        if not self.switched:
            self.fn(self.train_loop_obj)
            self.switched = True

    def on_epoch_begin(self) -> None:
        """Switch at the start of ``epoch``."""
        if self.train_loop_obj.epoch >= self.epoch:
            self.switch()

    @property
    def state_key(self) -> str:
        """``StageSwitch_<name>``."""
        return f'{type(self).__name__}_{self.name}'

    def state_dict(self) -> Dict[str, Any]:
        """Whether the switch happened."""
        return {'switched': self.switched}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Redo the switch when the checkpoint was taken after it (once; before the optimizer state loads)."""
        if state_dict.get('switched'):
            if self.reapply_on_resume:
                self.switch()
            else:
                self.switched = True

    def __repr__(self) -> str:
        return f'StageSwitch(epoch={self.epoch}, fn={getattr(self.fn, "__qualname__", self.fn)!r})'
