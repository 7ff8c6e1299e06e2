"""The callbacks a fit gets without asking, as Keras' CallbackList adds its History and progress bar. The loop
calls :func:`add_default_callbacks` once per fit (by its path, so that importing the loop loads no callback library),
after the user's callbacks are registered and, in a distributed run, after the loaders are sharded."""
from typing import TYPE_CHECKING, List

from .abstract import AbstractCallback, AbstractScheduler
from .ddp import DistributedSamplerSetEpoch
from .preemption import PreemptionCheckpoint, preemption_default_needed
from .basic import ProgressBar
from .train_schedule import LRMonitor

if TYPE_CHECKING:
    from ..engine.train_loop import TrainLoop


def add_default_callbacks(loop: 'TrainLoop') -> List[AbstractCallback]:
    """Register what this fit needs and the user did not register; returns the callbacks added.

    - :class:`~aitoolbox_like.callbacks.basic.ProgressBar` when ``loop.progress_bar`` is on, in the main process;
    - :class:`~aitoolbox_like.callbacks.train_schedule.LRMonitor` when a scheduler callback is registered;
    - :class:`~aitoolbox_like.callbacks.ddp.DistributedSamplerSetEpoch` for the samplers a DDP fit gave the
      loaders (``loop.distributed_samplers``); a second fit points the registered one at the new samplers;
    - :class:`~aitoolbox_like.callbacks.preemption.PreemptionCheckpoint` when a checkpoint callback
      (ModelCheckpoint / ModelIterationCheckpoint) is registered and ``loop.preemption_safe`` is not False (in a DDP
      fit rank 0, which holds the checkpoint callback, decides for every rank).
    """
    def registered(cls: type) -> List[AbstractCallback]:
        return [cb for cb in loop.callbacks if isinstance(cb, cls)]

    added: List[AbstractCallback] = []
    if loop.progress_bar and loop.is_main_process() and not registered(ProgressBar):
        added.append(ProgressBar())
    if registered(AbstractScheduler) and not registered(LRMonitor):
        added.append(LRMonitor())
    samplers = loop.distributed_samplers
    if samplers is not None:
        existing = registered(DistributedSamplerSetEpoch)
        if existing:
            setter = existing[0]
            assert isinstance(setter, DistributedSamplerSetEpoch)
            setter.train_sampler, setter.validation_sampler, setter.test_sampler = samplers
        else:
            added.append(DistributedSamplerSetEpoch(*samplers))
    if preemption_default_needed(loop):
        added.append(PreemptionCheckpoint())
    loop.callbacks_handler.register_callbacks(added)
    return added
