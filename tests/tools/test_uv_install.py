"""tools/uv_install.py, the Makefile's install of an extra: uv installs from where pip's configuration says, and pip
installs when uv cannot be told all of it. The installs are real (a fresh venv, a wheel in a local folder, no
network)."""
import base64
import hashlib
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

from tools import uv_install

ROOT = Path(__file__).resolve().parents[2]

PROBE = 'aitb_uv_probe'


def _wheel(folder, value):
    """A one-module wheel of version 1.0, written by hand (nothing is built, nothing is downloaded)."""
    files = {f'{PROBE}/__init__.py': f'VALUE = {value}\n',
             f'{PROBE}-1.0.dist-info/METADATA': 'Metadata-Version: 2.1\nName: aitb-uv-probe\nVersion: 1.0\n',
             f'{PROBE}-1.0.dist-info/WHEEL': 'Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\n'
                                             'Tag: py3-none-any\n'}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()
        record.append(f'{name},sha256={digest},{len(text.encode())}')
    files[f'{PROBE}-1.0.dist-info/RECORD'] = '\n'.join(record + [f'{PROBE}-1.0.dist-info/RECORD,,']) + '\n'
    folder.mkdir()
    with zipfile.ZipFile(folder / f'{PROBE}-1.0-py3-none-any.whl', 'w') as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return folder


def _fresh_venv(path):
    venv.create(path, with_pip=False)
    return str(path / 'bin' / 'python')


def _installed_value(python):
    return subprocess.run([python, '-c', f'import {PROBE}; print({PROBE}.VALUE)'], capture_output=True,
                          text=True).stdout.strip()


def test_pips_settings_reach_uv_with_pips_choice_among_indexes(monkeypatch):
    monkeypatch.delenv('SSL_CERT_FILE', raising=False)
    settings = {'index-url': 'https://mirror.example/simple', 'extra-index-url': 'file:///opt/a file:///opt/b',
                'find-links': '/opt/wheels', 'constraint': '/etc/pip/c.txt', 'cert': '/etc/ssl/ca.pem',
                'default-timeout': '180', 'no-index': 'false'}
    options, environment, why = uv_install.uv_arguments(settings)
    assert why is None
    assert options == ['--index-strategy', 'unsafe-best-match', '--index-url', 'https://mirror.example/simple',
                       '--extra-index-url', 'file:///opt/a', '--extra-index-url', 'file:///opt/b',
                       '--find-links', '/opt/wheels', '--constraints', '/etc/pip/c.txt']
    assert environment == {'SSL_CERT_FILE': '/etc/ssl/ca.pem'}
    monkeypatch.setenv('SSL_CERT_FILE', '/the/users/own.pem')
    assert uv_install.uv_arguments(settings)[1] == {}


def test_pips_variables_override_its_files_as_pip_reads_them(tmp_path, monkeypatch):
    config = tmp_path / 'pip.conf'
    config.write_text('[global]\nfind-links = /from/global\nextra-index-url = file:///global\n'
                      '[install]\nfind-links = /from/install\n')
    monkeypatch.setenv('PIP_CONFIG_FILE', str(config))
    monkeypatch.setenv('PIP_FIND_LINKS', '/from/env')
    monkeypatch.delenv('PIP_EXTRA_INDEX_URL', raising=False)
    settings = uv_install.pip_configuration()
    assert settings['find-links'] == '/from/env'
    assert settings['extra-index-url'] == 'file:///global'
    monkeypatch.delenv('PIP_FIND_LINKS')
    assert uv_install.pip_configuration()['find-links'] == '/from/install'


def test_uv_installs_from_the_wheel_folder_pip_is_configured_with(tmp_path, monkeypatch):
    wheels = _wheel(tmp_path / 'wheels', 42)
    monkeypatch.setenv('PIP_NO_INDEX', '1')
    monkeypatch.setenv('PIP_FIND_LINKS', str(wheels))
    target = _fresh_venv(tmp_path / 'venv')
    assert uv_install.install([PROBE], target) == 'uv'
    assert _installed_value(target) == '42'


def test_a_setting_uv_is_not_told_leaves_the_install_to_pip_with_one_line_naming_it(tmp_path, monkeypatch, caplog):
    wheels = _wheel(tmp_path / 'wheels', 7)
    monkeypatch.setenv('PIP_NO_INDEX', '1')
    monkeypatch.setenv('PIP_FIND_LINKS', str(wheels))
    monkeypatch.setenv('PIP_PREFER_BINARY', '1')
    target = _fresh_venv(tmp_path / 'venv')
    with caplog.at_level('WARNING', logger='tools.uv_install'):
        assert uv_install.install([PROBE], target) == 'pip'
    assert [r.getMessage() for r in caplog.records] == [
        "pip's setting prefer-binary='1', which uv is not told: pip installs instead of uv"]
    assert _installed_value(target) == '7'


def test_the_command_line_installs_constraints_and_requirements(tmp_path):
    wheels = _wheel(tmp_path / 'wheels', 3)
    constraint = tmp_path / 'c.txt'
    constraint.write_text('aitb-uv-probe==1.0\n')
    target = _fresh_venv(tmp_path / 'venv')
    env = {'PATH': '/usr/bin:/bin', 'PIP_NO_INDEX': '1', 'PIP_FIND_LINKS': str(wheels), 'PIP_CONFIG_FILE': '/dev/null'}
    done = subprocess.run([sys.executable, '-m', 'tools.uv_install', '--python', target, '-c', str(constraint), PROBE],
                          env=env, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == 'tools.uv_install: installed with uv'
    assert _installed_value(target) == '3'
