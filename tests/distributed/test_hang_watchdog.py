"""HangWatchdog: a rank that stops in a callback ends the job, non-zero, within its timeout plus a few seconds, with
that rank named, its stack (the callback's frame) in the report, and the other rank named as waiting in a collective;
in one process, with an emergency checkpoint to continue from."""
import os
import sys
from pathlib import Path

import pytest

from aitoolbox_like.checkpoint import load_checkpoint

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ddp_scripts', 'hang_fit.py')


def _run(warm_python, tmp_path, *args):
    """Run hang_fit.py; it must end by itself within 30 s (the stuck callback sleeps 300 s)."""
    env = dict(os.environ, OMP_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join([os.path.dirname(SCRIPT), os.environ.get('PYTHONPATH', '')]))
    process = warm_python.start_here([SCRIPT, tmp_path, *args], tmp_path / 'run', env=env)
    code = warm_python.wait(process, timeout=30)
    output = ''.join(process.output())
    assert code not in (0, -9), f'status {code}:\n{output[-4000:]}'     # -9: still running after 30 s, killed
    return output


def _experiment(tmp_path):
    [experiment] = (tmp_path / 'exp' / 'hang').iterdir()
    return experiment


@pytest.mark.system
@pytest.mark.timeout(120)
def test_a_rank_stuck_in_a_callback_ends_the_ddp_job_naming_it_and_its_frame(warm_python, tmp_path):
    output = _run(warm_python, tmp_path, '--ranks', '2', '--hang-rank', '1')
    assert 'HangWatchdog: rank 1 of 2' in output and 'its main thread is in user code' in output
    assert 'in on_batch_begin' in output and 'hang_fit.py' in output          # the callback's frame
    assert 'HangWatchdog: rank 0 of 2' in output and 'waiting in torch' in output
    assert 'HangWatchdog: stopped in user code: rank 1 (' in output
    assert 'only waiting in a collective: rank 0' in output
    reports = _experiment(tmp_path) / 'hang_reports'
    stack = (reports / 'rank1.txt').read_text()
    assert 'HangWatchdog: rank 1 of 2' in stack and 'on_batch_begin' in stack   # faulthandler's stack of the thread
    assert 'no emergency checkpoint' in output


@pytest.mark.timeout(120)
def test_one_process_stuck_between_steps_writes_an_emergency_checkpoint(warm_python, tmp_path):
    output = _run(warm_python, tmp_path, '--ranks', '1', '--hang-rank', '0', '--timeout-s', '1')
    assert 'HangWatchdog: rank 0 of 1' in output and 'in on_batch_begin' in output
    assert 'emergency checkpoint after batch 2' in output, output[-3000:]
    [checkpoint] = (_experiment(tmp_path) / 'checkpoint_model').glob('*_ITER2.pth')
    assert load_checkpoint(checkpoint)['data_position']['batches_done'] == 3
