"""The startup hook of the venv the Makefile builds: torchvision (and torchmetrics) importable beside CPU torch.

    .venv/bin/python -m tools.cpu_torchvision

writes ``aitoolbox_like-torchvision-cpu.pth`` into the site-packages of the venv that runs it (the Makefile does,
after each install). Python runs that file's line at every start of the venv's interpreter: it loads
aitoolbox_like/runtime/_torchvision_compat.py of this checkout on its own (not the package, whose import loads torch) and
installs its import hook, which declares the two op schemas torchvision's CUDA build needs beside a CPU-only torch
when torchvision is first imported, and does nothing otherwise (aitoolbox_like/runtime/_torchvision_compat.py says why).
The line does nothing when that file is gone; deleting the .pth file removes the hook.
"""
import logging
import sys
import sysconfig
from pathlib import Path

HOOK_FILE = 'aitoolbox_like-torchvision-cpu.pth'
# The name the hook's copy of the module has in sys.modules: keeps it, and the schemas it declared, alive.
HOOK_MODULE = '_aitoolbox_like_torchvision_hook'
COMPAT_MODULE = Path(__file__).resolve().parents[1] / 'aitoolbox_like' / 'runtime' / '_torchvision_compat.py'

logger = logging.getLogger('tools.cpu_torchvision')


def hook_line(module_path: Path = COMPAT_MODULE) -> str:
    """The .pth line: one statement starting with ``import`` (the only kind of line site.py runs)."""
    return (f'import os, sys, importlib.util as u; p = {str(module_path)!r}; '
            f's = os.path.exists(p) and u.spec_from_file_location({HOOK_MODULE!r}, p); '
            f'm = s and u.module_from_spec(s); '
            f'm and (sys.modules.setdefault(s.name, m), s.loader.exec_module(m), m.install_import_hook())\n')


def install() -> Path:
    """Write the hook into this interpreter's site-packages; a venv's only, never a system Python's."""
    if sys.prefix == sys.base_prefix:
        raise SystemExit(f'{sys.executable} is not a virtual environment\'s python: the hook goes into a venv only')
    target = Path(sysconfig.get_paths()['purelib']) / HOOK_FILE
    target.write_text(hook_line())
    return target


def declare_torchvision_ops() -> None:
    """The hook's work done by hand in this process, for a script that may run outside the Makefile's venv
    (benchmarks/peers.py); in that venv the hook has done it already."""
    from aitoolbox_like.runtime._torchvision_compat import prepare_torchvision
    prepare_torchvision()


if __name__ == '__main__':
    logging.basicConfig(level=logging.INFO, format='%(message)s')
    logger.info('torchvision start-up hook: %s', install())
