"""Parallel wrappers and the multi-GPU model classes.

- TTParallelBase puts the TTModel's API (get_loss / get_predictions, helpers, attributes) on a wrapper and runs
  the forward through the wrapper; checked in-process with a plain nn.Module wrapper and once with real DDP
  (2 gloo processes), where the gradients must be the average of both ranks' hand-computed gradients.
- TTDataParallel (gpu_mode='dp') passes the TTModel's API through torch.nn.DataParallel.
- TTBasicMultiGPUModel / MultiGPUModelWrap compute the loss in forward and train like a hand-written loop.
"""
import copy
import os
import pickle

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TrainLoop, TTModel
from aitoolbox_like import distributed
from aitoolbox_like.distributed import parallel
from aitoolbox_like.distributed import find_free_port
from aitoolbox_like.model import MultiGPUModelWrap, TTBasicMultiGPUModel
from aitoolbox_like.distributed.parallel import TTDataParallel, TTDistributedDataParallel, TTParallelBase


class ScaledRegressor(TTModel):
    """Uses a plain attribute, a sub-module and a helper method that calls self(x) inside get_loss."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(3, 1)
        self.scale = 2.0

    def forward(self, x):
        return self.net(x)

    def scaled_output(self, x):
        return self(x) * self.scale

    def get_loss(self, batch_data, criterion, device):
        x, y = batch_data
        return criterion(self.scaled_output(x.to(device)), y.to(device))

    def get_predictions(self, batch_data, device):
        x, y = batch_data
        return self.scaled_output(x.to(device)).detach(), y, {'n': [len(x)]}


class CountingWrapper(TTParallelBase, nn.Module):
    """A minimal parallel wrapper: counts the forwards that go through it."""

    def __init__(self, module):
        nn.Module.__init__(self)
        self.module = module
        self.forward_calls = 0
        TTParallelBase.__init__(self, module)

    def forward(self, *args, **kwargs):
        self.forward_calls += 1
        return self.module(*args, **kwargs)


def _batch(seed, n=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=g), torch.randn(n, 1, generator=g)


def test_wrapper_runs_the_models_methods_with_the_forward_through_the_wrapper():
    torch.manual_seed(0)
    model = ScaledRegressor()
    wrapper = CountingWrapper(model)
    x, y = _batch(1)
    loss = wrapper.get_loss((x, y), nn.MSELoss(), 'cpu')
    torch.testing.assert_close(loss, nn.functional.mse_loss(model.net(x) * 2.0, y))
    assert wrapper.forward_calls == 1
    torch.testing.assert_close(wrapper.get_loss_eval((x, y), nn.MSELoss(), 'cpu'), loss)
    assert wrapper.forward_calls == 2
    y_pred, y_true, metadata = wrapper.get_predictions((x, y), 'cpu')
    torch.testing.assert_close(y_pred, model.net(x).detach() * 2.0)
    assert y_true is y and metadata == {'n': [5]} and wrapper.forward_calls == 3
    # Helper methods are bound to the wrapper too.
    wrapper.scaled_output(x)
    assert wrapper.forward_calls == 4


def test_wrapper_reads_model_attributes_live():
    model = ScaledRegressor()
    wrapper = CountingWrapper(model)
    assert wrapper.net is model.net
    assert wrapper.scale == 2.0
    model.scale = 3.0          # changed after wrapping: no stale copy (AIToolbox's transfer_model_attributes)
    assert wrapper.scale == 3.0
    assert wrapper.default_model_methods == ('get_loss', 'get_loss_eval', 'get_predictions')
    with pytest.raises(AttributeError, match='no_such_attribute'):
        wrapper.no_such_attribute


def test_wrapper_survives_deepcopy_and_pickle():
    wrapper = CountingWrapper(ScaledRegressor())
    for clone in (copy.deepcopy(wrapper), pickle.loads(pickle.dumps(wrapper))):
        x, y = _batch(2)
        torch.testing.assert_close(clone.get_loss((x, y), nn.MSELoss(), 'cpu'),
                                   wrapper.get_loss((x, y), nn.MSELoss(), 'cpu'))


def test_wrapper_of_a_plain_module_explains_get_loss_is_missing():
    wrapper = CountingWrapper(nn.Linear(3, 1))
    with pytest.raises(AttributeError, match='has no method get_loss'):
        wrapper.get_loss(_batch(0), nn.MSELoss(), 'cpu')


def test_data_parallel_wrapper_passes_the_tt_model_api_through():
    model = ScaledRegressor()
    wrapper = TTDataParallel(model)
    assert isinstance(wrapper, nn.DataParallel) and wrapper.module is model
    batch = _batch(0)
    assert torch.equal(wrapper.get_loss(batch, nn.MSELoss(), 'cpu'), model.get_loss(batch, nn.MSELoss(), 'cpu'))


def test_distributed_module_uses_the_one_ddp_wrapper():
    assert distributed.TTDistributedDataParallel is parallel.TTDistributedDataParallel
    assert issubclass(TTDistributedDataParallel, nn.parallel.DistributedDataParallel)


# ---- DDP: one spawn of 2 gloo processes ------------------------------------------------------------


def _ddp_worker(rank, world_size, port, out_dir):
    os.environ['MASTER_ADDR'] = '127.0.0.1'
    os.environ['MASTER_PORT'] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group('gloo', rank=rank, world_size=world_size)
    wrapper = None
    try:
        torch.manual_seed(0)
        model = ScaledRegressor()
        wrapper = TTDistributedDataParallel(model)
        forward_calls = []
        wrapper.register_forward_pre_hook(lambda module, args: forward_calls.append(1))
        x, y = _batch(10 + rank)
        loss = wrapper.get_loss((x, y), nn.MSELoss(), torch.device('cpu'))
        loss.backward()
        with torch.no_grad():
            y_pred, _, _ = wrapper.get_predictions((x, y), 'cpu')
        torch.save({
            'loss': loss.detach(), 'grads': {k: p.grad.clone() for k, p in model.named_parameters()},
            'forward_calls': len(forward_calls), 'scale': wrapper.scale, 'net_is_model_net': wrapper.net is model.net,
            'y_pred': y_pred,
        }, os.path.join(out_dir, f'rank{rank}.pt'))
    finally:
        # The DDP wrapper's reducer holds the process group: released before the group is destroyed, not after (a
        # group object outliving destroy_process_group can abort the process in gloo's threads: "terminate called
        # without an active exception", seen once in a full run; callbacks/preemption.py drops its groups likewise).
        del wrapper
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_ddp_wrapper_get_loss_goes_through_ddp_and_averages_gradients(tmp_path, monkeypatch):
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    mp.spawn(_ddp_worker, args=(2, find_free_port(), str(tmp_path)), nprocs=2, join=True)
    results = [torch.load(tmp_path / f'rank{r}.pt') for r in range(2)]

    torch.manual_seed(0)
    reference = ScaledRegressor()
    expected_grads = []
    for rank in range(2):
        reference.zero_grad()
        x, y = _batch(10 + rank)
        loss = nn.functional.mse_loss(reference.net(x) * 2.0, y)
        loss.backward()
        torch.testing.assert_close(results[rank]['loss'], loss.detach())
        torch.testing.assert_close(results[rank]['y_pred'], reference.net(x).detach() * 2.0)
        expected_grads.append({k: p.grad.clone() for k, p in reference.named_parameters()})
    for result in results:
        # DDP all-reduced: every rank holds the mean of both ranks' gradients.
        for name, grad in result['grads'].items():
            torch.testing.assert_close(grad, (expected_grads[0][name] + expected_grads[1][name]) / 2)
        assert result['forward_calls'] == 2      # get_loss's helper and get_predictions both went through DDP
        assert result['scale'] == 2.0 and result['net_is_model_net']


# ---- TTBasicMultiGPUModel / MultiGPUModelWrap ------------------------------------------------------


class LossInForward(TTBasicMultiGPUModel):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(3, 2)
        self.seen = None

    def forward(self, x, targets=None, criterion=None):
        self.seen = (targets is not None, criterion is not None)
        predictions = self.net(x)
        return criterion(predictions, targets) if criterion is not None else predictions


def test_basic_multi_gpu_model_passes_targets_and_criterion_to_forward():
    torch.manual_seed(0)
    model = LossInForward()
    x, y = torch.randn(6, 3), torch.tensor([0, 1, 1, 0, 1, 0])
    loss = model.get_loss((x, y), nn.CrossEntropyLoss(), 'cpu')
    assert model.seen == (True, True)
    torch.testing.assert_close(loss, nn.functional.cross_entropy(model.net(x), y))
    y_pred, y_true, _ = model.get_predictions((x, y), 'cpu')
    assert model.seen == (False, False)
    torch.testing.assert_close(y_pred, model.net(x).detach())
    assert torch.equal(y_true, y)


def test_multi_gpu_model_wrap_trains_like_a_hand_written_loop():
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(20, 3, generator=g), torch.randint(0, 2, (20,), generator=g))
    loader = DataLoader(data, batch_size=6)

    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    reference = copy.deepcopy(net)
    wrapped = MultiGPUModelWrap(net)
    assert isinstance(wrapped, TTModel)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    TrainLoop(wrapped, loader, None, None, optimizer, nn.CrossEntropyLoss(), end_auto_eval=False,
              progress_bar=False).fit(num_epochs=2)

    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        for x, y in loader:
            nn.functional.cross_entropy(reference(x), y).backward()
            ref_optimizer.step()
            ref_optimizer.zero_grad()
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(wrapped.state_dict()[f'model.{key}'], value)
    x, _ = data.tensors
    torch.testing.assert_close(wrapped(x), net(x))


def test_multi_gpu_model_wrap_refuses_a_non_module():
    with pytest.raises(TypeError, match='nn.Module'):
        MultiGPUModelWrap(lambda x: x)
