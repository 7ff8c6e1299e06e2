"""AmpPolicy, what ``use_amp`` becomes on a device (aitoolbox_like/runtime/amp.py), checked against torch's own
autocast and optimizer on CPU. The fp16 GradScaler path needs CUDA: tests/gpu/test_amp_gpu.py."""
import warnings

import pytest
import torch
from torch import nn

from aitoolbox_like.runtime.amp import AmpPolicy


def _model_and_batch():
    torch.manual_seed(0)
    return nn.Linear(8, 4), torch.randn(16, 8)


def test_bf16_on_cpu_runs_the_forward_as_torch_autocast_does_and_steps_without_a_scaler():
    policy = AmpPolicy('bf16', 'cpu')
    assert (policy.mode, policy.enabled, policy.uses_scaler, policy.dtype) == ('bf16', True, False, torch.bfloat16)
    model, x = _model_and_batch()
    with policy.autocast():
        ours = model(x)
    with torch.autocast(device_type='cpu', dtype=torch.bfloat16):
        theirs = model(x)
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, theirs)

    # The update is the optimizer's own step: the same weights as stepping it by hand.
    reference = nn.Linear(8, 4)
    reference.load_state_dict(model.state_dict())
    ours_opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(reference.parameters(), lr=0.1)
    with policy.autocast():
        loss = model(x).float().pow(2).mean()
    policy.scale(loss).backward()
    with torch.autocast(device_type='cpu', dtype=torch.bfloat16):
        ref_loss = reference(x).float().pow(2).mean()
    ref_loss.backward()
    assert policy.step(ours_opt) is True
    ref_opt.step()
    applied = [True]
    policy.update([ours_opt], applied)
    assert applied == [True] and not policy.scaler.is_enabled()
    for ours_p, ref_p in zip(model.parameters(), reference.parameters()):
        assert torch.equal(ours_p, ref_p)


def test_full_precision_is_a_context_that_changes_nothing():
    policy = AmpPolicy(False, 'cpu')
    model, x = _model_and_batch()
    with policy.autocast():
        out = model(x)
    assert out.dtype == torch.float32 and torch.equal(out, model(x))
    loss = out.sum()
    assert policy.scale(loss) is loss


def test_use_amp_true_without_cuda_warns_and_trains_in_full_precision_as_aitoolbox_did():
    with pytest.warns(UserWarning, match="use_amp='bf16'"):
        policy = AmpPolicy(True, 'cpu')
    assert policy.mode is None and not policy.enabled and policy.unavailable is None
    with pytest.warns(UserWarning):
        assert AmpPolicy({'init_scale': 1024.0}, 'cpu').mode is None     # AIToolbox's dict: AMP where possible


def test_an_explicit_fp16_without_cuda_is_refused_at_fit_naming_bf16():
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        policy = AmpPolicy('fp16', 'cpu')
    assert policy.unavailable is not None and "use_amp='bf16'" in policy.unavailable


def test_an_unknown_value_names_the_accepted_ones():
    with pytest.raises(ValueError, match=r"use_amp must be False, True/'fp16', 'bf16'"):
        AmpPolicy('fp8', 'cpu')
