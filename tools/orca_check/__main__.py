"""make orca-check: BigDL Orca 2.4.0's own PyTorch callback classes, with only their import lines changed, run on
the TrainLoop through aitoolbox_like.adapters.orca, against what Orca's own tests expect.

    python -m tools.orca_check [--min-classes N] [--min-expectations K] [--keep]

Downloads the pinned bigdl-orca wheel (pip download --no-deps: nothing installed, nothing of BigDL imported), finds
its callback classes, rewrites the import lines of their modules (rewrite.py), imports the copies and runs the
scenarios (scenarios.py). The last line printed is "N of M Orca callback classes run; K of L Orca expectations
hold"; the exit status is 1 when N or K is below the given minimum.
"""
import argparse
import importlib
import logging
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, List

from .. import callback_check
from . import wheel as wheel_files
from .rewrite import Rewriter
from .scenarios import NOT_RUN, Scenarios, builtins_against_the_wheel, kill_and_resume, orca22_callbacks
from .tally import Tally

PACKAGE = 'orca_callbacks'


def dotted(path: str) -> str:
    return path[:-len('.py')].replace('/', '.')


def write_copies(modules: List[wheel_files.CallbackModule], folder: Path, name: str = PACKAGE) -> List[str]:
    """The rewritten callback modules as the package ``name`` (``orca_callbacks``) in ``folder``; returns a report
    line per rewritten import."""
    package = folder / name
    package.mkdir()
    (package / '__init__.py').write_text('')
    rewriter = Rewriter({dotted(module.path): f'{name}.{module.stem}' for module in modules})
    report = []
    for module in modules:
        text, edits = rewriter.rewrite(module.source)
        (package / f'{module.stem}.py').write_text(text)
        report += [f'  {module.path}:{line}: {new}' for line, new in edits]
    return report


def _orca22(cache: Path, folder: Path) -> Any:
    """Orca 2.2.0's callback modules, rewritten as Orca 2.4.0's are, imported (``orca22_callbacks``)."""
    wheel = wheel_files.fetch_wheel22(cache)
    modules = wheel_files.find_callback_modules(wheel_files.read_sources(wheel))
    write_copies(modules, folder, 'orca22_callbacks')
    imported = {}
    for module in modules:
        imported[module.stem] = importlib.import_module(f'orca22_callbacks.{module.stem}')
    return types.SimpleNamespace(**imported)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--min-classes', type=int, default=0, help='fail when fewer Orca callback classes run')
    parser.add_argument('--min-expectations', type=int, default=0, help='fail when fewer Orca expectations hold')
    parser.add_argument('--cache', type=Path, default=wheel_files.default_cache(), help='where the wheel is kept')
    parser.add_argument('--keep', action='store_true', help='keep the rewritten modules (their folder is printed)')
    parser.add_argument('--show-imports', action='store_true', help='print every rewritten import line')
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(name)s: %(message)s')
    started = time.monotonic()
    import torch
    torch.set_num_threads(1)    # tiny tensors: more threads only add overhead (and the cores may be shared)

    wheel = wheel_files.fetch_wheel(args.cache)
    modules = wheel_files.find_callback_modules(wheel_files.read_sources(wheel))
    classes = [(module, name) for module in modules for name in module.classes]
    print(f'bigdl-orca {wheel_files.ORCA_VERSION}: {len(classes)} callback classes in {len(modules)} modules')

    args.cache.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix='rewritten-', dir=args.cache))
    try:
        edits = write_copies(modules, folder)
        print(f'{len(edits)} import statements rewritten, nothing else changed' + (':' if args.show_imports else ''))
        if args.show_imports:
            print('\n'.join(edits))
        sys.path.insert(0, str(folder))
        adapter = importlib.import_module('aitoolbox_like.adapters.orca')
        imported, import_errors = {}, {}
        for module in modules:
            try:
                imported[module.stem] = importlib.import_module(f'{PACKAGE}.{module.stem}')
            except Exception as exc:
                import_errors[module.stem] = f'its module does not import: {type(exc).__name__}: {exc}'
        tally = Tally({f'{PACKAGE}.{module.stem}' for module in modules})
        if 'maincallback' in imported:
            work = tempfile.mkdtemp(prefix='runs-', dir=folder)
            scenarios = Scenarios(types.SimpleNamespace(**imported), adapter, tally, work)
            scenarios.run_all()
            builtins_against_the_wheel(scenarios)
            orca22_callbacks(scenarios, _orca22(args.cache, folder))
            kill_and_resume(scenarios, folder)
        return callback_check.report('Orca', 'orca-check', "Orca tests' expectations (check: the check's own)",
                                     classes, tally, NOT_RUN, import_errors, args.min_classes,
                                     args.min_expectations, started)
    finally:
        if args.keep:
            print(f'rewritten modules kept in {folder / PACKAGE}')
        else:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
