"""FSDP2 (gpu_mode='fsdp') on CPU: 2 processes, gloo. Few tests, each a whole run a user relies on: training equal
to one process over the same global batches, sharded checkpoints (DCP) that resume exactly after kill -9, on
another number of processes (2 -> 1, 1 -> 2), and a whole-model export that loads into a plain module.

Tolerance: weights and EMA within rtol 1e-5, atol 1e-6 of the single-process reference (the sharded reductions
sum in another order than one process does)."""
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ddp_scripts'))

from aitoolbox_like.checkpoint import load_checkpoint              # noqa: E402
from aitoolbox_like.experiment import LATEST_POINTER, read_pointer  # noqa: E402
from helpers import assert_close_states, experiment_dir, one_thread_per_worker  # noqa: E402,F401  (fixture)
from ddp_common import Regressor                                   # noqa: E402
from fsdp_common import callbacks, reference, shard_each_layer, tracked_loop  # noqa: E402
from fsdp_checkpoint_common import continued_loop                  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FSDP = dict(num_gpus=2, on_gpu=False, fsdp_shard_fn=shard_each_layer)
EMA_KEY = 'ExponentialMovingAverage_0.9'


def latest_checkpoint_state(root):
    """The train state the latest pointer names (a sharded checkpoint's train_state.pt)."""
    marker = read_pointer(experiment_dir(root), LATEST_POINTER)
    return marker, load_checkpoint(os.path.join(os.path.dirname(marker), 'train_state.pt'))


@pytest.mark.timeout(180)
@pytest.mark.real_spawn        # fresh interpreters, as a script's fit starts them (not tests/support/warm_ranks.py)
def test_fsdp_trains_like_one_process_exports_whole_model_and_resumes_in_one_process(tmp_path):
    loop = tracked_loop(tmp_path, end_save=True)
    model = loop.model
    returned = loop.fit(num_epochs=2, callbacks=callbacks(), **FSDP)

    ref_model, ref_ema = reference(2)
    # The caller's own model comes back trained and unsharded, with the optimizer state (momentum) of the run.
    assert returned is model and not any(type(t).__name__ == 'DTensor' for t in model.state_dict().values())
    assert_close_states(model.state_dict(), ref_model.state_dict())
    assert len(loop.optimizer.state_dict()['state']) == 4

    # Sharded checkpoints: one folder per epoch, each rank's shards, DCP's metadata; the pointer names the marker.
    folder = experiment_dir(tmp_path)
    names = sorted(os.listdir(os.path.join(folder, 'checkpoint_model')))
    assert [n for n in names if n.endswith('.dcp')] == [f'model_exp_{loop.experiment_timestamp}_E{e}.dcp'
                                                          for e in (0, 1)]
    assert not [n for n in names if n.endswith('.tmp')]
    marker, state = latest_checkpoint_state(tmp_path)
    assert marker.endswith('_E1.dcp/.metadata')
    assert sorted(os.listdir(os.path.dirname(marker))) == ['.metadata', '__0_0.distcp', '__1_0.distcp',
                                                           'train_state.pt']
    assert_close_states(state['callbacks'][EMA_KEY]['ema'], ref_ema)       # the EMA gathered from both shards

    # The final export is one whole file (gathered to rank 0) that loads into a plain module.
    [export] = os.listdir(os.path.join(folder, 'model'))
    exported = load_checkpoint(os.path.join(folder, 'model', export))
    plain = Regressor()
    plain.load_state_dict(exported['model_state_dict'])
    assert_close_states(plain.state_dict(), ref_model.state_dict())

    # 2 -> 1: a single-process loop of the same experiment resumes the sharded checkpoint (DCP reshards).
    single = tracked_loop(tmp_path, gpu_mode='single', per_rank_batch=8)
    single.fit(num_epochs=3, callbacks=callbacks(), resume_from='latest')
    ref_model, ref_ema = reference(3)
    assert_close_states(single.model.state_dict(), ref_model.state_dict())
    assert_close_states(single.callbacks_handler.callbacks_state_dict()[EMA_KEY]['ema'], ref_ema)
    assert single.train_history.get_epochs('val_loss') == [0, 1, 2]

    # AIToolbox's way: ModelLoadContinueTraining on a plain loop continues from epoch 0's sharded checkpoint.
    loop, loader = continued_loop(tmp_path, loop.experiment_timestamp, epoch_num=0)
    loop.fit(num_epochs=2, callbacks=[loader] + callbacks())
    ref_model, ref_ema = reference(2)
    assert_close_states(loop.model.state_dict(), ref_model.state_dict())
    assert_close_states(loop.callbacks_handler.callbacks_state_dict()[EMA_KEY]['ema'], ref_ema)
    assert loader.loaded_from.endswith('_E0.dcp/.metadata')


@pytest.mark.system
@pytest.mark.timeout(240)
def test_fsdp_kill_9_then_resume_is_exact(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get('PYTHONPATH')])))
    script = os.path.join(REPO_ROOT, 'tests', 'distributed', 'ddp_scripts', 'fsdp_kill_script.py')
    # 4 global batches per epoch: batch 9 is the second of epoch 2, after the checkpoints of epochs 0 and 1.
    proc = subprocess.run([sys.executable, script, str(tmp_path), '9'], env=env, capture_output=True, text=True,
                          timeout=150, start_new_session=True)
    assert proc.returncode == -9, proc.stdout[-3000:] + proc.stderr[-3000:]
    marker, state = latest_checkpoint_state(tmp_path)
    assert marker.endswith('_E1.dcp/.metadata') and state['loop']['epochs_completed'] == 2

    resumed = tracked_loop(tmp_path)
    resumed.fit(num_epochs=3, callbacks=callbacks(), resume_from='latest', **FSDP)
    ref_model, ref_ema = reference(3)
    assert_close_states(resumed.model.state_dict(), ref_model.state_dict())
    _, state = latest_checkpoint_state(tmp_path)
    assert state['loop']['epochs_completed'] == 3
    assert_close_states(state['callbacks'][EMA_KEY]['ema'], ref_ema)
    assert resumed.train_history.get_epochs('val_loss') == [0, 1, 2]
    assert len(os.listdir(os.path.join(tmp_path, 'proj'))) == 1          # the same experiment folder


@pytest.mark.timeout(240)
def test_fsdp_checkpoint_of_one_process_resumes_on_two(tmp_path):
    # 1 -> 2: an FSDP run of one process (batches of 8) checkpoints epoch 0; two processes (4 each) go on.
    first = tracked_loop(tmp_path, per_rank_batch=8)
    first.fit(num_epochs=1, callbacks=callbacks(), **dict(FSDP, num_gpus=1))
    marker, _ = latest_checkpoint_state(tmp_path)
    assert sorted(os.listdir(os.path.dirname(marker))) == ['.metadata', '__0_0.distcp', 'train_state.pt']

    resumed = tracked_loop(tmp_path)
    resumed.fit(num_epochs=3, callbacks=callbacks(), resume_from='latest', **FSDP)
    ref_model, ref_ema = reference(3)
    assert_close_states(resumed.model.state_dict(), ref_model.state_dict())
    _, state = latest_checkpoint_state(tmp_path)
    assert_close_states(state['callbacks'][EMA_KEY]['ema'], ref_ema)
