"""The rank processes of ``fit(gpu_mode='ddp'/'fsdp')`` in the tests, forked from a warm server.

A fit started in a test spawns its ranks as a script's fit does: fresh interpreters (``start_method='spawn'``),
each importing torch, torch._dynamo (which the first optimizer imports) and the package again, about 2.5 CPU-s a
rank against a fraction of a second of training. Here those ranks come from Python's forkserver instead: one server
per pytest worker, started at the first such fit, imports those modules once, and each rank is a fork of it.

Everything of the library's spawn path still runs: the pickled loop, the rendezvous, the ranks' results and failure
reports, :class:`~aitoolbox_like.engine.launch.DDPWorkerError`. Like a spawned rank, a forked one gets the caller's
``sys.path`` and working directory (multiprocessing sends them), and, from :func:`_in_callers_environment`, what a
server would otherwise give it from its own start: the caller's environment as it is at this fit, its stdout and
stderr as they are now (pytest's capture of this test), and the thread count a fresh interpreter would read from
``OMP_NUM_THREADS``. What differs: the preloaded modules are already imported.

The tests marked ``real_spawn`` (the first of tests/distributed/test_ddp.py and of test_fsdp.py) keep the library's
own start method, as do the scripts and commands the tests start cold (tests/distributed/ddp_scripts, the DDP
recipe's command line), so the spawn of fresh interpreters itself stays tested. (The runs forked from warm_python.py
fork their ranks from the run.)
"""
import multiprocessing
import multiprocessing.reduction
import os

import torch
import torch.multiprocessing

_torch_start_processes = torch.multiprocessing.start_processes

#: What every rank imports, in the server once.
PRELOAD = ['torch', 'torch._dynamo', 'torch.distributed', 'torch.distributed.fsdp', 'aitoolbox_like',
           'aitoolbox_like.engine.launch']


class _CallersFd:
    """The caller's file descriptor ``fd``, sent to the forked rank (multiprocessing passes it at the rank's start)."""

    def __init__(self, fd):
        self.fd = fd

    def __reduce__(self):
        return _detach, (multiprocessing.reduction.DupFd(self.fd),)


def _detach(dup_fd):
    return dup_fd.detach()


def _in_callers_environment(local_rank, fn, env, stdout_fd, stderr_fd, *args):
    """In the rank: the caller's environment, stdout and stderr, then the library's entry ``fn``."""
    os.environ.clear()
    os.environ.update(env)
    for fd, target in ((stdout_fd, 1), (stderr_fd, 2)):
        os.dup2(fd, target)
        os.close(fd)
    if 'OMP_NUM_THREADS' in env:
        # A fresh interpreter sizes torch's thread pool from it at start; the server did so from its own.
        torch.set_num_threads(int(env['OMP_NUM_THREADS']))
    fn(local_rank, *args)


def start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method='spawn'):
    """Stands in for ``torch.multiprocessing.start_processes``: ``start_method='spawn'`` forks from the warm server;
    every other start method is torch's own."""
    if start_method != 'spawn':
        return _torch_start_processes(fn, args, nprocs, join, daemon, start_method)
    multiprocessing.set_forkserver_preload(PRELOAD)     # read when the server starts (the first fit)
    callers = (fn, dict(os.environ), _CallersFd(1), _CallersFd(2))
    return _torch_start_processes(_in_callers_environment, callers + tuple(args), nprocs, join, daemon,
                                  start_method='forkserver')
