"""The shipped example must keep working, keep learning, and resume with one argument."""
import glob
import os

import matplotlib.image
import pytest

from aitoolbox_like.checkpoint import load_checkpoint
from aitoolbox_like.adapters.ray import CHECKPOINT_FILE_NAME

from helpers import EXAMPLES_DIR, load_example


def test_digits_example_learns_writes_artifacts_and_resumes(tmp_path):
    digits = load_example('digits_cnn')
    out = str(tmp_path / 'out')
    first = digits.main(['--epochs', '4', '--output-dir', out])
    assert first.train_history['val_Accuracy'][-1] > 0.9
    [experiment] = glob.glob(os.path.join(out, 'digits', 'cnn_*'))
    assert glob.glob(os.path.join(experiment, 'checkpoint_model', '*.pth'))
    assert glob.glob(os.path.join(experiment, 'tensorboard', '*', 'events.out.tfevents.*'))
    for name in ('val_loss', 'val_Accuracy'):
        [png] = glob.glob(os.path.join(experiment, 'results', 'train_end_plots_epoch_3', f'{name}.png'))
        assert matplotlib.image.imread(png).shape[0] > 100

    resumed = digits.main(['--epochs', '5', '--output-dir', out, '--resume'])
    assert glob.glob(os.path.join(out, 'digits', 'cnn_*')) == [experiment]       # same experiment folder
    assert resumed.train_history.get_epochs('val_Accuracy') == [0, 1, 2, 3, 4]
    assert resumed.train_history['val_Accuracy'][:4] == first.train_history['val_Accuracy']


def _run_example_and_resume(name, project, tmp_path):
    example = load_example(name)
    out = str(tmp_path / 'out')
    first = example.main(['--epochs', '1', '--output-dir', out, '--batch-size', '128'])
    [experiment] = glob.glob(os.path.join(out, project, '*'))
    assert glob.glob(os.path.join(experiment, 'checkpoint_model', '*_E0.pth'))
    resumed = example.main(['--epochs', '2', '--output-dir', out, '--batch-size', '128', '--resume'])
    assert glob.glob(os.path.join(out, project, '*')) == [experiment]          # same experiment folder
    assert resumed.train_history.get_epochs('accumulated_loss') == [0, 1]
    assert resumed.train_history['accumulated_loss'][:1] == first.train_history['accumulated_loss']
    return resumed


def test_gan_example_trains_two_networks_and_resumes(tmp_path):
    loop = _run_example_and_resume('gan_digits', 'digits_gan', tmp_path)
    assert loop.train_history.get_epochs('accumulated_loss_generator') == [0, 1]
    assert loop.train_history.get_epochs('accumulated_loss_discriminator') == [0, 1]


def test_sam_example_learns_and_resumes(tmp_path):
    loop = _run_example_and_resume('sam_digits', 'digits_sam', tmp_path)
    assert loop.train_history['val_loss'][1] < loop.train_history['val_loss'][0]


@pytest.mark.timeout(600)
@pytest.mark.xdist_group('ray')         # one Ray cluster at a time (tests/distributed/test_ray.py)
def test_ray_train_example_learns_and_a_second_run_of_the_same_name_continues_it(tmp_path, monkeypatch, capfd,
                                                                                 quick_ray_train):
    import ray
    from ray.train import Checkpoint

    from aitoolbox_like.adapters.ray import QUIET_WORKER_LOGS_HOOK

    monkeypatch.setenv('OMP_NUM_THREADS', '1')      # inherited by Ray's workers
    # Ray's workers import the example's train_fn by its module name.
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join(p for p in (EXAMPLES_DIR, os.environ.get('PYTHONPATH')) if p))
    example = load_example('ray_train_digits')
    args = ['--storage-path', str(tmp_path / 'ray'), '--name', 'digits']
    # One local cluster for both runs (main leaves it running), started as the example starts its own.
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={'worker_process_setup_hook': QUIET_WORKER_LOGS_HOOK})
    try:
        first = example.main(['--epochs', '2'] + args)
        second = example.main(['--epochs', '3'] + args)
    finally:
        ray.shutdown()
    printed = ''.join(capfd.readouterr())
    # What the workers say reaches this console (Ray forwards it), without Ray Train's per-run chatter: the
    # placement-group cleaner's once-a-second "Failed to query ..." and every rank's every report.
    assert 'Epoch 1: accumulated_loss=' in printed
    assert 'Failed to query Ray Train Controller actor state' not in printed
    assert 'Reporting training result' not in printed
    assert first.metrics['epoch'] == 1 and first.metrics['val_Accuracy'] > 0.8
    assert second.metrics['epoch'] == 2 and second.metrics['val_Accuracy'] > 0.8

    def history(checkpoint: Checkpoint):
        with checkpoint.as_directory() as folder:
            return load_checkpoint(os.path.join(folder, CHECKPOINT_FILE_NAME))['train_history']['train_history']

    # The second run trained only epoch 2, on top of the first run's checkpoint.
    assert history(second.checkpoint)['val_Accuracy'][:2] == history(first.checkpoint)['val_Accuracy']
