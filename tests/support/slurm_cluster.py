"""A real one-node SLURM cluster on loopback for tests: Debian's slurmctld, slurmd and munge.

The ``slurm_cluster`` fixture (session scope, imported into tests/conftest.py) installs the Debian packages when
they are missing (apt-get, as root: CI starts from a clean machine), writes a configuration of its own in a
temporary folder (ports picked free, a random first job id so that clusters of parallel sessions give their jobs
different ids), starts munged, slurmctld and slurmd in the foreground as child processes, and at the end cancels
what is left and stops the three daemons by PID.

Jobs see ``SLURM_CONF`` pointing at this cluster (sbatch passes the test process's environment on). The node has
8 CPUs configured (more than the machine has: the jobs here are small) and the name ``localhost``, so the
``MASTER_ADDR`` a job derives from its node list resolves everywhere.

What the tests use, checked on this SLURM (22.05):
- ``scancel --signal=USR1 JOB`` signals every task of the job's steps, as ``#SBATCH --signal=USR1@N`` does before
  the time limit;
- ``scontrol requeue JOB`` sends SIGCONT and SIGTERM to every process of the job, SIGKILL after KillWait (30 s);
- a job of the ``preemptor`` partition (:data:`PREEMPTOR`) that needs the node (``--exclusive``) preempts the
  jobs of the default partition: they are requeued, and each of their processes gets SIGTERM, SIGCONT and SIGTERM
  again within milliseconds, then SIGKILL after KillWait;
- a requeued job waits about two minutes (its begin time) unless released with :meth:`SlurmCluster.release`;
- ``--open-mode=append`` keeps the output of every run of a requeued job in one file.
"""
import atexit
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

PACKAGES = ('slurmctld', 'slurmd', 'slurm-client', 'munge')
COMMANDS = ('slurmctld', 'slurmd', 'sbatch', 'munged')
NODE = 'localhost'
#: A partition whose jobs preempt (requeue) the jobs of the default one, as a job of higher priority does on a
#: cluster: ``sbatch --partition=preemptor --exclusive ...``.
PREEMPTOR = 'preemptor'
_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 10.0
FINISHED = ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL', 'OUT_OF_MEMORY', 'BOOT_FAIL', 'DEADLINE',
            'PREEMPTED')


def _command(name):
    """The path of a SLURM or munge program (the daemons are in /usr/sbin, which a user's PATH may lack), or None."""
    found = shutil.which(name)
    if found is None and os.path.exists(f'/usr/sbin/{name}'):
        found = f'/usr/sbin/{name}'
    return found


def _missing_commands():
    return [c for c in COMMANDS if _command(c) is None]


def ensure_installed():
    """Install Debian's SLURM and munge packages when a command is missing (apt-get; root)."""
    if not _missing_commands():
        return
    if os.geteuid() != 0:
        raise RuntimeError(f'SLURM is not installed ({", ".join(_missing_commands())} missing) and the tests do not '
                           f'run as root: apt-get install -y {" ".join(PACKAGES)}')
    env = dict(os.environ, DEBIAN_FRONTEND='noninteractive')
    install = ['apt-get', '-o', 'DPkg::Lock::Timeout=600', 'install', '-y', '--no-install-recommends', *PACKAGES]
    done = subprocess.run(install, env=env, capture_output=True, text=True)
    if done.returncode != 0:        # a clean machine may have no package lists yet
        subprocess.run(['apt-get', '-o', 'DPkg::Lock::Timeout=600', 'update'], env=env, capture_output=True)
        done = subprocess.run(install, env=env, capture_output=True, text=True)
    if done.returncode != 0 or _missing_commands():
        raise RuntimeError(f'apt-get could not install {" ".join(PACKAGES)}:\n{done.stdout[-2000:]}\n'
                           f'{done.stderr[-2000:]}')


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _config(root, ctld_port, slurmd_port, first_job_id):
    return f"""\
ClusterName=aitltest
SlurmctldHost={NODE}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
PlugStackConfig={root}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=30
# srun binds random ports (1025-65535) unless told a range; keep it off the job-id-derived MASTER_PORT range
# (12000-31999), as clusters with a firewall do, or a job may find its rendezvous port taken by its own srun.
SrunPortRange=61000-63000
MinJobAge=3600
FirstJobId={first_job_id}
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName={NODE} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName={PREEMPTOR} Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
"""


class SlurmCluster:
    """munged, slurmctld and slurmd of one node, configured under ``root``."""

    def __init__(self, root, extra_config=''):
        self.root = Path(root)
        self.extra_config = extra_config        # slurm.conf lines added at the end (partitions, preemption)
        self.conf = self.root / 'slurm.conf'
        self.processes = {}
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    def start(self):
        root = self.root
        for folder in ('state', 'spool'):
            (root / folder).mkdir(parents=True, exist_ok=True)
        key = root / 'munge.key'
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        (root / 'plugstack.conf').write_text('')
        self.conf.write_text(_config(root, _free_port(), _free_port(), random.randint(10_000, 60_000_000))
                             + self.extra_config)
        self._spawn('munged', [_command('munged'), '--foreground', '--force', f'--key-file={key}',
                               f'--socket={root}/munge.socket', f'--pid-file={root}/munged.pid',
                               f'--log-file={root}/munged.log', f'--seed-file={root}/munged.seed'])
        self._wait_until(lambda: (root / 'munge.socket').exists(), 'munged to create its socket')
        self._spawn('slurmctld', [_command('slurmctld'), '-D', '-i', '-f', str(self.conf)])
        self._spawn('slurmd', [_command('slurmd'), '-D', '-N', NODE, '-f', str(self.conf)])
        self._wait_until(self._node_idle, 'the node to be idle')

    def _spawn(self, name, command):
        log = open(self.root / f'{name}.out', 'ab')
        try:
            self.processes[name] = subprocess.Popen(command, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        _LIVE_PROCESSES.add(self.processes[name])

    def _wait_until(self, condition, what, timeout=_START_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f'{name} exited with status {process.returncode} while waiting for {what}:\n'
                                       f'{self.logs()}')
            if condition():
                return
            time.sleep(0.2)
        raise RuntimeError(f'the test SLURM cluster: timed out waiting for {what}:\n{self.logs()}')

    def _node_idle(self):
        done = self.run('sinfo', '-h', '-N', '-o', '%T', check=False)      # one line per partition of the node
        states = done.stdout.split()
        return done.returncode == 0 and bool(states) and all(state == 'idle' for state in states)

    def logs(self, lines=20):
        parts = []
        for name in ('munged.out', 'munged.log', 'slurmctld.log', 'slurmd.log', 'slurmctld.out', 'slurmd.out'):
            path = self.root / name
            if path.exists():
                tail = path.read_text(errors='replace').splitlines()[-lines:]
                parts.append(f'--- {name}\n' + '\n'.join(tail))
        return '\n'.join(parts)

    # ---- clients

    def run(self, *command, check=True, timeout=60):
        """A SLURM client command against this cluster; its CompletedProcess (text)."""
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f'{" ".join(command)} failed ({done.returncode}): {done.stderr or done.stdout}')
        return done

    def sbatch(self, script, *options, env=None, args=()):
        """Submit the batch script ``script`` (a path) with sbatch ``options`` and the script's own ``args``; the
        job id. ``env``: variables added to the job's environment (sbatch passes the submitting environment on)."""
        environment = dict(self.env, **(env or {}))
        done = subprocess.run(['sbatch', '--parsable', *options, str(script), *args], env=environment,
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f'sbatch failed ({done.returncode}): {done.stderr or done.stdout}')
        return done.stdout.strip().split(';')[0]

    def job(self, job_id):
        """``scontrol show job``'s fields of the job, as a dict (JobState, Restarts, ExitCode, ...)."""
        return self.records(job_id)[0]

    def records(self, job_id):
        """``scontrol show job``'s fields, one dict per record: one for a job, one per task of a job array (its
        tasks still pending together share one record, ``ArrayTaskId=2-7``)."""
        shown = self.run('scontrol', 'show', 'job', '--oneliner', str(job_id)).stdout
        return [dict(re.findall(r'(\w+)=(\S*)', line)) for line in shown.splitlines() if line.strip()]

    def wait_for(self, job_id, condition, what, timeout=180):
        """Poll the job until ``condition(fields)`` is true; the fields. Fails naming ``what`` at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if condition(fields):
                return fields
            if time.monotonic() > deadline:
                raise AssertionError(f'job {job_id}: timed out waiting for {what}; it is {fields.get("JobState")} '
                                     f'({fields.get("Reason")}), restarts {fields.get("Restarts")}')
            time.sleep(0.2)

    def wait_until_finished(self, job_id, timeout=180):
        """Wait until the job has ended (COMPLETED, FAILED, CANCELLED, ...); its fields."""
        return self.wait_for(job_id, lambda f: f.get('JobState') in FINISHED, 'the job to finish', timeout)

    def wait_until_array_finished(self, job_id, timeout=300):
        """Wait until every task of the job array ``job_id`` has ended; their fields, one dict per task."""
        deadline = time.monotonic() + timeout
        while True:
            records = self.records(job_id)
            if all(r.get('JobState') in FINISHED for r in records):
                return records
            if time.monotonic() > deadline:
                states = ', '.join(f'{r.get("ArrayTaskId")}: {r.get("JobState")}' for r in records)
                raise AssertionError(f'job array {job_id}: timed out waiting for every task to finish ({states})')
            time.sleep(0.2)

    def release(self, job_id, restarts=1, timeout=120):
        """Wait until the job is pending again after its ``restarts``-th requeue, and let it start now instead of
        after the begin time SLURM gives a requeued job (about two minutes)."""
        # SLURM gives some requeued jobs no begin time: such a job may already run again, or have finished, when
        # first seen after its requeue (a short remaining run): then there is nothing to release.
        fields = self.wait_for(job_id, lambda f: int(f.get('Restarts', 0)) >= restarts
                               and f.get('JobState') in ('PENDING', 'RUNNING', *FINISHED),
                               f'requeue number {restarts}', timeout)
        if fields.get('JobState') != 'PENDING':
            return
        # slurmd revokes the killed run's job credential with a time in whole seconds and refuses any credential of
        # the job made in that second or before ("Job credential revoked", the job FAILS): start it in a later one.
        time.sleep(_CREDENTIAL_REVOCATION_GRANULARITY_S)
        released = self.run('scontrol', 'update', f'jobid={job_id}', 'StartTime=now', check=False)
        # SLURM may have started the job on its own meanwhile (it gives some requeued jobs no begin time).
        if released.returncode != 0 and 'no longer pending' not in (released.stderr + released.stdout):
            raise RuntimeError(f'scontrol update jobid={job_id} StartTime=now failed: {released.stderr}')

    # ---- stop

    def stop(self):
        """Cancel every job, wait (bounded) for their processes to end, then stop the daemons by PID."""
        if 'slurmctld' in self.processes and self.processes['slurmctld'].poll() is None:
            self.run('scancel', '--full', '--user=root', check=False)
            deadline = time.monotonic() + 45        # KillWait, then SIGKILL
            while time.monotonic() < deadline:
                queue = self.run('squeue', '-h', check=False)
                if queue.returncode != 0 or not queue.stdout.strip():
                    break
                time.sleep(0.5)
        for name in ('slurmd', 'slurmctld', 'munged'):
            process = self.processes.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=_STOP_TIMEOUT_S)
            _LIVE_PROCESSES.discard(process)


_LIVE_PROCESSES = set()
_CREDENTIAL_REVOCATION_GRANULARITY_S = 1.5


@atexit.register
def _kill_leftovers():
    # Last resort if the session dies without running the fixture's teardown.
    for process in list(_LIVE_PROCESSES):
        if process.poll() is None:
            process.kill()
            process.wait(timeout=_STOP_TIMEOUT_S)


def submit_and_wait(cluster, script, *options, timeout=180, env=None, args=()):
    """Submit ``script`` with sbatch ``options`` (and the script's ``args``), wait for the job to finish; its
    ``scontrol show job`` fields (``JobId``, ``JobState``, ``ExitCode``, ``Restarts``...)."""
    job_id = cluster.sbatch(script, *options, env=env, args=args)
    fields = cluster.wait_until_finished(job_id, timeout)
    fields.setdefault('JobId', job_id)
    return fields


def submit_array_and_wait(cluster, script, *options, timeout=300, env=None, args=()):
    """Submit the job array ``script`` (``--array=...`` among its directives or ``options``), wait until every task
    has ended; their ``scontrol show job`` fields, one dict per task (``ArrayTaskId``, ``JobState``, ...)."""
    job_id = cluster.sbatch(script, *options, env=env, args=args)
    return cluster.wait_until_array_finished(job_id, timeout)


def write_batch_script(path, body, *directives):
    """A batch script at ``path``: ``#SBATCH`` lines for ``directives`` (e.g. '--ntasks=2'), then ``body``."""
    lines = ['#!/bin/bash'] + [f'#SBATCH {d}' for d in directives] + [body.strip(), '']
    Path(path).write_text('\n'.join(lines))
    return Path(path)


@pytest.fixture(scope='session')
def slurm_cluster(tmp_path_factory):
    """One SLURM cluster for the session (installed with apt-get when missing), stopped at the end."""
    ensure_installed()
    cluster = SlurmCluster(tmp_path_factory.mktemp('slurm'))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
