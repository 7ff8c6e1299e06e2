"""DistributedDataParallel on CPU: 2 processes, gloo. Each spawn costs seconds, so the tests are few and each
checks what a user relies on: same weights as one process over the same global batches, callbacks running
where they are told to, predictions gathered in dataset order, early stopping agreed, no hang."""
import os
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ddp_scripts'))

from aitoolbox_like import TrainLoop                                   # noqa: E402
from aitoolbox_like.callbacks.ddp import InMultiProcessDataLoad         # noqa: E402
from aitoolbox_like.engine.launch import DDPWorkerError                   # noqa: E402
from aitoolbox_like.distributed import distribute_loader, find_free_port  # noqa: E402
from ddp_common import (MarkRun, PredictOnRankZero, Regressor, SaveFinalWeights,  # noqa: E402
                        SaveMicroBatchGradients, SavePredictions, StopOnRank, build_validation_loader,
                        equivalence_setup, reference_loader, regression_data)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DDP = dict(num_gpus=2, on_gpu=False)


@pytest.fixture(autouse=True)
def _one_thread_per_worker(monkeypatch):
    monkeypatch.setenv('OMP_NUM_THREADS', '1')      # inherited by the spawned processes


def single_process_reference(num_epochs=2, grad_accumulation=2):
    """The same model trained by hand in one process on the global batches (both ranks' batches of 4)."""
    model, _, _, optimizer = equivalence_setup()
    criterion = nn.MSELoss()
    loader = reference_loader()
    for _ in range(num_epochs):
        for i, (x, y) in enumerate(loader):
            (criterion(model(x), y) / grad_accumulation).backward()
            if (i + 1) % grad_accumulation == 0 or i == len(loader) - 1:
                optimizer.step()
                optimizer.zero_grad()
    return model


def mse(model, dataset):
    x, y = dataset.tensors
    with torch.no_grad():
        return nn.functional.mse_loss(model(x), y).item()


def assert_close_states(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
@pytest.mark.real_spawn        # fresh interpreters, as a script's fit starts them (not tests/support/warm_ranks.py)
def test_spawn_trains_like_one_process_and_returns_the_model(tmp_path):
    out = str(tmp_path)
    model, train, val, optimizer = equivalence_setup()
    # Sample-weighted losses: over the whole data set they equal the single-process values, whatever the split (the
    # training set's too, evaluated as AIToolbox did).
    loop = TrainLoop(model, train, val, None, optimizer, nn.MSELoss(), gpu_mode='ddp', eval_loss_weighting='sample',
                     eval_train_set=True)
    returned = loop.fit(num_epochs=2, grad_accumulation=2, callbacks=[
        SaveFinalWeights(out), SaveMicroBatchGradients(out),
        MarkRun('everywhere', out), MarkRun('rank0only', out, device_idx_execution=0)], **DDP)

    w0, w1 = (torch.load(tmp_path / f'weights_rank{r}.pt') for r in (0, 1))
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    reference = single_process_reference()
    assert_close_states(w0, reference.state_dict())
    # fit returns the caller's own model, trained (AIToolbox returned None in DDP mode).
    assert returned is model
    assert all(torch.equal(model.state_dict()[k], w0[k]) for k in w0)
    # History comes back too; losses are over the whole data set, not one rank's half.
    assert len(loop.train_history['loss']) == 2
    assert loop.train_history['loss'][-1] == pytest.approx(mse(reference, train.dataset), rel=1e-5)
    assert loop.train_history['val_loss'][-1] == pytest.approx(mse(reference, val.dataset), rel=1e-5)

    # Gradient accumulation: the micro-batch that does not update keeps its gradient local (no_sync), the
    # updating one all-reduces the accumulated gradient.
    g0, g1 = (torch.load(tmp_path / f'gradients_rank{r}.pt') for r in (0, 1))
    assert not torch.allclose(g0[0], g1[0]) and not torch.allclose(g0[2], g1[2])
    assert torch.equal(g0[1], g1[1]) and torch.equal(g0[3], g1[3])

    marks = {name: (tmp_path / name).read_text() for name in os.listdir(out) if not name.endswith('.pt')}
    assert marks == {'everywhere_rank0': '2', 'everywhere_rank1': '2', 'rank0only_rank0': '2'}


@pytest.mark.system
@pytest.mark.timeout(120)
def test_torchrun_trains_like_one_process(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get('PYTHONPATH')])))
    script = os.path.join(REPO_ROOT, 'tests', 'distributed', 'ddp_scripts', 'torchrun_fit.py')
    proc = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2',
                           f'--master_port={find_free_port()}', script, str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    w0, w1 = (torch.load(tmp_path / f'weights_rank{r}.pt') for r in (0, 1))
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    assert_close_states(w0, single_process_reference().state_dict())
    h0, h1 = (torch.load(tmp_path / f'history_rank{r}.pt') for r in (0, 1))
    assert h0['train_history']['val_loss'] == h1['train_history']['val_loss']     # agreed, not per-rank
    # The library's messages: INFO once (rank 0), warnings of the other ranks with their rank.
    lines = proc.stderr.splitlines()
    assert sum('Epoch 1:' in line for line in lines) == 1
    assert sum('said by every rank' in line for line in lines) == 1
    warned = sorted(line for line in lines if 'warned by every rank' in line)
    assert warned == ['WARNING: [rank 1] warned by every rank', 'WARNING: warned by every rank'], warned


@pytest.mark.timeout(120)
def test_gathered_predictions_are_complete_and_in_dataset_order(tmp_path):
    torch.manual_seed(0)
    model = Regressor()
    # 9 shuffled training samples: the DistributedSampler pads them to 10, which the gather must drop.
    train = DataLoader(regression_data(9, 3), batch_size=2, shuffle=True)
    loop = TrainLoop(model, train, None, None, torch.optim.SGD(model.parameters(), lr=0.01), nn.MSELoss(),
                     gpu_mode='ddp')
    loop.fit(num_epochs=1, callbacks=[SavePredictions(str(tmp_path))],
             in_process_data_load=InMultiProcessDataLoad(val_loader_build_fn=build_validation_loader), **DDP)

    expected = {'train': regression_data(9, 3), 'val': regression_data(7, 2)}
    for rank in (0, 1):
        predictions = torch.load(tmp_path / f'predictions_rank{rank}.pt')
        for name, dataset in expected.items():
            y_pred, y_true, metadata = predictions[name]
            x, y = dataset.tensors
            assert torch.equal(y_true, y)
            with torch.no_grad():
                torch.testing.assert_close(y_pred, model(x))      # model: the trained weights, returned by fit


@pytest.mark.timeout(120)
def test_early_stop_on_one_rank_stops_every_rank(tmp_path):
    model, train, val, optimizer = equivalence_setup()
    loop = TrainLoop(model, train, val, None, optimizer, nn.MSELoss(), gpu_mode='ddp')
    loop.fit(num_epochs=3, callbacks=[StopOnRank(1), MarkRun('epochs', str(tmp_path))], **DDP)
    assert (tmp_path / 'epochs_rank0').read_text() == '1'
    assert (tmp_path / 'epochs_rank1').read_text() == '1'
    assert len(loop.train_history['val_loss']) == 1


@pytest.mark.timeout(120)
def test_rank_restricted_callback_calling_a_collective_raises_instead_of_hanging():
    model, train, val, optimizer = equivalence_setup()
    loop = TrainLoop(model, train, val, None, optimizer, nn.MSELoss(), gpu_mode='ddp')
    # The error reported is the root cause on rank 0, not rank 1's connection error that follows from it.
    with pytest.raises(DDPWorkerError, match='rank 0 failed first') as info:
        loop.fit(num_epochs=1, callbacks=[PredictOnRankZero()], **DDP)
    assert 'CollectiveInRankRestrictedCallbackError' in str(info.value)
    assert 'rank-0 predictor' in str(info.value)


def test_unpicklable_loader_error_names_it_and_the_fix():
    model, train, val, optimizer = equivalence_setup()
    train = DataLoader(train.dataset, batch_size=4, collate_fn=lambda batch: batch)
    loop = TrainLoop(model, train, val, None, optimizer, nn.MSELoss(), gpu_mode='ddp')
    with pytest.raises(TypeError, match='train_loader.*InMultiProcessDataLoad'):
        loop.fit(num_epochs=1, **DDP)


def test_sharded_loaders_keep_their_arguments_and_split_the_data():
    dataset = regression_data(11, 4)
    generator = torch.Generator().manual_seed(5)
    loader = DataLoader(dataset, batch_size=3, shuffle=True, num_workers=1, generator=generator,
                        persistent_workers=True, prefetch_factor=3, drop_last=False, collate_fn=collate_pairs)
    shards = [distribute_loader(loader, 2, rank)[0] for rank in (0, 1)]
    for shard in shards:
        assert (shard.num_workers, shard.generator, shard.persistent_workers, shard.prefetch_factor,
                shard.collate_fn, shard.batch_size) == (1, generator, True, 3, collate_pairs, 3)
        assert shard.sampler.shuffle and shard.sampler.seed == 5
    seen = [i for shard in shards for i in shard.sampler]
    assert sorted(set(seen)) == list(range(11)) and len(seen) == 12        # one padding sample

    # A user's batch_sampler: each rank takes every other batch of it; evaluation loaders are not padded.
    batches = DataLoader(dataset, batch_sampler=[[0, 1], [2, 3, 4], [5], [6, 7, 8, 9, 10]])
    shards = [distribute_loader(batches, 2, rank, evaluation=True)[0] for rank in (0, 1)]
    assert list(shards[0].batch_sampler) == [[0, 1], [5]]
    assert list(shards[1].batch_sampler) == [[2, 3, 4], [6, 7, 8, 9, 10]]


def collate_pairs(batch):
    return torch.stack([x for x, _ in batch]), torch.stack([y for _, y in batch])


@pytest.mark.timeout(180)
def test_checkpoints_written_by_rank0_and_ddp_resume_continues_the_run(tmp_path):
    """A DDP run checkpointed by rank 0 and resumed in DDP ends where the uninterrupted DDP run ends (the data
    order is deterministic here; both ranks load the same checkpoint)."""
    from aitoolbox_like.tracking import TrainLoopCheckpoint

    def tracked_loop(folder):
        model, train, val, optimizer = equivalence_setup()
        return TrainLoopCheckpoint(model, train, val, None, optimizer, nn.MSELoss(), 'proj', 'exp', str(folder),
                                   {'lr': 0.05}, cloud_save_mode='local', gpu_mode='ddp')

    uninterrupted = tracked_loop(tmp_path / 'full')
    uninterrupted.fit(num_epochs=3, grad_accumulation=2, **DDP)

    first = tracked_loop(tmp_path / 'resumed')
    first.fit(num_epochs=2, grad_accumulation=2, **DDP)
    [experiment] = os.listdir(tmp_path / 'resumed' / 'proj')
    checkpoints = sorted(os.listdir(tmp_path / 'resumed' / 'proj' / experiment / 'checkpoint_model'))
    assert [c for c in checkpoints if c.endswith('.pth')] == [f'model_{experiment}_E0.pth', f'model_{experiment}_E1.pth']

    resumed = tracked_loop(tmp_path / 'resumed')
    resumed.fit(num_epochs=3, grad_accumulation=2, resume_from='latest', **DDP)
    assert os.listdir(tmp_path / 'resumed' / 'proj') == [experiment]          # same experiment folder
    assert_close_states(resumed.model.state_dict(), uninterrupted.model.state_dict())
    assert resumed.train_history.get_epochs('val_loss') == [0, 1, 2]
    assert resumed.train_history['val_loss'] == pytest.approx(uninterrupted.train_history['val_loss'], rel=1e-6)
