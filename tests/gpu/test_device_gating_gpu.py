"""cuda_device_idx picks the GPU the loop trains on, and device_idx_execution gates callbacks by the process's
global rank, never by the GPU index: in a single-process run every callback runs (docs/user-guide.md)."""
import pytest
import torch
from torch import nn

from aitoolbox_like import TrainLoop
from gpu_common import Recorder, differing, hand_written, parts, weights


def test_cuda_device_idx_trains_there_and_every_callback_runs_in_a_single_process(device):
    ref_model, train, _, ref_opt = parts(device)
    torch.manual_seed(3)
    hand_written(ref_model, ref_opt, train, device, num_epochs=2)

    model, train, val, opt = parts(device)
    log = []
    callbacks = [Recorder('rank 0 only', log, device_idx_execution=0),
                 Recorder('rank 1 only', log, device_idx_execution=1),
                 Recorder('every rank', log, device_idx_execution=None)]
    torch.manual_seed(3)
    loop = TrainLoop(model, train, val, None, opt, nn.CrossEntropyLoss(), cuda_device_idx=0, progress_bar=False)
    loop.fit(num_epochs=2, callbacks=callbacks)

    expected_device = 'cuda:0' if device.type == 'cuda' else 'cpu'
    assert str(loop.device) == expected_device
    steps = 2 * len(train)
    for name in ('rank 0 only', 'rank 1 only', 'every rank'):
        seen = [entry[1:] for entry in log if entry[0] == name]
        assert seen == [(expected_device, expected_device)] * steps, (name, seen[:3])
    assert not differing(weights(model), weights(ref_model))


def test_cuda_device_idx_past_the_visible_gpus_names_their_number(device):
    if device.type != 'cuda':
        pytest.skip('without CUDA, cuda_device_idx is ignored with a warning')
    model, train, val, opt = parts(device)
    count = torch.cuda.device_count()
    with pytest.raises(ValueError, match=rf'cuda_device_idx={count} but only {count} GPUs are visible'):
        TrainLoop(model, train, val, None, opt, nn.CrossEntropyLoss(), cuda_device_idx=count)
