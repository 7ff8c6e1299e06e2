"""`make gpu-check` (benchmarks/gpu_check.py) where it is mostly run from: a machine without CUDA, where it must
say so at once and exit with its own status, never read as a GPU check passed. The GPU checks themselves are
tests/gpu/ (skipped here), and every GPU-only test must live there for the check to run it."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NO_CUDA = 3


def test_without_cuda_the_gpu_check_says_so_and_exits_with_its_own_status(tmp_path):
    log = tmp_path / 'gpu_check.log'
    env = {k: v for k, v in os.environ.items() if k != 'OUT'}
    env['CUDA_VISIBLE_DEVICES'] = ''        # a machine without a GPU, also where the tests run on one
    process = subprocess.run([sys.executable, str(ROOT / 'benchmarks' / 'gpu_check.py'), '--log', str(log)],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert process.returncode == NO_CUDA, process.stdout + process.stderr
    last = process.stdout.strip().splitlines()[-1]
    assert last.startswith('gpu-check: no CUDA device') and 'nothing was checked' in last
    assert not re.search(r'^(PASS|FAIL) ', process.stdout, re.MULTILINE)
    assert log.read_text(encoding='utf-8') == process.stdout


def test_every_gpu_only_test_is_in_tests_gpu_where_the_gpu_check_runs_it():
    # A test skipped without CUDA: a skipif on torch.cuda.is_available() being False, or pytest.skip under it.
    skipped_without_cuda = re.compile(r'skipif\(\s*not torch\.cuda\.is_available\(\)'
                                      r'|if not torch\.cuda\.is_available\(\):\s*pytest\.skip')
    outside = [str(path.relative_to(ROOT)) for path in (ROOT / 'tests').rglob('*.py')
               if path.relative_to(ROOT / 'tests').parts[0] != 'gpu'
               and skipped_without_cuda.search(path.read_text(encoding='utf-8'))]
    assert not outside, f'tests that need CUDA belong in tests/gpu/ (make gpu-check runs that folder): {outside}'
