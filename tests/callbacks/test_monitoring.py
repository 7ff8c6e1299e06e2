"""ModelSummary, ThroughputMonitor and StepHistory inside real fits."""
import logging
import os

import pytest
import torch
from torch import nn

from aitoolbox_like import AbstractCallback, StopTraining, TrainLoop
from aitoolbox_like.callbacks.model_save import ModelCheckpoint, ModelIterationCheckpoint
from aitoolbox_like.callbacks.monitoring import ModelSummary, StepHistory, ThroughputMonitor, _percentile
from aitoolbox_like.callbacks.train_schedule import LinearWarmupScheduler
from helpers import Interrupt, MLP, loaders


def make_loop(n=32, batch_size=8, dropout=0.0):
    torch.manual_seed(0)
    model = MLP(dropout=dropout)
    train, val, test = loaders(n=n, batch_size=batch_size)
    return TrainLoop(model, train, val, test, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                     progress_bar=False)


def test_model_summary_with_default_arguments_logs_counts_and_layers(caplog):
    loop = make_loop()
    summary = ModelSummary()
    with caplog.at_level(logging.INFO, logger='aitoolbox_like.callbacks.monitoring'):
        loop.fit(num_epochs=1, callbacks=[summary])
    expected = sum(p.numel() for p in loop.model.parameters())        # 6*16+16 + 16*3+3 = 163
    assert summary.summary['num_parameters'] == expected == 163
    assert summary.summary['num_trainable_parameters'] == 163
    assert summary.summary['parameter_bytes'] == 163 * 4
    assert [layer['name'] for layer in summary.summary['layers']] == ['net.0', 'net.1', 'net.2', 'net.3']
    assert [layer['num_parameters'] for layer in summary.summary['layers']] == [112, 0, 0, 51]
    assert all(layer['output_shape'] is None for layer in summary.summary['layers'])
    assert 'net.0' in caplog.text and 'Linear' in caplog.text and '163 total' in caplog.text
    assert 'num_parameters' not in loop.train_history          # constants of the model stay out of the history
    assert summary.report_path is None                          # no experiment folder


def test_model_summary_frozen_parameters_depth_shapes_and_report_file(tmp_path):
    loop = make_loop()
    for p in loop.model.net[0].parameters():
        p.requires_grad_(False)
    summary = ModelSummary(example_input=torch.zeros(5, 6), max_depth=1)
    loop.fit(num_epochs=1, callbacks=[summary, ModelCheckpoint('p', 'e', str(tmp_path), {}, cloud_save_mode='local')])
    assert summary.summary['num_trainable_parameters'] == 51
    assert summary.summary['layers'] == [{'name': 'net', 'type': 'Sequential', 'num_parameters': 163,
                                          'output_shape': [5, 3]}]
    assert summary.report_path == os.path.join(loop.experiment.dir_path, 'model_summary.txt')
    text = open(summary.report_path).read()
    assert '112 frozen' in text and '[5, 3]' in text

    shapes = ModelSummary.summarize(MLP(dropout=0.5), torch.zeros(2, 6))
    assert [layer['output_shape'] for layer in shapes['layers']] == [[2, 16], [2, 16], [2, 16], [2, 3]]


def test_model_summary_example_input_does_not_change_the_training_run():
    plain = make_loop(dropout=0.3)
    plain.fit(num_epochs=2)
    summarized = make_loop(dropout=0.3)
    summarized.fit(num_epochs=2, callbacks=[ModelSummary(example_input=torch.ones(3, 6))])
    for a, b in zip(plain.model.parameters(), summarized.model.parameters()):
        assert torch.equal(a, b)


def test_model_summary_arguments():
    with pytest.raises(ValueError):
        ModelSummary(max_depth=0)


def test_throughput_monitor_with_default_arguments_writes_the_documented_history_keys():
    loop = make_loop(n=36, batch_size=8)           # 5 batches per epoch, the last one of 4 samples
    monitor = ThroughputMonitor()
    loop.fit(num_epochs=2, callbacks=[monitor])
    history = loop.train_history
    for key in ('throughput_samples_per_sec', 'throughput_batches_per_sec', 'step_time_p50', 'step_time_p90',
                'step_time_p99'):
        assert len(history[key]) == 2 and all(v > 0 for v in history[key]), key
        assert history.get_epochs(key) == [0, 1]
    assert 'cuda_max_memory_allocated_mb' not in history        # CPU run
    assert history['step_time_p50'][0] <= history['step_time_p90'][0] <= history['step_time_p99'][0]
    # Samples and batches are counted over the same time: their ratio is the mean batch size.
    ratio = history['throughput_samples_per_sec'][0] / history['throughput_batches_per_sec'][0]
    assert ratio == pytest.approx(36 / 5)


def test_throughput_monitor_custom_percentiles_and_nearest_rank():
    loop = make_loop()
    loop.fit(num_epochs=1, callbacks=[ThroughputMonitor(percentiles=(25, 100), log=False)])
    assert set(loop.train_history) >= {'step_time_p25', 'step_time_p100'}
    assert _percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert _percentile([1.0, 2.0, 3.0, 4.0], 99) == 4.0
    assert _percentile([5.0], 1) == 5.0
    with pytest.raises(ValueError):
        ThroughputMonitor(percentiles=(0,))


def test_throughput_monitor_uses_no_device_hooks_per_step():
    hooks = ThroughputMonitor().hooks_in_use()
    assert set(hooks) == {'on_train_begin', 'on_epoch_begin', 'on_batch_begin', 'on_batch_end', 'on_train_epoch_end'}


class StepWitness(AbstractCallback):
    """What each step trains with, read the slow way (a host read per step): the learning rate its update uses and
    its loss."""

    def __init__(self):
        super().__init__('witness')
        self.steps = {}

    def on_batch_begin(self):
        loop = self.train_loop_obj
        self.steps[loop.total_iteration_idx] = {'lr': loop.optimizer.param_groups[0]['lr']}

    def on_after_loss(self):
        loop = self.train_loop_obj
        self.steps[loop.total_iteration_idx]['loss'] = loop.loss.item()


def test_step_history_keeps_every_step_s_loss_and_learning_rate_after_the_fit():
    loop = make_loop(n=40)          # 5 batches per epoch
    witness = StepWitness()
    loop.fit(num_epochs=2, callbacks=[witness, LinearWarmupScheduler(num_warmup_steps=6),
                                      StepHistory(sync_every_n_steps=3)])
    steps = loop.train_history.steps
    assert [record['step'] for record in steps] == list(range(10))
    assert [record['epoch'] for record in steps] == [0] * 5 + [1] * 5
    for record in steps:
        expected = witness.steps[record['step']]
        assert record['loss'] == expected['loss'] and record['lr'] == expected['lr']
        assert set(record) == {'step', 'epoch', 'loss', 'lr'}
    assert steps[0]['lr'] == 0.0 and steps[6]['lr'] == 0.1      # the warm-up, as each update used it
    assert 'steps' not in loop.train_history        # the per-epoch names are as they were


def test_step_history_every_k_steps_and_without_it_nothing_is_kept():
    loop = make_loop(n=40)
    loop.fit(num_epochs=2, callbacks=[StepHistory(every_n_steps=3)])
    assert [record['step'] for record in loop.train_history.steps] == [0, 3, 6, 9]
    plain = make_loop(n=40)
    plain.fit(num_epochs=1)
    assert plain.train_history.steps == []


def test_step_history_continues_after_a_resume_inside_an_epoch(tmp_path):
    def callbacks(root, *extra):
        return [LinearWarmupScheduler(num_warmup_steps=6), StepHistory(sync_every_n_steps=4),
                ModelIterationCheckpoint(3, 'proj', 'exp', str(root), {}, cloud_save_mode='local'), *extra]

    reference = make_loop(n=40)
    reference.fit(num_epochs=2, callbacks=callbacks(tmp_path / 'reference'))
    first = make_loop(n=40)
    first.fit(num_epochs=2, callbacks=callbacks(tmp_path / 'run', Interrupt(batch=8)))   # checkpoint after batch 6
    assert [record['step'] for record in first.train_history.steps] == list(range(8))
    resumed = make_loop(n=40)
    resumed.fit(num_epochs=2, callbacks=callbacks(tmp_path / 'run'), resume_from='latest')
    assert resumed.train_history.steps == reference.train_history.steps
    assert [record['step'] for record in resumed.train_history.steps] == list(range(10))
