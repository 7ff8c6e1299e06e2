"""Sharded (FSDP) checkpoints on 2 gloo processes on CPU. PreemptionCheckpoint(on_exception=True): a data error that
reaches every rank between two steps leaves a sharded checkpoint that resumes to the very weights of the
uninterrupted run; an error that reaches one rank only leaves no checkpoint, and the run fails instead of hanging.
Asynchronous mid-epoch checkpoints whose copy of the shards outlasts the next step's forward and backward hold the
weights of the batch they were taken after (the step's optimizer waits for the copy).

Runs are compared with the same FSDP run uninterrupted, on the same 2 processes, bit for bit (the same shards
reduce in the same order)."""
import os
import sys

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ddp_scripts'))

from aitoolbox_like.checkpoint import sharded as sharded_checkpoint  # noqa: E402
from aitoolbox_like.callbacks.preemption import PreemptionCheckpoint  # noqa: E402
from aitoolbox_like.checkpoint import load_checkpoint  # noqa: E402
from aitoolbox_like.engine.launch import DDPWorkerError  # noqa: E402
from aitoolbox_like.experiment import LATEST_POINTER, read_pointer  # noqa: E402
from fsdp_common import callbacks, shard_each_layer  # noqa: E402
from fsdp_defects_common import (SLOW_COPY_ENV, FailNextFetch, RecordStepWaits, SaveWholeWeightsAfter,  # noqa: E402
                                 failing_data_loop)
from helpers import experiment_dir, one_thread_per_worker  # noqa: E402,F401  (fixture)

FSDP = dict(num_gpus=2, on_gpu=False, fsdp_shard_fn=shard_each_layer)
EMA_KEY = 'ExponentialMovingAverage_0.9'


def latest_train_state(root):
    marker = read_pointer(experiment_dir(root), LATEST_POINTER)
    return marker, load_checkpoint(os.path.join(os.path.dirname(marker), sharded_checkpoint.TRAIN_STATE_FILE))


def assert_equal_states(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.timeout(300)
def test_async_mid_epoch_checkpoints_and_a_data_error_on_every_rank_resume_bit_exactly(tmp_path, monkeypatch):
    whole = failing_data_loop(tmp_path / 'whole')
    whole.fit(num_epochs=3, callbacks=callbacks() + [SaveWholeWeightsAfter(4, str(tmp_path))], **FSDP)

    # Asynchronous checkpoints after batches 2 and 4, each followed by a step: the copy of the shards is left to
    # the stager's thread and slowed down to outlast that step's forward and backward. The data source fails on
    # both ranks when batch 6 (the third of epoch 1) is fetched, after batch 5's step.
    failing = failing_data_loop(tmp_path / 'run', iteration_save_freq=2)
    monkeypatch.setenv(SLOW_COPY_ENV, '0.5')
    with pytest.raises(DDPWorkerError, match='the data storage went away'):
        failing.fit(num_epochs=3, callbacks=callbacks() + [
            FailNextFetch(5), RecordStepWaits(5, str(tmp_path)), PreemptionCheckpoint(on_exception=True)], **FSDP)
    monkeypatch.delenv(SLOW_COPY_ENV)
    marker, state = latest_train_state(tmp_path / 'run')
    assert marker.endswith(f'model_exp_{failing.experiment_timestamp}_E1_ITER5.dcp/.metadata')
    assert state['data_position']['batches_done'] == 2 and state['iteration_idx'] == 5

    # The optimizer steps after the checkpoints waited for their copies, which hold the weights after batch 4.
    assert all(torch.load(tmp_path / f'step_waits_rank{r}.pt') > 0 for r in (0, 1))
    folder = os.path.join(experiment_dir(tmp_path / 'run'), 'checkpoint_model',
                          f'model_exp_{failing.experiment_timestamp}_E1_ITER4.dcp')
    dcp_to_torch_save(folder, tmp_path / 'iter4.pt')
    assert_equal_states(torch.load(tmp_path / 'iter4.pt', weights_only=True)['model'],
                        torch.load(tmp_path / 'weights_after_4.pt', weights_only=True))

    resumed = failing_data_loop(tmp_path / 'run')
    resumed.fit(num_epochs=3, callbacks=callbacks(), resume_from='latest', **FSDP)
    assert_equal_states(resumed.model.state_dict(), whole.model.state_dict())
    assert_equal_states(latest_train_state(tmp_path / 'run')[1]['callbacks'][EMA_KEY]['ema'],
                        latest_train_state(tmp_path / 'whole')[1]['callbacks'][EMA_KEY]['ema'])
    # The interrupted epoch's running losses were averaged over the ranks when saved, the uninterrupted run's at
    # the epoch's end: the same numbers summed in another order.
    assert resumed.train_history['accumulated_loss'] == pytest.approx(whole.train_history['accumulated_loss'],
                                                                      rel=1e-6)


@pytest.mark.timeout(200)
def test_a_data_error_on_one_rank_writes_nothing_and_the_run_fails_instead_of_hanging(tmp_path, capfd):
    # Rank 1's data source fails after batch 5; rank 0 goes on into batch 6's collectives and waits there. Rank 1
    # waits 2 s for the others in on_exception, writes nothing, and fails; its exit ends rank 0's wait.
    loop = failing_data_loop(tmp_path)
    preemption = PreemptionCheckpoint(on_exception=True, fsdp_exception_timeout_s=2)
    with pytest.raises(DDPWorkerError, match='rank 1 failed first(.|\n)*the data storage went away'):
        loop.fit(num_epochs=3, callbacks=[FailNextFetch(5, on_ranks=(1,)), preemption], **FSDP)
    marker, _ = latest_train_state(tmp_path)
    assert marker.endswith(f'model_exp_{loop.experiment_timestamp}_E0.dcp/.metadata')
    names = os.listdir(os.path.join(experiment_dir(tmp_path), 'checkpoint_model'))
    assert names == [f'model_exp_{loop.experiment_timestamp}_E0.dcp']
    assert 'not every rank reached on_exception between the same steps' in capfd.readouterr().err
