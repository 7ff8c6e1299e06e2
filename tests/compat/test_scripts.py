"""Run AIToolbox-style user scripts the two ways the compatibility promise covers.

(a) unchanged, through the compat runner:   python -m aitoolbox_like.compat SCRIPT OUT_DIR
(b) after the plain rename \\baitoolbox\\b -> aitoolbox_like:   python RENAMED_SCRIPT OUT_DIR

Each script in scripts/ is written against the AIToolbox 1.8.0 API, is seeded, and ends by printing a one-line
JSON summary; both runs must exit 0 and print the same summary.

Most runs are forked from the tests' zygote (conftest's ``warm_python``: each its own process, as ``python ...``);
a script that starts processes (a ``gpu_mode='ddp'`` fit) runs in fresh interpreters, as a user runs it, so that its
ranks are spawned and re-import it (through the compat runner too) instead of being forked from a process that
already ran it.
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest


SCRIPTS_DIR = Path(__file__).parent / 'scripts'
SCRIPTS = sorted(p.name for p in SCRIPTS_DIR.glob('s[0-9][0-9]_*.py'))
REPO_ROOT = Path(__file__).resolve().parents[2]

SLOW_SCRIPTS = {'s19_ddp_cpu.py': 240}
DEFAULT_TIMEOUT = 120
_STARTS_PROCESSES = re.compile(r"""gpu_mode\s*=\s*['"](?:ddp|fsdp)['"]|multiprocessing""")


def _starts_processes(script):
    return bool(_STARTS_PROCESSES.search((SCRIPTS_DIR / script).read_text()))


def _env():
    env = dict(os.environ)
    # the package under test comes from this checkout, whatever the cwd
    env['PYTHONPATH'] = os.pathsep.join([str(REPO_ROOT)] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
    env.setdefault('OMP_NUM_THREADS', '1')
    env.setdefault('MKL_NUM_THREADS', '1')
    env['MPLBACKEND'] = 'Agg'
    env['PYTHONHASHSEED'] = '0'
    env.pop('AITB_COMPAT_OUT', None)
    return env


class _FreshProcess:
    """``python *cmd`` started as a shell starts it (a fresh interpreter, no hash seed forced), with the interface of
    warm_python's runs."""

    def __init__(self, cmd, cwd, stdout, stderr):
        env = _env()
        del env['PYTHONHASHSEED']
        self.stdout_path, self.stderr_path = stdout, stderr
        with open(stdout, 'w') as out, open(stderr, 'w') as err:
            self.process = subprocess.Popen([sys.executable, *map(str, cmd)], cwd=cwd, env=env, stdout=out,
                                            stderr=err)

    def wait(self, timeout):
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def output(self):
        with open(self.stdout_path, errors='replace') as out, open(self.stderr_path, errors='replace') as err:
            return out.read(), err.read()


def _run_both(warm, commands, cwd, timeout, fresh=False):
    """Run the commands at the same time (the two runs of a script are independent), forked from ``warm`` or, with
    ``fresh``, in fresh interpreters, and return each one's summary."""
    if fresh:
        processes = [_FreshProcess(cmd, cwd, cwd / f'run{i}.stdout', cwd / f'run{i}.stderr')
                     for i, cmd in enumerate(commands)]
    else:
        processes = [warm.start(cmd, cwd, _env(), cwd / f'run{i}.stdout', cwd / f'run{i}.stderr')
                     for i, cmd in enumerate(commands)]
    deadline = time.monotonic() + timeout

    def wait(proc):
        left = max(1.0, deadline - time.monotonic())
        return proc.wait(left) if fresh else warm.wait(proc, left)

    codes = [wait(proc) for proc in processes]
    summaries = []
    for cmd, proc, code in zip(commands, processes, codes):
        stdout, stderr = proc.output()
        assert code == 0, (
            f'python {" ".join(map(str, cmd))} exited {code}\n'
            f'--- stdout (tail) ---\n{stdout[-3000:]}\n--- stderr (tail) ---\n{stderr[-6000:]}')
        summaries.append(_summary(stdout, cmd))
    return summaries


def _summary(stdout, cmd):
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, f'{cmd}: no output'
    last = lines[-1].strip()
    assert last.startswith('{'), f'{cmd}: last stdout line is not the JSON summary: {last[:300]}'
    return json.loads(last)


def rename_aitoolbox(source):
    return re.sub(r'\baitoolbox\b', 'aitoolbox_like', source)


def test_rename_is_plain_word_replace():
    src = 'from aitoolbox.torchtrain.train_loop import *\nimport aitoolbox\nx = "my_aitoolbox_dir"\n'
    assert rename_aitoolbox(src) == ('from aitoolbox_like.torchtrain.train_loop import *\nimport aitoolbox_like\n'
                                     'x = "my_aitoolbox_dir"\n')


def test_scripts_are_written_against_aitoolbox():
    """Every script imports aitoolbox (not aitoolbox_like): they are the unchanged user code."""
    for name in SCRIPTS:
        src = (SCRIPTS_DIR / name).read_text()
        assert re.search(r'^(from|import) aitoolbox\b', src, re.M), name
        assert 'aitoolbox_like' not in src, name


def test_the_ddp_script_is_recognised_as_starting_processes():
    assert [script for script in SCRIPTS if _starts_processes(script)] == ['s19_ddp_cpu.py']


# AIToolbox's DDP script spawns its ranks as fresh interpreters, twice: a system test (make system-check).
@pytest.mark.parametrize('script', [pytest.param(s, marks=pytest.mark.system) if s == 's19_ddp_cpu.py' else s
                                    for s in SCRIPTS])
def test_script_compat_runner_and_renamed_agree(script, tmp_path, warm_python):
    timeout = SLOW_SCRIPTS.get(script, DEFAULT_TIMEOUT)
    original = SCRIPTS_DIR / script

    out_a = tmp_path / 'out_compat'
    out_a.mkdir()
    renamed = tmp_path / script
    renamed.write_text(rename_aitoolbox(original.read_text()))
    out_b = tmp_path / 'out_renamed'
    out_b.mkdir()
    summary_a, summary_b = _run_both(warm_python, [['-m', 'aitoolbox_like.compat', original, out_a],
                                                   [renamed, out_b]], cwd=tmp_path, timeout=timeout,
                                       fresh=_starts_processes(script))

    assert summary_a == summary_b, f'summaries differ:\ncompat:  {summary_a}\nrenamed: {summary_b}'
