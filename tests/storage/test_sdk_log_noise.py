"""A user's script that logs at INFO (``logging.basicConfig(level=logging.INFO)``) and checkpoints to a cloud shows
the run's own log, not every request of the cloud's client library; a user who sets a level on the library's logger
gets its log. Each run is a process of its own (forked from the tests' zygote, conftest's warm_python) against the
cloud's real server on loopback (the ``cloud`` fixture), so the logging set-up is the script's alone."""
import os
import re

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EPOCHS = 3
#: The loggers of the clients the backends use (and of the HTTP libraries under them).
CLIENT_LOGGERS = ('azure', 'google', 'urllib3', 'requests', 'botocore', 'boto3', 's3transfer')
#: botocore says once, when a client is made, where it found the credentials and the endpoint (boto3 users see these
#: in every script; they are no request log).
BOTO_SETUP_LOGGERS = ('botocore.credentials', 'botocore.configprovider')
#: basicConfig's format: LEVEL:logger:message; a record of several lines continues on lines without it.
_RECORD = re.compile(r'^(DEBUG|INFO|WARNING|ERROR|CRITICAL):([\w.]+):')


def _run(warm_python, cloud, tmp_path, *levels):
    bucket = cloud.make_bucket()
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))
    args = [os.path.join(HERE, 'sdk_log_script.py'), tmp_path / 'out', cloud.mode, bucket, '--epochs', EPOCHS]
    for level in levels:
        args += ['--level', level]
    run = warm_python.start_here(args, tmp_path / 'run', env)
    assert warm_python.wait(run, timeout=300) == 0, run.output()[1][-3000:]
    lines = run.output()[1].splitlines()
    records = [m.group(2) for m in map(_RECORD.match, lines) if m]
    assert records, 'the run logged nothing at INFO: the script no longer shows what a user sees'
    return lines, records


def _from_clients(records):
    return [name for name in records if name.split('.')[0] in CLIENT_LOGGERS and name not in BOTO_SETUP_LOGGERS]


def test_a_cloud_run_logging_at_info_shows_no_request_of_the_client_library(cloud, tmp_path, warm_python):
    lines, records = _run(warm_python, cloud, tmp_path)
    print(f'{cloud.scheme}: {len(lines)} lines, {len(records)} records, {len(_from_clients(records))} from the client')
    assert _from_clients(records) == [], '\n'.join(lines[:40])
    # Every line is a record of its own: no record spreads headers over lines.
    assert len(lines) == len(records), '\n'.join(lines[:40])


@pytest.mark.parametrize('logger', ['azure', 'azure.core.pipeline.policies.http_logging_policy'])
def test_a_level_the_user_sets_on_azure_brings_its_request_log_back(logger, azure_server, tmp_path, warm_python,
                                                                    monkeypatch):
    from cloud_servers import Cloud
    cloud = Cloud('az', azure_server)
    cloud.configure(monkeypatch)
    lines, records = _run(warm_python, cloud, tmp_path, f'{logger}=INFO')
    requests = [name for name in records if name == 'azure.core.pipeline.policies.http_logging_policy']
    print(f'az with {logger}=INFO: {len(lines)} lines, {len(records)} records, {len(requests)} of requests')
    # A request and its response at least for each epoch's checkpoint upload.
    assert len(requests) >= 2 * EPOCHS, '\n'.join(lines[:40])
