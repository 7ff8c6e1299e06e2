"""The public path of the launch of a ``gpu_mode='ddp'`` / ``'fsdp'`` fit, defined in
:mod:`aitoolbox_like.distributed.launch`."""
from .distributed.launch import DDPWorkerError, default_fsdp_shard, fit_ddp, fit_fsdp  # noqa: F401  (public path)
