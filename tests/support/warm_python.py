"""``python SCRIPT ARGS`` and ``python -m MODULE ARGS`` without paying the start-up of torch in every run.

A test that runs many short user scripts spends most of its time importing torch, torch._dynamo (which the first
optimizer imports), numpy and scikit-learn, seconds per run against a fraction of a second of training. A
:class:`WarmPython` starts one Python process (the zygote: this file run as a script) that imports those modules
once; each run is then a ``fork`` of it that becomes ``python ARGS``: its own process (own pid, signals, exit
status), its working directory, environment, ``sys.argv`` and ``sys.path[0]`` as the ``python`` command sets them,
its stdout and stderr in files, and the interpreter's own end (atexit handlers, non-daemon threads joined, an
uncaught exception printed with status 1). What differs from a cold ``python``: the preloaded modules are already in
``sys.modules``, and the hash seed and interpreter flags are the zygote's (its environment is the runs' at start).
The processes a run starts are started as the run asks (a ``fit(gpu_mode='ddp'/'fsdp')`` from a file spawns fresh
interpreters that re-import it), but the tests run scripts that start processes (the docs' DDP blocks, AIToolbox's
DDP script) and the tests of Ctrl-C and exit statuses in fresh interpreters anyway, as a user runs them: a script
that only works when forked from an interpreter that already ran it must fail there.

Protocol (one JSON object per line on the zygote's stdin, one reply per line on its stdout): ``{"run": ARGS, "cwd",
"env", "stdout", "stderr"}`` -> ``{"pid"}``; ``{"wait": PID}`` -> ``{"returncode"}`` (negative: the signal).
"""
import gc
import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys

#: What every run would import; not aitoolbox_like, which each run imports itself as the user's process does.
PRELOAD = ('torch', 'torch._dynamo', 'torch.distributed', 'numpy', 'sklearn.datasets', 'sklearn.metrics',
           'matplotlib', 'matplotlib.pyplot')
#: The tests' shared zygote (conftest's ``warm_python``) adds what the runs of its other users import: the docs'
#: blocks (TensorBoard), the study workers (Optuna on SQLite), the cloud runs (the S3 and Azure clients).
SHARED_PRELOAD = PRELOAD + ('torch.utils.tensorboard', 'optuna', 'sqlalchemy', 'boto3', 'azure.storage.blob')


class WarmProcess:
    """One run: its ``pid``, and the files of its ``stdout`` and ``stderr``."""

    def __init__(self, pid, stdout, stderr):
        self.pid, self.stdout_path, self.stderr_path = pid, stdout, stderr
        self.returncode = None

    def output(self):
        """(stdout, stderr) as text."""
        with open(self.stdout_path, errors='replace') as out, open(self.stderr_path, errors='replace') as err:
            return out.read(), err.read()


class WarmPython:
    """A zygote started with ``env``. Each run gets its own environment; what a fresh interpreter reads from it only
    at start is applied to the run too (``PYTHONPATH``, ``PYTHONDONTWRITEBYTECODE``, and ``OMP_NUM_THREADS`` for
    torch's thread pool); the rest of what a module reads at import is the zygote's, from ``env``: leave out there
    what the runs set differently (``OMP_NUM_THREADS``: a zygote without it sizes torch's pool as a fresh interpreter
    without it would). The hash seed is the zygote's: give ``PYTHONHASHSEED`` in ``env``."""

    def __init__(self, env, preload=PRELOAD):
        # Its own session: closing kills the runs' own children too (the ranks or workers a run starts).
        self.zygote = subprocess.Popen([sys.executable, os.path.abspath(__file__), *preload], env=env,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                       start_new_session=True)
        self.live = {}
        ready = self._reply(timeout=120)
        assert ready == {'ready': True}, ready

    def _reply(self, timeout):
        readable, _, _ = select.select([self.zygote.stdout], [], [], timeout)
        if not readable:
            return None
        line = self.zygote.stdout.readline()
        if not line:
            raise RuntimeError(f'the warm Python zygote ended (status {self.zygote.wait()})')
        return json.loads(line)

    def _send(self, request):
        self.zygote.stdin.write(json.dumps(request) + '\n')
        self.zygote.stdin.flush()

    def start(self, args, cwd, env, stdout, stderr):
        """Start ``python *args`` (``args`` as after ``python``: a script's path or ``-m MODULE``, then arguments);
        ``stderr`` may be the ``stdout`` file (both into one)."""
        self._send({'run': [str(a) for a in args], 'cwd': str(cwd), 'env': dict(env), 'stdout': str(stdout),
                    'stderr': str(stderr)})
        process = WarmProcess(self._reply(timeout=60)['pid'], str(stdout), str(stderr))
        self.live[process.pid] = process
        return process

    def start_here(self, args, log, env=None):
        """``python *args`` in the current folder with ``env`` (None: this process's environment) and
        ``PYTHONHASHSEED=0`` (the zygote's seed), its stdout and stderr in ``log``.out and ``log``.err."""
        env = dict(os.environ if env is None else env, PYTHONHASHSEED='0')
        return self.start([str(a) for a in args], os.getcwd(), env, f'{log}.out', f'{log}.err')

    def running(self, process):
        """Whether the run has not ended yet (its /proc entry is there, and not a zombie waiting for :meth:`wait`)."""
        try:
            with open(f'/proc/{process.pid}/stat') as f:
                return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
        except FileNotFoundError:
            return False

    def wait(self, process, timeout):
        """The run's exit status; a run still going after ``timeout`` seconds is killed (status -9)."""
        self._send({'wait': process.pid})
        reply = self._reply(timeout)
        if reply is None:
            os.kill(process.pid, signal.SIGKILL)
            reply = self._reply(timeout=60)
        process.returncode = reply['returncode']
        del self.live[process.pid]
        return process.returncode

    def close(self):
        for pid in list(self.live):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.zygote.stdin.close()
        try:
            self.zygote.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.zygote.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.zygote.wait()


# ------------------------------------------------------------------------------------------------ the zygote


def _serve():
    """Answer requests until stdin closes; returns (only in a forked child) the run that child is to become."""
    replies = sys.stdout
    replies.write(json.dumps({'ready': True}) + '\n')
    replies.flush()
    for line in sys.stdin:
        request = json.loads(line)
        if 'wait' in request:
            _, status = os.waitpid(request['wait'], 0)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            replies.write(json.dumps({'returncode': code}) + '\n')
            replies.flush()
            continue
        pid = os.fork()
        if pid == 0:
            return request
        replies.write(json.dumps({'pid': pid}) + '\n')
        replies.flush()
    sys.exit(0)


def _pythonpath(env):
    return [entry for entry in env.get('PYTHONPATH', '').split(os.pathsep) if entry]


# What the zygote read at its own start, which each run replaces by its own.
_ZYGOTE_PYTHONPATH = _pythonpath(os.environ)
_ZYGOTE_THREADS = None


def _start_as_a_fresh_interpreter_would(env):
    """The run's environment, and what an interpreter started with it reads from it only at start."""
    import torch
    os.environ.clear()
    os.environ.update(env)
    sys.dont_write_bytecode = bool(env.get('PYTHONDONTWRITEBYTECODE'))
    # sys.path: [the script's folder, PYTHONPATH's entries, the installation's]; the first is set by the caller.
    sys.path[1:1 + len(_ZYGOTE_PYTHONPATH)] = [os.path.abspath(entry) for entry in _pythonpath(env)]
    torch.set_num_threads(int(env['OMP_NUM_THREADS']) if env.get('OMP_NUM_THREADS') else _ZYGOTE_THREADS)


def _become(request):
    """Turn this forked child into ``python *request['run']``."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request['stdout']), (2, request['stderr'])):
        if fd == 2 and path == request['stdout']:
            os.dup2(1, 2)           # one file for both, as `> file 2>&1`
            continue
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, 'w', closefd=False)
    sys.stderr = open(2, 'w', closefd=False)
    os.chdir(request['cwd'])
    _start_as_a_fresh_interpreter_would(request['env'])
    args = request['run']
    if args[0] == '-m':
        sys.argv = [args[1], *args[2:]]     # runpy puts the module's file first, as `python -m` does
        sys.path[0] = os.getcwd()
        runpy.run_module(args[1], run_name='__main__', alter_sys=True)
    else:
        sys.argv = list(args)
        sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
        runpy.run_path(args[0], run_name='__main__')


if __name__ == '__main__':
    for name in sys.argv[1:]:
        importlib.import_module(name)
    import torch
    # The first optimizer finishes torch._dynamo's lazy set-up; do it here, once (on a tensor made without the random
    # generator, whose state the runs inherit untouched).
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    _ZYGOTE_THREADS = torch.get_num_threads()
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()
    _become(_serve())
