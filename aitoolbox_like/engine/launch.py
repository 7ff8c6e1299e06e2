"""Run a TrainLoop fit with DistributedDataParallel (``gpu_mode='ddp'``) or FSDP2 (``gpu_mode='fsdp'``, torch's
``fully_shard``): one process per device.

Two ways in (see docs/distributed.md):
- started by torchrun (RANK / WORLD_SIZE set), as a task of a SLURM job step of several tasks (srun; slurm.py
  sets torchrun's variables from SLURM's) or with a process group already initialised: this process is one rank;
  it joins the group and trains. This is the way to train on several machines.
- started as a plain script: ``num_gpus`` processes are spawned on this machine (torch.multiprocessing),
  each trains, and the trained weights and history of rank 0 come back into the caller's model and loop.
"""
import logging
import os
import pickle
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from ..runtime.console import label_records_with_rank
from ..runtime.devices import cuda_is_available
from ..model.feeds import TTModel
from ..distributed import slurm
from ..distributed.data import distribute_train_loop_loaders
from ..distributed.parallel import TTDistributedDataParallel
from ..distributed.processes import find_free_port, is_distributed, join_process_group_from_env
from ..checkpoint.sharded.state_dicts import full_state, index_keyed
from ..distributed.tensors import is_fsdp_model, rebuild_optimizer

logger = logging.getLogger(__name__)


class DDPWorkerError(RuntimeError):
    """A spawned DDP process failed. The message holds the traceback of the process that failed first: when one
    rank raises, the others typically fail next with a connection error that only hides the cause."""

_RESULT_FILE = 'ddp_result.pt'
_FAILURE_FILE = 'failure_rank{}.txt'
# experiment_timestamp: a resumed run moves into its checkpoint's experiment folder inside the processes.
_LOOP_STATE_ATTRS = ('epoch', 'iteration', 'total_iteration_idx', 'num_epochs', 'num_iterations', 'grad_accumulation',
                     'early_stop', 'epochs_completed', 'experiment_timestamp', 'interrupted')


#: The default FSDP policy shards every child module holding at least this many parameters, then the root.
FSDP_MIN_SHARD_PARAMS = 100_000


def default_fsdp_shard(model, min_num_params=FSDP_MIN_SHARD_PARAMS, **fully_shard_args):
    """The default of ``fit(..., fsdp_shard_fn=None)``: ``fully_shard`` every sub-module holding at least
    ``min_num_params`` parameters (inner ones first, as fully_shard requires), then the root module, so each large
    block is gathered only while it computes. A small model ends up as one unit (the root)."""
    from torch.distributed.fsdp import fully_shard     # not at import: it takes most of a second (tensors.py)

    def shard_children(module):
        for child in module.children():
            if sum(p.numel() for p in child.parameters()) >= min_num_params:
                shard_children(child)       # inner blocks first: fully_shard wants children sharded before parents
                fully_shard(child, **fully_shard_args)
            else:
                shard_children(child)
    shard_children(model)
    fully_shard(model, **fully_shard_args)


def fit_fsdp(train_loop_obj, num_epochs, num_iterations, callbacks=None, grad_accumulation=1, fsdp_shard_fn=None,
             fsdp_min_num_params=FSDP_MIN_SHARD_PARAMS, in_process_data_load=None, num_nodes=1, node_rank=0,
             num_gpus=None, backend=None, init_method='env://', on_gpu=None):
    """``TrainLoop.fit`` with ``gpu_mode='fsdp'`` (torch's FSDP2, ``fully_shard``); returns the trained model
    (in spawn mode the caller's own, unsharded; under torchrun this process's sharded module).

    Args:
        fsdp_shard_fn (callable or None): ``fsdp_shard_fn(model) -> None`` shards the model in place with
            ``torch.distributed.fsdp.fully_shard`` (called in each process, on the process's device, before the
            optimizer is rebuilt over the sharded parameters). It must shard the root module last. None:
            :func:`default_fsdp_shard` with ``fsdp_min_num_params``.
        fsdp_min_num_params (int): the default policy's threshold.

    The other arguments are :func:`fit_ddp`'s.
    """
    if fsdp_shard_fn is not None and not callable(fsdp_shard_fn):
        raise TypeError(f'fsdp_shard_fn must be a function model -> None that calls fully_shard, got '
                        f'{type(fsdp_shard_fn).__qualname__}')
    fsdp = dict(shard_fn=fsdp_shard_fn, min_num_params=fsdp_min_num_params)
    return fit_ddp(train_loop_obj, num_epochs, num_iterations, callbacks, grad_accumulation, None,
                   in_process_data_load, num_nodes, node_rank, num_gpus, backend, init_method, on_gpu, _fsdp=fsdp)


def fit_ddp(train_loop_obj, num_epochs, num_iterations, callbacks=None, grad_accumulation=1, ddp_model_args=None,
            in_process_data_load=None, num_nodes=1, node_rank=0, num_gpus=None, backend=None, init_method='env://',
            on_gpu=None, _fsdp=None):
    """``TrainLoop.fit`` with ``gpu_mode='ddp'``; returns the trained model. (``_fsdp``: set by :func:`fit_fsdp`.)

    Args:
        ddp_model_args (dict or None): keyword arguments of torch's DistributedDataParallel.
        in_process_data_load (AbstractCallback or list or None): callbacks whose on_multiprocess_start builds the
            data inside each process, e.g. InMultiProcessDataLoad.
        num_nodes: machines in the run (spawn mode; torchrun sets it).
        node_rank: this machine's index (spawn mode; torchrun sets it).
        num_gpus (int or None): processes per machine (spawn mode); None: every visible GPU. Required on CPU.
        backend (str or None): torch.distributed backend; None: 'nccl' on GPU, 'gloo' on CPU.
        init_method (str): process-group rendezvous URL; 'env://' reads MASTER_ADDR / MASTER_PORT.
        on_gpu (bool or None): train on GPUs (one per process); None: when CUDA is available.
    """
    if on_gpu is None:
        on_gpu = cuda_is_available()
    if on_gpu and not cuda_is_available():
        raise ValueError("fit(gpu_mode='ddp', on_gpu=True) needs CUDA, which is not available; pass on_gpu=False to "
                         "train with several CPU processes (backend 'gloo')")
    backend = backend or ('nccl' if on_gpu else 'gloo')
    in_process_data_load = _as_callback_list(in_process_data_load)
    settings = dict(on_gpu=on_gpu, ddp_model_args=dict(ddp_model_args or {}), callbacks=callbacks,
                    in_process_data_load=in_process_data_load, num_epochs=num_epochs, num_iterations=num_iterations,
                    grad_accumulation=grad_accumulation, fsdp=_fsdp)

    if is_distributed() or ('RANK' in os.environ and 'WORLD_SIZE' in os.environ):
        return _fit_in_this_process(train_loop_obj, backend, init_method, settings)
    task = slurm.join_step_as_rank()        # srun's tasks: each one rank, as under torchrun
    if task is not None:
        device = slurm.task_device(task, torch.cuda.device_count()) if on_gpu else None
        return _fit_in_this_process(train_loop_obj, backend, init_method, settings, slurm_device=device)
    return _fit_spawned(train_loop_obj, num_nodes, node_rank, num_gpus, backend, init_method, settings)


def _as_callback_list(in_process_data_load):
    # TrainLoop.fit checked it: a callback or a list of them (engine/checks.py).
    if in_process_data_load is None:
        return []
    return list(in_process_data_load) if isinstance(in_process_data_load, (list, tuple)) else [in_process_data_load]


# ---------------------------------------------------------------------------------------------- torchrun


def _fit_in_this_process(loop, backend, init_method, settings, slurm_device=None):
    local_rank = int(os.environ.get('LOCAL_RANK', 0)) if slurm_device is None else slurm_device
    if settings['on_gpu']:
        torch.cuda.set_device(local_rank)
    if not is_distributed():
        if init_method == 'env://':
            join_process_group_from_env(backend)     # restart-safe under torchrun, bounded set-up
        else:
            dist.init_process_group(backend=backend, init_method=init_method)
    if slurm_device is not None:
        slurm.check_distinct_gpus(slurm_device)
    # The process group stays up after fit, so that evaluation and prediction afterwards still see every rank's
    # share of the data; the script ends it with torch.distributed.destroy_process_group().
    try:
        _train_worker(loop, local_rank, settings)
    finally:
        # Under torchrun the callbacks are the caller's own objects: a later fit of theirs gets them as given.
        for cb, gate in settings.get('lifted_gates', []):
            cb.device_idx_execution = gate
    return loop.model


# ---------------------------------------------------------------------------------------------- spawn


def _fit_spawned(loop, num_nodes, node_rank, num_gpus, backend, init_method, settings):
    if num_gpus is None:
        if not settings['on_gpu']:
            raise ValueError("fit(gpu_mode='ddp') on CPU needs the number of processes per machine: pass num_gpus=N "
                             "(e.g. num_gpus=2)")
        num_gpus = torch.cuda.device_count()
    if num_gpus == 0 and not settings['on_gpu'] and not isinstance(num_gpus, bool):
        # AIToolbox's examples pass num_gpus=torch.cuda.device_count(), which is 0 here (AIToolbox then trained nothing).
        raise ValueError("fit(gpu_mode='ddp', num_gpus=0): no GPU is visible (torch.cuda.device_count() is 0), so "
                         "the processes train on CPU and need their number: pass num_gpus=N (e.g. num_gpus=2)")
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
        raise ValueError(f'num_gpus must be a positive int (processes per machine), got {num_gpus!r}')
    if settings['on_gpu'] and num_gpus > torch.cuda.device_count():
        raise ValueError(f'num_gpus={num_gpus} but only {torch.cuda.device_count()} GPUs are visible')
    if not 0 <= node_rank < num_nodes:
        raise ValueError(f'node_rank must be in [0, num_nodes={num_nodes}), got {node_rank}')

    master_addr, master_port = os.environ.get('MASTER_ADDR'), os.environ.get('MASTER_PORT')
    if init_method == 'env://' and num_nodes > 1 and not (master_addr and master_port):
        raise ValueError('training on several machines needs MASTER_ADDR and MASTER_PORT set to the address and a free '
                         'port of the node_rank=0 machine, the same on every machine (or start each machine with '
                         'torchrun, see docs/distributed.md)')
    rendezvous = dict(backend=backend, init_method=init_method, master_addr=master_addr or '127.0.0.1',
                      master_port=master_port or str(find_free_port()), node_rank=node_rank,
                      num_gpus=num_gpus, world_size=num_nodes * num_gpus,
                      seed=torch.initial_seed())   # workers continue the caller's torch.manual_seed

    # Plain pickle copies every tensor: torch.multiprocessing would put the model's parameters in memory shared
    # by all processes, and each rank's optimizer step would then be applied to the same weights.
    try:
        payload = pickle.dumps((loop, settings), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        culprit = _find_unpicklable(loop, settings) or 'the TrainLoop'
        raise TypeError(f"fit(gpu_mode='ddp') sends the TrainLoop to each spawned process, but {culprit} cannot be "
                        f"pickled ({exc}). Build the data inside each process with fit(..., in_process_data_load="
                        f"InMultiProcessDataLoad(train_loader_build_fn=...)) from aitoolbox_like.callbacks.ddp, use "
                        f"module-level functions instead of lambdas, or start the script with torchrun.") from exc
    start_method = start_method_for(sys.modules.get('__main__'), payload)
    result_dir = tempfile.mkdtemp(prefix='aitoolbox_like_ddp_')
    try:
        try:
            mp.start_processes(_spawn_entry, args=(payload, rendezvous, result_dir), nprocs=num_gpus, join=True,
                               start_method=start_method)
        except Exception as exc:
            first = _first_failure(result_dir)
            if first is None:
                raise
            rank, trace = first
            raise DDPWorkerError(f'the DDP process of rank {rank} failed first (errors of the other processes '
                                 f'follow from it):\n{trace}') from exc
        _load_worker_result(loop, os.path.join(result_dir, _RESULT_FILE))
    finally:
        shutil.rmtree(result_dir, ignore_errors=True)
    return loop.model


def start_method_for(main_module: Any, payload: bytes) -> str:
    """How the processes of a fit started as a plain program are started: ``'spawn'`` (fresh interpreters that
    import what ``payload``, the pickled loop, names, safe with CUDA), or ``'fork'`` when the loop holds classes or
    functions of a ``__main__`` that is not a file (defined in a Jupyter notebook's cells, at the IPython prompt, in
    ``python -c``), which a spawned process could not import: forked processes have them already. Fork needs CUDA
    untouched in this process; otherwise, and where there is no fork (Windows), a RuntimeError says why and what to
    do."""
    # A pickle names a class or function by its module: a payload without '__main__' imports from files only.
    if hasattr(main_module, '__file__') or b'__main__' not in payload:
        return 'spawn'
    where = 'a notebook (or another program whose __main__ is not a file)'
    if 'fork' not in mp.get_all_start_methods():
        raise RuntimeError(f"a gpu_mode='ddp'/'fsdp' fit started from {where} needs processes that have the "
                           f"notebook's classes and functions, which this platform cannot fork: put the model, data "
                           f"and fit code in a .py file and run it (python train.py, or torchrun)")
    if torch.cuda.is_initialized():
        raise RuntimeError(f"a gpu_mode='ddp'/'fsdp' fit started from {where} forks its processes (so that they have "
                           f"the notebook's classes and functions), and CUDA does not survive a fork once it is "
                           f"initialised in this process, which it is: something ran on the GPU already (a .cuda() or "
                           f".to('cuda'), a tensor created on the GPU, a torch.cuda call). Restart the kernel and run "
                           f"the fit before anything touches the GPU (keep the model on the CPU: each process moves "
                           f"it to its own GPU), or put the code in a .py file and run it with torchrun")
    return 'fork'


def _first_failure(result_dir):
    """``(rank, traceback text)`` of the earliest failure a spawned process recorded, or None."""
    failures = []
    for name in os.listdir(result_dir):
        if name.startswith('failure_rank') and name.endswith('.txt'):
            with open(os.path.join(result_dir, name), encoding='utf-8') as f:
                when, _, trace = f.read().partition('\n')
            failures.append((float(when), int(name[len('failure_rank'):-len('.txt')]), trace))
    return min(failures)[1:] if failures else None


def _record_failure(result_dir, global_rank):
    """Write the exception being handled, with the time, so the parent can report the root cause rather than
    the first exit it sees. Called before this rank exits (which makes the other ranks fail)."""
    path = os.path.join(result_dir, _FAILURE_FILE.format(global_rank))
    if not os.path.exists(path):
        # Written aside and renamed: the parent stops the other ranks as soon as one exits, possibly in the middle
        # of this write, and must never read half a file.
        with open(path + '.tmp', 'w', encoding='utf-8') as f:
            f.write(f'{time.time()!r}\n{traceback.format_exc()}')
        os.replace(path + '.tmp', path)


def _spawn_entry(local_rank, payload, rendezvous, result_dir):
    global_rank = rendezvous['node_rank'] * rendezvous['num_gpus'] + local_rank
    try:
        _run_spawned_rank(local_rank, global_rank, payload, rendezvous, result_dir)
    except BaseException:
        _record_failure(result_dir, global_rank)       # failures before the process group existed
        raise


def _run_spawned_rank(local_rank, global_rank, payload, rendezvous, result_dir):
    loop, settings = pickle.loads(payload)
    if rendezvous['init_method'] == 'env://':
        os.environ['MASTER_ADDR'] = rendezvous['master_addr']
        os.environ['MASTER_PORT'] = rendezvous['master_port']
    # Mirror torchrun: one process per device, so CPU processes share the cores instead of each taking all.
    if not settings['on_gpu'] and 'OMP_NUM_THREADS' not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // rendezvous['num_gpus']))
    torch.manual_seed(rendezvous['seed'] + global_rank)
    if settings['on_gpu']:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend=rendezvous['backend'], init_method=rendezvous['init_method'],
                            world_size=rendezvous['world_size'], rank=global_rank)
    try:
        _train_worker(loop, local_rank, settings)
        # Under FSDP the whole weights and optimizer state are gathered first (a collective of every rank).
        gathered = full_state(loop) if settings['fsdp'] is not None else None
        if local_rank == 0:     # weights are identical on every rank; the first process of each machine reports
            _save_worker_result(loop, os.path.join(result_dir, _RESULT_FILE), gathered)
        dist.barrier()
    except BaseException:
        _record_failure(result_dir, global_rank)
        traceback.print_exc()
        _end_rank_process(1)
    dist.destroy_process_group()
    _end_rank_process(0)


def _end_rank_process(status):
    """End a spawned rank's process now, with ``status``, skipping the interpreter's clean-up.

    A failed rank (status 1) does not tear its process group down: ``destroy_process_group`` can wait on peers that
    are themselves blocked in a collective waiting for this rank (a deadlock that only the test timeout ended, seen
    under load). Exiting closes this rank's connections, so the other ranks' collectives fail at once; the parent
    reports the failure recorded before this call.

    A finished rank (status 0) has written its result and destroyed its process group, but process-group objects
    still referenced from reference cycles (callbacks and the loop refer to each other) would be destroyed during
    interpreter shutdown, where gloo's threads can abort the process ("terminate called without an active
    exception", seen in CI): the parent would then report a finished run as failed."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    logging.shutdown()
    os._exit(status)


def _save_worker_result(loop, path, gathered=None):
    """``gathered``: ``(model state, optimizer state keyed by name)`` of an FSDP fit, whole, on this rank."""
    state = {'history': loop.train_history.state_dict(),
             'loop': {name: getattr(loop, name) for name in _LOOP_STATE_ATTRS}}
    if gathered is not None and gathered[0]:
        state['model'] = gathered[0]
        if gathered[1] is not None:
            state['optimizer'] = index_keyed(loop, gathered[1])
    elif gathered is not None:
        raise RuntimeError('the FSDP state was gathered to global rank 0; with several machines in spawn mode, start '
                           'them with torchrun instead')
    else:
        state['model'] = {k: v.detach().cpu() for k, v in loop.model.state_dict().items()}
        if callable(getattr(loop.optimizer, 'state_dict', None)):
            state['optimizer'] = loop.optimizer.state_dict()
    state['amp_scaler'] = loop.amp_scaler.state_dict()
    torch.save(state, path + '.tmp')
    os.replace(path + '.tmp', path)


def _load_worker_result(loop, path):
    if not os.path.exists(path):
        raise RuntimeError('the DDP processes finished without reporting the trained model')
    # Our own file, written a moment ago by our worker: it may hold any history value, so not weights_only.
    state = torch.load(path, map_location='cpu', weights_only=False)
    loop.model.load_state_dict(state['model'])
    loop.train_history.load_state_dict(state['history'])
    for name, value in state['loop'].items():
        setattr(loop, name, value)
    if 'optimizer' in state:
        loop.optimizer.load_state_dict(state['optimizer'])
    if state['amp_scaler']:
        loop.amp_scaler.load_state_dict(state['amp_scaler'])
    loop.purge_prediction_cache()


def _find_unpicklable(loop, settings):
    candidates = [('the train_loader', loop.train_loader), ('the validation_loader', loop.validation_loader),
                  ('the test_loader', loop.test_loader), ('the model', loop.model), ('the optimizer', loop.optimizer),
                  ('the criterion', loop.criterion)]
    candidates += [(f'callback {cb.callback_name!r}', cb)
                   for cb in list(settings['callbacks'] or []) + settings['in_process_data_load'] + loop.callbacks]
    for name, obj in candidates:
        try:
            pickle.dumps(obj)
        except Exception:
            return name
    return None


# ---------------------------------------------------------------------------------------------- one rank


def _train_worker(loop, local_rank, settings):
    """Everything one rank does, once its process group is up: register the callbacks (so rank gating
    sees the real rank), let them load data, shard the loaders, wrap the model and train."""
    label_records_with_rank(dist.get_rank())        # the library's messages once, or with their rank
    loop.ddp_training_mode = True
    if settings['on_gpu']:
        loop.move_to_device(torch.device('cuda', local_rank))
        settings['ddp_model_args'].setdefault('device_ids', [local_rank])
    elif loop.device.type != 'cpu':
        loop.move_to_device(torch.device('cpu'))
    if settings['fsdp'] is not None:
        _shard_model(loop, settings)
    else:
        # Checkpoint callbacks run on every rank: each rank's RNG states and running losses go into rank 0's file.
        _lift_gates(loop, settings, 'collective_when_distributed')

    loop.callbacks_handler.regate_for_rank()
    # As in a single process, a resumed run settles its experiment folder before callbacks register; the data
    # callbacks must run (on_multiprocess_start) before the loaders are sharded and training starts.
    loop.register_fit_callbacks(list(settings['callbacks'] or []) + settings['in_process_data_load'])
    loop.callbacks_handler.dispatch.on_multiprocess_start()

    shared_seed = [torch.initial_seed()]
    dist.broadcast_object_list(shared_seed, src=0)
    loop.distributed_samplers = distribute_train_loop_loaders(loop, shared_seed[0])

    loop.model.to(loop.device)
    if isinstance(loop.criterion, torch.nn.Module):
        loop.criterion.to(loop.device)
    if settings['fsdp'] is not None:
        # fully_shard shards loop.model in place: it is the module that trains, no wrapper around it.
        loop.train_in_this_process(settings['num_epochs'], settings['num_iterations'], None,
                                   settings['grad_accumulation'])
        return
    ddp_model: torch.nn.Module
    if loop.batch_model_feed_def is None and isinstance(loop.model, TTModel):
        ddp_model = TTDistributedDataParallel(loop.model, **settings['ddp_model_args'])
    else:
        ddp_model = DistributedDataParallel(loop.model, **settings['ddp_model_args'])
    with loop.distributed_model(ddp_model):
        loop.train_in_this_process(settings['num_epochs'], settings['num_iterations'], None,
                                   settings['grad_accumulation'])


def _shard_model(loop, settings):
    """FSDP: shard ``loop.model`` in place on this process's device and rebuild the optimizer(s) over the sharded
    parameters, before any callback registers (so schedulers built at registration hold the new optimizer), and let
    the callbacks that write sharded checkpoints run on every rank (they set ``collective_when_sharded``)."""
    model = loop.model
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"gpu_mode='fsdp' shards a torch.nn.Module; the TrainLoop's model is "
                        f"{type(model).__qualname__}")
    model.to(loop.device)
    old_names = {id(p): name for name, p in model.named_parameters()}
    fsdp = settings['fsdp']
    if fsdp['shard_fn'] is not None:
        fsdp['shard_fn'](model)
    else:
        default_fsdp_shard(model, fsdp['min_num_params'])
    if not is_fsdp_model(model):
        raise ValueError("gpu_mode='fsdp': fsdp_shard_fn did not shard the model (call "
                         "torch.distributed.fsdp.fully_shard on its blocks and then on the model itself)")
    new_params = dict(model.named_parameters())
    optimizer = loop.optimizer
    if optimizer is not None:
        if hasattr(optimizer, 'optimizer_list'):        # MultiOptimizer: rebuild each, keep the wrapper
            optimizer.optimizer_list = [rebuild_optimizer(o, old_names, new_params)
                                        for o in optimizer.optimizer_list]
        elif getattr(optimizer, 'param_groups', None) is not None:
            loop.optimizer = rebuild_optimizer(optimizer, old_names, new_params)
    _lift_gates(loop, settings, 'collective_when_sharded')


def _lift_gates(loop, settings, flag):
    """Let the callbacks whose class sets ``flag`` run on every rank (their rank gate is put back after a torchrun
    fit, where they are the caller's own objects)."""
    for cb in (list(loop.callbacks) + list(loop.callbacks_handler.cached_callbacks)
               + list(settings['callbacks'] or [])):
        if getattr(cb, flag, False) and cb.device_idx_execution is not None:
            settings.setdefault('lifted_gates', []).append((cb, cb.device_idx_execution))
            cb.device_idx_execution = None
