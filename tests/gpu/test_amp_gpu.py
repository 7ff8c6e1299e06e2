"""Mixed precision on CUDA: use_amp=True / 'fp16' / a dict of GradScaler arguments (float16 autocast and a
GradScaler) and 'bf16' (bfloat16 autocast, no scaler) train like the hand-written torch.autocast + GradScaler loop,
to the bit, including the updates the scaler skips (inf gradients) and their report in optimizer_update_applied()."""
import warnings

import pytest
import torch
from torch import nn

from aitoolbox_like import TrainLoop
from gpu_common import AppliedRecorder, differing, hand_written_amp, parts, weights

EPOCHS = 3
# A loss scale far too large for float16 gradients: the first updates overflow and are skipped, the scale backs
# off, then the updates apply. 2**24 * gradients of ~0.05 overflow float16 (max 65504).
OVERFLOWING = {'init_scale': 2.0 ** 24}


@pytest.mark.parametrize('use_amp, optimizer, grad_accumulation', [
    ('fp16', 'sgd', 1),
    (True, 'adam', 2),
    (OVERFLOWING, 'sgd', 1),
    (OVERFLOWING, 'adam_fused', 1),         # fused: the skip is seen from the scale, not from step() calls
    ('bf16', 'adam', 1),
], ids=['fp16-sgd', 'True-adam-accumulate2', 'dict-overflowing-sgd', 'dict-overflowing-fused-adam', 'bf16-adam'])
def test_amp_trains_like_hand_written_autocast_and_grad_scaler(device, use_amp, optimizer, grad_accumulation):
    mode = 'bf16' if use_amp == 'bf16' else 'fp16'
    if mode == 'fp16' and device.type != 'cuda':
        pytest.skip('float16 with a GradScaler is a CUDA feature (the loop trains in full precision on CPU)')
    if mode == 'bf16' and device.type == 'cuda' and not torch.cuda.is_bf16_supported():
        pytest.skip(f'{torch.cuda.get_device_name(device)} has no bfloat16 support')
    scaler_kwargs = use_amp if isinstance(use_amp, dict) else None

    ref_model, train, _, ref_opt = parts(device, optimizer=optimizer)
    torch.manual_seed(7)
    ref_applied = hand_written_amp(ref_model, ref_opt, train, device, EPOCHS, mode, scaler_kwargs, grad_accumulation)

    model, train, val, opt = parts(device, optimizer=optimizer)
    torch.manual_seed(7)
    recorder = AppliedRecorder()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        loop = TrainLoop(model, train, val, None, opt, nn.CrossEntropyLoss(), use_amp=use_amp, progress_bar=False)
    loop.fit(num_epochs=EPOCHS, callbacks=[recorder], grad_accumulation=grad_accumulation)

    assert not [w for w in caught if 'full precision' in str(w.message)]       # on CUDA, AMP as asked
    assert loop.device.type == device.type and loop.precision == mode
    assert loop.amp_scaler.is_enabled() == (mode == 'fp16')
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not differing(weights(model), weights(ref_model)), differing(weights(model), weights(ref_model))
    assert recorder.applied == ref_applied
    if scaler_kwargs is not None:       # the case is only worth its name if both kinds of update happened
        assert False in ref_applied and True in ref_applied, ref_applied
        assert loop.amp_scaler.get_scale() < OVERFLOWING['init_scale']
    if optimizer != 'sgd':
        assert not differing(opt.state_dict()['state'][0], ref_opt.state_dict()['state'][0])
    losses = loop.train_history['accumulated_loss']
    assert len(losses) == EPOCHS and all(torch.isfinite(torch.tensor(losses)))
