"""The public path of the launch of a ``gpu_mode='ddp'`` / ``'fsdp'`` fit, defined in
:mod:`aitoolbox_like.distributed.launch`."""
from .distributed.launch import (FSDP_MIN_SHARD_PARAMS, DDPWorkerError,  # noqa: F401  (public path)
                                 default_fsdp_shard, fit_ddp, fit_fsdp, start_method_for)
