"""Kill and resume, as a user's run lives it (make pta-check, sg-check, orca-check): a training script, run in
processes of its own, once to its end, and once killed with SIGKILL (by itself, at a chosen batch, so the kill lands
at the same step every time) and started again with ``fit(resume_from='auto')`` in a new process. What each run
leaves (its final weights, the foreign callbacks' files and state, what it printed after the kill point) is then
compared, to the bit.

A script is a module with ``main(folder, kill_at)`` that trains into ``folder`` (the experiment's folder and the
callbacks' files), calls :func:`kill_at_batch` with ``kill_at`` among its callbacks, and returns what it wants
compared (a dict of tensors, numbers, strings, lists and dicts), which :func:`script_main` writes to
``folder/result.pt``.
"""
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch

from aitoolbox_like.callbacks.abstract import AbstractCallback

CHECKOUT = Path(__file__).resolve().parents[1]
RESULT = 'result.pt'


class KillAtBatch(AbstractCallback):
    """SIGKILL to this very process before the global batch ``total_iteration_idx`` trains (no handler runs, no file
    is flushed: the process is gone, as after ``kill -9`` or an out-of-memory kill)."""

    def __init__(self, batch: int) -> None:
        super().__init__('kill -9 at a chosen batch', execution_order=-1000)
        self.batch = batch

    def on_batch_begin(self) -> None:
        if self.train_loop_obj.total_iteration_idx == self.batch:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def kill_at_batch(kill_at: Optional[int]) -> Sequence[AbstractCallback]:
    """``[KillAtBatch(kill_at)]``, or nothing for the uninterrupted run."""
    return [] if kill_at is None else [KillAtBatch(kill_at)]


def script_main(main: Callable[[Path, Optional[int]], Dict[str, Any]]) -> None:
    """The entry of a script module: ``python -m <module> FOLDER [KILL_AT]``."""
    folder = Path(sys.argv[1])
    kill_at = int(sys.argv[2]) if len(sys.argv) > 2 else None
    torch.set_num_threads(1)
    result = main(folder, kill_at)
    torch.save(result, folder / RESULT)


def _run(module: str, folder: Path, kill_at: Optional[int], pythonpath: Sequence[str]) -> Tuple[int, str]:
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join([str(CHECKOUT), *pythonpath, env.get('PYTHONPATH', '')])
    command = [sys.executable, '-m', module, str(folder)] + ([] if kill_at is None else [str(kill_at)])
    done = subprocess.run(command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600)
    return done.returncode, done.stdout


def uninterrupted_and_resumed(module: str, work: Path, kill_at: int,
                              pythonpath: Sequence[str] = ()) -> Tuple[Dict[str, Any], Dict[str, Any], str]:
    """Run ``module`` to its end in ``work/uninterrupted``; in ``work/killed`` run it until it kills itself before
    batch ``kill_at``, then again (resuming). Returns both results and the resumed run's output; a run that fails
    (or a kill that did not happen) raises RuntimeError with its output."""
    whole, killed = work / 'uninterrupted', work / 'killed'
    for folder in (whole, killed):
        folder.mkdir(parents=True, exist_ok=True)
    status, output = _run(module, whole, None, pythonpath)
    if status != 0:
        raise RuntimeError(f'the uninterrupted run failed (status {status}):\n{output[-3000:]}')
    status, output = _run(module, killed, kill_at, pythonpath)
    if status != -signal.SIGKILL:
        raise RuntimeError(f'the run to kill ended with status {status}, not by SIGKILL at batch {kill_at}:\n'
                           f'{output[-3000:]}')
    status, resumed_output = _run(module, killed, None, pythonpath)
    if status != 0:
        raise RuntimeError(f'the resumed run failed (status {status}):\n{resumed_output[-3000:]}')
    load = lambda folder: torch.load(folder / RESULT, map_location='cpu', weights_only=False)  # noqa: E731
    return load(whole), load(killed), resumed_output


def first_difference(a: Any, b: Any, where: str = 'result') -> Optional[str]:
    """None when ``a`` and ``b`` are equal to the bit (tensors by value and dtype, containers item by item), else
    where they first differ."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and bool(torch.equal(a, b))):
            return f'{where}: {_short(a)} against {_short(b)}'
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f'{where}: keys {sorted(map(str, a))} against {sorted(map(str, b))}'
        for key in a:
            found = first_difference(a[key], b[key], f'{where}[{key!r}]')
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f'{where}: {len(a)} items against {len(b)}'
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f'{where}[{i}]')
            if found:
                return found
        return None
    same = a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)
    return None if same else f'{where}: {a!r} against {b!r}'


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f'tensor{tuple(value.shape)} {value.dtype} {value.flatten()[:3].tolist()}'
    return repr(value)[:80]
