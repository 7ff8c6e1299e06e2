"""SLURM: the tasks of an ``srun`` job step train as one process group, and a job stopped by a signal ends
checkpointed, requeued when the signal was the time-limit warning.

- :func:`join_step_as_rank` is what ``fit(gpu_mode='ddp' / 'fsdp')`` (distributed/launch.py) calls when neither torchrun's
  variables nor a process group are there: in a job step of several tasks it sets torch's variables from SLURM's
  (``RANK`` = ``SLURM_PROCID``, ``WORLD_SIZE`` = the step's tasks, ``LOCAL_RANK`` = ``SLURM_LOCALID``,
  ``MASTER_ADDR`` = the first host of the step's node list, ``MASTER_PORT`` derived from the job id), so that this
  process trains as one rank, as under torchrun.
- :func:`end_stopped_task` is what ``PreemptionCheckpoint`` (callbacks/preemption.py) calls inside a SLURM job once
  a signal stopped training and the checkpoint is written: after the warning signal (``#SBATCH --signal=USR1@90``)
  one rank requeues the job (``scontrol requeue``), and every rank exits.

See docs/distributed.md, section "SLURM".
"""
import atexit
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Dict, List, Mapping, MutableMapping, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .processes import get_rank, get_world_size, is_distributed

logger = logging.getLogger(__name__)

#: The signal SLURM is asked to send before a job's time limit in the examples (``#SBATCH --signal=USR1@90``).
DEFAULT_WARNING_SIGNAL = signal.SIGUSR1

# MASTER_PORT from the job id: below Linux's ephemeral range (32768-60999), so an outgoing connection of another
# process does not hold it; jobs whose ids differ by a multiple of the span would pick the same port.
_PORT_BASE, _PORT_SPAN = 12000, 20000
_SCONTROL_TIMEOUT_S = 60.0


class SlurmLaunchError(RuntimeError):
    """The SLURM job's tasks do not match how the script trains (e.g. ``--ntasks=2`` without ``srun``)."""


@dataclass(frozen=True)
class StepTask:
    """This process as one task of a SLURM job step (what ``srun`` started)."""
    job_id: str
    rank: int               # SLURM_PROCID
    world_size: int         # the step's tasks
    local_rank: int         # SLURM_LOCALID: the task's index on its node
    local_world_size: int   # the step's tasks on this node
    master_addr: str
    master_port: str


def in_job(environ: Mapping[str, str] = os.environ) -> bool:
    """True inside a SLURM job (its batch script, or a task of one of its steps)."""
    return bool(environ.get('SLURM_JOB_ID'))


def expand_hostlist(hostlist: str) -> List[str]:
    """The host names of a SLURM host list in its compressed syntax, in order: ``'gpu[01-03,07],login'`` ->
    ``['gpu01', 'gpu02', 'gpu03', 'gpu07', 'login']`` (what ``scontrol show hostnames`` prints). Zero padding is
    kept; several bracket groups in one name expand as their product (``'r[1-2]n[1,3]'`` -> r1n1, r1n3, r2n1,
    r2n3)."""
    hosts: List[str] = []
    for name in _split_top_level(hostlist.strip()):
        hosts.extend(_expand_name(name))
    return hosts


def _split_top_level(text: str) -> List[str]:
    """Split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == '[':
            depth += 1
        elif char == ']':
            depth -= 1
            if depth < 0:
                raise ValueError(f'unbalanced brackets in the SLURM host list {text!r}')
        elif char == ',' and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f'unbalanced brackets in the SLURM host list {text!r}')
    parts.append(text[start:])
    return [part for part in parts if part]


def _expand_name(name: str) -> List[str]:
    match = re.search(r'\[([^\]]*)\]', name)
    if match is None:
        return [name]
    prefix, rest = name[:match.start()], name[match.end():]
    return [prefix + value + tail for value in _expand_ranges(match.group(1), name) for tail in _expand_name(rest)]


def _expand_ranges(ranges: str, name: str) -> List[str]:
    values = []
    for part in ranges.split(','):
        low, dash, high = part.partition('-')
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f'cannot read {part!r} in the SLURM host list entry {name!r}')
        if not dash:
            values.append(low)
            continue
        width = len(low)        # gpu[01-10]: the zero padding of the lower bound
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values


def expand_tasks_per_node(spec: str) -> List[int]:
    """SLURM's tasks per node, ``'2(x3),1'`` -> ``[2, 2, 2, 1]`` (``SLURM_STEP_TASKS_PER_NODE``)."""
    counts: List[int] = []
    for part in spec.split(','):
        match = re.fullmatch(r'\s*(\d+)(?:\(x(\d+)\))?\s*', part)
        if match is None:
            raise ValueError(f'cannot read the SLURM tasks per node {spec!r}')
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def master_port_for_job(job_id: str) -> int:
    """The rendezvous port of a job's step: the same on every task (they all know the job id) and different for
    jobs running at the same time on the first node (unless their ids differ by a multiple of 20000)."""
    digits = re.sub(r'\D', '', job_id) or '0'
    return _PORT_BASE + int(digits) % _PORT_SPAN


def step_task(environ: Mapping[str, str] = os.environ) -> Optional[StepTask]:
    """This process as a task of a SLURM job step of several tasks (started by ``srun``), or None (not in a job
    step, or a step of one task). ``MASTER_ADDR`` / ``MASTER_PORT`` already set in the environment are kept."""
    if not in_job(environ) or 'SLURM_STEP_ID' not in environ:
        return None
    world_size = int(environ.get('SLURM_STEP_NUM_TASKS') or environ.get('SLURM_NTASKS') or 1)
    if world_size < 2:
        return None
    job_id = environ['SLURM_JOB_ID']
    nodes = expand_hostlist(environ.get('SLURM_STEP_NODELIST') or environ['SLURM_JOB_NODELIST'])
    return StepTask(job_id=job_id, rank=int(environ['SLURM_PROCID']), world_size=world_size,
                    local_rank=int(environ.get('SLURM_LOCALID', 0)),
                    local_world_size=_tasks_on_this_node(environ, nodes),
                    master_addr=environ.get('MASTER_ADDR') or nodes[0],
                    master_port=environ.get('MASTER_PORT') or str(master_port_for_job(job_id)))


def _tasks_on_this_node(environ: Mapping[str, str], nodes: List[str]) -> int:
    spec = environ.get('SLURM_STEP_TASKS_PER_NODE') or environ.get('SLURM_TASKS_PER_NODE')
    here = environ.get('SLURMD_NODENAME')
    if spec and here in nodes:
        counts = expand_tasks_per_node(spec)
        index = nodes.index(here)
        if index < len(counts):
            return counts[index]
    gtids = environ.get('SLURM_GTIDS')       # the global task ids on this node (older SLURM versions)
    return len(gtids.split(',')) if gtids else 1


def check_batch_shell(environ: Mapping[str, str] = os.environ) -> None:
    """Refuse a distributed fit run straight from the batch script of a job of several tasks: only one process
    would run, while the job waits for ``SLURM_NTASKS``."""
    if not in_job(environ) or 'SLURM_STEP_ID' in environ:
        return
    ntasks = int(environ.get('SLURM_NTASKS') or 1)
    if ntasks > 1:
        raise SlurmLaunchError(
            f'this SLURM job has {ntasks} tasks (SLURM_NTASKS={ntasks}), but the script runs in the batch script '
            f'itself, as one process: start it with srun in the batch script (`srun python train.py`: one task per '
            f'process, each one rank of the group), or submit the job with --ntasks=1 to let fit start the '
            f'processes of this machine itself (num_gpus)')


def task_device(task: StepTask, device_count: int) -> int:
    """The CUDA device of ``task``: its local rank when every task of the node sees all the node's GPUs, 0 when
    SLURM gave each task a GPU of its own (``--gpus-per-task``, ``--gpu-bind``: one visible device; the check that
    no two tasks share it follows once the group is up, :func:`check_distinct_gpus`)."""
    if device_count >= task.local_world_size:
        return task.local_rank
    if device_count == 1:
        return 0
    raise SlurmLaunchError(
        f'{task.local_world_size} tasks of this SLURM job step run on this node, but it has {device_count} GPUs '
        f'visible: ask for one task per GPU (#SBATCH --ntasks-per-node={device_count}, or --gpus-per-node='
        f'{task.local_world_size} / --gpus-per-task=1), or train on CPU (fit(..., on_gpu=False))')


def check_distinct_gpus(device: int) -> None:
    """Every rank on a node trains on its own GPU (a collective, once, before the first step): two tasks that
    share one would both run, at half speed or out of memory."""
    mine = (os.uname().nodename, str(torch.cuda.get_device_properties(device).uuid))
    everyone: List[Optional[Tuple[str, str]]] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    seen: Dict[Optional[Tuple[str, str]], int] = {}
    for rank, key in enumerate(everyone):
        if key is not None and key in seen:
            raise SlurmLaunchError(
                f'ranks {seen[key]} and {rank} of this SLURM job step train on the same GPU of {key[0]}: ask for '
                f'one GPU per task (#SBATCH --gpus-per-task=1, or --gpus-per-node equal to --ntasks-per-node)')
        seen[key] = rank


def join_step_as_rank(environ: Optional[MutableMapping[str, str]] = None) -> Optional[StepTask]:
    """In a SLURM job step of several tasks, set torch's launch variables (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) from SLURM's in ``environ`` (this
    process's environment) and return the task; None elsewhere. Raises :class:`SlurmLaunchError` in the batch
    script of a job of several tasks."""
    if environ is None:
        environ = os.environ
    check_batch_shell(environ)
    task = step_task(environ)
    if task is None:
        return None
    environ.update(RANK=str(task.rank), WORLD_SIZE=str(task.world_size), LOCAL_RANK=str(task.local_rank),
                   LOCAL_WORLD_SIZE=str(task.local_world_size), MASTER_ADDR=task.master_addr,
                   MASTER_PORT=task.master_port)
    if task.rank == 0:
        logger.info('SLURM job %s: %d tasks train as one group (rendezvous at %s:%s)', task.job_id,
                    task.world_size, task.master_addr, task.master_port)
    return task


# ---------------------------------------------------------------------------------------------- the end of a job


def this_job(environ: Mapping[str, str]) -> str:
    """The job this process runs in, as scontrol names it: ``<array job>_<task>`` for a task of a job array (its own
    ``SLURM_JOB_ID`` is, for the array's first task, the id of the whole array: requeueing that requeues every task),
    else ``SLURM_JOB_ID``; '' outside SLURM."""
    array, task = environ.get('SLURM_ARRAY_JOB_ID'), environ.get('SLURM_ARRAY_TASK_ID')
    if array and task:
        return f'{array}_{task}'
    return environ.get('SLURM_JOB_ID', '')


def requeue(job_id: str) -> Tuple[bool, str]:
    """``scontrol requeue JOB_ID``: (True, '') when SLURM accepted it, else (False, why)."""
    try:
        done = subprocess.run(['scontrol', 'requeue', job_id], capture_output=True, text=True,
                              timeout=_SCONTROL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f'scontrol could not be run: {error}'
    if done.returncode != 0:
        return False, (done.stderr or done.stdout).strip() or f'scontrol exited with status {done.returncode}'
    return True, ''


def resubmit_command(job_id: str) -> str:
    """The command that submits the job again, from ``scontrol show job``: ``cd WORKDIR && sbatch SCRIPT`` for
    a batch job (or the job's own command line for an interactive srun)."""
    try:
        shown = subprocess.run(['scontrol', 'show', 'job', '--oneliner', job_id], capture_output=True, text=True,
                               timeout=_SCONTROL_TIMEOUT_S, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        shown = ''
    fields = dict(re.findall(r'(\w+)=(\S*)', shown))
    command, workdir = fields.get('Command'), fields.get('WorkDir')
    if not command:
        return 'sbatch <your batch script>'
    if fields.get('BatchFlag') == '0':
        return command
    return f'cd {workdir} && sbatch {command}' if workdir else f'sbatch {command}'


def end_stopped_task(signals_received: Sequence[int], warning_signal: Optional[int], how_to_resume: str,
                     exit_code: Optional[int] = None) -> None:
    """Inside a SLURM job, once a stop of training is complete (its checkpoint written and uploaded): end this
    process when a signal caused the stop, on any rank. Every rank of a distributed fit calls it at the same point
    (after the step they all stopped at); it is one small collective there.

    - Only ``warning_signal`` was received (the time-limit warning): rank 0 requeues the job with
      ``scontrol requeue``; the requeued job's ``fit(resume_from='auto')`` continues from the checkpoint. When
      SLURM refuses (a job submitted with ``--no-requeue``), an error says how to continue.
    - Another signal (SIGTERM of a preemption, a ``scontrol requeue`` or a ``scancel``; SIGINT): no requeue
      (SLURM requeues a preempted job itself, and a cancelled one must end).

    Every rank then raises ``SystemExit(exit_code)`` (default ``128 + signal number``, what a process killed by the
    signal reports), so that the script does not go on as if training had finished; in a distributed fit the
    process ends with that status as soon as the interpreter starts its exit.
    Returns when no rank received a signal (a stop by ``Timer``): fit returns as usual.
    """
    warned = warning_signal is not None and warning_signal in signals_received
    other = max((s for s in signals_received if s != warning_signal), default=0)
    # From here the process is (most likely) leaving: the SIGTERM that SLURM sends every process of the job when rank
    # 0 requeues it must not cut the exit short on a rank that is slower to get here.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN) if main_thread else None
    if is_distributed() and get_world_size() > 1:
        everyone: List[Optional[Tuple[bool, int]]] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, (warned, other))
        gathered = [pair for pair in everyone if pair is not None]
        warned = any(w for w, _ in gathered)
        other = max(o for _, o in gathered)
    if not warned and not other:
        if main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        return
    signum = other or warning_signal
    assert signum is not None
    name, job_id = signal.Signals(signum).name, this_job(os.environ)
    if get_rank() == 0:
        if other:
            logger.warning('SLURM job %s: training stopped on %s and the checkpoint is saved; when SLURM requeues the '
                           'job (preemption, scontrol requeue), its fit(resume_from=\'auto\') continues from it; '
                           'otherwise continue with %s', job_id, name, how_to_resume)
        else:
            _requeue_after_warning(job_id, name, how_to_resume)
    code = 128 + signum if exit_code is None else exit_code
    if is_distributed():
        _leave_at_interpreter_exit(code)
    raise SystemExit(code)


def _leave_at_interpreter_exit(code: int) -> None:
    """End the process with ``code`` as soon as the interpreter starts its exit, once ``SystemExit`` has unwound fit
    and the script (their ``finally`` blocks and exception handlers run, and non-daemon threads are joined before
    atexit functions run). What is skipped is the clean-up of torch's distributed objects, which can block once
    the rank holding the group's store has exited (seen: a rank waiting until SLURM's SIGKILL after KillWait, with
    no Python code running) or abort the process (gloo: "terminate called without an active exception")."""
    def leave() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        logging.shutdown()
        os._exit(code)
    atexit.register(leave)        # registered last, so it runs first


def _requeue_after_warning(job_id: str, name: str, how_to_resume: str) -> None:
    requeued, why = requeue(job_id)
    if requeued:
        logger.warning("SLURM job %s: training stopped on %s (the time-limit warning), the checkpoint is saved and "
                       "the job is requeued: its fit(resume_from='auto') continues from the checkpoint", job_id, name)
        return
    logger.error("SLURM job %s: training stopped on %s (the time-limit warning) and the checkpoint is saved, but the "
                 "job could not be requeued (%s). To continue, submit it again: `%s` (with the sbatch options given "
                 "on its command line, if any; a script with fit(resume_from='auto') continues from the checkpoint, "
                 "otherwise continue with %s)",
                 job_id, name, why, resubmit_command(job_id), how_to_resume)
