"""The public path of the SLURM support (srun's tasks as a distributed fit's ranks, the requeue after a stopping
signal), defined in :mod:`aitoolbox_like.distributed.slurm`."""
from .distributed.slurm import (DEFAULT_WARNING_SIGNAL, SlurmLaunchError, StepTask,  # noqa: F401  (public path)
                                check_batch_shell, check_distinct_gpus, end_stopped_task, expand_hostlist,
                                expand_tasks_per_node, in_job, join_step_as_rank, master_port_for_job, requeue,
                                resubmit_command, step_task, task_device, this_job)
