"""The shipped example must keep working and keep learning."""
import importlib.util
import os

EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'examples')


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES_DIR, f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_digits_example_reaches_90_percent_validation_accuracy(tmp_path):
    digits = load_example('digits_cnn')
    train_loop = digits.main(['--epochs', '5', '--output-dir', str(tmp_path / 'out')])
    assert train_loop.train_history['val_accuracy'][-1] > 0.9
