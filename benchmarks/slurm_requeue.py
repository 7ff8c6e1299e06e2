"""What a time limit and a preemption cost a SLURM job: signal to checkpoint, requeue to first step, steps lost.

It starts a one-node SLURM cluster of its own (tests/support/slurm_cluster.py: Debian's slurmctld, slurmd and munge, installed
with apt-get when missing, as root) and runs benchmarks/slurm_requeue_job.py, a DDP TrainLoop over 2 srun tasks on CPU
(gloo, 1 thread each) with a ModelCheckpoint per epoch, the default PreemptionCheckpoint and
``fit(resume_from='auto')``, three times:

- uninterrupted, the reference;
- **time limit**: ``scancel --signal=USR1`` (what ``#SBATCH --signal=USR1@N`` sends N seconds before the time limit)
  ``--signal-after`` seconds after the first training step: the ranks stop at an agreed step, write the checkpoint,
  rank 0 requeues the job (``scontrol requeue``), every rank exits;
- **preemption**: a job of a partition of higher priority (tests/support/slurm_cluster.py's ``preemptor``) takes the node
  instead; SLURM sends every process of the job SIGTERM (twice) and SIGKILL after KillWait, and requeues it: the
  ranks checkpoint and exit. The preempting job (``true``) ends before the requeued one is released.

A requeued job waits for the begin time SLURM gives it (about two minutes after the requeue), printed as SLURM's
hold; the benchmark then lets it start at once (``scontrol update StartTime=now``) and measures from there. Printed
per interrupted run: the steps trained between the signal and the stop, the seconds from the signal to the checkpoint
file written (its modification time) and to the job pending again, SLURM's hold, the seconds from the release to the
requeued run's processes running the script, to their imports done and to their first training step (each the slowest
process), the steps lost (trained in the first run after its checkpoint, hence again), and whether the final weights
equal the uninterrupted run's. Timings on a shared machine vary from run to run; nothing about time is asserted.

Usage: python benchmarks/slurm_requeue.py [--signal-after 3] [--epochs 4] [--steps-per-epoch 500] [--width 256]
"""
import argparse
import glob
import json
import os
import re
import shutil
import sys
import tempfile
import time
from datetime import datetime

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(REPO_ROOT, 'benchmarks', 'slurm_requeue_job.py')
sys.path.insert(0, os.path.join(REPO_ROOT, 'tests', 'support'))
from slurm_cluster import PREEMPTOR, SlurmCluster, ensure_installed, write_batch_script  # noqa: E402


def job_env():
    return dict(OMP_NUM_THREADS='1', PYTHONPATH=os.pathsep.join(
        filter(None, [REPO_ROOT, os.path.join(REPO_ROOT, 'benchmarks'), os.environ.get('PYTHONPATH')])))


def submit(cluster, out_dir, job_args):
    os.makedirs(out_dir)
    script = write_batch_script(os.path.join(out_dir, 'job.sh'), f'srun {sys.executable} {JOB} {out_dir} {job_args}',
                                '--ntasks=2', '--requeue', '--open-mode=append', f'--output={out_dir}/job.out')
    return cluster.sbatch(script, env=job_env())


def records(out_dir, pattern):
    return [json.load(open(path)) for path in glob.glob(os.path.join(out_dir, pattern))]


def steps(out_dir, restart=None):
    """Every (step index, end time) of every process (of the run after ``restart`` requeues, when given)."""
    found = []
    for path in glob.glob(os.path.join(out_dir, 'steps_*.txt')):
        start = json.load(open(path.replace('steps_', 'start_').replace('.txt', '.json')))
        if restart is not None and start['restart'] != restart:
            continue
        for line in open(path):
            index, when = line.split()
            found.append((int(index), float(when)))
    return found


def wait_for(condition, what, timeout=600):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f'timed out waiting for {what}')
        time.sleep(0.05)


def warn(cluster, job_id):
    """What ``#SBATCH --signal=USR1@N`` sends N seconds before the time limit."""
    cluster.run('scancel', '--signal=USR1', job_id)


def preempt(cluster, out_dir):
    """Submit a job that needs the whole node in the partition that preempts the others; its job id."""
    script = write_batch_script(os.path.join(out_dir, 'preemptor.sh'), 'true', f'--partition={PREEMPTOR}',
                                '--exclusive', f'--output={out_dir}/preemptor.out')
    return cluster.sbatch(script)


def interrupted_run(cluster, out_dir, job_args, interrupt, signal_after):
    job_id = submit(cluster, out_dir, job_args)
    wait_for(lambda: len(records(out_dir, 'start_*.json')) == 2, 'the first training step')
    time.sleep(signal_after)
    signalled = time.time()
    preemptor = interrupt(job_id)       # the preempting job's id, or None
    fields = cluster.wait_for(job_id, lambda f: f['JobState'] == 'PENDING' and f.get('Restarts') == '1',
                              'the requeue', timeout=300)
    pending = time.time()
    if preemptor is not None:
        cluster.wait_until_finished(preemptor, timeout=300)
    hold = datetime.fromisoformat(fields['StartTime']).timestamp() - pending
    cluster.run('scontrol', 'update', f'jobid={job_id}', 'StartTime=now')
    released = time.time()
    job = cluster.wait_until_finished(job_id, timeout=600)
    if job['JobState'] != 'COMPLETED':
        raise RuntimeError(f'job {job_id} ended {job["JobState"]} ({job}):\n'
                           f'{open(os.path.join(out_dir, "job.out")).read()}\n{cluster.logs()}')
    [checkpoint] = glob.glob(os.path.join(out_dir, 'exp', '*', '*', 'checkpoint_model', '*_ITER*.pth'))
    stop_step = int(re.search(r'_ITER(\d+)\.pth$', checkpoint).group(1))
    second = [s for s in records(out_dir, 'start_*.json') if s['restart'] == 1]
    before_signal = [index for index, when in steps(out_dir) if when <= signalled]
    return {'job': job_id, 'stop_step': stop_step, 'steps_after_signal': stop_step - max(before_signal),
            'to_checkpoint': os.path.getmtime(checkpoint) - signalled, 'to_pending': pending - signalled,
            'hold': hold, 'to_script': max(s['script_started'] for s in second) - released,
            'to_imports': max(s['imports_done'] for s in second) - released,
            'to_first_step': max(s['first_step_end'] for s in second) - released,
            # trained by the first run after the step its checkpoint holds: trained again by the second
            'lost': len({i for i, _ in steps(out_dir, restart=0) if i > stop_step}),
            'resumed_at': min(s['first_step'] for s in second),
            'final': torch.load(os.path.join(out_dir, 'final.pt'))['weights']}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--signal-after', type=float, default=3.0, help='seconds after the first training step')
    parser.add_argument('--epochs', type=int, default=4)
    parser.add_argument('--steps-per-epoch', type=int, default=500)
    parser.add_argument('--width', type=int, default=256)
    parser.add_argument('--batch-size', type=int, default=32)
    args = parser.parse_args()
    job_args = (f'--epochs {args.epochs} --steps-per-epoch {args.steps_per_epoch} --width {args.width} '
                f'--batch-size {args.batch_size}')
    ensure_installed()
    folder = tempfile.mkdtemp(prefix='slurm_requeue_')
    cluster = SlurmCluster(os.path.join(folder, 'cluster'))
    try:
        cluster.start()
        reference_dir = os.path.join(folder, 'uninterrupted')
        job_id = submit(cluster, reference_dir, job_args)
        cluster.wait_until_finished(job_id, timeout=600)
        reference = torch.load(os.path.join(reference_dir, 'final.pt'))
        reference_steps = sorted(steps(reference_dir))
        step_ms = (reference_steps[-1][1] - reference_steps[0][1]) / (reference_steps[-1][0] or 1) * 1e3
        runs = {'time limit (SIGUSR1, the job requeues itself)': interrupted_run(
                    cluster, os.path.join(folder, 'warning'), job_args,
                    lambda job: warn(cluster, job), args.signal_after),
                'preemption (a job of higher priority; SIGTERM)': interrupted_run(
                    cluster, os.path.join(folder, 'preemption'), job_args,
                    lambda job: preempt(cluster, os.path.join(folder, 'preemption')), args.signal_after)}
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)

    total = args.epochs * args.steps_per_epoch
    print(f'job: MLP 64-{args.width}-{args.width}-1, batch {args.batch_size} per task, 2 srun tasks on CPU (gloo, 1 '
          f'thread each), {total} steps at {step_ms:.1f} ms; ModelCheckpoint per epoch, the default '
          f'PreemptionCheckpoint (stop_within_s=1.0); torch {torch.__version__}')
    for name, run in runs.items():
        identical = all(torch.equal(reference['weights'][k], run['final'][k]) for k in reference['weights'])
        print(f'{name}:')
        print(f'  stopped after step {run["stop_step"]}, {run["steps_after_signal"]} steps after the signal; '
              f'signal -> checkpoint written {run["to_checkpoint"]:.2f} s, -> job pending again '
              f'{run["to_pending"]:.2f} s')
        print(f'  SLURM\'s hold of the requeued job: {run["hold"]:.0f} s; after the release: processes running the '
              f'script {run["to_script"]:.2f} s, imports done {run["to_imports"]:.2f} s, first step '
              f'{run["to_first_step"]:.2f} s (resumed at step {run["resumed_at"]})')
        print(f'  steps lost: {run["lost"]}; final weights identical to the uninterrupted run: '
              f'{"yes" if identical else "NO"}')


if __name__ == '__main__':
    main()
