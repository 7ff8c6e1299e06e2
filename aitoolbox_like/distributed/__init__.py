"""Training over several processes, in one package: the processes and their ranks (processes.py), each process's
share of the data and the gathered predictions (data.py), the TTModel-aware DDP / DataParallel wrappers and the
loop's DDP forward (parallel.py), the tensors of a sharded model (tensors.py), and SLURM's tasks as ranks (slurm.py).

The names callbacks and users need are importable from here (``aitoolbox_like.distributed.get_rank()``). The launch
of a ``gpu_mode='ddp'`` / ``'fsdp'`` fit is the engine's (``aitoolbox_like.engine.launch``) and a sharded model's
state dicts are the checkpoint room's (``aitoolbox_like.checkpoint.sharded.state_dicts``)."""
from .data import (RemainingOrderSampler, ShardedSampler, distribute_loader, distribute_train_loop_loaders,
                   epoch_order, gather_predictions, loader_with_sampler)
from .parallel import DDPFeed, TTDataParallel, TTDistributedDataParallel, skip_grad_sync
from .processes import (DEFAULT_SETUP_TIMEOUT_S, SETUP_TIMEOUT_ENV, ProcessGroupSetupError, collective_device,
                        find_free_port, get_rank, get_world_size, is_distributed, is_main_process,
                        join_process_group_from_env, setup_timeout_s)
from .tensors import (average_over_processes_, copy_full_into, full_tensor, is_dtensor, is_fsdp_model, local_tensor,
                      rebuild_optimizer)

__all__ = ['DEFAULT_SETUP_TIMEOUT_S', 'DDPFeed', 'ProcessGroupSetupError', 'RemainingOrderSampler', 'SETUP_TIMEOUT_ENV',
           'ShardedSampler', 'TTDataParallel', 'TTDistributedDataParallel', 'average_over_processes_',
           'collective_device', 'copy_full_into', 'distribute_loader', 'distribute_train_loop_loaders', 'epoch_order',
           'find_free_port', 'full_tensor', 'gather_predictions', 'get_rank', 'get_world_size', 'is_distributed', 'is_dtensor',
           'is_fsdp_model', 'is_main_process', 'join_process_group_from_env', 'loader_with_sampler', 'local_tensor',
           'rebuild_optimizer', 'setup_timeout_s', 'skip_grad_sync']
