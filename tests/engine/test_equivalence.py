"""The TrainLoop must train exactly like a hand-written PyTorch loop: same seed, same weights to the bit."""
import copy

import pytest
import torch
from torch import nn

from aitoolbox_like import TrainLoop
from helpers import MLP, loaders, state_equal


def hand_written_loop(model, train_loader, optimizer, criterion, num_epochs, grad_accumulation=1):
    model.train()
    for _ in range(num_epochs):
        num_batches = len(train_loader)
        for i, (x, y) in enumerate(train_loader):
            loss = criterion(model(x), y)
            if grad_accumulation > 1:
                loss = loss / grad_accumulation
            loss.backward()
            if (i + 1) % grad_accumulation == 0 or i == num_batches - 1:
                optimizer.step()
                optimizer.zero_grad()
    return model


def make(seed, dropout, optimizer_cls, **optimizer_kwargs):
    torch.manual_seed(seed)
    model = MLP(dropout=dropout)
    optimizer = optimizer_cls(model.parameters(), lr=0.05, **optimizer_kwargs) if optimizer_cls is torch.optim.SGD \
        else optimizer_cls(model.parameters(), lr=0.01, **optimizer_kwargs)
    return model, optimizer


def assert_optimizer_state_equal(ref, tl):
    """Every parameter's optimizer state (tensors to the bit) and every param group's settings."""
    ref, tl = ref.state_dict(), tl.state_dict()
    assert ref['param_groups'] == tl['param_groups']
    assert ref['state'].keys() == tl['state'].keys()
    for idx, state in ref['state'].items():
        assert state.keys() == tl['state'][idx].keys(), idx
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, tl['state'][idx][key]), (idx, key)
            else:
                assert value == tl['state'][idx][key], (idx, key)


@pytest.mark.parametrize('grad_accumulation', [1, 3])
@pytest.mark.parametrize('optimizer_cls, optimizer_kwargs', [
    (torch.optim.SGD, {}), (torch.optim.SGD, dict(momentum=0.9)), (torch.optim.Adam, {})])
def test_weights_equal_hand_written_loop_to_the_bit(grad_accumulation, optimizer_cls, optimizer_kwargs):
    # 53 samples in batches of 8: 7 batches, so with accumulation 3 the last window holds one batch.
    ref_model, ref_opt = make(1, 0.2, optimizer_cls, **optimizer_kwargs)
    tl_model, tl_opt = make(1, 0.2, optimizer_cls, **optimizer_kwargs)
    assert state_equal(ref_model.state_dict(), tl_model.state_dict())

    torch.manual_seed(7)
    train, _, _ = loaders()
    hand_written_loop(ref_model, train, ref_opt, nn.CrossEntropyLoss(), 3, grad_accumulation)

    torch.manual_seed(7)
    train, val, test = loaders()
    # Evaluation runs every epoch here and must not disturb the training randomness (shuffle, dropout).
    TrainLoop(tl_model, train, val, test, tl_opt, nn.CrossEntropyLoss()).fit(
        num_epochs=3, grad_accumulation=grad_accumulation)

    assert state_equal(ref_model.state_dict(), tl_model.state_dict())
    # The state a resumed run would continue from: plain SGD keeps none, momentum and Adam one entry per parameter.
    num_params = len(list(ref_model.parameters()))
    stateful = optimizer_cls is torch.optim.Adam or optimizer_kwargs.get('momentum', 0) != 0
    assert len(ref_opt.state_dict()['state']) == (num_params if stateful else 0)
    assert_optimizer_state_equal(ref_opt, tl_opt)


@pytest.mark.parametrize('weighting', ['batch', 'sample'])
def test_history_losses_match_hand_computed_values(weighting):
    torch.manual_seed(0)
    model, opt = make(0, 0.0, torch.optim.SGD)
    train, val, test = loaders(shuffle=False)

    tl = TrainLoop(model, train, val, test, opt, nn.CrossEntropyLoss(), eval_loss_weighting=weighting,
                   eval_train_set=True)
    tl.fit(num_epochs=1)
    batch_losses = [loss.item() for loss in tl.loss_batch_accum]
    assert tl.train_history['accumulated_loss'] == [pytest.approx(sum(batch_losses) / len(batch_losses))]

    model.eval()
    with torch.no_grad():
        def dataset_loss(loader):
            if weighting == 'sample':     # the mean over samples
                total = sum(nn.functional.cross_entropy(model(x), y, reduction='sum').item() for x, y in loader)
                return total / len(loader.dataset)
            # AIToolbox's: the float64 mean of the batch means, to the bit
            return torch.mean(torch.DoubleTensor([nn.functional.cross_entropy(model(x), y) for x, y in loader]))
        for key, loader in (('loss', train), ('val_loss', val), ('train_end_test_loss', test)):
            expected = dataset_loss(loader)
            if weighting == 'batch':
                assert tl.train_history[key][0] == expected.item(), key
            else:
                assert tl.train_history[key][0] == pytest.approx(expected, rel=1e-6), key
    assert len(train.dataset) % train.batch_size != 0, 'a smaller last batch tells the two weightings apart'


def test_end_auto_eval_every_k_epochs():
    model, opt = make(0, 0.0, torch.optim.SGD)
    train, val, test = loaders()
    tl = TrainLoop(model, train, val, test, opt, nn.CrossEntropyLoss(), end_auto_eval=2, eval_train_set=True)
    tl.fit(num_epochs=5)
    assert len(tl.train_history['accumulated_loss']) == 5
    assert tl.train_history.get_epochs('val_loss') == [0, 2, 4]
    assert tl.train_history.get_epochs('loss') == [0, 2, 4]


def test_end_auto_eval_false_records_only_accumulated_loss():
    model, opt = make(0, 0.0, torch.optim.SGD)
    train, val, test = loaders()
    tl = TrainLoop(model, train, val, test, opt, nn.CrossEntropyLoss(), end_auto_eval=False)
    tl.fit(num_epochs=2)
    assert len(tl.train_history['accumulated_loss']) == 2
    assert tl.train_history['loss'] == [] and tl.train_history['val_loss'] == []
    assert 'train_end_test_loss' not in tl.train_history


def test_num_iterations_spans_epochs_and_applies_last_partial_window():
    ref_model, ref_opt = make(3, 0.0, torch.optim.SGD)
    tl_model, tl_opt = make(3, 0.0, torch.optim.SGD)
    train, val, _ = loaders(shuffle=False)          # 7 batches per epoch
    criterion = nn.CrossEntropyLoss()
    # Reference: 7 batches of epoch 0, then 3 of epoch 1, accumulation 2 -> updates after 2,4,6,7 | 2, 3.
    batches = list(train)
    for epoch_batches in (batches, batches[:3]):
        for i, (x, y) in enumerate(epoch_batches):
            (criterion(ref_model(x), y) / 2).backward()
            if (i + 1) % 2 == 0 or i == len(epoch_batches) - 1:
                ref_opt.step()
                ref_opt.zero_grad()
    tl = TrainLoop(tl_model, train, val, None, tl_opt, criterion)
    tl.fit(num_iterations=10, grad_accumulation=2)
    assert tl.total_iteration_idx == 9 and tl.epoch == 1
    assert tl.get_num_optimizer_updates() == 6
    assert tl.get_num_training_steps() == 5      # AIToolbox's count leaves out the epochs' partial windows
    assert state_equal(ref_model.state_dict(), tl_model.state_dict())


def test_bf16_autocast_on_cpu_trains():
    model, opt = make(0, 0.0, torch.optim.SGD)
    before = copy.deepcopy(model.state_dict())
    seen_dtypes = []

    class Probe(MLP):
        pass

    train, val, test = loaders()
    original_forward = model.forward

    def forward(x):
        out = original_forward(x)
        seen_dtypes.append(out.dtype)
        return out
    model.forward = forward
    tl = TrainLoop(model, train, val, test, opt, nn.CrossEntropyLoss(), use_amp='bf16')
    tl.fit(num_epochs=2)
    assert seen_dtypes and all(d == torch.bfloat16 for d in seen_dtypes)
    assert not state_equal(before, model.state_dict())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert tl.train_history['val_loss'][-1] < tl.train_history['accumulated_loss'][0] * 2
    assert not tl.amp_scaler.is_enabled() and tl.use_amp == 'bf16' and tl.precision == 'bf16'


def test_fp16_without_cuda_warns_and_trains_in_full_precision():
    # AIToolbox's behaviour: the same script runs on a CPU-only machine, in full precision.
    ref_model, ref_opt = make(4, 0.0, torch.optim.SGD)
    hand_written_loop(ref_model, loaders()[0], ref_opt, nn.CrossEntropyLoss(), num_epochs=2)
    model, opt = make(4, 0.0, torch.optim.SGD)
    train, val, test = loaders()
    with pytest.warns(UserWarning, match="needs a CUDA device.*full precision.*use_amp='bf16'"):
        tl = TrainLoop(model, train, val, test, opt, nn.CrossEntropyLoss(), use_amp=True)
    tl.fit(num_epochs=2)
    # The flag stays the user's (AIToolbox scripts read it); the precision used is full.
    assert not tl.amp_scaler.is_enabled() and tl.use_amp is True and tl.precision == 'fp32'
    assert state_equal(ref_model.state_dict(), model.state_dict())


def test_changing_eval_loss_weighting_between_two_evaluations_recomputes():
    model, opt = make(0, 0.0, torch.optim.SGD)
    train, val, test = loaders(shuffle=False)
    tl = TrainLoop(model, train, val, test, opt, nn.CrossEntropyLoss())
    by_batch = tl.evaluate_loss_on_validation_set()
    tl.eval_loss_weighting = 'sample'
    by_sample = tl.evaluate_loss_on_validation_set()
    with torch.no_grad():
        expected = sum(nn.functional.cross_entropy(model(x), y, reduction='sum') for x, y in val) / len(val.dataset)
    assert by_sample.item() == pytest.approx(expected.item(), rel=1e-6)
    assert by_batch.item() != pytest.approx(by_sample.item(), rel=1e-6)
