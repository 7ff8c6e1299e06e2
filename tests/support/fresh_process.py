"""A command started as a user's shell starts it, and a terminal's Ctrl-C.

:class:`FreshProcess` runs a command (the venv's ``python``, a console script) as a fresh interpreter: no fork of a
process that imported anything, the environment given minus ``PYTHONHASHSEED`` (a shell forces none), its stdout and
stderr in files. It is the leader of a session of its own, so its process group stands for a terminal's foreground
job: :meth:`FreshProcess.ctrl_c` sends SIGINT to the whole group, as the terminal does on Ctrl-C, which reaches the
processes the command started too (workers, ranks), not only the command. :meth:`FreshProcess.left_running` lists
what of the session is still running after the command ended.
"""
import os
import signal
import subprocess


class FreshProcess:
    """``command`` in ``cwd`` with ``env``; its stdout and stderr in ``log``.out and ``log``.err. As a context
    manager, whatever of its session still runs at the end is killed (a failed test leaves nothing behind)."""

    def __init__(self, command, cwd, env, log):
        env = {name: value for name, value in env.items() if name != 'PYTHONHASHSEED'}
        self.stdout_path, self.stderr_path = f'{log}.out', f'{log}.err'
        with open(self.stdout_path, 'w') as out, open(self.stderr_path, 'w') as err:
            self.popen = subprocess.Popen([str(part) for part in command], cwd=cwd, env=env, stdout=out, stderr=err,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.popen.pid

    @property
    def returncode(self):
        return self.popen.returncode

    def running(self):
        return self.popen.poll() is None

    def ctrl_c(self):
        """What Ctrl-C in a terminal does: SIGINT to every process of the foreground process group."""
        os.killpg(self.pid, signal.SIGINT)

    def send(self, signum):
        """``kill -SIGNUM PID``: the signal to the command's process alone (what a scheduler or ``kill`` sends)."""
        os.kill(self.pid, signum)

    def wait(self, timeout):
        """The exit status (negative: the signal); a command still going after ``timeout`` seconds is killed with
        its session (status -9)."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_session()
            return self.popen.wait()

    def output(self):
        """(stdout, stderr) as text."""
        with open(self.stdout_path, errors='replace') as out, open(self.stderr_path, errors='replace') as err:
            return out.read(), err.read()

    def left_running(self):
        """``(pid, command line)`` of every process of the command's session still running (zombies, already ended,
        are left out)."""
        left = []
        for entry in os.listdir('/proc'):
            if not entry.isdigit():
                continue
            try:
                with open(f'/proc/{entry}/stat') as f:
                    state, _, _, session = f.read().rsplit(')', 1)[1].split()[:4]
                with open(f'/proc/{entry}/cmdline', 'rb') as f:
                    cmdline = f.read().replace(b'\0', b' ').decode(errors='replace').strip()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(session) == self.pid and state != 'Z':
                left.append((int(entry), cmdline))
        return left

    def kill_session(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)     # the group: the session's processes that kept it
        except ProcessLookupError:
            pass
        for pid, _ in self.left_running():          # any that made a group of their own
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.kill_session()
        self.popen.wait()
