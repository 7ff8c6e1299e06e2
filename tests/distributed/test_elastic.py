"""Restartable runs: fit(resume_from='auto'), and elastic torchrun killing workers and machines on purpose.

The torchrun tests start the script users are told to write (ddp_scripts/elastic_fit.py: a checkpoint callback and
resume_from='auto') under torchrun's c10d rendezvous with the launcher's store shared with the workers (torch's
default, the set-up in which restarts used to fail: pytorch/pytorch#135712), and compare with uninterrupted runs.
"""
import glob
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TrainLoop, TTBasicModel
from aitoolbox_like.callbacks.model_save import ModelCheckpoint
from aitoolbox_like.checkpoint import load_checkpoint
from aitoolbox_like.distributed import find_free_port

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO_ROOT, 'tests', 'distributed', 'ddp_scripts', 'elastic_fit.py')


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != 'TORCH_DISABLE_SHARE_RDZV_TCP_STORE'}
    env.update(OMP_NUM_THREADS='1', PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get('PYTHONPATH')])),
               **extra)
    return env


# torchrun itself (torch.distributed.run's main, as `python -m torch.distributed.run` runs it), started only once a
# line arrives on stdin: its imports are done by then, so two agents told to go within a second reach the rendezvous
# within a second, however long a loaded machine takes to import torch.
_TORCHRUN_ON_GO = ('import sys, torch.distributed.run as run; print("ready", flush=True); sys.stdin.readline(); '
                   'sys.argv[0] = run.__file__; run.main()')


def _torchrun(out_dir, *script_args, nnodes='1', nproc=2, port=None, rdzv_conf='', env=None, on_go=False):
    launcher = ['-c', _TORCHRUN_ON_GO] if on_go else ['-m', 'torch.distributed.run']
    command = [sys.executable, *launcher, f'--nnodes={nnodes}', f'--nproc_per_node={nproc}',
               '--rdzv-backend=c10d', f'--rdzv-endpoint=127.0.0.1:{port or find_free_port()}', '--rdzv-id=test',
               '--max-restarts=1'] + ([f'--rdzv-conf={rdzv_conf}'] if rdzv_conf else []) + [SCRIPT, str(out_dir)]
    process = subprocess.Popen(command + list(script_args), env=env or _env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, stdin=subprocess.PIPE if on_go else None, text=True)
    if on_go:
        assert process.stdout.readline() == 'ready\n'
    return process


def _go(process):
    process.stdin.write('go\n')
    process.stdin.flush()                   # communicate() closes stdin later


def _finish(process, timeout=150):
    output, _ = process.communicate(timeout=timeout)
    return process.returncode, output


def _records(out_dir):
    """Every trained batch, per process (file), in the order trained."""
    return {path: [json.loads(line) for line in open(path)]
            for path in glob.glob(os.path.join(out_dir, 'samples_*.jsonl'))}


@pytest.mark.system
@pytest.mark.timeout(300)
def test_a_worker_killed_mid_epoch_under_torchrun_restarts_and_ends_with_the_uninterrupted_weights(tmp_path):
    reference, killed = tmp_path / 'reference', tmp_path / 'killed'
    reference.mkdir(), killed.mkdir()
    code, output = _finish(_torchrun(reference, '--epochs', '2', '--no-record'))
    assert code == 0, output[-3000:]
    # Rank 1 dies after batch 3 of epoch 1 (global batch 9); the checkpoint after global batch 8 is the resume point.
    code, output = _finish(_torchrun(killed, '--epochs', '2', '--kill', 'worker', '--kill-at', '1', '3'))
    assert code == 0, output[-3000:]
    assert (killed / 'killed').read_text() == '9'          # it really died, and the restart finished the run

    expected, got = torch.load(reference / 'final.pt'), torch.load(killed / 'final.pt')
    assert all(torch.equal(expected['weights'][k], got['weights'][k]) for k in expected['weights'])
    # Each rank's running losses of the interrupted epoch came back (not rank 0's on both): the epoch's loss is
    # the uninterrupted one to the bit.
    assert got['history'] == expected['history']


def _wait_until_listening(port, process, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(('127.0.0.1', port), timeout=1).close()
            return
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline, f'nothing listens on port {port}'
            time.sleep(0.05)


@pytest.mark.system
@pytest.mark.timeout(300)
def test_a_machine_lost_for_good_the_other_finishes_alone_training_each_sample_of_the_epoch_once(tmp_path):
    """Two torchrun agents on localhost stand in for two machines (--nnodes=1:2, one process each). In epoch 1 the
    second machine dies for good (its agent and worker killed); the first re-forms the group alone and resumes the
    2-process checkpoint on 1 process."""
    port = find_free_port()
    # Round 0 must hold both machines: an agent arriving after the last call (2 s past the first) would only join in
    # a later round, and the run would test something else. Hence both agents import first and go together.
    conf = 'last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=2'
    first = _torchrun(tmp_path, '--epochs', '2', '--kill', 'agent', '--kill-at', '1', '3', nnodes='1:2', nproc=1,
                      port=port, rdzv_conf=conf, on_go=True)
    second = _torchrun(tmp_path, '--epochs', '2', '--kill', 'agent', '--kill-at', '1', '3', nnodes='1:2', nproc=1,
                       port=port, rdzv_conf=conf, env=_env(KILL_MY_AGENT='1'), on_go=True)
    _go(first)
    _wait_until_listening(port, first)      # the first agent hosts the rendezvous store
    _go(second)
    second_code, _ = _finish(second)
    code, output = _finish(first)
    assert second_code != 0 and code == 0, output[-3000:]
    assert torch.load(tmp_path / 'final.pt')['world_size'] == 1

    runs = _records(tmp_path)
    two_process = [r for records in runs.values() for r in records if r['world_size'] == 2]
    one_process = [r for records in runs.values() for r in records if r['world_size'] == 1]
    assert {r['rank'] for r in two_process} == {0, 1} and one_process
    # 96 samples, 8 per batch and process. The last checkpoint before the kill was taken after global batch 8,
    # i.e. 3 batches into epoch 1 on each of the 2 processes: 48 samples of the epoch's order.
    before = [s for r in two_process if r['epoch'] == 1 and r['iteration'] < 3 for s in r['samples']]
    after = [s for r in one_process if r['epoch'] == 1 for s in r['samples']]
    assert len(before) == 48 and len(after) == 48
    assert sorted(before + after) == list(range(96))       # every sample of the interrupted epoch exactly once
    # The resumed epoch continues the same order: the uninterrupted 2-process run would have trained `after` too.
    assert not {r['epoch'] for r in one_process} - {1}


DEADLINE_SCRIPT = os.path.join(REPO_ROOT, 'tests', 'distributed', 'ddp_scripts', 'stop_deadline_fit.py')
# A large model's step (the script's model sleeps in forward), and the SIGKILL simulated after the SIGTERM, well below
# torchrun's own 30 s: the checkpoint must be complete by then. Stops agreed on every 10 steps and read one agreement
# later (before issue 40) came 10 to 20 steps after the signal: 20 to 40 s here.
SLOW_STEP_S, KILL_AFTER_S = 2.0, 12.0


def _killed(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.system
@pytest.mark.timeout(180)
def test_with_slow_steps_sigterm_to_torchrun_checkpoints_every_rank_at_the_same_step_before_the_kill(tmp_path):
    """Steps of 2 s on 2 workers; SIGTERM to torchrun's agent (what Kubernetes or `docker stop` send to a container's
    first process; the agent passes it to its workers) in the middle of batch 1; SIGKILL to the agent and the
    workers 12 s later unless they are gone. The checkpoint is complete and loadable, both ranks stopped after the
    same batch."""
    command = [sys.executable, '-m', 'torch.distributed.run', '--nnodes=1', '--nproc_per_node=2',
               '--rdzv-backend=c10d', f'--rdzv-endpoint=127.0.0.1:{find_free_port()}', DEADLINE_SCRIPT,
               str(tmp_path), '--step-s', str(SLOW_STEP_S), '--mark-at', '1']
    agent = subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    begun = [tmp_path / f'begun_run0_rank{rank}' for rank in (0, 1)]
    deadline = time.monotonic() + 120
    while not all(path.exists() for path in begun) and agent.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = [json.loads(path.read_text())['pid'] for path in begun if path.exists()]
    if len(workers) < 2:
        agent.kill(), _killed(workers)
        pytest.fail(f'the workers never began batch 1: {agent.communicate()[0][-3000:]}')
    time.sleep(0.3)                                     # in the middle of the step
    warned = time.time()
    agent.send_signal(signal.SIGTERM)
    try:
        output = agent.communicate(timeout=KILL_AFTER_S)[0]
        killed = False
    except subprocess.TimeoutExpired:
        agent.kill()                                    # the simulated SIGKILL: the agent, then its workers
        _killed(workers)
        output, killed = agent.communicate()[0], True
    ended_after = time.time() - warned

    stopped = [tmp_path / f'stopped_run0_rank{rank}.json' for rank in (0, 1)]
    assert not killed and all(path.exists() for path in stopped), \
        f'not stopped {KILL_AFTER_S} s after SIGTERM (killed: {killed}):\n{output[-3000:]}'
    stopped = [json.loads(path.read_text()) for path in stopped]
    last = stopped[0]['last']
    assert stopped[1]['last'] == last and last in (1, 2), stopped        # the signal's step (or the next one)
    assert [s['stop_reason'] for s in stopped] == ['received SIGTERM'] * 2, stopped
    assert stopped[0]['checkpoint_path'].endswith(f'_E0_ITER{last}.pth'), stopped
    checkpoint = load_checkpoint(stopped[0]['checkpoint_path'])           # complete: loads with weights_only
    assert checkpoint['data_position']['batches_done'] == last + 1 and checkpoint['model_state_dict']
    steps = [json.loads(line) for line in (tmp_path / 'steps_run0_rank0.jsonl').read_text().splitlines()]
    checkpoint_started = steps[-1]['time'] - warned                 # the end of the last step: the checkpoint follows
    assert checkpoint_started < ended_after < KILL_AFTER_S
    print(f'SIGTERM -> checkpoint started {checkpoint_started:.2f} s, every process ended {ended_after:.2f} s '
          f'(steps of {SLOW_STEP_S} s)')


def _deadline_run(out_dir, *args, run=0, signal_phase=False):
    """stop_deadline_fit.py under torchrun with 2 workers (run ``run``: DEADLINE_RUN). With ``signal_phase``, SIGTERM
    to torchrun's agent (which passes it to its workers) 0.5 s after both workers began their slow phase; the workers
    must be gone well before a phase of 60 s could have ended. Returns the 'stopped' record of each rank and the
    output."""
    command = [sys.executable, '-m', 'torch.distributed.run', '--nnodes=1', '--nproc_per_node=2',
               '--rdzv-backend=c10d', f'--rdzv-endpoint=127.0.0.1:{find_free_port()}', DEADLINE_SCRIPT,
               str(out_dir), '--samples', '32', '--epochs', '3', *args]
    agent = subprocess.Popen(command, env=_env(DEADLINE_RUN=str(run)), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    if signal_phase:
        began = [out_dir / f'phase_run{run}_rank{rank}' for rank in (0, 1)]
        deadline = time.monotonic() + 120
        while not all(path.exists() for path in began) and agent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not all(path.exists() for path in began):
            agent.kill()
            pytest.fail(f'the workers never began their slow phase: {agent.communicate()[0][-3000:]}')
        time.sleep(0.5)
        agent.send_signal(signal.SIGTERM)
    try:
        output = agent.communicate(timeout=30 if signal_phase else 120)[0]
    except subprocess.TimeoutExpired:
        agent.kill()
        pytest.fail(f'torchrun still running: {agent.communicate()[0][-3000:]}')
    # The agent itself ends with a SignalException (status 1) after a SIGTERM; its workers ended on their own.
    assert signal_phase or agent.returncode == 0, output[-3000:]
    stopped = [out_dir / f'stopped_run{run}_rank{rank}.json' for rank in (0, 1)]
    assert all(path.exists() for path in stopped), output[-3000:]
    return [json.loads(path.read_text()) for path in stopped], output


@pytest.mark.system
@pytest.mark.timeout(300)
def test_under_torchrun_sigterm_in_a_loader_wait_then_in_a_checkpoint_write_each_stops_with_a_checkpoint(tmp_path):
    """2 workers, 4 batches each per epoch, 3 epochs. Run 0: the train loader's read of batch 5 stalls (60 s);
    SIGTERM: both workers abandon the wait and checkpoint after batch 4. Run 1 resumes; the checkpoint write at the
    end of epoch 1 is slow (3 s more); SIGTERM during it: the workers stop right after it, with that epoch-end
    checkpoint (not after the next step, with one more). Run 2 resumes to the end: the weights of the uninterrupted run, bit for bit."""
    reference_dir, out_dir = tmp_path / 'reference', tmp_path / 'out'
    reference_dir.mkdir(), out_dir.mkdir()
    _deadline_run(reference_dir)

    stopped, output = _deadline_run(out_dir, '--sleep-loader-at', '5', run=0, signal_phase=True)
    assert [s['last'] for s in stopped] == [4, 4], output[-3000:]
    assert [s['stop_reason'] for s in stopped] == ['received SIGTERM'] * 2
    assert stopped[0]['checkpoint_path'].endswith('_E1_ITER4.pth') and stopped[0]['stop_latency_s'] is not None
    assert 'the fetch was abandoned' in output and 'the checkpoint is durable' in output

    # The write must end (it is the checkpoint): 3 s of slow storage, the signal 0.5 s into it.
    stopped, output = _deadline_run(out_dir, '--slow-save-epoch', '1', '--phase-s', '3', run=1, signal_phase=True)
    assert [s['last'] for s in stopped] == [7, 7], output[-3000:]          # no batch of epoch 2
    assert [s['epochs_completed'] for s in stopped] == [2, 2]
    assert stopped[0]['checkpoint_path'].endswith('_E1.pth'), stopped        # the write it came in, no other
    assert 'saving a checkpoint at the end of epoch 1' in output

    _deadline_run(out_dir, run=2)
    resumed = torch.load(out_dir / 'final.pt', weights_only=True)['weights']
    reference = torch.load(reference_dir / 'final.pt', weights_only=True)['weights']
    assert resumed.keys() == reference.keys() and all(torch.equal(resumed[k], reference[k]) for k in reference)


class _Regression(TTBasicModel):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(3, 1)

    def forward(self, x):
        return self.layer(x)


def _loop(seed=0):
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(32, 3, generator=generator)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)
    model = _Regression()
    return TrainLoop(model, data, None, None, torch.optim.SGD(model.parameters(), lr=0.05), nn.MSELoss()), model


def _checkpoint(folder):
    return ModelCheckpoint('project', 'run', str(folder), {}, cloud_save_mode='local', async_save=False)


def test_resume_from_auto_starts_fresh_on_an_empty_folder_then_continues_the_newest_checkpoint(tmp_path, caplog):
    reference, reference_model = _loop()
    reference.fit(num_epochs=3)

    loop, _ = _loop()
    with caplog.at_level(logging.INFO, logger='aitoolbox_like'):
        loop.fit(num_epochs=1, callbacks=[_checkpoint(tmp_path)], resume_from='auto')
    assert 'no checkpoint of project/run' in caplog.text and 'training from scratch' in caplog.text
    [first_run] = os.listdir(tmp_path / 'project')

    caplog.clear()
    restarted, model = _loop(seed=123)          # a restarted script; the checkpoint restores the RNG
    with caplog.at_level(logging.INFO, logger='aitoolbox_like'):
        restarted.fit(num_epochs=3, callbacks=[_checkpoint(tmp_path)], resume_from='auto')
    assert "resume_from='auto'): resuming from" in caplog.text
    assert os.listdir(tmp_path / 'project') == [first_run]          # continued in the same experiment folder
    assert restarted.epochs_completed == 3
    for name, value in reference_model.state_dict().items():
        assert torch.equal(value, model.state_dict()[name])


def test_resume_from_auto_without_a_callback_that_writes_checkpoints_is_refused_before_training(tmp_path):
    loop, model = _loop()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"resume_from='auto'.*no registered callback writes checkpoints.*"
                                         r"ModelCheckpoint"):
        loop.fit(num_epochs=1, resume_from='auto')
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert loop.epochs_completed == 0
