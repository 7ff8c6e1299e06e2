"""Goodput under elastic torchrun: what a worker failure costs a restartable run.

It runs the same job twice under torchrun's elastic agent (``python -m torch.distributed.run --nnodes=1
--nproc_per_node=2 --rdzv-backend=c10d --max-restarts=N``, torch's default launch: the agent's store shared with the
workers), 2 CPU processes with gloo and 1 thread each: once uninterrupted, and once with the worker of rank 1
SIGKILLing itself right after the training step of global index n * K for every n >= 1 (``--kill-every K``; each
kill happens once). The job (benchmarks/goodput_job.py) is the script users are told to write: a DDP TrainLoop with
a synchronous ModelIterationCheckpoint every C steps (``--save-every``) and ``fit(resume_from='auto')``, so each
restarted group continues from the newest checkpoint and retrains the steps done since it. With the defaults the
kills land 15, 5, 20 and 10 steps after a checkpoint.

The job's processes write, in files, the wall-clock time of their first training step and the step they started
from, and rank 1 the time and step of each kill. Printed:

- per failure: the step killed at, the step the restarted group started from, the steps lost (trained after the
  last checkpoint and before the kill, hence trained again), and the seconds from the kill until the restarted
  processes were running the script (the agent noticing the failure, stopping rank 0, the new rendezvous, starting
  the interpreters), until they had imported torch and aitoolbox_like, and until the restarted group's first
  training step had ended (also building the model and optimizer, joining the process group, loading the
  checkpoint); each time is the group's slowest process; the means and maxima of the steps lost and of the time to
  the first step;
- goodput = useful steps (the job's steps, counted once) / wall time of the whole torchrun command, for both runs,
  and as the last line ``goodput with a kill every K steps / uninterrupted: R``.

Both runs must end with the same weights (bit for bit); the script says whether they do. Timings on a shared 2-core
machine vary from run to run; nothing about time is asserted.

Usage: python benchmarks/goodput.py [--kill-every 90] [--save-every 25] [--epochs 4] [--steps-per-epoch 100]
                                    [--width 256] [--batch-size 32] [--dir FOLDER]
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import torch

from aitoolbox_like.distributed import find_free_port

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(REPO_ROOT, 'benchmarks', 'goodput_job.py')
NPROC = 2


def job_env() -> Dict[str, str]:
    """The environment of torchrun: torch's default launch (the agent's store shared with the workers, i.e.
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE unset), one thread per process, this checkout importable."""
    env = {k: v for k, v in os.environ.items() if k != 'TORCH_DISABLE_SHARE_RDZV_TCP_STORE'}
    env['OMP_NUM_THREADS'] = '1'
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get('PYTHONPATH')]))
    return env


def run_job(out_dir: str, job_args: List[str], max_restarts: int, timeout_s: float) -> float:
    """Run the job under torchrun until it ends; returns the wall time in seconds. Raises RuntimeError with the end
    of its output when it fails."""
    command = [sys.executable, '-m', 'torch.distributed.run', '--nnodes=1', f'--nproc_per_node={NPROC}',
               '--rdzv-backend=c10d', f'--rdzv-endpoint=127.0.0.1:{find_free_port()}', '--rdzv-id=goodput',
               f'--max-restarts={max_restarts}', JOB, out_dir] + job_args
    start = time.perf_counter()
    result = subprocess.run(command, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=timeout_s)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        # torchrun's summary comes last and names only the signals: the workers' own messages are earlier.
        with tempfile.NamedTemporaryFile('w', prefix='goodput_failed_', suffix='.log', delete=False) as log:
            log.write(result.stdout)
        raise RuntimeError(f'the job under torchrun failed with status {result.returncode} (its whole output: '
                           f'{log.name}):\n{result.stdout[-4000:]}')
    return wall


def read_records(out_dir: str, pattern: str) -> List[dict]:
    return [json.load(open(path)) for path in sorted(glob.glob(os.path.join(out_dir, pattern)))]


def failures(starts: List[dict], kills: List[dict]) -> List[dict]:
    """One row per kill: the restarted group is the first torchrun restart whose processes started after it."""
    rows = []
    for kill in sorted(kills, key=lambda k: k['time']):
        after = [s for s in starts if s['script_started'] > kill['time']]
        if not after:
            raise RuntimeError(f'no process started after the kill at step {kill["step"]}: the run was not restarted')
        restart = min(s['restart'] for s in after)
        group = [s for s in after if s['restart'] == restart]
        resumed_at = min(s['first_step'] for s in group)
        rows.append({'step': kill['step'], 'resumed_at': resumed_at, 'lost': kill['step'] - resumed_at + 1,
                     'to_script': max(s['script_started'] for s in group) - kill['time'],
                     'to_imports_done': max(s['imports_done'] for s in group) - kill['time'],
                     # The group's first step ends when every rank has ended it (DDP's gradient all-reduce).
                     'to_first_step': max(s['first_step_end'] for s in group) - kill['time']})
    return rows


def same_weights(first: Dict[str, torch.Tensor], second: Dict[str, torch.Tensor]) -> bool:
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def mean_max(values: List[float], unit: str, digits: int) -> str:
    return f'mean {statistics.mean(values):.{digits}f}{unit}, max {max(values):.{digits}f}{unit}'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--kill-every', type=int, default=90, help='rank 1 dies after the step of index n * K')
    parser.add_argument('--save-every', type=int, default=25, help='checkpoint every C steps (synchronous)')
    parser.add_argument('--epochs', type=int, default=4)
    parser.add_argument('--steps-per-epoch', type=int, default=100)
    parser.add_argument('--width', type=int, default=256, help='hidden width of the MLP 64-W-W-1')
    parser.add_argument('--batch-size', type=int, default=32, help='per process')
    parser.add_argument('--timeout', type=float, default=600.0, help='seconds allowed for each torchrun run')
    parser.add_argument('--dir', default=None, help='where the runs write (default: a temp folder)')
    args = parser.parse_args()
    if args.kill_every < 1 or args.save_every < 1:
        parser.error('--kill-every and --save-every must be >= 1')
    steps = args.epochs * args.steps_per_epoch
    kills_expected = (steps - 1) // args.kill_every
    job_args = ['--epochs', str(args.epochs), '--steps-per-epoch', str(args.steps_per_epoch), '--width',
                str(args.width), '--batch-size', str(args.batch_size), '--save-every', str(args.save_every)]

    folder = tempfile.mkdtemp(prefix='goodput_', dir=args.dir)
    try:
        reference_dir, killed_dir = os.path.join(folder, 'uninterrupted'), os.path.join(folder, 'killed')
        os.makedirs(reference_dir)
        os.makedirs(killed_dir)
        launched = time.time()
        reference_wall = run_job(reference_dir, job_args, 0, args.timeout)
        # One restart more than the kills: an unplanned failure then shows up in the table instead of ending the run.
        killed_wall = run_job(killed_dir, job_args + ['--kill-every', str(args.kill_every)], kills_expected + 1,
                              args.timeout)
        reference_starts = read_records(reference_dir, 'start_*.json')
        starts, kills = read_records(killed_dir, 'start_*.json'), read_records(killed_dir, 'killed_*.json')
        reference_final = torch.load(os.path.join(reference_dir, 'final.pt'))
        killed_final = torch.load(os.path.join(killed_dir, 'final.pt'))
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    rows = failures(starts, kills)
    first_step_end = max(s['first_step_end'] for s in reference_starts)
    step_ms = (reference_final['end'] - first_step_end) / (steps - 1) * 1e3
    print(f'job: MLP 64-{args.width}-{args.width}-1, batch {args.batch_size} per process, {NPROC} CPU processes '
          f'(gloo, 1 thread each), {steps} steps ({args.epochs} epochs of {args.steps_per_epoch}), synchronous '
          f'checkpoint every {args.save_every} steps; torch {torch.__version__}')
    print(f'uninterrupted: {steps} steps in {reference_wall:.1f} s (torchrun start to first step '
          f'{first_step_end - launched:.1f} s, then {step_ms:.1f} ms per step with the checkpoints)')
    print(f'killed every {args.kill_every} steps: {len(kills)} kills (expected {kills_expected}), '
          f'{max(s["restart"] for s in starts)} restarts, {steps} useful + {sum(r["lost"] for r in rows)} retrained '
          f'steps in {killed_wall:.1f} s')
    print(f'{"killed at":>10} {"resumed at":>11} {"lost":>5}   seconds from the kill to: {"script":>7} '
          f'{"imports done":>13} {"first step":>11}')
    for row in rows:
        print(f'{row["step"]:>10} {row["resumed_at"]:>11} {row["lost"]:>5} {"":>26}{row["to_script"]:>7.2f} '
              f'{row["to_imports_done"]:>13.2f} {row["to_first_step"]:>11.2f}')
    if rows:
        print(f'steps lost per failure: {mean_max([r["lost"] for r in rows], "", 1)}')
        print(f'kill -> restarted processes running the script: {mean_max([r["to_script"] for r in rows], " s", 2)}')
        print(f'kill -> first training step of the restarted group: '
              f'{mean_max([r["to_first_step"] for r in rows], " s", 2)}')
    identical = same_weights(reference_final['weights'], killed_final['weights'])
    print(f'final weights identical to the uninterrupted run: {"yes" if identical else "NO"}')
    reference_goodput, killed_goodput = steps / reference_wall, steps / killed_wall
    print(f'goodput (useful steps / wall s): uninterrupted {reference_goodput:.1f}, with a kill every '
          f'{args.kill_every} steps {killed_goodput:.1f}')
    ratio = killed_goodput / reference_goodput
    print(f'goodput with a kill every {args.kill_every} steps / uninterrupted: {ratio:.3f}')


if __name__ == '__main__':
    main()
