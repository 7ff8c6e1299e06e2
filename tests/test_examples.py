"""The shipped example must keep working, keep learning, and resume with one argument."""
import glob
import importlib.util
import os

import matplotlib.image

EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'examples')


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES_DIR, f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_digits_example_learns_writes_artifacts_and_resumes(tmp_path):
    digits = load_example('digits_cnn')
    out = str(tmp_path / 'out')
    first = digits.main(['--epochs', '4', '--output-dir', out])
    assert first.train_history['val_Accuracy'][-1] > 0.9
    [experiment] = glob.glob(os.path.join(out, 'digits', 'cnn_*'))
    assert glob.glob(os.path.join(experiment, 'checkpoint_model', '*.pth'))
    assert glob.glob(os.path.join(experiment, 'tensorboard', '*', 'events.out.tfevents.*'))
    for name in ('loss', 'val_Accuracy'):
        [png] = glob.glob(os.path.join(experiment, 'results', 'train_end_plots_epoch_3', f'{name}.png'))
        assert matplotlib.image.imread(png).shape[0] > 100

    resumed = digits.main(['--epochs', '5', '--output-dir', out, '--resume'])
    assert glob.glob(os.path.join(out, 'digits', 'cnn_*')) == [experiment]       # same experiment folder
    assert resumed.train_history.get_epochs('val_Accuracy') == [0, 1, 2, 3, 4]
    assert resumed.train_history['val_Accuracy'][:4] == first.train_history['val_Accuracy']
