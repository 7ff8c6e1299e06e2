"""The GPU check (``make gpu-check``): on a machine with a CUDA GPU, every GPU-only test (tests/gpu/) and the
loop-overhead benchmark on a ResNet-18 step against a hand-written loop. A few minutes on one GPU.

The tests (docs/gpu-check.md lists them): use_amp=True / 'fp16' / a GradScaler dict / 'bf16' against a hand-written
torch.autocast + GradScaler loop, to the bit; gpu_mode='fsdp' on one GPU; cuda_device_idx with device_idx_execution;
a checkpoint written on the GPU resumed in a process without CUDA; ThroughputMonitor's CUDA memory.

Output, unbuffered: ``PASS name (seconds)``, ``FAIL name: reason`` or ``SKIP name: reason`` per check as it ends,
a ``RATIO`` line per benchmark (TrainLoop's steps/s over the hand-written loop's), the tracebacks of the failures,
then ``gpu-check: N passed, N failed, N skipped``. Everything, pytest's own report and the benchmark's whole output
included, also goes to the log file: --log, else $OUT/gpu_check.log when the variable OUT is set, else
build/gpu_check.log.

Exit status: 0 every check passed; 1 a check failed (or none ran); 3 no CUDA device: nothing was checked (a status
of its own, so that a machine without a GPU never reads as a GPU check passed).

--force-cpu runs what can run on the CPU (the tests with GPU_CHECK_FORCE_CPU=1 and CUDA_VISIBLE_DEVICES='', a tiny
benchmark), to develop the checks without a GPU; it is never a GPU check, and its last line says so.

Usage: python benchmarks/gpu_check.py [--log PATH] [--force-cpu]
"""
import argparse
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NO_CUDA = 3
TEST_TIMEOUT_S = 180        # per test (pytest-timeout); the whole check takes a few minutes
BENCH_TIMEOUT_S = 240
# (name, loop_overhead.py arguments): an ImageNet-sized step (the GPU is the bottleneck), and a small-image one
# (the kernel launches are: the loop's own cost shows most there).
BENCHMARKS = [
    ('loop_overhead[resnet18 3x224x224 batch 32]',
     ['--model', 'resnet18', '--image-size', '224', '--batch-size', '32', '--batches', '20', '--repeats', '5']),
    ('loop_overhead[resnet18 3x64x64 batch 64]',
     ['--model', 'resnet18', '--image-size', '64', '--batch-size', '64', '--batches', '20', '--repeats', '5']),
    # A transfer-bound step (large images, little compute) with the batches in host memory: the hand-written loop
    # copies each at the top of its step, the TrainLoop prefetches the next one while the step runs (above 1.0).
    ('loop_overhead[transfer-bound: one convolution, 3x224x224 batch 128 from host memory]',
     ['--model', 'tinyconv', '--image-size', '224', '--batch-size', '128', '--host-data', '--batches', '20',
      '--repeats', '5']),
]
CPU_BENCHMARKS = [
    ('loop_overhead[resnet18 3x32x32 batch 2, CPU]',
     ['--model', 'resnet18', '--image-size', '32', '--batch-size', '2', '--batches', '3', '--epochs', '1',
      '--repeats', '1']),
]


class Output:
    """Lines to the terminal (flushed at once) and to the log file; ``log`` alone takes the detail."""

    def __init__(self, log_path):
        self.terminal = sys.stdout
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(log_path, 'w', encoding='utf-8', buffering=1)
        self.mid_line = False       # pytest's progress characters leave the log's last line open

    def line(self, text=''):
        self.terminal.write(text + '\n')
        self.terminal.flush()
        self.log(text)

    def log(self, text):
        self.write_log(('\n' if self.mid_line else '') + (text if text.endswith('\n') else text + '\n'))

    def write_log(self, text):
        if text:
            self.file.write(text)
            self.mid_line = not text.endswith('\n')


class LogOnly:
    """Stands in for sys.stdout while pytest runs: its own report goes to the log, not between the check lines."""

    encoding = 'utf-8'

    def __init__(self, out):
        self.out = out

    def write(self, text):
        self.out.write_log(text)
        return len(text)

    def flush(self):
        self.out.file.flush()

    def isatty(self):
        return False


class Results:
    def __init__(self, out):
        self.out = out
        self.counts = {'PASS': 0, 'FAIL': 0, 'SKIP': 0}
        self.failures = []      # (name, full report)

    def record(self, status, name, info, details=None):
        self.counts[status] += 1
        self.out.line(f'{status} {name} ({info})' if status == 'PASS' else f'{status} {name}: {info}')
        if status == 'FAIL' and details:
            self.failures.append((name, details))


def one_line(text, limit=400):
    text = ' '.join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + '...'


class Reporter:
    """pytest plugin: one line per test once all its phases have run (a failed teardown fails a passed test)."""

    def __init__(self, results):
        self.results = results
        self.reports = {}

    @staticmethod
    def _name(nodeid):
        return nodeid.replace('tests/gpu/', '', 1).replace('.py::', '::', 1)

    @staticmethod
    def _reason(report):
        crash = getattr(report.longrepr, 'reprcrash', None)
        if crash is not None:
            return one_line(crash.message)
        lines = [line for line in report.longreprtext.splitlines() if line.strip()]
        return one_line(lines[-1] if lines else 'failed')

    def pytest_collectreport(self, report):
        if report.failed:
            self.results.record('FAIL', f'collect {report.nodeid or "tests/gpu"}', self._reason(report),
                                report.longreprtext)

    def pytest_runtest_logreport(self, report):
        self.reports.setdefault(report.nodeid, []).append(report)

    def pytest_runtest_logfinish(self, nodeid, location):
        reports = self.reports.pop(nodeid, [])
        name = self._name(nodeid)
        failed = [r for r in reports if r.failed]
        skipped = [r for r in reports if r.skipped]
        if failed:
            report = failed[0]
            where = '' if report.when == 'call' else f'in {report.when}: '
            self.results.record('FAIL', name, where + self._reason(report), report.longreprtext)
        elif skipped:
            longrepr = skipped[0].longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            self.results.record('SKIP', name, reason.replace('Skipped: ', '', 1))
        else:
            self.results.record('PASS', name, f'{sum(r.duration for r in reports):.1f} s')


def run_tests(out, results):
    import pytest
    out.log('=' * 30 + ' pytest tests/gpu ' + '=' * 30)
    # A test file that fails to import is one FAIL line; the other files still run.
    args = [str(ROOT / 'tests' / 'gpu'), '-c', str(ROOT / 'pytest.ini'), '--rootdir', str(ROOT), '-rA', '--color=no',
            '--continue-on-collection-errors', '-o', f'timeout={TEST_TIMEOUT_S}']
    stdout = sys.stdout
    sys.stdout = LogOnly(out)
    try:
        status = pytest.main(args, plugins=[Reporter(results)])
    finally:
        sys.stdout = stdout
    if status not in (0, 1) and not results.counts['FAIL']:
        results.record('FAIL', 'pytest tests/gpu', f'pytest ended with status {int(status)} (see the log)')


def parse_ratios(text):
    """The figures of loop_overhead.py's report, or None when one is missing."""
    patterns = dict(plain=r'TrainLoop, no callbacks:\s+([\d.]+)\s+([\d.]+)',
                    callbacks=r'TrainLoop, 50 no-op callbacks:\s+([\d.]+)\s+([\d.]+)',
                    step=r'raw loop step ~(\d+) us', overhead=r'overhead per step \(steady state\): (-?[\d.]+) us')
    found = {key: re.search(pattern, text) for key, pattern in patterns.items()}
    return None if not all(found.values()) else {key: match.groups() for key, match in found.items()}


def run_benchmark(out, results, name, device, arguments):
    command = [sys.executable, '-u', str(ROOT / 'benchmarks' / 'loop_overhead.py'), '--device', device, *arguments]
    out.log('=' * 30 + f' {name}: {" ".join(command[2:])} ' + '=' * 30)
    start = time.monotonic()
    try:
        process = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S)
    except subprocess.TimeoutExpired as timeout:
        out.log(f'{timeout.stdout or ""}\n{timeout.stderr or ""}')
        results.record('FAIL', name, f'still running after {BENCH_TIMEOUT_S} s', f'{timeout.stderr or ""}')
        return
    out.log(process.stdout + process.stderr)
    figures = parse_ratios(process.stdout)
    if process.returncode != 0 or figures is None:
        why = f'exit status {process.returncode}' if process.returncode else 'no ratio in its output'
        results.record('FAIL', name, why, process.stderr[-3000:] or process.stdout)
        return
    results.record('PASS', name, f'{time.monotonic() - start:.1f} s')
    for line in process.stdout.splitlines():
        out.line('    ' + line)
    (whole, steady), (whole_cbs, steady_cbs) = figures['plain'], figures['callbacks']
    out.line(f'RATIO {name}: TrainLoop / hand-written loop steps/s = {steady} steady state, {whole} whole fit; '
             f'with 50 no-op callbacks {steady_cbs} / {whole_cbs} (hand-written step ~{figures["step"][0]} us, '
             f'loop overhead {figures["overhead"][0]} us per step)')


def default_log():
    return Path(os.environ['OUT']) / 'gpu_check.log' if os.environ.get('OUT') else ROOT / 'build' / 'gpu_check.log'


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--log', type=Path, default=None, help='the full log (default: %(default)s)')
    parser.add_argument('--force-cpu', action='store_true',
                        help='develop the checks without a GPU: run what can run on the CPU (never a GPU check)')
    args = parser.parse_args()
    started = time.monotonic()
    # The checkout's package, without an install (a GPU machine may have torch and no venv): here, in the test
    # processes and in the benchmark's.
    sys.path.insert(0, str(ROOT))
    os.environ['PYTHONPATH'] = os.pathsep.join(p for p in (str(ROOT), os.environ.get('PYTHONPATH')) if p)
    os.environ['PYTHONUNBUFFERED'] = '1'
    if args.force_cpu:
        os.environ['CUDA_VISIBLE_DEVICES'] = ''     # the loop takes a GPU whenever it sees one
        os.environ['GPU_CHECK_FORCE_CPU'] = '1'
    out = Output(args.log or default_log())
    out.line(f'gpu-check: full log in {args.log or default_log()}')

    try:
        import torch
    except ImportError as error:
        out.line(f'FAIL import torch: {error} ({sys.executable}); give make a python that has torch: '
                 f'make gpu-check GPU_PYTHON=...')
        return 1
    cuda = torch.cuda.is_available()
    out.line(f'gpu-check: Python {platform.python_version()}, torch {torch.__version__} (CUDA build '
             f'{torch.version.cuda}), {platform.machine()}')
    if not cuda and not args.force_cpu:
        out.line(f'gpu-check: no CUDA device (torch.cuda.is_available() is False; torch {torch.__version__}, CUDA '
                 f'build {torch.version.cuda}): nothing was checked, exit status {NO_CUDA}')
        return NO_CUDA
    if cuda:
        props = torch.cuda.get_device_properties(0)
        out.line(f'gpu-check: {torch.cuda.device_count()} GPU(s); cuda:0 is {props.name}, compute capability '
                 f'{props.major}.{props.minor}, {props.total_memory / 2 ** 30:.0f} GiB')
    if args.force_cpu:
        out.line('gpu-check: --force-cpu: the checks run on the CPU; this is not a GPU check')

    results = Results(out)
    try:
        import aitoolbox_like
    except Exception as error:      # noqa: BLE001 (any failure to import is the finding)
        results.record('FAIL', 'import aitoolbox_like', one_line(f'{type(error).__name__}: {error}'))
        return 1
    results.record('PASS', 'import aitoolbox_like', f'{aitoolbox_like.__version__} from '
                   f'{Path(aitoolbox_like.__file__).parent}')
    run_tests(out, results)
    if cuda:
        torch.cuda.empty_cache()    # the tests' cached blocks are not the benchmark's
    device = 'cpu' if args.force_cpu else 'cuda'
    for name, arguments in (CPU_BENCHMARKS if args.force_cpu else BENCHMARKS):
        run_benchmark(out, results, name, device, arguments)

    for name, details in results.failures:
        out.line(f'\n---------- FAIL {name} ----------\n{details.rstrip()}')
    counts = results.counts
    where = ' (--force-cpu: on the CPU, not a GPU check)' if args.force_cpu else ''
    out.line(f'gpu-check: {counts["PASS"]} passed, {counts["FAIL"]} failed, {counts["SKIP"]} skipped in '
             f'{time.monotonic() - started:.0f} s{where}')
    return 0 if counts['FAIL'] == 0 and counts['PASS'] > 1 else 1


if __name__ == '__main__':
    sys.exit(main())
