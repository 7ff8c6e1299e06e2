"""What a user meets in the venv the Makefile builds (README, Install; the torchvision hook: CONTRIBUTING.md), each in
a fresh interpreter of that venv started as a user starts one (not the tests' zygote, nothing of the tests loaded): torchvision and torchmetrics
import, with the torchvision CUDA build the package index offers beside CPU torch; the library prepares torchvision
itself where no start-up hook runs; a missing or broken torchvision / torchmetrics is named with what to install;
the SG adapter's save_image draws the same grid with Pillow when torchvision is not there."""
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]

# Prepended to a child's code: the named top-level modules behave as not installed.
NOT_INSTALLED = '''
import sys


class NotInstalled:
    def __init__(self, names):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in self.names:
            raise ModuleNotFoundError(f'No module named {name!r}', name=name)
        return None


sys.meta_path.insert(0, NotInstalled(NAMES))
'''

# Prepended to a child's code started with -S: the venv's site-packages and this checkout on sys.path, as site.py
# would put them, but no .pth file run (so no start-up hook, and the checkout instead of the editable finder).
WITHOUT_START_UP_HOOK = f'''
import sys
sys.path[:0] = [{str(ROOT)!r}]
sys.path.append({sysconfig.get_paths()['purelib']!r})
'''


def run_python(code, *args, cwd, env=None):
    """A fresh interpreter of this venv, as a user starts one; its last line of output, parsed as JSON."""
    if env is None:
        env = {name: value for name, value in os.environ.items() if name != 'PYTHONPATH'}
    done = subprocess.run([sys.executable, *args, '-c', textwrap.dedent(code)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


USER_CODE = '''
import json
import sys

from torchmetrics import Accuracy
import torch
import torchvision
from torchvision.transforms import v2

accuracy = Accuracy(task='multiclass', num_classes=3)(torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 1, 2]))
augmented = v2.Compose([v2.RandomHorizontalFlip(p=1.0), v2.Resize(4)])(torch.arange(64.).view(1, 8, 8))
grid = torchvision.utils.make_grid(torch.rand(5, 3, 8, 8), nrow=2)
print(json.dumps({'accuracy': accuracy.item(), 'augmented': list(augmented.shape), 'grid': list(grid.shape),
                  'flipped': bool(torch.equal(v2.RandomHorizontalFlip(p=1.0)(torch.arange(4.).view(1, 1, 4)),
                                              torch.tensor([[[3., 2., 1., 0.]]]))),
                  'package_loaded': [m for m in sys.modules if m.startswith('aitoolbox_like')]}))
'''


def test_torchmetrics_and_torchvision_import_in_a_fresh_interpreter_of_the_venv(tmp_path):
    # What README's `make test` / `make demo` venv promises a user's own script, before (and without) this package.
    seen = run_python(USER_CODE, cwd=tmp_path)
    assert seen == {'accuracy': 0.75, 'augmented': [1, 4, 4], 'grid': [3, 32, 22], 'flipped': True,
                    'package_loaded': []}


def test_where_no_start_up_hook_runs_torchvision_fails_and_the_library_prepares_it_itself(tmp_path):
    # A venv of the user's own (pip install -e '.[vision,metrics]' beside CPU torch, no Makefile): torchvision's own
    # import fails there; the library's callbacks that draw with it (SaveBatchImages, the SG adapter's save_image)
    # make it importable before they import it, for the rest of the process.
    plain = subprocess.run([sys.executable, '-S', '-c', WITHOUT_START_UP_HOOK + 'import torchvision'],
                           cwd=tmp_path, capture_output=True, text=True, timeout=180)
    if plain.returncode == 0:
        pytest.skip('torchvision here is a build for this torch: nothing to prepare')
    assert 'operator torchvision::nms does not exist' in plain.stderr, plain.stderr[-3000:]

    seen = run_python(WITHOUT_START_UP_HOOK + '''
import json
import torch
from aitoolbox_like.callbacks.visualization import SaveBatchImages
from aitoolbox_like.results.basic import TorchMetricsPackage
SaveBatchImages()
import torchvision.utils
from torchmetrics import Accuracy
package = TorchMetricsPackage({'accuracy': Accuracy(task='binary')})
print(json.dumps({'collection': type(package.metric).__name__,
                  'grid': list(torchvision.utils.make_grid(torch.rand(2, 1, 8, 8)).shape),
                  'accuracy': Accuracy(task='binary')(torch.tensor([1, 0]), torch.tensor([1, 1])).item()}))
''', '-S', cwd=tmp_path)
    assert seen == {'collection': 'MetricCollection', 'grid': [3, 12, 22], 'accuracy': 0.5}


def test_a_missing_torchvision_or_torchmetrics_is_named_with_the_extra_that_installs_it(tmp_path):
    seen = run_python(NOT_INSTALLED.replace('NAMES', repr({'torchvision', 'torchmetrics'})) + '''
import json
from aitoolbox_like.callbacks.visualization import SaveBatchImages
from aitoolbox_like.results.basic import AccuracyMetric, TorchMetricsPackage
errors = {}
for name, make in [('SaveBatchImages', SaveBatchImages), ('TorchMetricsPackage', lambda: TorchMetricsPackage([AccuracyMetric]))]:
    try:
        make()
    except ImportError as exc:
        errors[name] = [type(exc).__name__, str(exc)]
print(json.dumps(errors))
''', cwd=tmp_path)
    assert seen == {
        'SaveBatchImages': ['ImportError', 'SaveBatchImages needs torchvision: pip install aitoolbox_like[vision]'],
        'TorchMetricsPackage': ['ImportError',
                                'TorchMetricsPackage needs torchmetrics: pip install aitoolbox_like[metrics]']}


def test_a_torchvision_that_fails_to_import_is_reported_as_installed_but_broken(tmp_path):
    # A torchvision built for another torch, as this venv's would be without its start-up hook: its import raises.
    env = dict(os.environ, PYTHONPATH=broken_torchvision(tmp_path))
    seen = run_python('''
import json
from aitoolbox_like.callbacks.visualization import SaveBatchImages
from aitoolbox_like.results.basic import AccuracyMetric, TorchMetricsPackage
errors = {}
for name, make in [('SaveBatchImages', SaveBatchImages), ('TorchMetricsPackage', lambda: TorchMetricsPackage([AccuracyMetric]))]:
    try:
        make()
    except ImportError as exc:
        errors[name] = str(exc)
print(json.dumps(errors))
''', cwd=tmp_path, env=env)
    assert seen['SaveBatchImages'] == ('torchvision is installed but cannot be imported (operator torchvision::nms '
                                       'does not exist); install the torchvision build that matches your torch')
    assert seen['TorchMetricsPackage'].startswith('torchmetrics is installed but failed to import (RuntimeError: '
                                                  'operator torchvision::nms does not exist). This usually means a '
                                                  'torch extension package (often torchvision) does not match')


SAVE_IMAGES = '''
import json
import sys
import torch
from aitoolbox_like.adapters.supergradients import save_image
torch.manual_seed(0)
save_image(torch.rand(5, 3, 8, 8), 'colour.png', nrow=2)
save_image(torch.randn(4, 1, 6, 6) * 3, 'grey_normalized.png', nrow=3, padding=1, normalize=True)
save_image(torch.rand(3, 7, 5), 'one.png')
print(json.dumps({'torchvision_loaded': 'torchvision' in sys.modules}))
'''


def broken_torchvision(folder):
    """A folder for PYTHONPATH whose torchvision raises on import, as a build for another torch does."""
    stub = folder / 'stub' / 'torchvision'
    stub.mkdir(parents=True)
    (stub / '__init__.py').write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    return str(stub.parent)


@pytest.mark.parametrize('torchvision_is', ['not installed', 'broken'])
def test_sg_save_image_without_torchvision_draws_torchvision_s_grid_with_pillow(tmp_path, torchvision_is):
    with_torchvision, with_pillow = tmp_path / 'torchvision', tmp_path / 'pillow'
    with_torchvision.mkdir()
    with_pillow.mkdir()
    assert run_python(SAVE_IMAGES, cwd=with_torchvision) == {'torchvision_loaded': True}
    if torchvision_is == 'not installed':
        assert run_python(NOT_INSTALLED.replace('NAMES', repr({'torchvision'})) + SAVE_IMAGES, cwd=with_pillow) == \
            {'torchvision_loaded': False}
    else:
        assert run_python(SAVE_IMAGES, cwd=with_pillow, env=dict(os.environ, PYTHONPATH=broken_torchvision(
            tmp_path))) == {'torchvision_loaded': False}
    for name, shape in [('colour.png', (2 + 3 * 10, 2 + 2 * 10, 3)), ('grey_normalized.png', (1 + 2 * 7, 1 + 3 * 7, 3)),
                        ('one.png', (7, 5, 3))]:
        expected = np.asarray(Image.open(with_torchvision / name))
        drawn = np.asarray(Image.open(with_pillow / name))
        assert expected.shape == shape
        assert np.array_equal(drawn, expected), name
