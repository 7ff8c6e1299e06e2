"""gpu_mode='fsdp' on one GPU: one spawned process, NCCL, the model sharded by FSDP2 over that one rank. It trains
like the hand-written loop on the same GPU, the caller's model comes back trained, and the rank-gated callbacks
run as in any one-process run (all of them) on cuda:0."""
import json
import os

import torch
from torch import nn

from aitoolbox_like import TrainLoop
from gpu_common import FileMarker, hand_written, parts, weights
from helpers import assert_close_states, one_thread_per_worker  # noqa: F401  (fixture)


def test_fsdp_on_one_gpu_trains_like_one_process_and_runs_the_rank_gated_callbacks(device, tmp_path):
    # No dropout and no shuffling: the spawned process seeds its own RNG, and its loader reads in sampler order.
    ref_model, train, _, ref_opt = parts(device, optimizer='sgd', dropout=0.0, shuffle=False)
    hand_written(ref_model, ref_opt, train, device, num_epochs=2)

    model, train, val, opt = parts(torch.device('cpu'), optimizer='sgd', dropout=0.0, shuffle=False)
    markers = [FileMarker('rank0', str(tmp_path), device_idx_execution=0),
               FileMarker('rank1', str(tmp_path), device_idx_execution=1),
               FileMarker('every', str(tmp_path), device_idx_execution=None)]
    loop = TrainLoop(model, train, val, None, opt, nn.CrossEntropyLoss(), gpu_mode='fsdp', progress_bar=False)
    returned = loop.fit(num_epochs=2, callbacks=markers, num_gpus=1, on_gpu=device.type == 'cuda')

    # The caller's own model comes back, unsharded and trained; sharding over one rank changes no result.
    assert returned is model
    assert not any(type(t).__name__ == 'DTensor' for t in model.state_dict().values())
    assert_close_states(weights(model), weights(ref_model))
    assert len(loop.train_history['accumulated_loss']) == 2 and len(loop.train_history['val_loss']) == 2

    expected_device = 'cuda:0' if device.type == 'cuda' else 'cpu'
    for name in ('rank0', 'rank1', 'every'):
        with open(tmp_path / f'{name}.json', encoding='utf-8') as f:
            record = json.load(f)
        assert record == dict(rank=0, world_size=1, device=expected_device, parameter_device=expected_device,
                              batches=2 * len(train)), (name, record)
    assert sorted(os.listdir(tmp_path)) == ['every.json', 'rank0.json', 'rank1.json']
