"""Real Google Cloud Storage and Azure Blob Storage servers on loopback for tests, beside SeaweedFS (s3_server.py).

- Google Cloud Storage: the PyPI package ``gcp-storage-emulator`` (in the dev extra), reached by Google's client
  through ``STORAGE_EMULATOR_HOST``. It does not enforce ``ifGenerationMatch=0``; its request log shows what each
  write asked for (``requests_with``). It rewrites its metadata file in place, so killing it can leave that file
  half written: the clients reach it through a TCP relay on its own port, and an outage stops the relay.
- Azure Blob Storage: Azurite (the npm package ``azurite``), reached through ``AZURE_STORAGE_CONNECTION_STRING`` with
  its well-known development account. Installed with npm into ``.test-servers/azurite`` of the checkout when it is
  not there (``make test`` does it first; CI starts from a clean clone).

Both keep their data in a folder of the test session, so a server stopped (an outage) and started again on the same
port finds its buckets. One server per test session, started when a test first asks for it, stopped by PID at the
end. The ``cloud`` fixture runs a test once per cloud: S3, Google Cloud Storage, Azure.
"""
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from s3_server import _LIVE_PROCESSES, make_bucket

REPO = Path(__file__).resolve().parents[2]
AZURITE_DIR = REPO / '.test-servers' / 'azurite'
AZURITE_VERSION = '3'
# Azurite's development account: public, documented by Microsoft, valid only against the emulator.
AZURITE_ACCOUNT = 'devstoreaccount1'
AZURITE_KEY = 'Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=='
_STARTUP_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 15.0
# Variables of a developer's own Google or Azure set-up that must not reach the tests.
_CLOUD_ENV = ('STORAGE_EMULATOR_HOST', 'GOOGLE_APPLICATION_CREDENTIALS', 'GOOGLE_CLOUD_PROJECT', 'CLOUDSDK_CONFIG',
              'API_ENDPOINT_OVERRIDE', 'AZURE_STORAGE_CONNECTION_STRING', 'AZURE_STORAGE_ACCOUNT_URL',
              'AZURE_STORAGE_ACCOUNT')


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class LoopbackServer:
    """One server process on a loopback port; stop() and start() keep the port and the data folder."""

    name = 'server'

    def __init__(self, data_dir):
        self.data_dir = Path(data_dir)
        self.port = None
        self.process = None
        self._log = None

    @property
    def own_url(self):
        return f'http://127.0.0.1:{self.port}'

    @property
    def endpoint_url(self):
        """Where the clients reach the server."""
        return self.own_url

    @property
    def log_path(self):
        return self.data_dir / f'{self.name}.log'

    def command(self):
        raise NotImplementedError

    def environment(self):
        return dict(os.environ)

    def answers(self):
        """True once the server answers HTTP (any status)."""
        try:
            urllib.request.urlopen(self.own_url + '/', timeout=2)
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
        return True

    def start(self):
        if self.running:
            return
        if self.port is None:
            self.port = free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, 'ab')
        self.process = subprocess.Popen(self.command(), cwd=self.data_dir, env=self.environment(),
                                        stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        _LIVE_PROCESSES.add(self.process)
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f'{self.name} exited with code {self.process.returncode} during start-up; log:\n'
                                   f'{self.log_tail()}')
            if self.answers():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f'{self.name} did not answer within {_STARTUP_TIMEOUT_S:.0f} s; log:\n{self.log_tail()}')

    #: The signal that stops the server; Azurite saves its metadata on SIGTERM only (its data survives an outage).
    stop_signal = signal.SIGKILL

    def stop(self):
        """Stop the server (its process group: node or Python and what they started); the port stops answering at
        once, as in a network outage."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            try:
                os.killpg(process.pid, self.stop_signal)
                process.wait(timeout=_STOP_TIMEOUT_S)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=_STOP_TIMEOUT_S)
        _LIVE_PROCESSES.discard(process)
        self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    @property
    def running(self):
        return self.process is not None and self.process.poll() is None

    @contextlib.contextmanager
    def outage(self):
        self.stop()
        try:
            yield self
        finally:
            self.start()

    def shutdown(self):
        """Stop for good (the end of the session)."""
        self.stop()

    def log_tail(self, lines=40):
        try:
            return '\n'.join(self.log_path.read_text(errors='replace').splitlines()[-lines:])
        except OSError:
            return '(no log)'


# A TCP relay: python -c RELAY LISTEN_PORT TARGET_PORT. Every connection it accepts is joined to one it opens to the
# target; killing it drops them all and refuses new ones, as a network outage does.
_RELAY = r'''
import socket, sys, threading
listen, target = int(sys.argv[1]), int(sys.argv[2])

def pump(source, sink):
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    for s in (source, sink):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    source.close()

server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(('127.0.0.1', listen))
server.listen(64)
while True:
    client, _ = server.accept()
    try:
        upstream = socket.create_connection(('127.0.0.1', target))
    except OSError:
        client.close()
        continue
    for pair in ((client, upstream), (upstream, client)):
        threading.Thread(target=pump, args=pair, daemon=True).start()
'''


class Relay(LoopbackServer):
    """A TCP relay on its own loopback port to ``target_port``."""

    name = 'relay'

    def __init__(self, data_dir, target_port):
        super().__init__(data_dir)
        self.target_port = target_port

    def command(self):
        return [sys.executable, '-c', _RELAY, str(self.port), str(self.target_port)]


class GCSEmulator(LoopbackServer):
    """``gcp-storage-emulator`` with its data on disk (STORAGE_BASE), behind a relay: ``stop`` and ``start`` (an
    outage) stop and start the relay; the emulator and its data stay."""

    name = 'gcp-storage-emulator'

    def __init__(self, executable, data_dir):
        super().__init__(data_dir)
        self.executable = executable
        self.relay = None

    @property
    def endpoint_url(self):
        return self.relay.own_url

    def start(self):
        super().start()
        if self.relay is None:
            self.relay = Relay(self.data_dir, self.port)
        self.relay.start()

    def stop(self):
        if self.relay is not None:
            self.relay.stop()

    def shutdown(self):
        self.stop()
        super().stop()

    def command(self):
        return [self.executable, 'start', '--host', '127.0.0.1', '--port', str(self.port)]

    def environment(self):
        return dict(os.environ, STORAGE_BASE=str(self.data_dir))

    def client(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
        return storage.Client(project='test', credentials=AnonymousCredentials(),
                              client_options={'api_endpoint': self.own_url})

    def make_bucket(self, name=None):
        name = name or f'test-{uuid.uuid4().hex[:12]}'
        self.client().create_bucket(name)
        return name

    def keys(self, bucket, prefix=''):
        return sorted(blob.name for blob in self.client().list_blobs(bucket, prefix=prefix))

    def requests_with(self, text):
        """The request lines of the server's log that contain ``text``."""
        return [line for line in self.log_path.read_text(errors='replace').splitlines() if text in line]


class Azurite(LoopbackServer):
    """Azurite's Blob service with its data in a folder (``--location``) so that it survives a restart."""

    name = 'azurite-blob'
    stop_signal = signal.SIGTERM

    def __init__(self, executable, data_dir):
        super().__init__(data_dir)
        self.executable = executable

    def command(self):
        return [self.executable, '--blobHost', '127.0.0.1', '--blobPort', str(self.port), '--location',
                str(self.data_dir / 'data'), '--silent', '--disableTelemetry', '--skipApiVersionCheck']

    @property
    def account_url(self):
        return f'{self.endpoint_url}/{AZURITE_ACCOUNT}'

    @property
    def connection_string(self):
        return (f'DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};'
                f'BlobEndpoint={self.account_url};')

    def service(self):
        from azure.storage.blob import BlobServiceClient
        return BlobServiceClient.from_connection_string(self.connection_string, retry_total=0)

    def make_bucket(self, name=None):
        name = name or f'test-{uuid.uuid4().hex[:12]}'
        self.service().create_container(name)
        return name

    def keys(self, bucket, prefix=''):
        container = self.service().get_container_client(bucket)
        return sorted(blob.name for blob in container.list_blobs(name_starts_with=prefix or None))


def find_gcs_emulator():
    candidate = Path(sys.executable).parent / 'gcp-storage-emulator'
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which('gcp-storage-emulator')


def find_or_install_azurite():
    """The ``azurite-blob`` executable: on PATH, else in .test-servers/azurite (installed there with npm when
    missing, under a lock so that parallel test workers install it once)."""
    on_path = shutil.which('azurite-blob')
    if on_path:
        return on_path
    executable = AZURITE_DIR / 'node_modules' / '.bin' / 'azurite-blob'
    if executable.exists():
        return str(executable)
    npm = shutil.which('npm')
    if npm is None:
        return None
    AZURITE_DIR.mkdir(parents=True, exist_ok=True)
    with open(AZURITE_DIR / '.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not executable.exists():
            subprocess.run([npm, 'install', '--no-audit', '--no-fund', '--prefix', str(AZURITE_DIR),
                            f'azurite@{AZURITE_VERSION}'], check=True, stdout=subprocess.DEVNULL, timeout=600)
    return str(executable)


def _session_server(server):
    for attempt in range(3):     # a port picked free may be taken before the server binds it
        try:
            server.start()
            return server
        except RuntimeError:
            server.shutdown()
            server.port = None
            if getattr(server, 'relay', None) is not None:
                server.relay = None
            if attempt == 2:
                raise
    return server


@pytest.fixture(scope='session')
def gcs_server(tmp_path_factory):
    executable = find_gcs_emulator()
    if executable is None:
        pytest.fail('gcp-storage-emulator is not installed: pip install -e .[dev]')
    server = GCSEmulator(executable, tmp_path_factory.mktemp('gcs'))
    try:
        yield _session_server(server)
    finally:
        server.shutdown()


@pytest.fixture(scope='session')
def azure_server(tmp_path_factory):
    executable = find_or_install_azurite()
    if executable is None:
        pytest.fail('Azurite is not installed and npm is not there to install it (npm install azurite)')
    server = Azurite(executable, tmp_path_factory.mktemp('azurite'))
    try:
        yield _session_server(server)
    finally:
        server.stop()


class Cloud:
    """One cloud's server for a test, with what the test needs to use it the user's way."""

    def __init__(self, scheme, server):
        self.scheme = scheme
        self.server = server
        self.mode = {'s3': 's3', 'gs': 'gcs', 'az': 'azure'}[scheme]

    def __repr__(self):
        return f'Cloud({self.scheme})'

    @property
    def endpoint_url(self):
        """What ``endpoint_url=`` takes for this cloud (S3 endpoint, GCS API endpoint, Azure account URL)."""
        return self.server.account_url if self.scheme == 'az' else self.server.endpoint_url

    def make_bucket(self):
        return make_bucket(self.server) if self.scheme == 's3' else self.server.make_bucket()

    def keys(self, bucket, prefix=''):
        if self.scheme == 's3':
            pages = self.server.client().get_paginator('list_objects_v2').paginate(Bucket=bucket, Prefix=prefix)
            return sorted(obj['Key'] for page in pages for obj in page.get('Contents', ()))
        return self.server.keys(bucket, prefix)

    def storage(self, bucket, prefix=''):
        from aitoolbox_like.storage import open_storage
        return open_storage(f'{self.scheme}://{bucket}/{prefix}')

    def url(self, bucket, key=''):
        return f'{self.scheme}://{bucket}/{key}'.rstrip('/')

    def stop(self):
        """Kill the server, as a crash or a network outage would (``start`` brings it back, data kept)."""
        if self.scheme == 's3':
            self.server.stop(graceful=False)
        else:
            self.server.stop()

    def start(self):
        self.server.start()

    def configure(self, monkeypatch):
        """Point this process's clients (and the processes it starts) at the server, as a user would."""
        for name in _CLOUD_ENV:
            monkeypatch.delenv(name, raising=False)
        if self.scheme == 's3':
            monkeypatch.setenv('AWS_ENDPOINT_URL_S3', self.server.endpoint_url)
        elif self.scheme == 'gs':
            monkeypatch.setenv('STORAGE_EMULATOR_HOST', self.server.endpoint_url)
        else:
            monkeypatch.setenv('AZURE_STORAGE_CONNECTION_STRING', self.server.connection_string)


CLOUD_SERVER_FIXTURES = {'s3': 's3_server', 'gs': 'gcs_server', 'az': 'azure_server'}


@pytest.fixture(params=list(CLOUD_SERVER_FIXTURES))
def cloud(request, monkeypatch):
    """Each cloud in turn (``s3``, ``gs``, ``az``), its session server up and this process configured for it; the
    server is up again after the test whatever the test did."""
    cloud = Cloud(request.param, request.getfixturevalue(CLOUD_SERVER_FIXTURES[request.param]))
    cloud.configure(monkeypatch)
    try:
        yield cloud
    finally:
        cloud.start()
