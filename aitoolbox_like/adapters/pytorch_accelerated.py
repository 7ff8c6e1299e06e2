"""pytorch-accelerated's callbacks on the TrainLoop, as they are (``pip install aitoolbox_like[pta]``).

A pytorch-accelerated (PTA) user passes the callbacks they have, PTA's own classes and their subclasses of PTA's
``TrainerCallback``, to ``TrainLoop.fit(callbacks=[...])``, mixed with ours. The loop hands them to one
:class:`AcceleratedCallbacks`, which calls PTA's events at PTA's points of a training run with PTA's arguments,
through PTA's own ``CallbackHandler``, and gives them a ``trainer`` (:class:`AcceleratedTrainer`) that offers what
PTA's Trainer offers callbacks: its run history with PTA's names, ``run_config``, ``print``, ``save_checkpoint`` /
``load_checkpoint`` and ``save_training_state`` / ``load_training_state`` in PTA's file formats, the model,
optimizer, scheduler, loaders and device.

Where PTA's events fall in a fit (PTA's ``trainer.py`` is the reference):

========================================  ====================================================================
PTA event                                 when, here
========================================  ====================================================================
``on_init_end``                           the callback's registration
``on_training_run_start``                 ``on_train_begin``
``on_train_epoch_start``                  ``on_epoch_begin``
``on_train_step_start``                   ``on_batch_begin``
``on_train_step_end``                     ``on_after_loss``: before backward, ``batch_output['loss']`` divided for
                                          gradient accumulation, as PTA calls it
``on_train_epoch_end``                    ``on_train_epoch_end``, after ``train_loss_epoch`` is recorded
``on_eval_epoch_start`` ... ``_end``      the validation loss pass of the end-of-epoch evaluation (and the passes a
                                          PTA callback runs itself: ``trainer._run_eval_epoch``); ``eval_loss_epoch``
                                          is recorded before ``on_eval_epoch_end``
``on_training_run_epoch_end``             ``on_epoch_end``; then ``run_history.current_epoch`` goes up
``on_training_run_end``                   ``on_train_end``
``on_stop_training_error``                after a PTA ``StopTrainingError`` (a ``StopTraining`` for the loop)
========================================  ====================================================================

``on_evaluation_run_start`` / ``_end`` belong to PTA's ``Trainer.evaluate``, which has no counterpart in a fit:
they are not called, as PTA calls them in no training run.
"""
import copyreg
import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .. import distributed
from ..model.predictions import batch_size_of
from ..engine.handler import foreign_library
from ..callbacks.abstract import AbstractCallback, AbstractScheduler, StopTraining
from .foreign_state import Encoder, ForeignState, loop_references, unsaveable
from ..callbacks.preemption import find_checkpoint_callback

if TYPE_CHECKING:
    from ..engine.train_loop import TrainLoop

logger = logging.getLogger(__name__)

_INSTALL = "pytorch-accelerated's callbacks need it installed: pip install 'aitoolbox_like[pta]'"


def _pta() -> Any:
    """PTA's callbacks module (importing it imports accelerate, about a second: only when PTA callbacks are used)."""
    try:
        import pytorch_accelerated.callbacks as callbacks
    except ImportError as error:
        raise ImportError(_INSTALL) from error
    return callbacks


def _pta_utils() -> Any:
    _pta()
    import pytorch_accelerated.utils as utils
    return utils


def is_accelerated_callback(obj: Any) -> bool:
    """True for a PTA callback, an instance or a class (PTA's Trainer takes both)."""
    return foreign_library(obj) == 'pytorch_accelerated'


def _rebuilt(cls: Any, state: Dict[str, Any]) -> Any:
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return obj


def _reduced(obj: Any) -> Tuple[Callable[..., Any], Tuple[type, Dict[str, Any]]]:
    return _rebuilt, (type(obj), vars(obj))


def make_picklable() -> None:
    """Let ``pickle`` handle PTA callbacks (of every ``TrainerCallback`` subclass defined so far), so that they
    reach the processes of a DDP fit: PTA's ``TrainerCallback.__getattr__`` raises its own error, not
    ``AttributeError``, for the names pickle looks up. Each is rebuilt from its class and ``__dict__``."""
    pending = [_pta().TrainerCallback]
    while pending:
        cls = pending.pop()
        copyreg.pickle(cls, _reduced)
        pending += cls.__subclasses__()


def adopt_callbacks(loop: 'TrainLoop', callbacks: Sequence[Any]) -> List[Any]:
    """``callbacks`` (given to ``fit``) with the PTA callbacks among them held by one :class:`AcceleratedCallbacks`
    where the first of them was: the one in ``callbacks`` or already registered on the loop if there is one (with
    its ``create_scheduler_fn``), else a new one. PTA's callbacks share one trainer, as on PTA's Trainer."""
    make_picklable()
    pta = [cb for cb in callbacks if is_accelerated_callback(cb)]
    holder = next((cb for cb in list(callbacks) + list(loop.callbacks) if isinstance(cb, AcceleratedCallbacks)), None)
    if holder is not None:
        holder.add_callbacks(pta)
        return [cb for cb in callbacks if not is_accelerated_callback(cb)]
    holder = AcceleratedCallbacks(pta)
    return [holder if cb is pta[0] else cb for cb in callbacks if cb is pta[0] or not is_accelerated_callback(cb)]


def _run_history(loop: 'TrainLoop') -> Any:
    """A PTA ``InMemoryRunHistory`` (PTA's names and methods) that also records every value a callback updates into
    ``loop.train_history``, under the same name (the loop's plots, reports and checkpoints then have them)."""
    from pytorch_accelerated.tracking import InMemoryRunHistory

    class LoopRunHistory(InMemoryRunHistory):
        def update_metric(self, metric_name: str, metric_value: Any) -> None:
            super().update_metric(metric_name, metric_value)
            name = f'{self.metric_name_prefix}{metric_name}'
            if not name.startswith('intermediate_'):        # deleted again right away (StepBasedEvaluation)
                loop.insert_metric_result_into_history(name, metric_value)

    return LoopRunHistory()


def _run_config(values: Dict[str, Any]) -> Any:
    """PTA's ``TrainerRunConfig`` with ``values``, which reads by key too: PTA's documentation examples write
    ``trainer.run_config['train_per_device_batch_size']``."""
    from pytorch_accelerated.run_config import TrainerRunConfig

    class RunConfig(TrainerRunConfig):
        def __getitem__(self, key: str) -> Any:
            return getattr(self, key)

    return RunConfig(**values)


class PreparedLoader:
    """A loader as PTA's callbacks see it (accelerate's prepared loader): the loop's loader, with ``device``."""

    def __init__(self, loader: Any, device: torch.device) -> None:
        self.loader = loader
        self.device = device

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name == 'loader':        # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


class AcceleratorView:
    """What PTA's callbacks use of the trainer's ``accelerate.Accelerator``: the process flags, ``print`` once per
    machine, ``unwrap_model``, ``wait_for_everyone``, ``save`` on the main process, ``gather``."""

    def __init__(self, loop: 'TrainLoop') -> None:
        self._loop = loop

    @property
    def is_main_process(self) -> bool:
        """The process of global rank 0."""
        return self._loop.is_main_process()

    @property
    def is_local_main_process(self) -> bool:
        """The first process of this machine."""
        return int(os.environ.get('LOCAL_RANK', self._loop.global_rank)) == 0

    @property
    def num_processes(self) -> int:
        """How many processes train together."""
        return self._loop.world_size

    @property
    def device(self) -> torch.device:
        """The loop's device."""
        return self._loop.device

    @property
    def mixed_precision(self) -> str:
        """accelerate's name of the precision: ``'no'``, ``'fp16'`` or ``'bf16'``."""
        precision = self._loop.precision
        return 'no' if precision == 'fp32' else precision

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last update was skipped (the fp16 GradScaler found inf/NaN gradients)."""
        return not all(self._loop.update_applied) if self._loop.update_applied else False

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` in the first process of each machine."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def unwrap_model(self, model: Any, keep_torch_compile: bool = True) -> Any:
        """The module inside DDP / DataParallel wrappers (and inside ``torch.compile`` unless kept)."""
        while isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        if not keep_torch_compile:
            model = getattr(model, '_orig_mod', model)
        return model

    def wait_for_everyone(self) -> None:
        """A barrier in a distributed run."""
        if distributed.is_distributed():
            dist.barrier()

    def save(self, obj: Any, path: Any) -> None:
        """``torch.save`` on the first process of each machine (accelerate's ``save``)."""
        if self.is_local_main_process:
            torch.save(obj, path)

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` of every process, concatenated on the first dimension (0-dim tensors become one each)."""
        tensor = tensor.reshape(1) if tensor.dim() == 0 else tensor
        if not distributed.is_distributed():
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.num_processes)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts)


class AcceleratedTrainer:
    """The ``trainer`` PTA's callbacks receive: what PTA's ``Trainer`` offers them, over the loop.

    ``model`` is the loop's model; a callback may set another (``ModelEmaCallback`` evaluates and saves its average
    that way): the trainer's own passes and saves then use it, while the loop trains its own. The loaders
    (``_train_dataloader``, ``_eval_dataloader``) are the loop's, with a ``device``; setting them sets the loop's for
    this fit (``LimitBatchesCallback``), and the loop gets its own back at the end of the fit, as PTA's Trainer builds
    new ones for every run. ``run_history`` is PTA's (``train_loss_epoch``, ``eval_loss_epoch``: means weighted by
    batch size; ``current_epoch`` counts from 1); what callbacks record in it lands in the loop's history too.
    """

    def __init__(self, loop: 'TrainLoop', callbacks: 'AcceleratedCallbacks') -> None:
        self.loop = loop
        self.callback_handler: Any = callbacks.handler
        self.run_history: Any = _run_history(loop)
        self.run_config: Any = None
        self.scheduler: Any = None
        self.create_scheduler_fn: Optional[Callable[..., Any]] = callbacks.create_scheduler_fn
        self.collate_fn: Any = None
        self._accelerator = AcceleratorView(loop)
        self._loss_tracker: Any = _loss_tracker()
        self._model: Any = None
        self._loaders: Optional[Tuple[Any, Any]] = None     # the loop's own, while a callback replaced them
        self._state_saver: Optional[Tuple[Any, Any, Any]] = None      # model, optimizer, their Accelerator
        # While the loop evaluates (its passes leave the global RNG as they found it) PTA's evaluation epochs run by
        # callbacks draw nothing that lasts; the draws PTA's Trainer would have made are owed, and made after it.
        self.in_loop_evaluation = False
        self.draws_owed = 0

    # ---- what PTA's Trainer holds -----------------------------------------------------------------------------

    @property
    def model(self) -> Any:
        """The loop's model, unless a callback set another for the trainer's own passes and saves."""
        return self._model if self._model is not None else self.loop.model

    @model.setter
    def model(self, model: Any) -> None:
        self._model = None if model is self.loop.model or model is self.loop.ddp_model else model

    @property
    def optimizer(self) -> Any:
        """The loop's optimizer."""
        return self.loop.optimizer

    @optimizer.setter
    def optimizer(self, optimizer: Any) -> None:
        self.loop.optimizer = optimizer

    @property
    def loss_func(self) -> Any:
        """The loop's criterion."""
        return self.loop.criterion

    @property
    def device(self) -> torch.device:
        """The loop's device."""
        return self.loop.device

    @property
    def train_dataset(self) -> Any:
        """The train loader's dataset."""
        return getattr(self.loop.train_loader, 'dataset', None)

    @property
    def eval_dataset(self) -> Any:
        """The validation loader's dataset."""
        return getattr(self.loop.validation_loader, 'dataset', None)

    @property
    def _train_dataloader(self) -> Optional[PreparedLoader]:
        loader = self.loop.train_loader
        return None if loader is None else PreparedLoader(loader, self.loop.device)

    @_train_dataloader.setter
    def _train_dataloader(self, loader: Any) -> None:
        self._keep_loop_loaders()
        self.loop.train_loader = loader.loader if isinstance(loader, PreparedLoader) else loader

    @property
    def _eval_dataloader(self) -> Optional[PreparedLoader]:
        loader = self.loop.validation_loader
        return None if loader is None else PreparedLoader(loader, self.loop.device)

    @_eval_dataloader.setter
    def _eval_dataloader(self, loader: Any) -> None:
        self._keep_loop_loaders()
        self.loop.validation_loader = loader.loader if isinstance(loader, PreparedLoader) else loader

    def _keep_loop_loaders(self) -> None:
        if self._loaders is None:
            self._loaders = (self.loop.train_loader, self.loop.validation_loader)

    def restore_loaders(self) -> None:
        """Give the loop back the loaders a callback replaced during the fit."""
        if self._loaders is not None:
            self.loop.train_loader, self.loop.validation_loader = self._loaders
            self._loaders = None

    # ---- PTA's Trainer methods that callbacks call -------------------------------------------------------------

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once per machine."""
        self._accelerator.print(*args, **kwargs)

    def gather(self, tensor: torch.Tensor, padding_value: Any = None) -> torch.Tensor:
        """``tensor`` of every process, concatenated (``padding_value``: unequal first dimensions are padded, then
        the padding removed, as PTA's)."""
        if padding_value is None or not distributed.is_distributed():
            return self._accelerator.gather(tensor)
        sizes = self._accelerator.gather(torch.tensor([tensor.shape[0]], device=tensor.device))
        longest = int(sizes.max())
        padded = torch.full((longest, *tensor.shape[1:]), padding_value, dtype=tensor.dtype, device=tensor.device)
        padded[:tensor.shape[0]] = tensor
        gathered = self._accelerator.gather(padded)
        return torch.cat([gathered[i * longest:i * longest + int(n)] for i, n in enumerate(sizes.tolist())])

    def get_model(self, keep_torch_compile: bool = True) -> Any:
        """The model outside its distributed wrappers."""
        return self._accelerator.unwrap_model(self.model, keep_torch_compile=keep_torch_compile)

    def save_checkpoint(self, save_path: Any, checkpoint_kwargs: Optional[Dict[str, Any]] = None,
                        save_optimizer: bool = True, save_scheduler: bool = True, save_per_node: bool = True) -> None:
        """PTA's model export: one file of ``{'model_state_dict', 'optimizer_state_dict', 'scheduler_state_dict',
        **checkpoint_kwargs}``, written once per machine (``save_per_node=False``: by the main process only)."""
        checkpoint: Dict[str, Any] = {'model_state_dict': self.get_model(keep_torch_compile=False).state_dict()}
        if save_optimizer:
            checkpoint['optimizer_state_dict'] = self.optimizer.state_dict()
        if save_scheduler and self.scheduler is not None:
            try:
                checkpoint['scheduler_state_dict'] = self.scheduler.state_dict()
            except Exception:
                self.print('Warning: Could not save the scheduler state dict. Please ensure the scheduler has a '
                           'state_dict method.')
        if checkpoint_kwargs is not None:
            checkpoint.update(checkpoint_kwargs)
        self._accelerator.wait_for_everyone()
        if save_per_node or self.loop.is_main_process():
            self._accelerator.save(checkpoint, save_path)

    def load_checkpoint(self, checkpoint_path: Any, load_optimizer: bool = True,
                        load_scheduler: bool = True) -> Dict[str, Any]:
        """Load a file :meth:`save_checkpoint` wrote; returns it whole (with the ``checkpoint_kwargs``)."""
        self._accelerator.wait_for_everyone()
        checkpoint = torch.load(checkpoint_path, map_location='cpu', weights_only=True)
        self.get_model(keep_torch_compile=False).load_state_dict(checkpoint['model_state_dict'])
        if load_optimizer and 'optimizer_state_dict' in checkpoint:
            if self.optimizer is None:
                raise ValueError('load_checkpoint: the checkpoint holds an optimizer state but the TrainLoop has no '
                                 'optimizer; pass one, or load_optimizer=False')
            self.optimizer.load_state_dict(checkpoint['optimizer_state_dict'])
        if load_scheduler and 'scheduler_state_dict' in checkpoint:
            if self.scheduler is None:
                raise ValueError('load_checkpoint: the checkpoint holds a scheduler state but no scheduler is set; '
                                 'pass create_scheduler_fn to AcceleratedCallbacks, or load_scheduler=False')
            self.scheduler.load_state_dict(checkpoint['scheduler_state_dict'])
        return checkpoint

    def save_training_state(self, output_dir: Any, checkpoint_kwargs: Optional[Dict[str, Any]] = None) -> None:
        """PTA's training state: accelerate's ``save_state`` folder (model, optimizer, scheduler, RNG states, the
        scaler) and ``trainer_metadata.pt`` (``current_epoch`` and ``checkpoint_kwargs``)."""
        output_dir = Path(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        accelerator = self._state_accelerator()
        accelerator.save_state(str(output_dir))
        metadata = {'current_epoch': self.run_history.current_epoch, **(checkpoint_kwargs or {})}
        if self.loop.is_main_process():
            torch.save(metadata, output_dir / 'trainer_metadata.pt')
        self._accelerator.wait_for_everyone()

    def load_training_state(self, input_dir: Any) -> Dict[str, Any]:
        """Load a folder :meth:`save_training_state` wrote; returns its metadata."""
        input_dir = Path(input_dir)
        self._state_accelerator().load_state(str(input_dir))
        metadata_path = input_dir / 'trainer_metadata.pt'
        metadata: Dict[str, Any] = {}
        if metadata_path.exists():
            metadata = torch.load(metadata_path, map_location='cpu', weights_only=True)
        return metadata

    def _state_accelerator(self) -> Any:
        """The ``accelerate.Accelerator`` that saves and loads PTA's training states (it only saves and loads: the
        loop trains): one per model and optimizer, which it knows; the scheduler is registered at every save and
        load, as PTA's Trainer registers it, so the folders hold the files PTA's hold."""
        from accelerate import Accelerator
        model, optimizer = self.get_model(keep_torch_compile=False), self.optimizer
        if self._state_saver is None or self._state_saver[0] is not model or self._state_saver[1] is not optimizer:
            accelerator = Accelerator(cpu=self.loop.device.type == 'cpu')
            accelerator.prepare_model(model, device_placement=False)
            if optimizer is not None:
                accelerator.prepare_optimizer(optimizer, device_placement=False)
            self._state_saver = (model, optimizer, accelerator)
        accelerator = self._state_saver[2]
        if self.scheduler is not None:
            accelerator.register_for_checkpointing(self.scheduler)
        return accelerator

    # ---- PTA's evaluation epoch (the passes callbacks run themselves) --------------------------------------------

    def _run_eval_epoch(self, valid_dl: Any, is_training: bool = True, is_intermediate: bool = False) -> None:
        """An evaluation epoch as PTA's Trainer runs one: the events, ``eval_loss_epoch`` (``intermediate_eval_loss``
        for an intermediate one, ``evaluation_loss`` outside training), with the trainer's current ``model``. The
        model's training mode is put back afterwards (the loop may be inside an epoch)."""
        if self.in_loop_evaluation:
            self.draws_owed += global_draws_of_iterating(valid_dl)
        model = self.model
        was_training = model.training
        model.eval()
        self._loss_tracker.reset()
        self.callback_handler.call_event('on_eval_epoch_start', self, is_intermediate=is_intermediate)
        loop = self.loop
        feed_def = loop.batch_model_feed_def
        outputs = _OutputCatcher(model)
        try:
            with torch.no_grad():
                for batch in valid_dl:
                    self.callback_handler.call_event('on_eval_step_start', self)
                    if feed_def is not None:
                        loss = feed_def.get_loss_eval(model, batch, loop.criterion, loop.device)
                    else:
                        loss = model.get_loss_eval(batch, loop.criterion, loop.device)
                    batch_output = {'loss': loss, 'model_outputs': outputs.last, 'batch_size': batch_size_of(batch)}
                    self._loss_tracker.update(loss.detach().mean().item(), batch_output['batch_size'])
                    self.callback_handler.call_event('on_eval_step_end', self, batch_output=batch_output,
                                                     batch=batch)
        finally:
            outputs.remove()
            model.train(was_training)
        name = 'intermediate_eval_loss' if is_intermediate else 'eval_loss_epoch' if is_training else 'evaluation_loss'
        self._add_epoch_loss_to_run_history(name)
        self.callback_handler.call_event('on_eval_epoch_end', self, is_intermediate=is_intermediate)

    def _add_epoch_loss_to_run_history(self, metric_name: str) -> None:
        """The loss tracker's batch-size-weighted mean over every process into the run history, computed as PTA's
        Trainer computes it (its float32 total and count gathered, then divided), so the value is PTA's to the
        bit."""
        total = self._accelerator.gather(torch.tensor(self._loss_tracker.total_loss, device=self.device))
        count = self._accelerator.gather(torch.tensor(self._loss_tracker.running_count, device=self.device))
        self.run_history.update_metric(metric_name, (total.sum() / count.sum()).item())


def global_draws_of_iterating(loader: Any) -> int:
    """How many numbers iterating ``loader`` once draws from the global torch RNG: a DataLoader's iterator draws
    its base seed (unless the loader has its own generator), and a RandomSampler without a generator one more."""
    loader = loader.loader if isinstance(loader, PreparedLoader) else loader
    if not isinstance(loader, torch.utils.data.DataLoader) or loader.generator is not None:
        return 0
    sampler = loader.sampler
    return 1 + (isinstance(sampler, torch.utils.data.RandomSampler) and sampler.generator is None)


def _loss_tracker() -> Any:
    from pytorch_accelerated.tracking import LossTracker
    return LossTracker()


class _OutputCatcher:
    """The output of ``model``'s last forward pass (PTA's ``batch_output['model_outputs']``), kept by a forward hook
    (the loop's models compute their loss inside ``get_loss``, which returns only the loss)."""

    def __init__(self, model: Any) -> None:
        self.last: Any = None
        self._handle = model.register_forward_hook(self._keep) if isinstance(model, torch.nn.Module) else None

    def _keep(self, module: Any, inputs: Any, output: Any) -> None:
        self.last = output

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


class AcceleratedCallbacks(AbstractCallback):
    """pytorch-accelerated callbacks run on the TrainLoop; ``fit`` makes one for the PTA callbacks it is given (see
    the module docstring), so it is rarely built by hand.

    Args:
        callbacks: PTA callbacks (``pytorch_accelerated.callbacks`` classes and subclasses of its
            ``TrainerCallback``), instances or classes, in the order PTA calls them.
        create_scheduler_fn: PTA's scheduler factory, ``optimizer -> scheduler``, where
            ``TrainerPlaceholderValues`` (``NUM_EPOCHS``, ``NUM_UPDATE_STEPS_PER_EPOCH``, ...) are filled from
            the fit, as PTA's ``Trainer.train(create_scheduler_fn=...)``: the scheduler is ``trainer.scheduler`` and
            steps after every applied optimizer update. None: ``trainer.scheduler`` is the first scheduler callback's
            scheduler, or None.
        trainer_rng (bool): draw random numbers as PTA's Trainer does, so that shuffled data gives PTA's numbers:
            a fit starting from scratch is seeded as PTA's ``train()`` seeds a run (42 plus the process's rank), and
            each epoch draws what PTA's evaluation epochs draw from the global RNG (the loop's evaluation draws
            nothing that lasts). False: the loop's own RNG use.

    Its ``state_dict`` holds the PTA side of the run (the trainer's run history, each PTA callback's attributes, the
    scheduler, the epoch's step losses), restored in a resumed fit after the callbacks' ``on_training_run_start``.
    """

    def __init__(self, callbacks: Sequence[Any] = (),
                 create_scheduler_fn: Optional[Callable[..., Any]] = None, trainer_rng: bool = True) -> None:
        super().__init__('pytorch-accelerated callbacks')
        make_picklable()        # a DDP fit pickles this callback, and the PTA callbacks it holds, to its processes
        self.handler = _pta().CallbackHandler([])
        self.create_scheduler_fn = create_scheduler_fn
        self.trainer_rng = trainer_rng
        self.trainer: Optional[AcceleratedTrainer] = None
        self._train_losses: List[Tuple[torch.Tensor, int]] = []
        self._outputs: Optional[_OutputCatcher] = None
        self._eval_outputs: Optional[_OutputCatcher] = None
        self._in_validation = False
        self._initialised = False
        self._running = False           # between on_training_run_start and the end of the run
        self._pending_scheduler_state: Optional[Dict[str, Any]] = None
        self._pending_state: Optional[Dict[str, Any]] = None
        self._states: List[ForeignState] = []      # per PTA callback, in handler order
        limit = os.environ.get(_pta_utils().LIMIT_BATCHES_ENV_VAR)
        if limit is not None and limit.lower() != 'none':
            # What PTA's Trainer does when it is made with PT_ACC_LIMIT_BATCHES set (utils.LimitBatches sets it).
            self.add_callbacks([_pta().LimitBatchesCallback(int(limit))])
        self.add_callbacks(callbacks)

    @property
    def callbacks(self) -> List[Any]:
        """The PTA callbacks, in the order they are called."""
        return list(self.handler.callbacks)

    def add_callbacks(self, callbacks: Sequence[Any]) -> None:
        """Add PTA callbacks (instances or classes; one instance of a class, as PTA's Trainer); one that is already
        here is kept once."""
        for callback in callbacks:
            if not is_accelerated_callback(callback):
                raise TypeError(f'AcceleratedCallbacks takes pytorch-accelerated callbacks (subclasses of '
                                f'pytorch_accelerated.callbacks.TrainerCallback), got {type(callback).__qualname__}')
            if any(callback is existing for existing in self.handler.callbacks):
                continue
            self.handler.add_callback(callback)
            added = self.handler.callbacks[-1]
            self._states.append(ForeignState(type(added).__name__))
            if self._initialised and self.trainer is not None:
                added.on_init_end(self.trainer)
                self._states[-1].record_initial(added, self._encoder())

    def _call(self, event: str, **kwargs: Any) -> None:
        """Call ``event`` on the PTA callbacks through the trainer's handler (a callback may have swapped it); PTA's
        ``StopTrainingError`` becomes the loop's ``StopTraining``."""
        assert self.trainer is not None
        try:
            self.trainer.callback_handler.call_event(event, self.trainer, **kwargs)
        except _pta().StopTrainingError as error:
            raise StopTraining(str(error)) from error

    # ---- the loop's hooks -> PTA's events -----------------------------------------------------------------------

    def on_train_loop_registration(self) -> None:
        """PTA's ``on_init_end``; each PTA callback's attributes as the script built them are recorded (a setting
        changed for a resumed run is told from the saved run's state by them)."""
        self.trainer = AcceleratedTrainer(self.train_loop_obj, self)
        self._initialised = True
        encoder = self._encoder()
        for callback, state in zip(self.handler.callbacks, self._states):
            state.record_initial(callback, encoder)
        self._call('on_init_end')

    def on_train_begin(self) -> None:
        """A new run: PTA's run config, scheduler and run history (reset, as PTA's ``train`` does), then
        ``on_training_run_start``."""
        trainer, loop = self.trainer, self.train_loop_obj
        assert trainer is not None
        if self.trainer_rng and loop.total_iteration_idx < 0:
            # PTA's train() seeds every run (accelerate's set_seed(42, device_specific=True): 42 plus the process's
            # rank); a resumed or continued fit keeps the RNG state its checkpoint or the run before left.
            from accelerate.utils import set_seed
            set_seed(42 + loop.global_rank)
        trainer.run_history.reset()
        # PTA's RunHistory moves its epoch only by _set_epoch / _increment_epoch, as PTA's Trainer does.
        trainer.run_history._set_epoch(loop.epochs_completed + 1)
        trainer.run_config = _run_config(_run_config_values(loop))
        # A resumed fit: the optimizer holds the checkpoint's values, which building a scheduler overwrites.
        groups = [dict(group) for group in trainer.optimizer.param_groups] if trainer.optimizer is not None else []
        trainer.scheduler = self._build_scheduler(trainer) if self.create_scheduler_fn is not None else \
            next((cb.scheduler for cb in loop.get_schedulers() if isinstance(cb, AbstractScheduler)), None)
        if self._pending_scheduler_state is not None and self.create_scheduler_fn is not None:
            trainer.scheduler.load_state_dict(self._pending_scheduler_state)
            self._pending_scheduler_state = None
            field = getattr(trainer.scheduler, 'param_group_field', 'lr')
            for group, saved in zip(trainer.optimizer.param_groups, groups):
                group[field] = saved[field]
        self._outputs = _OutputCatcher(loop.model)
        self._call('on_training_run_start')
        self._running = True
        # A resumed fit: the PTA callbacks have reset themselves (reset_on_train) and built what they build at the
        # start of a run (ModelEmaCallback's average); now the state they had when the checkpoint was taken.
        if self._pending_state is not None:
            state, self._pending_state = self._pending_state, None
            self._apply_state(state)
        if find_checkpoint_callback(loop) is not None or loop.resume_plan is not None:
            encoder = self._encoder()
            for callback, foreign in zip(self.handler.callbacks, self._states):
                foreign.name_unsaveable(unsaveable(callback, encoder))

    def _build_scheduler(self, trainer: AcceleratedTrainer) -> Any:
        from pytorch_accelerated.trainer import replace_trainer_placeholder_values
        scheduler_type = replace_trainer_placeholder_values(trainer, self.create_scheduler_fn)
        return scheduler_type(trainer.optimizer)

    def on_epoch_begin(self) -> None:
        """``on_train_epoch_start`` (the epoch's loss tracking starts)."""
        assert self.trainer is not None
        self.trainer.run_history._set_epoch(self.train_loop_obj.epoch + 1)
        self.trainer._loss_tracker.reset()
        self._train_losses = []
        self._call('on_train_epoch_start')

    def on_batch_begin(self) -> None:
        """``on_train_step_start``."""
        self._call('on_train_step_start')

    def on_after_loss(self) -> None:
        """``on_train_step_end``, as PTA calls it: after the loss, before backward, with the loss divided by the
        gradient accumulation steps (a callback's replacement is what backward then uses)."""
        loop = self.train_loop_obj
        accumulation = loop.grad_accumulation
        loss = loop.loss if accumulation == 1 else loop.loss / accumulation
        batch_output = {'loss': loss, 'model_outputs': self._outputs.last if self._outputs else None,
                        'batch_size': batch_size_of(loop.batch)}
        if isinstance(loss, torch.Tensor):
            self._train_losses.append((loss.detach(), batch_output['batch_size']))
        self._call('on_train_step_end', batch_output=batch_output, batch=loop.batch, step=loop.iteration)
        if batch_output['loss'] is not loss:
            loop.loss = batch_output['loss'] * accumulation

    def on_after_optimizer_step(self) -> None:
        """PTA steps its scheduler after each applied update."""
        trainer = self.trainer
        if self.create_scheduler_fn is not None and trainer is not None and trainer.scheduler is not None \
                and self.train_loop_obj.optimizer_update_applied(self.train_loop_obj.optimizer_idx):
            trainer.scheduler.step()

    def on_train_epoch_end(self) -> None:
        """``train_loss_epoch`` (the batch-size-weighted mean of the epoch's step losses, computed as PTA computes
        it), then ``on_train_epoch_end``. The step losses reach the loss tracker here, not at each step: reading
        a loss at each step would wait for the device every step."""
        trainer = self.trainer
        assert trainer is not None
        tracker = trainer._loss_tracker
        tracker.reset()
        if self._train_losses:
            values = torch.stack([loss.reshape(-1).mean().float() for loss, _ in self._train_losses]).tolist()
            for value, (_, size) in zip(values, self._train_losses):
                tracker.update(value, size)
        self._train_losses = []
        trainer._add_epoch_loss_to_run_history('train_loss_epoch')
        self._call('on_train_epoch_end')

    def on_eval_begin(self, dataset_info: Dict[str, Any]) -> None:
        """The validation loss pass of a training epoch is PTA's evaluation epoch: ``on_eval_epoch_start``."""
        loop = self.train_loop_obj
        self._in_validation = loop.epochs_running and dataset_info.get('type') == 'validation' \
            and dataset_info.get('kind') == 'loss'
        if self._in_validation:
            assert self.trainer is not None
            self.trainer._loss_tracker.reset()
            self._eval_outputs = _OutputCatcher(loop.model)
            self._call_in_evaluation('on_eval_epoch_start', is_intermediate=False)

    def on_eval_batch_begin(self, batch: Any, dataset_info: Dict[str, Any]) -> None:
        """``on_eval_step_start``."""
        if self._in_validation:
            self._call_in_evaluation('on_eval_step_start')

    def on_eval_batch_end(self, batch: Any, outputs: Any, dataset_info: Dict[str, Any]) -> None:
        """``on_eval_step_end`` with PTA's ``batch_output``."""
        if self._in_validation:
            assert self.trainer is not None
            batch_output = {'loss': outputs, 'model_outputs': self._eval_outputs.last if self._eval_outputs else None,
                            'batch_size': batch_size_of(batch)}
            self.trainer._loss_tracker.update(outputs.detach().mean().item(), batch_output['batch_size'])
            self._call_in_evaluation('on_eval_step_end', batch_output=batch_output, batch=batch)

    def on_eval_end(self, dataset_info: Dict[str, Any]) -> None:
        """``eval_loss_epoch`` into the run history, then ``on_eval_epoch_end``."""
        if self._in_validation:
            self._in_validation = False
            if self._eval_outputs is not None:
                self._eval_outputs.remove()
                self._eval_outputs = None
            assert self.trainer is not None
            if 'loss' in dataset_info:      # the pass completed
                self.trainer._add_epoch_loss_to_run_history('eval_loss_epoch')
                # PTA's evaluation epoch iterated its loader outside any fork of the RNG: its draws are owed
                self.trainer.draws_owed += global_draws_of_iterating(self.train_loop_obj.validation_loader)
                self._call_in_evaluation('on_eval_epoch_end', is_intermediate=False)

    def _call_in_evaluation(self, event: str, **kwargs: Any) -> None:
        assert self.trainer is not None
        self.trainer.in_loop_evaluation = True
        try:
            self._call(event, **kwargs)
        finally:
            self.trainer.in_loop_evaluation = False

    def on_epoch_end(self) -> None:
        """The random numbers PTA's evaluation epochs drew (with ``trainer_rng``), ``on_training_run_epoch_end``;
        then the run history's epoch goes up, as in PTA."""
        trainer = self.trainer
        assert trainer is not None
        owed, trainer.draws_owed = trainer.draws_owed, 0
        if self.trainer_rng:
            # The loop's evaluation leaves the global RNG as it found it (its passes run under fork_rng); PTA's
            # iterates its loaders in the open, and each iteration draws from the global generator, so PTA's next
            # epoch shuffles from a later state: the same numbers are drawn here, before PTA's epoch end.
            for _ in range(owed):
                torch.empty((), dtype=torch.int64).random_()
        self._call('on_training_run_epoch_end')
        trainer.run_history._increment_epoch()

    def on_train_stopped(self, reason: BaseException) -> None:
        """After a ``StopTrainingError`` of a PTA callback: its message, then ``on_stop_training_error``."""
        if isinstance(reason.__cause__, _pta().StopTrainingError):
            assert self.trainer is not None
            self.trainer.print(reason.__cause__)
            self._call('on_stop_training_error')

    def on_train_end(self) -> None:
        """``on_training_run_end`` (``TerminateOnNaNCallback`` ends the process there, as in PTA); the loop gets
        back the loaders a callback replaced."""
        trainer = self.trainer
        assert trainer is not None
        try:
            self._call('on_training_run_end')
        finally:
            self._end_run(trainer)

    def on_exception(self, exception: BaseException) -> None:
        """The run failed: the forward hooks and the loop's loaders are put back."""
        if self.trainer is not None:
            self._end_run(self.trainer)

    def _end_run(self, trainer: AcceleratedTrainer) -> None:
        self._running = False
        for catcher in (self._outputs, self._eval_outputs):
            if catcher is not None:
                catcher.remove()
        self._outputs = self._eval_outputs = None
        trainer.restore_loaders()
        trainer.model = self.train_loop_obj.model

    # ---- custom events and checkpoints --------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        """A custom event of the PTA callbacks (``loop.callbacks_handler.call_event('verify_train_batch', ...)``):
        called on every PTA callback that defines it, with the trainer."""
        if name.startswith('_') or name in ('handler', 'trainer'):
            raise AttributeError(name)
        handler = self.__dict__.get('handler')
        if handler is None or not any(_defines(callback, name) for callback in handler.callbacks):
            raise AttributeError(name)

        def call_event(**kwargs: Any) -> None:
            kwargs.pop('trainer', None)
            self._call(name, **kwargs)
        return call_event

    def _encoder(self) -> Encoder:
        """What is never saved from the PTA callbacks: the loop's objects, the trainer and its pieces (saved here
        apart), other callbacks."""
        trainer = self.trainer
        references: List[Any] = loop_references(self.train_loop_obj) + [self, self.handler]
        if trainer is not None:
            references += [trainer, trainer.callback_handler, trainer.run_history, trainer.scheduler,
                           trainer._accelerator, trainer._loss_tracker, trainer.run_config]
        callback_types = (AbstractCallback, _pta().TrainerCallback)
        return Encoder(references, lambda value: isinstance(value, callback_types))

    def state_dict(self) -> Optional[Dict[str, Any]]:
        """What the PTA side of the run holds, for the loop's checkpoints: the trainer's run history, the PTA
        scheduler's state (when ``create_scheduler_fn`` built one), each PTA callback's attributes (its counters,
        best values, EMA model, ...; see ``foreign_state``) and the epoch's step losses so far."""
        trainer = self.trainer
        if trainer is None:
            return None
        encoder = self._encoder()
        state: Dict[str, Any] = {
            'run_history': Encoder().encode(trainer.run_history, 0, set()),
            'callbacks': [{'class': type(callback).__qualname__, 'state': foreign.state(callback, encoder)}
                          for callback, foreign in zip(self.handler.callbacks, self._states)],
            'train_losses': [[loss.detach().to('cpu', copy=True), size] for loss, size in self._train_losses],
        }
        if self.create_scheduler_fn is not None and trainer.scheduler is not None:
            state['scheduler'] = trainer.scheduler.state_dict()
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore the PTA side of a resumed run: the scheduler's state when the fit builds it, the rest once the
        PTA callbacks have run ``on_training_run_start`` (where they reset themselves), or at once inside a run (a
        mid-epoch resume restores the epoch's state after its start)."""
        if self._running:
            self._apply_state(state_dict)
        else:
            self._pending_scheduler_state = state_dict.get('scheduler')
            self._pending_state = state_dict

    def _apply_state(self, state: Dict[str, Any]) -> None:
        from .foreign_state import decode
        trainer = self.trainer
        assert trainer is not None
        if 'run_history' in state:
            decode(state['run_history'], trainer.run_history)
        saved = state.get('callbacks', [])
        callbacks = self.handler.callbacks
        if [entry['class'] for entry in saved] != [type(callback).__qualname__ for callback in callbacks]:
            logger.warning('The checkpoint holds the state of the PTA callbacks %s, this fit has %s: the state of '
                           'those at the same place with the same class is restored',
                           [entry['class'] for entry in saved], [type(cb).__qualname__ for cb in callbacks])
        for entry, callback, foreign in zip(saved, callbacks, self._states):
            if entry['class'] == type(callback).__qualname__:
                foreign.apply(callback, entry['state'])
        if self._running:
            device = self.train_loop_obj.device
            self._train_losses = [(loss.to(device), int(size)) for loss, size in state.get('train_losses', [])]


def _defines(callback: Any, name: str) -> bool:
    """Whether a PTA callback has ``name`` (PTA's ``TrainerCallback.__getattr__`` raises its own error for a missing
    name, so ``hasattr`` cannot ask)."""
    return any(name in vars(klass) for klass in type(callback).__mro__)


def _run_config_values(loop: 'TrainLoop') -> Dict[str, Any]:
    """PTA's ``TrainerRunConfig`` fields for this fit, computed as PTA's Trainer computes them."""
    world = loop.world_size
    accumulation = loop.grad_accumulation
    train_bs = getattr(loop.train_loader, 'batch_size', None)
    eval_bs = getattr(loop.validation_loader, 'batch_size', None) or train_bs
    try:
        local_batches = len(loop.train_loader)
    except TypeError:
        local_batches = 0
    updates = math.ceil(local_batches * world / accumulation)
    local_updates = math.ceil(local_batches / accumulation)
    num_epochs = loop.num_epochs or 0
    if loop.num_iterations:
        max_steps = math.ceil(loop.num_iterations / accumulation)
        num_epochs = math.ceil(max_steps / updates) if updates else num_epochs
    else:
        max_steps = num_epochs * updates + 1        # PTA adds 1 so that rounding never stops a run early
    precision = loop.precision
    return {
        'num_epochs': num_epochs,
        'train_per_device_batch_size': train_bs,
        'train_dl_kwargs': _loader_kwargs(loop.train_loader),
        'eval_per_device_batch_size': eval_bs,
        'eval_dl_kwargs': _loader_kwargs(loop.validation_loader),
        'gradient_accumulation_steps': accumulation,
        'gradient_clip_value': None,
        'train_total_batch_size': (train_bs or 0) * world * accumulation,
        'eval_total_batch_size': (eval_bs or 0) * world,
        'num_update_steps_per_epoch': updates,
        'num_local_update_steps_per_epoch': local_updates,
        'max_num_train_steps': max_steps,
        'is_local_process_zero': int(os.environ.get('LOCAL_RANK', loop.global_rank)) == 0,
        'is_world_process_zero': loop.is_main_process(),
        'is_distributed': world > 1,
        'mixed_precision': 'no' if precision == 'fp32' else precision,
        'num_processes': world,
    }


def _loader_kwargs(loader: Any) -> Optional[Dict[str, Any]]:
    """The DataLoader arguments PTA's run config records (``None`` without a loader)."""
    if loader is None:
        return None
    names = ('batch_size', 'shuffle', 'num_workers', 'pin_memory', 'drop_last', 'worker_init_fn')
    kwargs = {name: getattr(loader, name) for name in names if hasattr(loader, name)}
    sampler = getattr(loader, 'sampler', None)
    if sampler is not None:
        kwargs.setdefault('shuffle', isinstance(sampler, torch.utils.data.RandomSampler))
    return kwargs
