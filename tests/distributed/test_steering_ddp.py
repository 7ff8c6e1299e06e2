"""skip_update() and end_epoch() in a 2-process DDP fit (gloo): asked on one rank only, every rank acts on them, so
the ranks end with equal weights, equal to a fit where every rank asks, and unlike a fit without them. LossSpikeGuard
judges the run, not a rank: a spike in one rank's batch leaves the update out on both."""
import os
import sys

import pytest
import torch
from torch import nn

from aitoolbox_like import TrainLoop

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'ddp_scripts'))
from aitoolbox_like.callbacks.health import LossSpikeGuard  # noqa: E402
from ddp_common import SaveFinalWeights, SkipAndEndOnRanks, equivalence_setup, spiking_setup  # noqa: E402

SKIP_AT = (1, 5)            # global batch indices (4 batches of 4 samples per rank and epoch, grad_accumulation 2)
END_AT = {2: 0}             # epoch 2 ends after its first batch, a micro-batch: its window is applied


def _fit(out_dir, callbacks, monkeypatch, setup=equivalence_setup, grad_accumulation=2):
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    os.makedirs(out_dir)
    model, train, val, optimizer = setup()
    loop = TrainLoop(model, train, val, None, optimizer, nn.MSELoss(), gpu_mode='ddp', progress_bar=False)
    loop.fit(num_epochs=3, grad_accumulation=grad_accumulation, num_gpus=2, on_gpu=False,
             callbacks=callbacks + [SaveFinalWeights(str(out_dir))])
    return [torch.load(os.path.join(out_dir, f'weights_rank{r}.pt'), weights_only=True) for r in (0, 1)]


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.timeout(300)
def test_skip_and_end_epoch_asked_on_rank_1_only_act_on_every_rank(tmp_path, monkeypatch):
    # The callback runs on rank 1 alone: rank 0 learns at the start of fit that a rank may ask.
    one_rank = _fit(tmp_path / 'one', [SkipAndEndOnRanks(SKIP_AT, END_AT, device_idx_execution=1)], monkeypatch)
    every_rank = _fit(tmp_path / 'every', [SkipAndEndOnRanks(SKIP_AT, END_AT)], monkeypatch)
    plain = _fit(tmp_path / 'plain', [], monkeypatch)
    assert _equal(one_rank[0], one_rank[1])
    assert _equal(one_rank[0], every_rank[0]) and _equal(every_rank[0], every_rank[1])
    assert not _equal(one_rank[0], plain[0])


@pytest.mark.timeout(300)
def test_loss_spike_guard_judges_the_run_a_spike_on_one_rank_is_skipped_on_both(tmp_path, monkeypatch):
    guarded = _fit(tmp_path / 'guarded', [LossSpikeGuard(window=4, threshold=20)], monkeypatch,
                   setup=spiking_setup, grad_accumulation=1)
    by_hand = _fit(tmp_path / 'by_hand', [SkipAndEndOnRanks((2, 6, 10), {})], monkeypatch, setup=spiking_setup,
                   grad_accumulation=1)
    assert _equal(guarded[0], guarded[1]) and _equal(guarded[0], by_hand[0])
