"""Callbacks that read whole weights or gradients under FSDP (gpu_mode='fsdp', 2 gloo processes on CPU), SWA under
FSDP, the default shard policy and the torchrun path. Three multi-process runs: one carries every reporting callback
(with the default shard policy), one SWA with BatchNorm, one is launched by torchrun.

Runs are compared with the same training in one process over the same global batches (ddp_common's data: 8 samples
per optimizer step, 4 per rank on 2 ranks), or with the same arithmetic done by hand. Tolerance: weights, averages,
BatchNorm statistics and gradient statistics within rtol 1e-5, atol 1e-6; TensorBoard histograms' min, max, sum and
sum of squares within rtol 1e-5, atol 1e-5 (the sharded reductions add in another order than one process does).
Histogram bucket counts are not compared (a value on a bucket edge may fall either side)."""
import glob
import json
import os
import subprocess
import sys

import pytest
import torch
from torch.optim import swa_utils
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ddp_scripts'))

from aitoolbox_like.checkpoint import load_checkpoint               # noqa: E402
from aitoolbox_like.distributed import find_free_port               # noqa: E402
from aitoolbox_like.experiment import LATEST_POINTER, read_pointer  # noqa: E402
from ddp_common import regression_data                              # noqa: E402
from fsdp_callbacks_common import (MIN_NUM_PARAMS, BatchNormRegressor, SaveWholeWeightsAtEpochEnd,  # noqa: E402
                                   reporting_callbacks, swa, tracked_loop)
from fsdp_common import callbacks, reference                        # noqa: E402
from helpers import SHARDED_TOLERANCE, assert_close_states, one_thread_per_worker  # noqa: E402,F401  (fixture)
from fsdp_common import tracked_loop as fsdp_tracked_loop          # noqa: E402

pytest.importorskip('tensorboard')
pytest.importorskip('matplotlib')
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOLERANCE = SHARDED_TOLERANCE
SWA_KEY = 'StochasticWeightAveraging'


def load_rank_file(folder, name, rank=0):
    return torch.load(os.path.join(folder, f'{name}_rank{rank}.pt'), weights_only=False)


def latest_train_state(root):
    [name] = os.listdir(os.path.join(root, 'proj'))
    marker = read_pointer(os.path.join(root, 'proj', name), LATEST_POINTER)
    if marker.endswith('.metadata'):        # a sharded checkpoint: its train_state.pt holds the callbacks' state
        return load_checkpoint(os.path.join(os.path.dirname(marker), 'train_state.pt'))
    return load_checkpoint(marker)


def histograms(log_dir):
    """{tag: [(step, num, min, max, sum, sum_squares)]} of the one event file in ``log_dir``."""
    assert len(glob.glob(os.path.join(log_dir, 'events.out.tfevents.*'))) == 1     # written by one process
    acc = EventAccumulator(log_dir, size_guidance={'histograms': 0, 'scalars': 0})
    acc.Reload()
    return {tag: [(h.step, h.histogram_value.num, h.histogram_value.min, h.histogram_value.max,
                   h.histogram_value.sum, h.histogram_value.sum_squares) for h in acc.Histograms(tag)]
            for tag in acc.Tags()['histograms']}


def assert_same_histograms(got, expected):
    assert sorted(got) == sorted(expected)
    for tag in expected:
        assert [h[:2] for h in got[tag]] == [h[:2] for h in expected[tag]], tag      # steps and sizes
        torch.testing.assert_close(torch.tensor([h[2:] for h in got[tag]], dtype=torch.float64),
                                   torch.tensor([h[2:] for h in expected[tag]], dtype=torch.float64),
                                   rtol=1e-5, atol=1e-5, msg=tag)


@pytest.mark.timeout(240)
def test_whole_gradient_stats_plots_histograms_and_swa_under_fsdp_with_the_default_shard_policy(tmp_path, capfd):
    dirs = {name: tmp_path / name for name in ('fsdp', 'fsdp_out', 'single', 'single_out')}
    for folder in dirs.values():
        folder.mkdir()
    fsdp = tracked_loop(dirs['fsdp'])
    fsdp.fit(num_epochs=3, callbacks=reporting_callbacks(str(dirs['fsdp_out']), str(dirs['fsdp_out'] / 'tb')),
             num_gpus=2, on_gpu=False, fsdp_shard_fn=None, fsdp_min_num_params=MIN_NUM_PARAMS)
    fsdp_printed = capfd.readouterr().out
    single = tracked_loop(dirs['single'], gpu_mode='single', per_rank_batch=8)
    single.fit(num_epochs=3, callbacks=reporting_callbacks(str(dirs['single_out']), str(dirs['single_out'] / 'tb')))

    # The default policy: the big child is its own FSDP unit, then the root; the small children are not units.
    for rank in (0, 1):
        with open(dirs['fsdp_out'] / f'fsdp_units_rank{rank}.json') as f:
            assert json.load(f) == ['', 'body']
    # It trains as one process does, SWA included: the returned model holds the average of epochs 1 and 2, as the
    # single process's (torch's AveragedModel) does.
    assert_close_states(fsdp.model.state_dict(), single.model.state_dict())

    # Gradient statistics of the whole gradients, printed once per epoch by the main process only.
    expected_stats = load_rank_file(dirs['single_out'], 'grad_stats')
    got_stats = load_rank_file(dirs['fsdp_out'], 'grad_stats')
    assert len(got_stats) == 3 and all(len(epoch) == 3 for epoch in got_stats)
    for got_epoch, expected_epoch in zip(got_stats, expected_stats):
        for got, expected in zip(got_epoch, expected_epoch):
            assert got.keys() == expected.keys()
            torch.testing.assert_close(torch.tensor(list(got.values())), torch.tensor(list(expected.values())),
                                       **TOLERANCE)
    assert load_rank_file(dirs['fsdp_out'], 'grad_stats', rank=1) == [None, None, None]
    assert fsdp_printed.count('---> Model layers gradients stats') == 3

    # Gradient plots of the whole gradients, drawn by the main process only.
    got_plots, expected_plots = (load_rank_file(d, 'grad_plot') for d in (dirs['fsdp_out'], dirs['single_out']))
    for got_epoch, expected_epoch in zip(got_plots['gradients'], expected_plots['gradients'], strict=True):
        assert [g.shape for g in got_epoch] == [(64,), (256,), (16,)]
        for got, expected in zip(got_epoch, expected_epoch, strict=True):
            torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(expected), **TOLERANCE)
    assert len(got_plots['paths']) == 9 and all(os.path.isfile(p) for p in got_plots['paths'])
    assert load_rank_file(dirs['fsdp_out'], 'grad_plot', rank=1) == {'gradients': [None] * 3, 'paths': []}

    # TensorBoard histograms of the whole parameters and gradients, in one event file per callback.
    for name in ('histograms', 'full'):
        got = histograms(str(dirs['fsdp_out'] / 'tb' / name))
        expected = histograms(str(dirs['single_out'] / 'tb' / name))
        assert {'parameters/body.weight', 'gradients/body.weight', 'parameters/head.bias'} <= set(got)
        assert [h[0] for h in got['parameters/inp.weight']] == ([0, 1, 2] if name == 'histograms' else [0, 2])
        assert_same_histograms(got, expected)

    # SWA's checkpoint state is gathered whole, in AveragedModel's format, equal to the single process's ...
    fsdp_state, single_state = latest_train_state(dirs['fsdp']), latest_train_state(dirs['single'])
    assert_close_states(fsdp_state['callbacks'][SWA_KEY]['swa_model'], single_state['callbacks'][SWA_KEY]['swa_model'])
    assert fsdp_state['callbacks'][SWA_KEY]['swa_scheduler'] == single_state['callbacks'][SWA_KEY]['swa_scheduler']
    # ... and a single-process loop resumes it (2 -> 1) to where an uninterrupted run of 4 epochs ends.
    resumed = tracked_loop(dirs['fsdp'], gpu_mode='single', per_rank_batch=8)
    resumed.fit(num_epochs=4, callbacks=[swa()], resume_from='latest')
    uninterrupted = tracked_loop(tmp_path / 'uninterrupted', gpu_mode='single', per_rank_batch=8)
    uninterrupted.fit(num_epochs=4, callbacks=[swa()])
    assert_close_states(resumed.model.state_dict(), uninterrupted.model.state_dict())


def per_rank_batches(num_ranks=2, per_rank_batch=4):
    """The inputs each rank read in the 2-process run (DistributedSampler without shuffling: rank r takes samples r,
    r + 2, ...), every rank's batches in one list."""
    x, _ = regression_data(32, 1).tensors
    return [x[r::num_ranks][i:i + per_rank_batch] for r in range(num_ranks)
            for i in range(0, 32 // num_ranks, per_rank_batch)]


@pytest.mark.timeout(180)
def test_swa_under_fsdp_averages_the_sharded_weights_and_updates_batchnorm_over_every_process(tmp_path):
    out = tmp_path / 'out'
    out.mkdir()
    loop = tracked_loop(tmp_path / 'run', model_cls=BatchNormRegressor)
    loop.fit(num_epochs=3, callbacks=[swa(), SaveWholeWeightsAtEpochEnd(str(out))], num_gpus=2, on_gpu=False)

    # The average of the weights at the ends of epochs 1 and 2 (swa_start_epoch=1), in every rank and in the model
    # fit returns.
    recorded = [load_rank_file(out, 'weights', rank) for rank in (0, 1)]
    epoch_ends = recorded[0]['epoch_end']
    average = {name: (epoch_ends[1][name] + epoch_ends[2][name]) / 2 for name in epoch_ends[0]}
    for rank in (0, 1):
        assert_close_states(recorded[rank]['final'], average)
    assert_close_states({name: p.detach() for name, p in loop.model.named_parameters()}, average)
    assert not torch.allclose(average['inp.weight'], epoch_ends[2]['inp.weight'])

    # update_bn ran on each rank's share of the data and the statistics were averaged over the ranks: equal on both,
    # and equal to update_bn over every rank's batches in one process.
    expected = BatchNormRegressor()
    expected.load_state_dict(average, strict=False)
    swa_utils.update_bn(DataLoader(per_rank_batches(), batch_size=None), expected)
    for rank in (0, 1):
        for stat in ('running_mean', 'running_var'):
            torch.testing.assert_close(recorded[rank][stat], getattr(expected.norm, stat), **TOLERANCE)
    torch.testing.assert_close(loop.model.norm.running_mean, expected.norm.running_mean, **TOLERANCE)

    # The checkpoint of epoch 2 holds the average gathered whole, in AveragedModel's format.
    state = latest_train_state(tmp_path / 'run')['callbacks'][SWA_KEY]['swa_model']
    assert int(state['n_averaged']) == 2
    assert_close_states({k[len('module.'):]: v for k, v in state.items() if k[len('module.'):] in average}, average)


@pytest.mark.system
@pytest.mark.timeout(240)
def test_fsdp_under_torchrun_trains_like_one_process_and_its_sharded_checkpoint_resumes_in_one(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get('PYTHONPATH')])))
    script = os.path.join(REPO_ROOT, 'tests', 'distributed', 'ddp_scripts', 'fsdp_torchrun_fit.py')
    proc = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2',
                           f'--master_port={find_free_port()}', script, str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    ref_model, _ = reference(2)
    assert_close_states(torch.load(tmp_path / 'weights.pt'), ref_model.state_dict())
    # The histograms (run on every rank, written by rank 0 alone) are of the whole 8 x 4 weight, not of a shard.
    written = histograms(str(tmp_path / 'tb'))
    assert [h[:2] for h in written['parameters/net.0.weight']] == [(0, 32), (1, 32)]
    torch.testing.assert_close(written['parameters/net.0.weight'][-1][4], ref_model.net[0].weight.sum().item(),
                               rtol=1e-5, atol=1e-5)

    # The sharded checkpoint of epoch 1 resumes in a single-process loop to where one process gets in 3 epochs.
    single = fsdp_tracked_loop(tmp_path, gpu_mode='single', per_rank_batch=8)
    single.fit(num_epochs=3, callbacks=callbacks(), resume_from='latest')
    ref_model, ref_ema = reference(3)
    assert_close_states(single.model.state_dict(), ref_model.state_dict())
    assert_close_states(single.callbacks_handler.callbacks_state_dict()['ExponentialMovingAverage_0.9']['ema'],
                        ref_ema)
