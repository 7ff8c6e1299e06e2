"""SLURM, against a real one-node cluster (tests/support/slurm_cluster.py): the tasks ``srun`` starts in a batch job
train as one group, and a job stopped by the time-limit warning (SIGUSR1) or requeued by the scheduler (SIGTERM)
continues in its requeued run and ends with the uninterrupted run's weights, every sample once per epoch.

The batch jobs run tests/distributed/ddp_scripts/slurm_fit.py with 2 tasks on CPU (gloo). One uninterrupted job is the
reference of every interrupted one.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from aitoolbox_like import AbstractCallback
from aitoolbox_like.distributed import slurm
from aitoolbox_like.callbacks.basic import Timer
from aitoolbox_like.callbacks.preemption import find_preemption_callback
from aitoolbox_like.checkpoint import load_checkpoint
from aitoolbox_like.distributed import find_free_port
from aitoolbox_like.tracking import TrainLoopCheckpoint
from helpers import MLP, loaders
from slurm_cluster import PREEMPTOR, submit_and_wait, write_batch_script

# One slurm at a time, in one pytest-xdist worker (its set-up is paid once, and two would share 2 cores).
pytestmark = pytest.mark.xdist_group('slurm')

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / 'tests' / 'distributed' / 'ddp_scripts' / 'slurm_fit.py'
SAMPLES, EPOCHS = 640, 3
JOB_TIMEOUT_S = 240


def _job_env():
    return dict(OMP_NUM_THREADS='1',
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get('PYTHONPATH')])))


def _batch_script(out_dir, *directives, launcher='srun', args=''):
    return write_batch_script(out_dir / 'job.sh', f'{launcher} {sys.executable} {SCRIPT} {out_dir} {args}',
                              '--ntasks=2', f'--output={out_dir}/job.out', '--open-mode=append', *directives)


def _output(out_dir):
    path = Path(out_dir) / 'job.out'
    return path.read_text(errors='replace') if path.exists() else '(no output)'


def _failure(cluster, job, out_dir):
    """What to read when a job did not end as expected: its fields, its output and the daemons' logs."""
    return f'job: {job}\n--- job output\n{_output(out_dir)}\n{cluster.logs()}'


def _records(out_dir):
    """Every trained batch of every process, as recorded by slurm_fit.py."""
    return [json.loads(line) for path in Path(out_dir).glob('samples_*.jsonl')
            for line in path.read_text().splitlines()]


def _final(out_dir):
    return torch.load(Path(out_dir) / 'final.pt')


def _assert_same_run(expected_dir, got_dir):
    expected, got = _final(expected_dir), _final(got_dir)
    assert got['world_size'] == expected['world_size'] == 2
    assert expected['weights'].keys() == got['weights'].keys()
    assert all(torch.equal(expected['weights'][k], got['weights'][k]) for k in expected['weights'])
    assert got['history'] == expected['history']


def _assert_every_sample_once_per_epoch(records):
    for epoch in range(EPOCHS):
        trained = sorted(s for r in records if r['epoch'] == epoch for s in r['samples'])
        assert trained == list(range(SAMPLES)), f'epoch {epoch}'


def _wait_until_waiting(cluster, job_id, out_dir, run=0):
    """Until every rank of the job's run ``run`` waits for a signal in the middle of an epoch (slurm_fit.py)."""
    paths = [out_dir / f'waiting_run{run}_rank{rank}' for rank in (0, 1)]
    cluster.wait_for(job_id, lambda fields: all(p.exists() for p in paths) or fields['JobState'] not in
                     ('PENDING', 'RUNNING'), f'every rank of run {run} to reach the batch where the signal is sent')
    assert all(p.exists() for p in paths), f'job {job_id} ended early:\n{_output(out_dir)}'


def _interrupted_job(cluster, out_dir, interrupt, *directives):
    """Submit a job that waits after batch 3 of epoch 1 in its first run; ``interrupt(job_id)`` once every rank is
    there. The job id."""
    job_id = cluster.sbatch(_batch_script(out_dir, *directives, args='--wait-for-signal 0 1 3'), env=_job_env())
    _wait_until_waiting(cluster, job_id, out_dir)
    interrupt(job_id)
    return job_id


def _assert_continued_mid_epoch_exactly(reference, out_dir, stopped_in=(1,)):
    """Run r of the job stopped in the middle of epoch ``stopped_in[r]``, and the runs together trained the
    uninterrupted run, every sample once per epoch."""
    records = _records(out_dir)
    first_epoch = 0
    for run, epoch in enumerate(list(stopped_in) + [EPOCHS - 1]):
        # Both runs around a stop trained some of its epoch's batches.
        assert {r['epoch'] for r in records if r['run'] == run} == set(range(first_epoch, epoch + 1)), run
        first_epoch = epoch
    assert {(r['rank'], r['world_size']) for r in records} == {(0, 2), (1, 2)}
    _assert_every_sample_once_per_epoch(records)        # so no step was trained twice, none skipped
    _assert_same_run(reference, out_dir)


@pytest.fixture(scope='module')
def runs(slurm_cluster, tmp_path_factory):
    """slurm_fit.py uninterrupted, trained by an sbatch job of 2 srun tasks (the reference of every interrupted job)
    and, at the same time, by 2 processes under torchrun: ``{'sbatch': folder, 'torchrun': folder}``."""
    folders = {name: tmp_path_factory.mktemp(name) for name in ('sbatch', 'torchrun')}
    job_id = slurm_cluster.sbatch(_batch_script(folders['sbatch']), env=_job_env())
    command = [sys.executable, '-m', 'torch.distributed.run', '--nnodes=1', '--nproc_per_node=2',
               '--rdzv-backend=c10d', f'--rdzv-endpoint=127.0.0.1:{find_free_port()}', str(SCRIPT),
               str(folders['torchrun'])]
    env = {k: v for k, v in os.environ.items() if not k.startswith('SLURM_')}
    done = subprocess.run(command, env=dict(env, **_job_env()), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    job = slurm_cluster.wait_until_finished(job_id, JOB_TIMEOUT_S)
    assert job['JobState'] == 'COMPLETED', _failure(slurm_cluster, job, folders['sbatch'])
    return folders


@pytest.fixture
def uninterrupted(runs):
    return runs['sbatch']


@pytest.mark.timeout(600)
def test_the_srun_tasks_of_a_batch_job_train_as_one_group_equal_to_the_same_script_under_torchrun(runs):
    uninterrupted = runs['sbatch']
    _assert_same_run(runs['torchrun'], uninterrupted)
    records = _records(uninterrupted)
    assert {(r['rank'], r['world_size']) for r in records} == {(0, 2), (1, 2)}
    _assert_every_sample_once_per_epoch(records)
    # The group met on the job's first node, at the port derived from the job id.
    [job_id] = re.findall(r'SLURM job (\d+): 2 tasks train as one group', _output(uninterrupted))
    assert f'rendezvous at localhost:{slurm.master_port_for_job(job_id)}' in _output(uninterrupted)


@pytest.mark.timeout(600)
def test_the_time_limit_warning_checkpoints_requeues_the_job_and_the_requeued_job_continues_exactly(
        slurm_cluster, uninterrupted, tmp_path):
    # What `#SBATCH --signal=USR1@90` sends 90 s before the time limit.
    job_id = _interrupted_job(slurm_cluster, tmp_path, lambda job: slurm_cluster.run('scancel', '--signal=USR1', job),
                              '--requeue')
    slurm_cluster.release(job_id)          # the job requeued itself
    job = slurm_cluster.wait_until_finished(job_id, JOB_TIMEOUT_S)
    output = _output(tmp_path)
    assert job['JobState'] == 'COMPLETED' and job['Restarts'] == '1', _failure(slurm_cluster, job, tmp_path)
    assert 'training stopped on SIGUSR1 (the time-limit warning), the checkpoint is saved and the job is requeued' \
        in output
    _assert_continued_mid_epoch_exactly(uninterrupted, tmp_path)


def _tasks_exited_143(output):
    """How many tasks srun reports as exited with status 143 ('task 1: ...', 'tasks 0-1: ...')."""
    count = 0
    for spec in re.findall(r'tasks? ([\d,-]+): Exited with exit code 143', output):
        for part in spec.split(','):
            first, _, last = part.partition('-')
            count += int(last or first) - int(first) + 1
    return count


@pytest.mark.timeout(600)
def test_a_job_preempted_then_requeued_by_scontrol_mid_epoch_checkpoints_on_sigterm_and_continues_exactly(
        slurm_cluster, uninterrupted, tmp_path):
    """Run 0 is preempted by a job of a partition of higher priority (SLURM sends SIGTERM twice within
    milliseconds, SIGKILL after KillWait, and requeues the job); run 1 is requeued with `scontrol requeue` (one
    SIGTERM); run 2 finishes."""
    job_id = slurm_cluster.sbatch(_batch_script(tmp_path, '--requeue', args='--wait-for-signal 0 1 3 '
                                                '--wait-for-signal 1 2 5'), env=_job_env())
    _wait_until_waiting(slurm_cluster, job_id, tmp_path, run=0)
    preemptor = slurm_cluster.sbatch(write_batch_script(tmp_path / 'preemptor.sh', 'true', f'--partition={PREEMPTOR}',
                                                        '--exclusive', f'--output={tmp_path}/preemptor.out'))
    slurm_cluster.wait_until_finished(preemptor, JOB_TIMEOUT_S)
    slurm_cluster.release(job_id, restarts=1)
    _wait_until_waiting(slurm_cluster, job_id, tmp_path, run=1)
    slurm_cluster.run('scontrol', 'requeue', job_id)
    slurm_cluster.release(job_id, restarts=2)
    job = slurm_cluster.wait_until_finished(job_id, JOB_TIMEOUT_S)

    output = _output(tmp_path)
    assert job['JobState'] == 'COMPLETED' and job['Restarts'] == '2', _failure(slurm_cluster, job, tmp_path)
    assert re.search(rf'JOB {job_id} ON \S+ CANCELLED AT \S+ DUE TO PREEMPTION', output)
    assert re.search(rf'JOB {job_id} ON \S+ CANCELLED AT \S+ DUE TO JOB REQUEUE', output)
    assert output.count('training stopped on SIGTERM and the checkpoint is saved') == 2
    # Every rank exited at once both times, not killed by SLURM after KillWait.
    assert _tasks_exited_143(output) == 4, output      # tasks 0 and 1, twice (srun groups tasks ending together)
    _assert_continued_mid_epoch_exactly(uninterrupted, tmp_path, stopped_in=(1, 2))


@pytest.mark.timeout(600)
def test_a_job_that_cannot_be_requeued_fails_with_the_command_that_continues_it(
        slurm_cluster, uninterrupted, tmp_path):
    job_id = _interrupted_job(slurm_cluster, tmp_path, lambda job: slurm_cluster.run('scancel', '--signal=USR1', job),
                              '--no-requeue')
    job = slurm_cluster.wait_until_finished(job_id, JOB_TIMEOUT_S)
    output = _output(tmp_path)
    assert job['JobState'] == 'FAILED' and job['Restarts'] == '0', _failure(slurm_cluster, job, tmp_path)
    assert 'the job could not be requeued' in output
    [command] = re.findall(r'submit it again: `([^`]+)`', output)

    resubmitted = subprocess.run(command, shell=True, env=dict(slurm_cluster.env, **_job_env()), capture_output=True,
                                 text=True, timeout=60)
    [new_job] = re.findall(r'Submitted batch job (\d+)', resubmitted.stdout)
    job = slurm_cluster.wait_until_finished(new_job, JOB_TIMEOUT_S)
    assert job['JobState'] == 'COMPLETED', _failure(slurm_cluster, job, tmp_path)
    _assert_every_sample_once_per_epoch(_records(tmp_path))
    _assert_same_run(uninterrupted, tmp_path)


DEADLINE_SCRIPT = REPO_ROOT / 'tests' / 'distributed' / 'ddp_scripts' / 'stop_deadline_fit.py'
# A large model's step (the script's model sleeps in forward in the job's first run), and the time limit simulated
# after the warning: the job must have checkpointed and requeued itself by then. Stops agreed on every 10 steps and
# read one agreement later (before issue 40) came 10 to 20 steps after the signal: 20 to 40 s here.
SLOW_STEP_S, LIMIT_AFTER_WARNING_S = 2.0, 12.0


def _deadline_records(out_dir, name, run=0):
    """stop_deadline_fit.py's files of ``run``: ``name`` 'stopped' (a dict per rank) or 'steps' (a list per rank)."""
    if name == 'stopped':
        return [json.loads((out_dir / f'stopped_run{run}_rank{r}.json').read_text()) for r in (0, 1)]
    return [[json.loads(line) for line in (out_dir / f'steps_run{run}_rank{r}.jsonl').read_text().splitlines()]
            for r in (0, 1)]


@pytest.mark.timeout(300)
def test_with_slow_steps_the_time_limit_warning_checkpoints_and_requeues_the_job_before_the_limit(
        slurm_cluster, tmp_path):
    """Steps of 2 s on 2 srun tasks; SIGUSR1 (what `#SBATCH --signal=USR1@90` sends) in the middle of batch 1; then
    the time limit, simulated: unless the job has checkpointed and requeued itself within 12 s, it is cancelled and
    the test fails. The requeued job continues from the checkpoint."""
    script = write_batch_script(tmp_path / 'job.sh', f'srun {sys.executable} {DEADLINE_SCRIPT} {tmp_path} '
                                f'--step-s {SLOW_STEP_S} --mark-at 1', '--ntasks=2', '--requeue',
                                f'--output={tmp_path}/job.out', '--open-mode=append')
    job_id = slurm_cluster.sbatch(script, env=_job_env())
    begun = [tmp_path / f'begun_run0_rank{rank}' for rank in (0, 1)]
    slurm_cluster.wait_for(job_id, lambda fields: all(p.exists() for p in begun) or fields['JobState'] not in
                           ('PENDING', 'RUNNING'), 'every rank to begin batch 1')
    assert all(p.exists() for p in begun), f'job {job_id} ended early:\n{_output(tmp_path)}'
    time.sleep(0.3)                                     # in the middle of the step
    warned = time.time()
    slurm_cluster.run('scancel', '--signal=USR1', job_id)
    try:
        slurm_cluster.wait_for(job_id, lambda fields: int(fields.get('Restarts', 0)) >= 1,
                               'the job to checkpoint and requeue itself',
                               timeout=LIMIT_AFTER_WARNING_S - (time.time() - warned))
    except AssertionError as late:
        slurm_cluster.run('scancel', job_id, check=False)           # the time limit
        raise AssertionError(f'{late}: the time limit ({LIMIT_AFTER_WARNING_S} s after the warning) came first\n'
                             f'{_output(tmp_path)}') from None
    requeued_after = time.time() - warned

    stopped, steps = _deadline_records(tmp_path, 'stopped'), _deadline_records(tmp_path, 'steps')
    last = stopped[0]['last']
    assert stopped[1]['last'] == last and last in (1, 2), stopped        # the signal's step (or the next one)
    assert [s['stop_reason'] for s in stopped] == ['received SIGUSR1'] * 2, stopped
    assert stopped[0]['checkpoint_path'].endswith(f'_E0_ITER{last}.pth'), stopped
    assert load_checkpoint(stopped[0]['checkpoint_path'])['data_position']['batches_done'] == last + 1
    checkpoint_started = steps[0][-1]['time'] - warned            # the end of the last step: the checkpoint follows
    assert checkpoint_started < requeued_after < LIMIT_AFTER_WARNING_S

    slurm_cluster.release(job_id)                                   # the requeued job continues
    job = slurm_cluster.wait_until_finished(job_id, JOB_TIMEOUT_S)
    assert job['JobState'] == 'COMPLETED' and job['Restarts'] == '1', _failure(slurm_cluster, job, tmp_path)
    assert 'training stopped on SIGUSR1 (the time-limit warning), the checkpoint is saved and the job is requeued' \
        in _output(tmp_path)
    continued = _deadline_records(tmp_path, 'steps', run=1)
    assert [[s['idx'] for s in rank] for rank in continued] == [list(range(last + 1, 8))] * 2
    trained = sorted(sample for run in (steps, continued) for rank in run for s in rank for sample in s['samples'])
    assert trained == list(range(64))                               # every sample of the epoch once
    print(f'SIGUSR1 -> checkpoint started {checkpoint_started:.2f} s, job requeued {requeued_after:.2f} s '
          f'(steps of {SLOW_STEP_S} s)')


@pytest.mark.timeout(300)
def test_the_time_limit_warning_during_a_validation_pass_abandons_it_checkpoints_and_requeues_the_job(
        slurm_cluster, tmp_path):
    """2 srun tasks; the validation pass of epoch 0 takes 8 s (4 batches of 2 s per task); SIGUSR1 1 s into it. The
    tasks abandon the pass at the next batch they agree on, checkpoint after the epoch's last batch and requeue the
    job before the simulated time limit; the requeued job evaluates epoch 0 again and trains epoch 1."""
    script = write_batch_script(tmp_path / 'job.sh', f'srun {sys.executable} {DEADLINE_SCRIPT} {tmp_path} '
                                f'--epochs 2 --slow-validation-epoch 0 --phase-s 8', '--ntasks=2', '--requeue',
                                f'--output={tmp_path}/job.out', '--open-mode=append')
    job_id = slurm_cluster.sbatch(script, env=_job_env())
    began = [tmp_path / f'phase_run0_rank{rank}' for rank in (0, 1)]
    slurm_cluster.wait_for(job_id, lambda fields: all(p.exists() for p in began) or fields['JobState'] not in
                           ('PENDING', 'RUNNING'), 'every rank to begin the validation pass')
    assert all(p.exists() for p in began), f'job {job_id} ended early:\n{_output(tmp_path)}'
    time.sleep(1.0)
    warned = time.time()
    slurm_cluster.run('scancel', '--signal=USR1', job_id)
    try:
        slurm_cluster.wait_for(job_id, lambda fields: int(fields.get('Restarts', 0)) >= 1,
                               'the job to checkpoint and requeue itself',
                               timeout=LIMIT_AFTER_WARNING_S - (time.time() - warned))
    except AssertionError as late:
        slurm_cluster.run('scancel', job_id, check=False)           # the time limit
        raise AssertionError(f'{late}: the time limit ({LIMIT_AFTER_WARNING_S} s after the warning) came first\n'
                             f'{_output(tmp_path)}') from None
    stopped = _deadline_records(tmp_path, 'stopped')
    assert [s['last'] for s in stopped] == [7, 7] and [s['val_loss'] for s in stopped] == [[], []], stopped
    assert [s['stop_reason'] for s in stopped] == ['received SIGUSR1'] * 2, stopped
    assert stopped[0]['checkpoint_path'].endswith('_E0_ITER7.pth'), stopped
    assert 'the evaluation was abandoned' in _output(tmp_path)

    slurm_cluster.release(job_id)                                   # the requeued job continues
    job = slurm_cluster.wait_until_finished(job_id, JOB_TIMEOUT_S)
    assert job['JobState'] == 'COMPLETED' and job['Restarts'] == '1', _failure(slurm_cluster, job, tmp_path)
    finished = _deadline_records(tmp_path, 'stopped', run=1)
    assert [len(s['val_loss']) for s in finished] == [2, 2] and finished[0]['last'] == 15, finished


def test_a_job_of_two_tasks_that_runs_the_script_without_srun_fails_before_training_naming_srun(
        slurm_cluster, tmp_path):
    job = submit_and_wait(slurm_cluster, _batch_script(tmp_path, launcher=''), env=_job_env(), timeout=JOB_TIMEOUT_S)
    output = _output(tmp_path)
    assert job['JobState'] == 'FAILED', _failure(slurm_cluster, job, tmp_path)
    assert 'SlurmLaunchError: this SLURM job has 2 tasks (SLURM_NTASKS=2), but the script runs in the batch ' \
           'script itself' in output and '`srun python train.py`' in output
    assert not _records(tmp_path)


def test_the_example_batch_script_trains_its_srun_tasks_as_one_group(slurm_cluster, tmp_path):
    example = REPO_ROOT / 'examples' / 'slurm' / 'train_ddp.sbatch'
    # The example asks for 2 nodes of 4 GPUs; this cluster has one node and no GPU. `python` is this interpreter.
    job = submit_and_wait(slurm_cluster, example, '--nodes=1', '--ntasks-per-node=2', '--gpus-per-node=0',
                          '--cpus-per-task=1', f'--chdir={REPO_ROOT}', f'--output={tmp_path}/job.out',
                          args=['--epochs', '2', '--output-dir', str(tmp_path / 'results')], timeout=JOB_TIMEOUT_S,
                          env=dict(_job_env(), PATH=os.pathsep.join([os.path.dirname(sys.executable),
                                                                     os.environ['PATH']])))
    output = _output(tmp_path)
    assert job['JobState'] == 'COMPLETED', _failure(slurm_cluster, job, tmp_path)
    assert re.search(r'SLURM job \d+: 2 tasks train as one group', output)
    [experiment] = (tmp_path / 'results' / 'digits_slurm').iterdir()
    assert list((experiment / 'checkpoint_model').glob('*_E1.pth'))
    accuracy = [float(a) for a in re.findall(r'^val_Accuracy: ([0-9.]+)', output, re.M)]
    assert len(accuracy) == 2 and accuracy[-1] > 0.8, output


def test_the_batch_scripts_shown_in_the_docs_are_the_example_files():
    docs = (REPO_ROOT / 'docs' / 'distributed.md').read_text()
    section = docs[docs.index('\n## SLURM\n'):docs.index('\n## Ray Train\n')]
    examples = {line for name in ('train_ddp.sbatch', 'tune_array.sbatch')
                for line in (REPO_ROOT / 'examples' / 'slurm' / name).read_text().splitlines()}
    shown = [block for block in re.findall(r'```bash\n(.*?)```', section, re.S)
             if re.search('^#SBATCH', block, re.M)]
    assert len(shown) == 2
    for block in shown:
        assert [line for line in block.splitlines() if line and line not in examples] == []


# ---------------------------------------------------------------------------------------------- one process


class SignalSelfAt(AbstractCallback):
    """Sends a signal to this process at the end of batch T (the handler runs in this main thread)."""

    def __init__(self, batch_idx, signum):
        super().__init__('signal self', execution_order=0)
        self.batch_idx, self.signum = batch_idx, signum
        self.handler_during_fit = None

    def on_batch_end(self):
        if self.train_loop_obj.total_iteration_idx == self.batch_idx:
            self.handler_during_fit = signal.getsignal(signal.SIGUSR1)
            os.kill(os.getpid(), self.signum)


def _checkpoint_loop(root):
    torch.manual_seed(0)
    model = MLP()
    train, val, _ = loaders()
    return TrainLoopCheckpoint(model, train, val, None, torch.optim.SGD(model.parameters(), lr=0.1),
                               torch.nn.CrossEntropyLoss(), 'proj', 'run', str(root), {}, cloud_save_mode='local',
                               progress_bar=False)


def test_in_a_slurm_job_a_signal_ends_the_process_after_its_checkpoint_and_a_stop_without_signal_returns(
        tmp_path, monkeypatch):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)
    monkeypatch.setenv('SLURM_JOB_ID', '4242')          # what SLURM sets in every process of a job
    loop, stop = _checkpoint_loop(tmp_path / 'a'), SignalSelfAt(3, signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as exited:
            loop.fit(num_epochs=2, callbacks=[stop])
    finally:
        signal.signal(signal.SIGTERM, before[0])       # ignored while the process leaves
    assert exited.value.code == 128 + signal.SIGTERM
    preemption = find_preemption_callback(loop)
    assert preemption.checkpoint_path.endswith('_ITER3.pth') and os.path.exists(preemption.checkpoint_path)
    assert stop.handler_during_fit == preemption._handle_signal     # SLURM's warning signal is handled too
    assert signal.getsignal(signal.SIGUSR1) == before[1]

    timed = _checkpoint_loop(tmp_path / 'b')
    timed.fit(num_epochs=2, callbacks=[Timer(max_duration_s=1e-6)])      # returns: no signal, nothing to end
    assert find_preemption_callback(timed).stop_reason is not None and timed.epochs_completed < 2
    assert signal.getsignal(signal.SIGTERM) == before[0]


# ---------------------------------------------------------------------------------------------- the parts


def test_host_lists_expand_as_scontrol_show_hostnames_does(slurm_cluster):
    for hostlist in ('gpu[01-04,07]', 'node1,node[3-5],gpu-[1,3]', 'r[1-2]n[08-10]', 'login', 'a[9-11],b'):
        shown = slurm_cluster.run('scontrol', 'show', 'hostnames', hostlist).stdout.split()
        assert slurm.expand_hostlist(hostlist) == shown, hostlist


def test_tasks_per_node_expand_the_repeat_counts():
    assert slurm.expand_tasks_per_node('2(x3),1') == [2, 2, 2, 1]
    assert slurm.expand_tasks_per_node('4') == [4]


def _step_env(**extra):
    env = dict(SLURM_JOB_ID='7311', SLURM_STEP_ID='0', SLURM_STEP_NUM_TASKS='8', SLURM_NTASKS='8',
               SLURM_PROCID='5', SLURM_LOCALID='1', SLURM_STEP_NODELIST='gpu[07-08]', SLURMD_NODENAME='gpu08',
               SLURM_STEP_TASKS_PER_NODE='4(x2)')
    env.update(extra)
    return env


def test_a_task_of_a_step_of_several_tasks_gets_its_rank_and_the_rendezvous_of_the_first_node():
    env = _step_env()
    task = slurm.join_step_as_rank(env)
    assert (task.rank, task.world_size, task.local_rank, task.local_world_size) == (5, 8, 1, 4)
    assert env['RANK'] == '5' and env['WORLD_SIZE'] == '8' and env['LOCAL_RANK'] == '1'
    assert env['MASTER_ADDR'] == 'gpu07' and env['MASTER_PORT'] == str(slurm.master_port_for_job('7311'))
    # Set by the user: kept.
    assert slurm.step_task(_step_env(MASTER_PORT='29999', MASTER_ADDR='gpu07-ib')).master_port == '29999'
    assert slurm.step_task(_step_env(MASTER_ADDR='gpu07-ib')).master_addr == 'gpu07-ib'
    # A step of one task, or no SLURM at all: not a group (fit trains as it would without SLURM).
    assert slurm.step_task(_step_env(SLURM_STEP_NUM_TASKS='1', SLURM_NTASKS='1')) is None
    assert slurm.step_task({}) is None


def test_jobs_running_together_get_different_ports():
    ports = {slurm.master_port_for_job(str(job)) for job in range(1000, 1100)}
    assert len(ports) == 100 and all(12000 <= p < 32768 for p in ports)


def test_more_tasks_on_a_node_than_gpus_is_refused_naming_the_fix():
    task = slurm.step_task(_step_env())              # 4 tasks on this node, local rank 1
    assert slurm.task_device(task, device_count=4) == 1
    assert slurm.task_device(task, device_count=8) == 1
    assert slurm.task_device(task, device_count=1) == 0      # one GPU per task (--gpus-per-task=1)
    with pytest.raises(slurm.SlurmLaunchError, match=r'4 tasks .* 2 GPUs visible: .*--ntasks-per-node=2'):
        slurm.task_device(task, device_count=2)


TUNE_TRIALS = 2
# A trial's epochs (~0.35 s each here): the time-limit warning must reach both tasks inside their first trial, after
# its first epoch; with 8 the window was ~2.5 s, which a loaded machine's polling and scancel sometimes missed (a task
# then finished its trial and the study's last one before the warning, and never requeued).
TUNE_EPOCHS = 20


def _tune_array_script(out_dir):
    """The example's job array in small: 2 tasks run the same search command on one shared study."""
    console = Path(sys.executable).parent / 'aitoolbox-like'
    recipe = REPO_ROOT / 'examples' / 'recipes' / 'digits.yaml'
    return write_batch_script(
        out_dir / 'tune.sh',
        f"srun {console} tune {recipe} fit.num_epochs={TUNE_EPOCHS} vars.output_dir={out_dir / 'runs'} --trials {TUNE_TRIALS} "
        f"--param 'optimizer.lr=loguniform(1e-3,1e-2)' --monitor val_loss --mode min "
        f"--storage sqlite:///{out_dir / 'study.db'} --output {out_dir / 'results'}",
        '--array=0-1', '--ntasks=1', '--requeue', f'--output={out_dir}/tune-%a.out', '--open-mode=append')


@pytest.mark.timeout(600)
def test_a_search_run_by_a_job_array_shares_one_study_and_a_task_requeued_mid_trial_leaves_it_fail(
        slurm_cluster, tmp_path):
    import optuna

    array_id = slurm_cluster.sbatch(_tune_array_script(tmp_path), env=_job_env())
    # Both tasks are in their first trial, past its first epoch (a trial's history file has a row per epoch).
    slurm_cluster.wait_for(array_id, lambda fields: len(list(tmp_path.glob('runs/digits/*/results/results.csv'))) >= 2
                           or fields['JobState'] not in ('PENDING', 'RUNNING'), 'both tasks in their first trial')
    tasks = {r['JobId'] for r in slurm_cluster.records(array_id)}
    assert len(tasks) == 2, slurm_cluster.records(array_id)
    slurm_cluster.run('scancel', '--signal=USR1', array_id)       # the time-limit warning, to every task
    for task in tasks:
        slurm_cluster.release(task)                                 # each requeued itself
    records = slurm_cluster.wait_until_array_finished(array_id, JOB_TIMEOUT_S)
    outputs = '\n'.join(p.read_text(errors='replace') for p in tmp_path.glob('tune-*.out'))
    assert [(r['JobState'], r['Restarts']) for r in records] == [('COMPLETED', '1')] * 2, \
        f'{records}\n{outputs}\n{slurm_cluster.logs()}'

    study = optuna.load_study(study_name='digits', storage=f'sqlite:///{tmp_path / "study.db"}')
    states = sorted(t.state.name for t in study.trials)
    # The two interrupted trials are FAIL, not counted (no error of their own); the study has its 2 trials besides.
    assert states == ['COMPLETE'] * TUNE_TRIALS + ['FAIL'] * 2, states
    assert all('error' not in t.user_attrs for t in study.trials if t.state.name == 'FAIL')
    # Each trial trained once, in a folder of its own; the interrupted ones left their checkpoint and their log.
    folders = [t.user_attrs.get('experiment_dir') for t in study.trials if t.state.name == 'COMPLETE']
    assert len(set(folders)) == TUNE_TRIALS and len(list(tmp_path.glob('runs/digits/*'))) == TUNE_TRIALS + 2
    interrupted_logs = [f.read_text() for f in tmp_path.glob('runs/digits/*/train.log') if str(f.parent) not in folders]
    assert len(interrupted_logs) == 2 and all(
        'training stopped on SIGUSR1 (the time-limit warning), the checkpoint is saved and the job is requeued' in log
        for log in interrupted_logs), interrupted_logs
