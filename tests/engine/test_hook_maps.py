"""The example callbacks of pytorch-accelerated's, BigDL Orca's and AIToolbox's callback pages, as written for
aitoolbox_like in examples/callbacks_from_other_libraries.py (docs/hooks-from-other-libraries.md maps the hooks)."""
import importlib.util
import os

import pytest
import torch
from torch import nn

from helpers import EXAMPLES_DIR


@pytest.fixture(scope='module')
def ex():
    spec = importlib.util.spec_from_file_location('callbacks_from_other_libraries',
                                                  os.path.join(EXAMPLES_DIR, 'callbacks_from_other_libraries.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def accuracy_by_hand(loop):
    correct = total = 0
    loop.model.eval()
    with torch.no_grad():
        for x, y in loop.validation_loader:
            correct += (loop.model(x).argmax(dim=1) == y).sum().item()
            total += len(y)
    return correct / total


def test_pa_classification_metrics_from_the_evaluation_batches(ex):
    loop = ex.make_loop()
    metrics = ex.ClassificationMetricsCallback(num_classes=10)
    loop.fit(num_epochs=2, callbacks=[metrics])
    assert loop.train_history.get_epochs('accuracy') == [0, 1]
    assert loop.train_history['accuracy'][-1] == pytest.approx(accuracy_by_hand(loop))
    confusion = loop.train_history['confusion_matrix'][-1]
    assert confusion.shape == (10, 10) and confusion.sum().item() == 150
    assert metrics.confusion.sum().item() == 0          # reset at the end of each evaluation, as PA's example


def test_pa_custom_event_from_the_training_step(ex):
    loop = ex.make_loop()
    verify, step = ex.VerifyBatchCallback(), ex.CustomEventStep()
    loop.fit(num_epochs=1, callbacks=[verify, step])
    assert verify.verified == len(loop.train_loader) == 30
    assert loop.train_step_owner is step
    # the same step as the standard one: same weights as a plain fit
    plain = ex.make_loop()
    plain.fit(num_epochs=1)
    assert torch.allclose(loop.model.fc.weight, plain.model.fc.weight, atol=1e-6)


def test_pa_verify_batch_event_fails_on_a_wrong_batch(ex):
    loop = ex.make_loop()
    loop.train_loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.zeros(3, 1, 8, 8), torch.zeros(3, dtype=torch.long)), batch_size=50)
    with pytest.raises(AssertionError):
        loop.fit(num_epochs=1, callbacks=[ex.VerifyBatchCallback(), ex.CustomEventStep()])


def test_orca_main_callback_is_the_hand_written_step(ex):
    loop = ex.make_loop()
    scheduler = torch.optim.lr_scheduler.StepLR(loop.optimizer, step_size=1, gamma=0.5)
    main = ex.OrcaMainCallback(scheduler)
    loop.fit(num_epochs=2, callbacks=[main])
    assert loop.optimizer.param_groups[0]['lr'] == pytest.approx(0.5 * 0.25)      # on_lr_adjust once per epoch

    torch.manual_seed(0)
    model = ex.DigitsNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    reference_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    train_loader, _, _ = ex.digits_loaders()
    for _ in range(2):
        for inputs, targets in train_loader:
            optimizer.zero_grad()
            loss = nn.CrossEntropyLoss()(model(inputs), targets)
            loss.backward()
            optimizer.step()
        reference_scheduler.step()
    assert torch.allclose(loop.model.fc.weight, model.fc.weight, atol=1e-6)
    assert main.outputs.shape[1] == 10


def test_orca_loss_dict_main_callback_sums_the_losses(ex):
    loop = ex.make_loop()
    losses = []

    class Record(ex.AbstractCallback):
        def __init__(self):
            super().__init__('record')

        def on_batch_end(self):
            losses.append(loop.loss)

    main = ex.LossDictMainCallback()
    loop.fit(num_epochs=1, callbacks=[main, Record()])
    assert set(main.outputs) == {'classification', 'l2'}
    assert losses[-1] is loop.loss
    assert torch.allclose(losses[-1], main.outputs['classification'] + main.outputs['l2'])
    assert loop.train_history['accumulated_loss'][0] < 2.3      # it trains


def test_orca_manual_lr_adjust_after_each_training_epoch(ex):
    loop = ex.make_loop()
    adjust = ex.ManualLRAdjust(initial_lr=0.5, gamma=0.1, step_index=1, epoch_size=30, warmup_epoch=1)
    lrs_during_training = []

    class ReadLR(ex.AbstractCallback):
        def __init__(self):
            super().__init__('read lr')

        def on_epoch_begin(self):
            lrs_during_training.append(loop.optimizer.param_groups[0]['lr'])

    loop.fit(num_epochs=3, callbacks=[adjust, ReadLR()])
    warmup = 1e-6 + (0.5 - 1e-6) * 29 / 30      # epoch 1 (1-based), last batch index 29
    assert adjust.lrs == pytest.approx([warmup, 0.05, 0.05])
    assert lrs_during_training == pytest.approx([0.5, warmup, 0.05])


def test_aitoolbox_examples_run_unchanged(ex):
    loop = ex.make_loop()
    report, first_gpu = ex.MyDemoTrainingReportCallback(), ex.DemoFirstGPUCallback()
    loop.fit(num_epochs=2, callbacks=[report, first_gpu])
    assert report.lines[0].startswith('Starting the training! Experiment started at: ')
    assert report.lines[1:3] == ['Starting new epoch num 0', 'Model predictions: 150']
    assert report.lines[-2:] == ['End of training! Stopped at epoch 1', f'Model predictions: {1797 - 1650}']
    assert first_gpu.ran          # a single process is rank 0


def test_the_example_script_runs(ex, capsys):
    ex.main()
    out = capsys.readouterr().out
    assert 'pytorch-accelerated: accuracy' in out and 'Orca: val_loss' in out
