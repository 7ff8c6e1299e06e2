"""The Makefile's install of an extra: with uv, told pip's own configuration; with pip where uv cannot do it.

    .venv/bin/python -m tools.uv_install -c CONSTRAINT -e '.[dev]'

installs the requirements into the environment of ``--python`` (default: the interpreter running this). pip fetches
the index page of each package and then each file one after the other, and evaluates every link of every page on
one core: on a fresh clone the dev extra's 227 packages took pip about 55 s, and uv, with the same indexes and
constraints, about 12 s (the same 227 packages at the same versions; CONTRIBUTING.md, "The tests").

uv does not read pip's configuration, and this machine's (an extra index, a local wheel folder, a constraint file,
a certificate) decides what is installed; a wrong index would pull a CUDA build of torch. So pip's effective
configuration (``pip config list``: its files and its ``PIP_*`` variables) is handed to uv option by option, with
pip's choice among indexes (the best version over all of them). An option this file does not know how to hand over,
uv missing and not installable, or uv failing: the install is pip's, as before, with one line saying why. torch
itself is installed by pip before (the Makefile), from the local CPU build, and the constraint holds it there.
"""
import argparse
import ast
import importlib.util
import logging
import os
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

logger = logging.getLogger('tools.uv_install')

UV = 'uv==0.13.9'
# pip's options that say where packages come from, as uv is told them: (uv's option, whether the value is a list).
HANDED_OVER = {'index-url': ('--index-url', False), 'extra-index-url': ('--extra-index-url', True),
               'find-links': ('--find-links', True), 'constraint': ('--constraints', True),
               'trusted-host': ('--allow-insecure-host', True)}
# pip's yes/no options that say which packages are candidates, as uv is told them when they are on.
FLAGS = {'no-index': ['--no-index'], 'pre': ['--prerelease', 'allow']}
# pip's options that change nothing of what is installed (cert: uv gets it as SSL_CERT_FILE; config-file: where the
# settings were read).
IRRELEVANT = {'timeout', 'default-timeout', 'disable-pip-version-check', 'progress-bar', 'quiet', 'verbose',
              'root-user-action', 'no-cache-dir', 'cache-dir', 'retries', 'no-compile', 'no-input',
              'require-virtualenv', 'no-color', 'resume-retries', 'no-warn-script-location', 'log', 'cert',
              'config-file'}
TRUE = {'1', 'true', 'yes', 'on'}
# pip reads its sections in this order, a later one overriding an earlier one (global, then the command, then PIP_*).
SECTIONS = ('global', 'install', ':env:')


def pip_configuration() -> Dict[str, str]:
    """pip's effective settings for ``pip install`` (option -> value), from ``pip config list``."""
    listed = subprocess.run([sys.executable, '-m', 'pip', 'config', 'list'], capture_output=True, text=True,
                            check=True).stdout
    by_section: Dict[str, Dict[str, str]] = {section: {} for section in SECTIONS}
    for line in listed.splitlines():
        key, _, value = line.partition('=')
        section, _, option = key.rpartition('.')
        if section in by_section and value:
            by_section[section][option] = ast.literal_eval(value)
    settings: Dict[str, str] = {}
    for section in SECTIONS:
        settings.update(by_section[section])
    return settings


def uv_arguments(settings: Dict[str, str]) -> Tuple[Optional[List[str]], Dict[str, str], Optional[str]]:
    """(uv's options, its environment variables, None), or (None, {}, why) when pip's settings cannot all be handed
    over."""
    options = ['--index-strategy', 'unsafe-best-match']    # pip's choice: the best version over all the indexes
    environment = {}
    for option, value in settings.items():
        if option in HANDED_OVER:
            flag, many = HANDED_OVER[option]
            for item in value.split() if many else [value]:
                options += [flag, item]
        elif option in FLAGS:
            if value.lower() in TRUE:
                options += FLAGS[option]
        elif option not in IRRELEVANT:
            return None, {}, f"pip's setting {option}={value!r}, which uv is not told"
    if 'cert' in settings and 'SSL_CERT_FILE' not in os.environ:
        environment['SSL_CERT_FILE'] = settings['cert']
    return options, environment, None


def _has_uv() -> bool:
    if importlib.util.find_spec('uv') is not None:
        return True
    installed = subprocess.run([sys.executable, '-m', 'pip', 'install', '--quiet', UV], capture_output=True, text=True)
    if installed.returncode != 0:
        logger.warning('uv could not be installed (%s): pip installs instead', installed.stderr.strip()[-400:])
    return installed.returncode == 0


def install(requirements: Sequence[str], target: str) -> str:
    """Install ``requirements`` (pip's syntax: ``-c FILE``, ``-e SPEC``, names) into ``target``'s environment, and
    return which installer did it: 'uv' or 'pip'."""
    try:
        options, environment, why = uv_arguments(pip_configuration())
    except (subprocess.CalledProcessError, ValueError, SyntaxError) as unreadable:
        options, environment, why = None, {}, f"pip's configuration could not be read ({unreadable})"
    if options is None:
        logger.warning('%s: pip installs instead of uv', why)
    elif _has_uv():
        command = [sys.executable, '-m', 'uv', 'pip', 'install', '--quiet', '--python', target, *options, *requirements]
        done = subprocess.run(command, env={**os.environ, **environment}, stderr=subprocess.PIPE, text=True)
        if done.returncode == 0:
            return 'uv'
        logger.warning('uv failed (%s): pip installs instead', done.stderr.strip()[-800:])
    subprocess.run([sys.executable, '-m', 'pip', '--python', target, 'install', '--quiet', '--no-compile',
                    *requirements], check=True)
    return 'pip'


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--python', default=sys.executable, help='the interpreter whose environment receives them')
    parser.add_argument('-c', dest='constraints', action='append', default=[], help='a constraint file (pip -c)')
    parser.add_argument('-e', dest='editables', action='append', default=[], help='an editable requirement (pip -e)')
    parser.add_argument('requirements', nargs='*')
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format='%(name)s: %(message)s')
    requirements = [*(f for c in args.constraints for f in ('-c', c)), *(f for e in args.editables for f in ('-e', e)),
                    *args.requirements]
    try:
        installer = install(requirements, args.python)
    except subprocess.CalledProcessError as failed:
        return failed.returncode or 1
    logger.info('installed with %s', installer)
    return 0


if __name__ == '__main__':
    sys.exit(main())
