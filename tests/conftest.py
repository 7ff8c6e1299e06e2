import atexit
import importlib.metadata
import logging
import os
import subprocess
import sys


def _end_the_worker_process():
    """The last exit handler of a pytest-xdist worker: the process ends here, without the interpreter's own
    finalization. Freeing what torch and two thousand tests built took 2-5 s per worker, which the controller waited
    for at the end of every run; the worker's reports were sent, and its fixtures closed its files, servers and
    processes. Registered before torch is imported, so that every exit handler registered after it (torch's,
    multiprocessing's: its children and finalizers) still runs first; logging's, registered before, is run here.
    Only in a worker (pytest_configure says so): a process started by a test inherits PYTEST_XDIST_WORKER."""
    if not _IN_A_WORKER:
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


_IN_A_WORKER = False
if os.environ.get('PYTEST_XDIST_WORKER'):
    atexit.register(_end_the_worker_process)

import pytest  # noqa: E402
import torch  # noqa: E402

# Tests import the test infrastructure (support/: helpers.py, s3_server.py, warm_python.py, ...) by module name.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'support'))

# One SLURM cluster per session for every test that asks for it (started on first use).
from slurm_cluster import slurm_cluster  # noqa: E402,F401  (pytest fixture)

# The suite may itself run inside a SLURM job: its fits would then act as SLURM tasks (signals end the process,
# srun's tasks form groups). The SLURM tests start jobs of their own, which get their variables from SLURM.
for _name in [name for name in os.environ if name.startswith('SLURM_')]:
    del os.environ[_name]


# The tests of the checks in tools/ (sg_check, pta_check, orca_check) import them as the package `tools`.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Tiny models: extra threads only add contention on the CI's two cores.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _work_in_tmp_dir(tmp_path, monkeypatch):
    """Callbacks that default to ./experiments must not litter the checkout."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def quick_ray_train(monkeypatch):
    """Ray Train as the tests need it, set in the environment of the process that starts the Ray node (its workers
    read it). Its controller polls the workers every 2 s: a run's end, and a worker's death, wait for that poll; 0.2 s
    here. Its preemption watcher, an actor process of its own in every run, waits for a cloud provider's preemption
    notices, which a local node never gets."""
    monkeypatch.setenv('RAY_TRAIN_HEALTH_CHECK_INTERVAL_S', '0.2')
    monkeypatch.setenv('RAY_TRAIN_ENABLE_PREEMPTION_WATCHER', '0')


def _check_groups_are_kept(config, items):
    """Under ``--dist loadgroup`` pytest-xdist keeps the tests of one ``xdist_group`` on one worker by a suffix it adds
    to their ids in each worker; a pytest that ignores it (9.2 with pytest-xdist 3.8, pytest-dev/pytest-xdist#1386)
    spreads them silently, and two SLURM clusters or Ray nodes then run at once. pytest_configure names the known
    case; this stops the workers of any other."""
    if getattr(config.option, 'loadgroup', False):          # set in pytest-xdist's workers under loadgroup
        lost = [item.nodeid for item in items if item.get_closest_marker('xdist_group') and '@' not in item.nodeid]
        if lost:
            pytest.exit(f'pytest-xdist could not group {lost[0]} and {len(lost) - 1} more tests', returncode=4)


@pytest.fixture(scope='session')
def docs_site(tmp_path_factory):
    """The documentation site built as ``make docs`` builds it (``mkdocs build --strict``, here into a temporary
    folder, with a HOME of its own), once for the tests that read it (their xdist group ``docs_site`` keeps them on
    one worker): ``(the finished build, its site folder)``."""
    home = tmp_path_factory.mktemp('docs_site')
    site = home / 'site'
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, HOME=str(home), MPLBACKEND='Agg', OMP_NUM_THREADS='1', NO_MKDOCS_2_WARNING='1',
               PYTHONDONTWRITEBYTECODE='1')
    build = subprocess.run([sys.executable, '-m', 'mkdocs', 'build', '--strict', '--config-file',
                            os.path.join(root, 'mkdocs.yml'), '--site-dir', str(site)], cwd=root, env=env,
                           capture_output=True, text=True, timeout=170)
    return build, site


@pytest.fixture(scope='session')
def warm_python():
    """One zygote per pytest worker (tests/support/warm_python.py) for every test that runs Python scripts as processes of
    their own without paying torch's start-up in each: the tests' own scripts (``start_here``), the docs' blocks,
    AIToolbox's scripts, the study workers, the cloud runs. Each run is its own process with its own environment;
    all have ``PYTHONHASHSEED=0``."""
    from warm_python import SHARED_PRELOAD, WarmPython
    env = {name: value for name, value in os.environ.items() if name != 'OMP_NUM_THREADS'}
    zygote = WarmPython(dict(env, PYTHONHASHSEED='0'), preload=SHARED_PRELOAD)
    yield zygote
    zygote.close()


def pytest_configure(config):
    global _IN_A_WORKER
    _IN_A_WORKER = hasattr(config, 'workerinput')     # what pytest-xdist gives its workers' config
    xdist_version = tuple(int(part) for part in importlib.metadata.version('pytest-xdist').split('.')[:2])
    loadgroup = config.getoption('dist', default=None) == 'loadgroup'     # no such option under -p no:xdist
    if loadgroup and pytest.version_tuple[:2] >= (9, 2) and xdist_version <= (3, 8):
        raise pytest.UsageError(f'pytest {pytest.__version__} ignores the xdist_group marks of pytest-xdist '
                                f'{importlib.metadata.version("pytest-xdist")} (pytest-dev/pytest-xdist#1386), which '
                                f'keep the tests sharing a SLURM cluster or a Ray node on one worker: install the '
                                f"versions setup.py's dev extra names (pip install -e '.[dev]')")
    config.addinivalue_line('markers', 'real_spawn: the ranks of a gpu_mode=ddp/fsdp fit started in the test are '
                                       'fresh interpreters, as in a script (the others fork from tests/support/warm_ranks.py)')
    config.addinivalue_line('markers', 'system: runs on a real cluster or launcher (SLURM, Ray, torchrun) or kills '
                                       'the ranks of a multi-process run: '
                                       '`make system-check` runs these, `make test` the others; CI runs both')


# The system tests: those on the SLURM cluster or a Ray node (by their fixture or xdist group, so a new test there is
# one too) and the ones marked `system` by hand: a fit under torchrun (its elastic agent killing and restarting
# workers too), the ranks of a multi-process run killed or hung, AIToolbox's DDP script spawning fresh ranks.
_SYSTEM_FIXTURES = frozenset({'slurm_cluster'})
_SYSTEM_GROUPS = frozenset({'ray'})


def pytest_itemcollected(item):
    group = item.get_closest_marker('xdist_group')
    if _SYSTEM_FIXTURES & set(getattr(item, 'fixturenames', ())) or (group and group.args[0] in _SYSTEM_GROUPS):
        item.add_marker(pytest.mark.system)


@pytest.fixture(autouse=True)
def _ranks_from_a_warm_server(request, monkeypatch):
    """A fit(gpu_mode='ddp'/'fsdp') in a test forks its ranks from a server that imported torch once
    (tests/support/warm_ranks.py), except in the tests marked real_spawn."""
    if request.node.get_closest_marker('real_spawn') is None:
        import warm_ranks
        monkeypatch.setattr(torch.multiprocessing, 'start_processes', warm_ranks.start_processes)


# The files of the longest tests (the SLURM and Ray groups, the multi-process runs) start first: pytest-xdist hands
# out work in collection order, and a long test collected last leaves one worker finishing it while the other
# idles. The rest keeps its order.
_LONGEST_FIRST = ('distributed/test_slurm.py', 'docs/test_examples.py', 'distributed/test_ray.py',
                  'tuning/test_ray_backend.py', 'distributed/test_elastic.py', 'distributed/test_fsdp_checkpoints.py',
                  'distributed/test_fsdp.py', 'distributed/test_fsdp_defects.py', 'distributed/test_fsdp_callbacks.py',
                  'recipes/test_cli.py', 'distributed/test_ddp.py', 'callbacks/test_preemption.py',
                  'tuning/test_tune.py', 'compat/test_scripts.py', 'docs/test_docs.py')


@pytest.hookimpl(trylast=True)       # after pytest-xdist has marked the groups
def pytest_collection_modifyitems(config, items):
    _check_groups_are_kept(config, items)

    def rank(item):
        path = item.nodeid.split('::', 1)[0]
        return next((i for i, name in enumerate(_LONGEST_FIRST) if path == f'tests/{name}'), len(_LONGEST_FIRST))
    items.sort(key=rank)
