"""What SuperGradients' ``Trainer.train`` does with ``training_params``, as one callback of the fit:
:class:`TrainingParamsCallback`.

SG's trainer turns the training params into callbacks and settings before its first epoch: the user's
``phase_callbacks``; the warm-up of ``warmup_mode``; SG's ``MetricsUpdateCallback`` at the training, validation and
test batch ends (feeding ``train_metrics_list`` / ``valid_metrics_list`` and the loss meters); the schedule of
``lr_mode``; gradient clipping; the metric that decides the best epoch. Here the loop, model, loaders, optimizer and
criterion are the TrainLoop's, so this callback does the rest: it registers those callbacks on the loop when it is
registered (they run after the callbacks of order 0, as SG's own run after the user's), checks that the fit
agrees with the params, and says once which params nothing acts on.
"""
import difflib
import logging
import os
import random
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple

import numpy as np
import torch

from ...callbacks.abstract import AbstractCallback
from .callback import Callback, PhaseCallback, name_loop_param_groups
from .context import PhaseContext, loss_names
from .lr import lr_mode_callback, warmup_callback
from .params import SG_DEFAULT_TRAINING_PARAMS, TrainingParams
from .phases import Phase

if TYPE_CHECKING:
    from ...engine.train_loop import TrainLoop

logger = logging.getLogger(__name__)

# The loop's own history names: an SG result of one of these names stays in metrics_dict only.
LOOP_HISTORY_NAMES = frozenset({'loss', 'accumulated_loss', 'val_loss', 'train_end_test_loss'})

# The execution_order of the callbacks SG's trainer adds itself (warm-up, metrics updates, schedule, clipping): after
# the user's SG callbacks (order 0), as SG runs its own after the phase_callbacks.
TRAINER_CALLBACKS_ORDER = 0.5

# The training params this callback acts on.
ACTED_ON = frozenset({
    'max_epochs', 'batch_accumulate', 'lr_mode', 'initial_lr', 'lr_updates', 'lr_decay_factor', 'step_lr_update_freq',
    'lr_schedule_function', 'cosine_final_lr_ratio', 'warmup_mode', 'lr_warmup_epochs', 'lr_warmup_steps',
    'warmup_initial_lr', 'lr_cooldown_epochs', 'clip_grad_norm', 'train_metrics_list', 'valid_metrics_list',
    'metric_to_watch', 'greater_metric_to_watch_is_better', 'phase_callbacks', 'seed',
})
# Values of SG's other params that ask for nothing the loop does not do anyway (no EMA, validation every epoch, ...).
NO_EFFECT: Dict[str, Any] = {
    'ema': False, 'ema_params': {}, 'average_best_models': False, 'run_validation_freq': 1, 'run_test_freq': 1,
    'max_train_batches': None, 'max_valid_batches': None, 'precise_bn': False, 'precise_bn_batch_size': None,
    'resume': False, 'resume_path': None, 'resume_from_remote_sg_logger': False, 'enable_qat': False,
    'torch_compile': False, 'torch_compile_loss': False, 'sync_bn': False, 'zero_weight_decay_on_bias_and_bn': False,
    'dataset_statistics': False, 'launch_tensorboard': False, 'save_tensorboard_to_s3': False, 'finetune': False,
    'criterion_params': {}, 'pre_prediction_callback': None, 'save_model': False, 'save_ckpt_epoch_list': [],
    'load_opt_params': True, 'silent_mode': False, 'tb_files_user_prompt': False, 'kill_ddp_pgroup_on_end': True,
}
# Where to look instead, for the params most often left (said in the warning).
HINTS = {
    'optimizer': "the TrainLoop's optimizer is used as built",
    'optimizer_params': "the TrainLoop's optimizer is used as built",
    'loss': "the TrainLoop's criterion is used", 'criterion_params': "the TrainLoop's criterion is used",
    'mixed_precision': 'TrainLoop(use_amp=...) decides',
    'sg_logger': 'context.sg_logger writes to the TensorBoard callback of the fit',
    'save_model': 'add a checkpoint callback (callbacks.model_save)',
    'ckpt_best_name': 'add a checkpoint callback (callbacks.model_save)',
    'ckpt_name': 'add a checkpoint callback (callbacks.model_save)',
    'average_best_models': 'the loop does not average the best models',
    'ema': 'callbacks.weight_averaging',
    'max_train_batches': 'fit(num_iterations=...) counts batches',
    'run_validation_freq': 'the loop validates every epoch',
    'resume': "fit(resume_from='latest')",
}


def _fuzzy(name: str) -> str:
    """SG's loose comparison of metric names: case and symbols ignored."""
    return re.sub(r'[^0-9a-z]', '', str(name).lower())


def given_keys(training_params: Mapping) -> Set[str]:
    """The params a user set: every key of a plain dict; of a :class:`TrainingParams` (SG's defaults filled in), the
    keys that are not SG's defaults or differ from them."""
    if not isinstance(training_params, TrainingParams):
        return set(training_params)
    return {key for key, value in training_params.items()
            if key not in SG_DEFAULT_TRAINING_PARAMS or SG_DEFAULT_TRAINING_PARAMS[key] != value}


class MetricsUpdateCallback(PhaseCallback):
    """SG's ``MetricsUpdateCallback``: at its phase (a training, validation or test batch end), update
    ``context.metrics_compute_fn`` with the context's fields (each metric gets those its ``update`` accepts:
    ``preds``, ``target``, ...; a target on another device than the predictions is moved to theirs) and
    ``context.loss_avg_meter`` with the batch's ``loss_log_items`` weighted by its size. In a predictions pass
    (no loss) only the metrics are updated.

    Args:
        phase (Phase or str): when it runs: ``TRAIN_BATCH_END``, ``VALIDATION_BATCH_END`` or ``TEST_BATCH_END``.
    """

    def __call__(self, context: PhaseContext) -> None:
        fields = {name: value for name, value in vars(context).items() if name not in ('loop', 'state')}
        preds, target = fields.get('preds'), fields.get('target')
        if isinstance(preds, torch.Tensor) and isinstance(target, torch.Tensor) and target.device != preds.device:
            fields['target'] = target.to(preds.device)
        if context.metrics_compute_fn is not None:
            context.metrics_compute_fn.update(**fields)
        if context.criterion is not None and context.loss_log_items is not None \
                and context.loss_avg_meter is not None and context.inputs is not None:
            context.loss_avg_meter.update(context.loss_log_items, len(context.inputs))


class ClipGradNorm(Callback):
    """SG's ``clip_grad_norm``: clip the norm of the model's gradients before each optimizer step (gradients
    unscaled).

    Args:
        max_norm (float): the largest norm kept.
    """

    def __init__(self, max_norm: float) -> None:
        super().__init__()
        self.max_norm = float(max_norm)

    def on_train_batch_gradient_step_start(self, context: PhaseContext) -> None:
        torch.nn.utils.clip_grad_norm_(context.loop.model.parameters(), self.max_norm)


class TrainingParamsCallback(Callback):
    """What SuperGradients' ``Trainer.train`` does with ``training_params``, as one callback of the fit: put it in
    ``callbacks=[...]`` with ``fit(num_epochs=training_params['max_epochs'])``.

    When registered (at the start of the fit) it

    * registers ``phase_callbacks`` and the callbacks SG's trainer adds: the warm-up of ``warmup_mode``
      (``lr_warmup_epochs`` / ``lr_warmup_steps``, ``warmup_initial_lr``), SG's ``MetricsUpdateCallback`` at the
      training, validation and test batch ends (``train_metrics_list`` / ``valid_metrics_list`` and the loss
      meters), the schedule of ``lr_mode`` (SG's by name, or ``{torch scheduler: {..., 'phase': ...}}``) and
      ``clip_grad_norm``; SG's own run after the callbacks of order 0 (execution_order 0.5);
    * names the optimizer's unnamed parameter groups as SG does (``'default'``, ``'group_<i>'``), reads
      ``initial_lr`` from the optimizer when it is not given, and otherwise sets it on the optimizer (SG builds its
      optimizer with it);
    * checks that the fit trains ``max_epochs`` epochs (``fit(num_epochs=...)`` must equal it: SG's schedules are
      computed over ``max_epochs``) with ``batch_accumulate`` micro-batches per update (``fit(grad_accumulation=
      ...)``); missing from the params, both are taken from the fit;
    * resolves ``metric_to_watch`` among SG's names of the validation results (the loss items: the criterion's class
      name or the MultiLoss parts; the titles of ``valid_metrics_list``), loosely as SG does (case and symbols
      ignored, with a warning), when the first batch has run at the latest; a name matching none is an error
      naming the close ones. The best epoch (``on_validation_end_best_epoch`` of every SG callback that does not
      set its own ``metric_to_watch``) and ``context.metric_to_watch`` follow it and
      ``greater_metric_to_watch_is_better``;
    * seeds torch, NumPy and ``random`` with ``seed`` (plus the global rank) when it is given;
    * logs one warning listing the params given that nothing acts on.

    ``context.training_params`` is its :class:`TrainingParams` (filled with SG's defaults).

    Args:
        training_params (Mapping): SG's training params: a dict or a :class:`TrainingParams`.
    """

    capture_train_preds = False

    def __init__(self, training_params: Mapping) -> None:
        super().__init__()
        if not isinstance(training_params, Mapping):
            raise TypeError(f'training_params must be a dict or a TrainingParams, got {type(training_params).__name__}')
        self.given: Set[str] = given_keys(training_params)
        self.training_params: TrainingParams = training_params if isinstance(training_params, TrainingParams) \
            else TrainingParams(training_params)
        self.built: List[AbstractCallback] = []        # the callbacks SG's trainer adds, once registered
        self.watched: Optional[str] = None             # metric_to_watch resolved among SG's names
        self._results: Optional[Tuple[int, Dict[str, Any]]] = None
        self._warned = False
        self._registered_on: Any = None
        self._clashes: Set[str] = set()     # SG names that are the loop's own history names (warned once)
        self._driven: Set[int] = set()      # the checkpoint callbacks metric_to_watch ranks

    # ---- registration: the checks, then the callbacks -------------------------------------------------------

    def register_train_loop_object(self, train_loop_obj: 'TrainLoop') -> AbstractCallback:
        """Check the fit against the params, then register the callbacks SG's trainer builds from them."""
        super().register_train_loop_object(train_loop_obj)
        loop = train_loop_obj
        try:
            context = self._adapter_context()
            other = context.state.get('run')
            if other is not None and other is not self:
                raise ValueError('the fit has two TrainingParamsCallbacks: one run has one training_params')
            self._check_fit()
            phase_callbacks = self._phase_callbacks()
            if self._registered_on is not loop:
                self._apply_optimizer_settings()
                self._seed()
                self.built = self._build()
            context.state['run'] = self
            self._resolve_watch(final=False)
        except Exception:
            # not left half-registered: a fit with corrected arguments registers it again
            loop.callbacks[:] = [cb for cb in loop.callbacks if cb is not self]
            loop.callbacks_handler.regate_for_rank()
            raise
        self._registered_on = loop
        self._warn_unused()
        for callback in phase_callbacks:
            if any(callback is registered for registered in loop.callbacks):
                logger.warning('%s is both in training_params["phase_callbacks"] and among the callbacks already '
                               'given to the fit; it is registered once and runs once per event (list it in one '
                               'place)', type(callback).__name__)
        loop.callbacks_handler.register_callbacks(phase_callbacks + self.built)
        return self

    def _check_fit(self) -> None:
        loop, params = self.train_loop_obj, self.training_params
        if params.max_epochs is None:
            if loop.num_epochs is None:
                raise ValueError('training_params has no max_epochs and the fit has no num_epochs yet: give '
                                 'training_params["max_epochs"] or register this callback through fit(callbacks=...)')
            params.max_epochs = loop.num_epochs
            self.given.discard('max_epochs')
        elif loop.num_epochs is not None and loop.num_epochs != params.max_epochs:
            asked = f'num_iterations={loop.num_iterations}, {loop.num_epochs} epochs' if loop.num_iterations \
                else f'num_epochs={loop.num_epochs}'
            raise ValueError(f'training_params max_epochs={params.max_epochs} but fit({asked}): SG trains max_epochs '
                             f'epochs and its learning-rate schedules are computed over them; call '
                             f'fit(num_epochs={params.max_epochs}) (or change max_epochs)')
        if 'batch_accumulate' in self.given and params.batch_accumulate != loop.grad_accumulation:
            raise ValueError(f'training_params batch_accumulate={params.batch_accumulate} but the fit accumulates '
                             f'{loop.grad_accumulation}: call fit(..., grad_accumulation={params.batch_accumulate})')
        params.batch_accumulate = loop.grad_accumulation
        clip = params.clip_grad_norm
        if clip is not None and not clip > 0:
            raise ValueError(f'training_params clip_grad_norm must be > 0 (or None), got {clip!r}')

    def _phase_callbacks(self) -> List[AbstractCallback]:
        entries = self.training_params.phase_callbacks or []
        if isinstance(entries, (AbstractCallback, str, Mapping)) or not isinstance(entries, (list, tuple)):
            raise TypeError(f'training_params phase_callbacks must be a list of callback objects, got {entries!r}')
        for i, entry in enumerate(entries):
            if not isinstance(entry, AbstractCallback):
                raise TypeError(f'training_params phase_callbacks[{i}] is {entry!r}: give callback objects (SG\'s '
                                f'names and YAML dicts need SG\'s registry; build the callback here instead)')
        return list(entries)

    def _train_loader_len(self) -> Optional[int]:
        try:
            return len(self.train_loop_obj.train_loader)
        except TypeError:
            return None

    def _apply_optimizer_settings(self) -> None:
        """Name the groups as SG does, and agree ``initial_lr`` with the optimizer (SG builds it with it)."""
        loop, params = self.train_loop_obj, self.training_params
        if loop.optimizer is None:
            return
        name_loop_param_groups(loop)
        groups = [group for optimizer in loop.optimizers for group in optimizer.param_groups]
        if params.initial_lr is None:
            lrs = {group['name']: group['lr'] for group in groups}
            params.initial_lr = groups[0]['lr'] if len(groups) == 1 or len(set(lrs.values())) == 1 else lrs
            return
        if loop.epochs_completed:
            return      # a continued run: the optimizer's rates are the run's own
        initial = params.initial_lr
        for i, group in enumerate(groups):
            if isinstance(initial, Mapping):
                if group['name'] not in initial:
                    raise ValueError(f'training_params initial_lr names {sorted(initial)} but parameter group {i} '
                                     f'is named {group["name"]!r}')
                lr = float(initial[group['name']])
            else:
                lr = float(initial)
            if group['lr'] != lr:
                logger.info('TrainingParamsCallback: parameter group %r starts at initial_lr=%s (the optimizer had '
                            '%s)', group['name'], lr, group['lr'])
                group['lr'] = lr

    def _seed(self) -> None:
        if 'seed' not in self.given or self.training_params.seed is None:
            return
        seed = int(self.training_params.seed) + self.train_loop_obj.global_rank
        random.seed(seed)
        np.random.seed(seed % 2 ** 32)
        torch.manual_seed(seed)

    def _build(self) -> List[AbstractCallback]:
        """The callbacks SG's trainer adds, in its order."""
        loop, params = self.train_loop_obj, self.training_params
        loader_len = self._train_loader_len()
        built: List[AbstractCallback] = []
        warmup = warmup_callback(params, loader_len, loop.model)
        if warmup is not None:
            built.append(warmup)
        built += [MetricsUpdateCallback(Phase.TRAIN_BATCH_END), MetricsUpdateCallback(Phase.VALIDATION_BATCH_END),
                  MetricsUpdateCallback(Phase.TEST_BATCH_END)]
        if params.lr_mode is not None:
            built.append(lr_mode_callback(params, loader_len, loop.model, loop.optimizer))
        if params.clip_grad_norm is not None:
            built.append(ClipGradNorm(params.clip_grad_norm))
        for callback in built:
            callback.execution_order = TRAINER_CALLBACKS_ORDER
        return built

    # ---- metric_to_watch ------------------------------------------------------------------------------------

    def sg_result_names(self, loss: Any = None) -> List[str]:
        """SG's names of the validation results: the loss items, then the titles of ``valid_metrics_list``."""
        context = self._adapter_context()
        return loss_names(self.train_loop_obj, loss) + context.metric_collection('validation').titles()

    def _resolve_watch(self, final: bool, loss: Any = None) -> None:
        name = self.training_params.metric_to_watch
        names = self.sg_result_names(loss)
        context = self._adapter_context()
        if name in names:
            self.watched = name
        elif _fuzzy(name) in [_fuzzy(n) for n in names]:
            self.watched = names[[_fuzzy(n) for n in names].index(_fuzzy(name))]
            logger.warning('TrainingParamsCallback: no exact match for metric_to_watch=%r among %s; %r is used',
                           name, names, self.watched)
        elif final:
            close = difflib.get_close_matches(name, names, n=3, cutoff=0.4)
            hint = f'; close names: {", ".join(repr(c) for c in close)}' if close else ''
            raise ValueError(f'training_params metric_to_watch={name!r} is none of the validation results{hint} '
                             f'(SG\'s names here: {", ".join(repr(n) for n in names)}: the loss items and the '
                             f'titles of valid_metrics_list)')
        else:
            self.watched = None     # the loss item names are known for sure once a batch has run
        context.metric_to_watch = self.watched if self.watched is not None else name
        self._drive_checkpoints()

    def on_batch_end(self) -> None:
        if self.watched is None:
            self._resolve_watch(final=True, loss=self.train_loop_obj.loss)

    # ---- SG's results in the history and in the checkpoints' ranking ------------------------------------------

    def history_result_names(self) -> List[str]:
        """The history names of SG's results, as SG keys them: the validation results under their own names (the
        loss items and the titles of ``valid_metrics_list``: what ``metric_to_watch`` names, and SG's checkpoints'
        ``metrics['valid']``), the training results under SG's log tag ``Train_<name>``."""
        context = self._adapter_context()
        train = loss_names(self.train_loop_obj) + context.metric_collection('train').titles()
        return self.sg_result_names() + [f'Train_{name}' for name in train]

    def _record(self, values: Dict[str, Any], names: List[str], prefix: str) -> None:
        loop = self.train_loop_obj
        for name in names:
            value = values.get(name)
            if value is None:
                continue
            key = prefix + name
            if key in LOOP_HISTORY_NAMES:
                if key not in self._clashes:
                    self._clashes.add(key)
                    logger.warning('TrainingParamsCallback: SG\'s result %r has the name of the loop\'s own %r; it is '
                                   'in metrics_dict, not recorded in the history', name, key)
                continue
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    continue
                value = value.item()
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                loop.insert_metric_result_into_history(key, float(value))

    def on_train_loader_end(self, context: PhaseContext) -> None:
        """SG's training results of the epoch into the history, as ``Train_<name>`` (SG's log tag)."""
        names = loss_names(self.train_loop_obj) + context.metric_collection('train').titles()
        self._record(context.metrics_dict or {}, names, 'Train_')

    def _drive_checkpoints(self) -> None:
        """``metric_to_watch`` ranks the loop's checkpoints (best_checkpoint.txt, the kept ones), as it chooses SG's
        best checkpoint: a checkpoint callback given no ``monitor`` of its own watches it, in SG's direction."""
        if self.watched is None:
            return
        from ...callbacks.model_save import ModelCheckpoint
        mode = 'max' if self.training_params.greater_metric_to_watch_is_better else 'min'
        for callback in self.train_loop_obj.callbacks:
            if not isinstance(callback, ModelCheckpoint) or (callback.monitor is not None
                                                              and id(callback) not in self._driven):
                continue        # a checkpoint callback given its own monitor keeps it
            if id(callback) not in self._driven:
                logger.info('TrainingParamsCallback: %s ranks its checkpoints by metric_to_watch=%r (mode %r), as '
                            'SG chooses its best checkpoint', type(callback).__name__, self.watched, mode)
            callback.monitor, callback.mode = self.watched, mode
            self._driven.add(id(callback))

    def watched_value(self, epoch: int) -> Optional[Tuple[float, Dict[str, Any]]]:
        """(the value of ``metric_to_watch``, SG's validation results) of ``epoch``'s validation, or None when that
        epoch has no validation results (or not the watched one)."""
        if self._results is None or self._results[0] != epoch or self.watched is None:
            return None
        value = self._results[1].get(self.watched)
        if value is None:
            return None
        return float(value.item() if isinstance(value, torch.Tensor) else value), self._results[1]

    # ---- the run ----------------------------------------------------------------------------------------------

    def on_training_start(self, context: PhaseContext) -> None:
        """Each fit: the same checks (a second fit continues the run), names for the groups of an optimizer loaded
        since registration, the metrics on the model's device."""
        self._check_fit()
        name_loop_param_groups(self.train_loop_obj)
        for split in ('train', 'validation'):
            context.metric_collection(split).to(self.train_loop_obj.device)
        if self.train_loop_obj.experiment is not None and self.train_loop_obj.is_main_process():
            os.makedirs(context.ckpt_dir, exist_ok=True)        # SG's trainer makes it before training
        self._drive_checkpoints()       # every callback of the fit is registered now
        if self.train_loop_obj.validation_loader is None:
            logger.warning('TrainingParamsCallback: the TrainLoop has no validation_loader, so metric_to_watch=%r '
                           'never has a value and on_validation_end_best_epoch never runs',
                           self.training_params.metric_to_watch)

    def on_validation_loader_end(self, context: PhaseContext) -> None:
        """Keep SG's validation results of the epoch (the best epoch is decided on them) and record them in the
        history under SG's names (so the epoch's log line, the checkpoints' ranking, EarlyStopping and the reports
        have them)."""
        self._results = (context.epoch, dict(context.metrics_dict or {}))
        if self.train_loop_obj.epochs_running:
            self._record(self._results[1], self.sg_result_names(), '')

    def _warn_unused(self) -> None:
        if self._warned:
            return
        self._warned = True
        unused = sorted(key for key in self.given - ACTED_ON if not self._consistent(key))
        if unused:
            notes = [f'{key} ({HINTS[key]})' if key in HINTS else key for key in unused]
            logger.warning('TrainingParamsCallback: nothing here acts on these training_params: %s',
                           ', '.join(notes))

    def _consistent(self, key: str) -> bool:
        """Whether the value of ``key`` asks for nothing the loop does not do anyway."""
        value = self.training_params.get(key)
        if key in NO_EFFECT:
            return bool(value == NO_EFFECT[key])
        loop = self.train_loop_obj
        if key == 'mixed_precision':
            return bool(value) == (loop.precision != 'fp32')
        if key == 'loss':
            criterion = loop.criterion
            return value is criterion or (isinstance(value, str) and criterion is not None
                                          and _fuzzy(value) == _fuzzy(type(criterion).__name__))
        if key in ('optimizer', 'optimizer_params'):
            optimizer = loop.optimizer
            if optimizer is None:
                return False
            if key == 'optimizer':
                name = value if isinstance(value, str) else getattr(value, '__name__', None)
                return value is optimizer or (name is not None and _fuzzy(name) == _fuzzy(type(optimizer).__name__))
            group = getattr(optimizer, 'param_groups', [{}])[0]
            return isinstance(value, Mapping) and all(_same(group.get(k), v) for k, v in value.items())
        return False

    def __repr__(self) -> str:
        return f'TrainingParamsCallback(max_epochs={self.training_params.max_epochs}, ' \
               f'lr_mode={self.training_params.lr_mode!r}, metric_to_watch={self.training_params.metric_to_watch!r})'


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)

