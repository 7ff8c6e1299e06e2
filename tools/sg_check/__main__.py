"""make sg-check: SuperGradients' own callback classes, with only their import lines changed, run on the TrainLoop
through aitoolbox_like.adapters.supergradients, against what SG's own unit tests expect.

    python -m tools.sg_check [--min-classes N] [--min-expectations K] [--keep]

Downloads the pinned super-gradients wheel (pip download --no-deps: nothing installed), finds its callback
classes, rewrites the import lines of their modules and of SG's drawing helpers they use (rewrite.py), imports the
copies and runs the scenarios (scenarios.py, drawing_scenarios.py). The last line printed is "N of M SG callback
classes run; K of L SG expectations hold"; the exit status is 1 when N or K is below the given minimum.
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
from typing import Dict, List

from .. import callback_check
from . import wheel as wheel_files
from .rewrite import Rewriter
from .scenarios import NOT_RUN, Scenarios, kill_and_resume
from .tally import Tally
from .trainer import Trainer, sg_default_training_params

PACKAGE = 'sg_callbacks'
# SG's modules of plain data that the callback modules import; copied unchanged.
DATA_MODULES = {'super_gradients.common.object_names': 'object_names',
                'super_gradients.common.sg_loggers.time_units': 'time_units'}
# SG's own helpers the visualisation callbacks draw with (OpenCV and NumPy code, in the same wheel): copied with their
# import lines rewritten as the callback modules' are, so those callbacks run with SG's drawing code (what those
# helpers import from torchvision is stand_ins' equivalent when torchvision does not import here).
HELPER_MODULES = {
    'super_gradients.training.utils.detection_utils': 'detection_utils',
    'super_gradients.training.utils.segmentation_utils': 'segmentation_utils',
    'super_gradients.training.utils.visualization.detection': 'visualization_detection',
    'super_gradients.training.utils.visualization.utils': 'visualization_utils',
    'super_gradients.training.utils.visualization.pose_estimation': 'visualization_pose_estimation',
    'super_gradients.training.datasets.data_formats.bbox_formats.xywh': 'bbox_xywh',
    'super_gradients.training.utils.pose_estimation.dekr_decode_callbacks': 'dekr_decode_callbacks',
}


def dotted(path: str) -> str:
    return path[:-len('.py')].replace('/', '.')


def write_copies(sources: Dict[str, str], modules: List[wheel_files.CallbackModule], folder: Path) -> List[str]:
    """The rewritten callback modules, SG's data modules and SG's rewritten helper modules as the package
    ``sg_callbacks`` in ``folder``; returns a report line per rewritten import."""
    package = folder / PACKAGE
    package.mkdir()
    (package / '__init__.py').write_text('')
    copies = {name: f'{PACKAGE}.{stem}' for name, stem in {**DATA_MODULES, **HELPER_MODULES}.items()}
    copies.update({dotted(module.path): f'{PACKAGE}.{module.stem}' for module in modules})
    defined = {}
    for module in modules:
        for name in _top_level_names(module.source):
            defined.setdefault(name, f'{PACKAGE}.{module.stem}')
    rewriter = Rewriter(copies, defined)
    report = []
    for name, stem in DATA_MODULES.items():
        (package / f'{stem}.py').write_text(sources[name.replace('.', '/') + '.py'])
    rewritten = [(module.path, module.stem, module.source) for module in modules]
    rewritten += [(name.replace('.', '/') + '.py', stem, sources[name.replace('.', '/') + '.py'])
                  for name, stem in HELPER_MODULES.items()]
    for path, stem, source in rewritten:
        text, edits = rewriter.rewrite(source)
        (package / f'{stem}.py').write_text(text)
        report += [f'  {path}:{line}: {new}' for line, new in edits]
    return report


def _top_level_names(source: str) -> List[str]:
    import ast
    return [node.name for node in ast.parse(source).body
            if isinstance(node, (ast.ClassDef, ast.FunctionDef))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--min-classes', type=int, default=0, help='fail when fewer SG callback classes run')
    parser.add_argument('--min-expectations', type=int, default=0, help='fail when fewer SG expectations hold')
    parser.add_argument('--cache', type=Path, default=wheel_files.default_cache(), help='where the wheel is kept')
    parser.add_argument('--keep', action='store_true', help='keep the rewritten modules (their folder is printed)')
    parser.add_argument('--show-imports', action='store_true', help='print every rewritten import line')
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(name)s: %(message)s')
    started = time.monotonic()
    import torch
    torch.set_num_threads(1)    # tiny tensors: more threads only add overhead (and the cores may be shared)

    wheel = wheel_files.fetch_wheel(args.cache)
    sources = wheel_files.read_sources(wheel)
    modules = wheel_files.find_callback_modules(sources)
    classes = [(module, name) for module in modules for name in module.classes]
    print(f'super-gradients {wheel_files.SG_VERSION}: {len(classes)} callback classes in {len(modules)} modules')

    folder = Path(tempfile.mkdtemp(prefix='rewritten-', dir=args.cache))
    try:
        edits = write_copies(sources, modules, folder)
        print(f'{len(edits)} import statements rewritten, nothing else changed' + (':' if args.show_imports else ''))
        if args.show_imports:
            print('\n'.join(edits))
        sys.path.insert(0, str(folder))
        adapter = importlib.import_module('aitoolbox_like.adapters.supergradients')
        imported, import_errors = {}, {}
        for module in modules:
            try:
                imported[module.stem] = importlib.import_module(f'{PACKAGE}.{module.stem}')
            except Exception as exc:
                import_errors[module.stem] = f'its module does not import: {type(exc).__name__}: {exc}'
        tally = Tally({f'{PACKAGE}.{module.stem}' for module in modules})
        if 'callbacks' in imported:
            sg = types.SimpleNamespace(**imported)
            trainer = Trainer(sg, adapter, sg_default_training_params(sources))
            scenarios = Scenarios(sg, adapter, trainer, tally, rewritten=folder)
            scenarios.run_all()
            kill_and_resume(scenarios)
        return callback_check.report('SG', 'sg-check', "SG unit tests' expectations", classes, tally,
                                     NOT_RUN, import_errors, args.min_classes, args.min_expectations, started)
    finally:
        if args.keep:
            print(f'rewritten modules kept in {folder / PACKAGE}')
        else:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
