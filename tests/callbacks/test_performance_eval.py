import contextlib
import csv
import glob
import os

import pytest
import torch

from aitoolbox_like import AbstractCallback, TrainLoop
from aitoolbox_like.callbacks.performance_eval import (MetricHistoryRename, ModelPerformanceEvaluation,
                                                       ModelPerformancePrintReport, ModelTrainHistoryFileWriter,
                                                       ModelTrainHistoryPlot, TrainHistoryFormatter,
                                                       make_metric_figure)
from aitoolbox_like.results import AbstractResultPackage, ClassificationResultPackage
from helpers import MLP, loaders


def make_loop(seed=0, **kwargs):
    torch.manual_seed(seed)
    train, val, test = loaders()
    model = MLP()
    return TrainLoop(model, train, val, test, torch.optim.SGD(model.parameters(), lr=0.1),
                     torch.nn.CrossEntropyLoss(), progress_bar=False, **kwargs)


def accuracy_by_hand(model, loader):
    model.eval()
    with torch.no_grad():
        correct = sum((model(x).argmax(1) == y).sum().item() for x, y in loader)
    model.train()
    return correct / len(loader.dataset)


class LossEcho(AbstractResultPackage):
    """A package that needs the loss: returns it and the per-class counts as a dict-valued metric."""

    def __init__(self):
        super().__init__(pkg_name='LossEcho')
        self.requires_loss = True

    def prepare_results_dict(self):
        loss = self.additional_results['additional_results']['loss']
        counts = {f'c{c}': float((self.y_true == c).sum()) for c in range(3)}
        return {'echo_loss': loss, 'counts': counts}


def test_val_and_train_metrics_match_accuracy_computed_by_hand():
    loop = make_loop()
    by_hand = []

    class HandAccuracy(ModelPerformanceEvaluation):
        def on_epoch_end(self):
            super().on_epoch_end()
            by_hand.append((accuracy_by_hand(loop.model, loop.validation_loader),
                            accuracy_by_hand(loop.model, loop.train_loader)))

    loop.fit(num_epochs=3, callbacks=[HandAccuracy(ClassificationResultPackage(), args={'lr': 0.1},
                                                   on_train_data=True)])
    history = loop.train_history
    assert history['val_Accuracy'] == pytest.approx([v for v, _ in by_hand])
    assert history['train_Accuracy'] == pytest.approx([t for _, t in by_hand])
    assert history.get_epochs('val_Accuracy') == [0, 1, 2]
    assert history['train_end_val_Accuracy'] == pytest.approx([by_hand[-1][0]])
    assert history['train_end_train_Accuracy'] == pytest.approx([by_hand[-1][1]])
    assert all(type(v) is float for v in history['val_Accuracy'])


def test_eval_frequency_and_end_of_training_only():
    loop = make_loop()
    loop.fit(num_epochs=5, callbacks=[ModelPerformanceEvaluation(ClassificationResultPackage(), {}, eval_frequency=2)])
    assert loop.train_history.get_epochs('val_Accuracy') == [0, 2, 4]

    loop = make_loop()
    loop.fit(num_epochs=2, callbacks=[ModelPerformanceEvaluation(ClassificationResultPackage(), {},
                                                                 on_each_epoch=False)])
    assert 'val_Accuracy' not in loop.train_history
    assert loop.train_history['train_end_val_Accuracy'] == \
        pytest.approx([accuracy_by_hand(loop.model, loop.validation_loader)])


def test_package_that_requires_loss_gets_the_validation_loss_and_dict_metrics_are_stored():
    loop = make_loop()
    loop.fit(num_epochs=2, callbacks=[ModelPerformanceEvaluation(LossEcho(), {})])
    history = loop.train_history
    assert history['val_echo_loss'] == pytest.approx(history['val_loss'])
    labels = torch.cat([y for _, y in loop.validation_loader])
    assert history['val_counts'][-1] == {f'c{c}': float((labels == c).sum()) for c in range(3)}


def test_bad_arguments_fail_clearly():
    with pytest.raises(ValueError, match='on_train_data and on_val_data'):
        ModelPerformanceEvaluation(ClassificationResultPackage(), {}, on_val_data=False)
    with pytest.raises(TypeError, match='result package'):
        ModelPerformanceEvaluation('accuracy', {})
    train, _, _ = loaders()
    model = MLP()
    loop = TrainLoop(model, train, None, None, torch.optim.SGD(model.parameters(), lr=0.1),
                     torch.nn.CrossEntropyLoss(), progress_bar=False)
    with pytest.raises(ValueError, match='validation_loader'):
        loop.fit(num_epochs=1, callbacks=[ModelPerformanceEvaluation(ClassificationResultPackage(), {})])


def test_print_report_prints_history_values_and_val_loss_works_at_the_end(capsys):
    loop = make_loop()
    loop.fit(num_epochs=2, callbacks=[ModelPerformanceEvaluation(ClassificationResultPackage(), {}),
                                      ModelPerformancePrintReport(['val_loss', 'val_Accuracy'])])
    out = capsys.readouterr().out
    history = loop.train_history
    for epoch in range(2):
        assert f"val_loss: {history['val_loss'][epoch]}" in out
        assert f"val_Accuracy: {history['val_Accuracy'][epoch]}" in out
    end_report = out.split('End of training performance report')[1]
    assert f"val_loss: {history['val_loss'][-1]}" in end_report
    assert f"train_end_val_Accuracy: {history['train_end_val_Accuracy'][-1]}" in end_report


def test_print_report_missing_metric(capsys):
    loop = make_loop()
    with pytest.raises(ValueError, match="'val_f1'"):
        loop.fit(num_epochs=1, callbacks=[ModelPerformancePrintReport(['val_f1'])])
    loop = make_loop()
    loop.fit(num_epochs=1, callbacks=[ModelPerformancePrintReport(['val_f1'], strict_metric_reporting=False)])
    assert "'val_f1' expected for the report is not in the training history" in capsys.readouterr().out
    with pytest.raises(ValueError):
        ModelPerformancePrintReport([])


def test_metric_rename_follows_metrics_computed_every_k_epochs():
    loop = make_loop()
    loop.fit(num_epochs=4, callbacks=[
        ModelPerformanceEvaluation(ClassificationResultPackage(), {}, eval_frequency=2),
        MetricHistoryRename('val_Accuracy', 'acc'),
        TrainHistoryFormatter(lambda h: h['val_loss'], lambda v: ('best_val_loss', min(v)),
                              epoch_end=False, train_end=True)])
    history = loop.train_history
    assert history['acc'] == history['val_Accuracy']
    assert history.get_epochs('acc') == [0, 2]
    assert history['best_val_loss'] == [min(history['val_loss'])]


def test_formatter_listed_before_the_metric_it_reads_fails_clearly():
    loop = make_loop()
    with pytest.raises(ValueError, match='must run before this one'):
        loop.fit(num_epochs=1, callbacks=[
            MetricHistoryRename('val_Accuracy', 'acc'),
            ModelPerformanceEvaluation(ClassificationResultPackage(), {})])
    with pytest.raises(ValueError, match='exactly one'):
        MetricHistoryRename('val_loss', 'x', epoch_end=True, train_end=True)


def test_formatter_refuses_a_metric_recorded_twice_in_an_epoch(caplog):
    # AIToolbox's check kept for what it caught: more values than epochs so far (here two in epoch 0)
    for strict in (True, False):
        loop = make_loop()
        evaluation = ModelPerformanceEvaluation(ClassificationResultPackage(), {})
        rename = MetricHistoryRename('val_Accuracy', 'acc', strict_metric_extract=strict)
        loop.callbacks_handler.register_callbacks([evaluation, rename])
        evaluation.evaluate_model_performance()
        rename.on_epoch_end()
        evaluation.evaluate_model_performance()
        if strict:
            with pytest.raises(ValueError, match='more than one per epoch'):
                rename.on_epoch_end()
        else:
            rename.on_epoch_end()
            assert 'more than one per epoch' in caplog.text
            assert len(loop.train_history['acc']) == 1
        loop.epoch += 1
        evaluation.evaluate_model_performance()     # 3 values after epoch 1: still one too many
        with pytest.raises(ValueError) if strict else contextlib.nullcontext():
            rename.on_epoch_end()


class DeviceRecordingMetric:
    """A metric written for AIToolbox: called with (predicted, target), with compute / reset / to, no update."""

    def __init__(self):
        self.devices, self.resets = [], 0

    def __call__(self, predicted, target):
        return float((predicted.argmax(1) == target).float().mean())

    def compute(self):
        return None

    def reset(self):
        self.resets += 1

    def to(self, device):
        self.devices.append(device)


def test_torch_metrics_package_of_an_aitoolbox_style_metric_is_moved_reset_and_called():
    from aitoolbox_like.results import TorchMetricsPackage

    loop = make_loop()
    metric = DeviceRecordingMetric()
    evaluation = ModelPerformanceEvaluation(TorchMetricsPackage(metric), {}, on_train_data=True)
    loop.fit(num_epochs=2, callbacks=[evaluation])
    assert metric.devices == [loop.device]          # moved at registration, as AIToolbox did
    assert evaluation.train_result_package.metric.devices == [loop.device]
    assert metric.resets == 2                       # after every epoch
    assert loop.train_history['val_DeviceRecordingMetric_PTLMetrics'][-1] == pytest.approx(
        accuracy_by_hand(loop.model, loop.validation_loader))


def test_missing_validation_loader_is_refused_when_training_starts_not_at_registration():
    train, _, _ = loaders()
    model = MLP()
    loop = TrainLoop(model, train, None, None, torch.optim.SGD(model.parameters(), lr=0.1),
                     torch.nn.CrossEntropyLoss(), progress_bar=False)
    evaluation = ModelPerformanceEvaluation(ClassificationResultPackage(), {})
    loop.callbacks_handler.register_callbacks([evaluation])         # AIToolbox registered it too
    with pytest.raises(ValueError, match='validation_loader'):
        loop.fit(num_epochs=1)
    assert loop.train_history['loss'] == []                          # refused before the first epoch


def _results_dir(root='experiments', project='default_project', experiment='experiment'):
    dirs = glob.glob(os.path.join(root, project, f'{experiment}_*', 'results'))
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_history_plot_png_per_metric_in_default_experiment_folder():
    import matplotlib.image
    loop = make_loop()
    plot = ModelTrainHistoryPlot()
    loop.fit(num_epochs=2, callbacks=[ModelPerformanceEvaluation(LossEcho(), {}), plot])
    folder = os.path.join(_results_dir(), 'plots_epoch_1')
    assert os.path.abspath(folder) == os.path.dirname(plot.last_written_files[0])
    names = sorted(os.listdir(folder))
    # dict-valued metrics are plotted per key; metrics with a single value are not plotted
    assert names == sorted(f'{m}.png' for m in ['accumulated_loss', 'val_loss', 'val_echo_loss',
                                                 'val_counts_c0', 'val_counts_c1', 'val_counts_c2'])
    image = matplotlib.image.imread(os.path.join(folder, 'accumulated_loss.png'))
    assert image.shape[0] > 200 and image.shape[1] > 300 and image.std() > 0
    assert os.path.isdir(os.path.join(_results_dir(), 'plots_epoch_0'))   # epoch 0: only one value, no plots


def test_plot_title_names_the_best_value_and_epoch():
    fig = make_metric_figure('val_loss', [0, 2, 4], [0.9, 0.4, 0.6])
    assert fig.axes[0].get_title() == 'val_loss\nbest: 0.4 at epoch 2'
    fig = make_metric_figure('val_Accuracy', [0, 1, 2], [0.5, 0.8, 0.7])
    assert fig.axes[0].get_title() == 'val_Accuracy\nbest: 0.8 at epoch 1'
    assert list(fig.axes[0].lines[0].get_xdata()) == [0, 1, 2]


def test_history_plot_pdf_with_explicit_and_inferred_experiment_details(tmp_path):
    loop = make_loop()
    plot = ModelTrainHistoryPlot(epoch_end=False, train_end=True, file_format='pdf', project_name='proj',
                                 experiment_name='exp', local_model_result_folder_path=str(tmp_path / 'out'))
    loop.fit(num_epochs=2, callbacks=[plot])
    path = os.path.join(_results_dir(str(tmp_path / 'out'), 'proj', 'exp'), 'train_end_plots_epoch_1.pdf')
    # AIToolbox's PDF, then the training-vs-validation charts' (loss and val_loss have two values)
    assert plot.last_written_files == [path, path.replace('.pdf', '_train_val.pdf')]
    for written in plot.last_written_files:
        with open(written, 'rb') as f:
            assert f.read(5) == b'%PDF-'

    # a tracking loop's details are used, and with a cloud mode the files go to its uploader
    loop = make_loop()
    loop.project_name, loop.experiment_name = 'tracked', 'run'
    loop.local_model_result_folder_path, loop.cloud_save_mode = str(tmp_path / 'tracked_root'), 's3'
    uploaded = []
    loop.experiment_uploader = type('Uploader', (), {'upload_experiment_file': lambda self, p: uploaded.append(p)})()
    writer = ModelTrainHistoryFileWriter(epoch_end=False, train_end=True)
    loop.fit(num_epochs=1, callbacks=[writer])
    assert writer.last_written_files[0].startswith(str(tmp_path / 'tracked_root' / 'tracked' / 'run_'))
    assert uploaded == writer.last_written_files


class MessageReader(AbstractCallback):
    """Reads, after the reporters (execution_order 97), the paths they post on the message service."""

    KEYS = ('ModelTrainHistoryPlot_results_file_local_paths', 'ModelTrainHistoryFileWriter_results_file_local_paths')

    def __init__(self):
        super().__init__('message reader', execution_order=98)
        self.seen = []

    def _read(self, phase):
        self.seen.append((phase, *[self.message_service.read_messages(key) for key in self.KEYS]))

    def on_epoch_end(self):
        self._read(f'epoch {self.train_loop_obj.epoch}')

    def on_train_end(self):
        self._read('train end')


def test_history_reporters_post_the_written_paths_until_the_end_of_the_epoch():
    loop = make_loop()
    plot, writer, reader = ModelTrainHistoryPlot(train_end=True), ModelTrainHistoryFileWriter(train_end=True), \
        MessageReader()
    loop.fit(num_epochs=2, callbacks=[reader, plot, writer])
    results = os.path.abspath(_results_dir())
    names = ['accumulated_loss.png', 'val_loss.png']      # history order; one-value metrics unplotted
    # One message per key and epoch (the previous epoch's is gone), each the list of paths written then.
    assert reader.seen == [
        ('epoch 0', [[]], [[os.path.join(results, 'results.txt')]]),
        ('epoch 1', [[os.path.join(results, 'plots_epoch_1', n) for n in names]],
         [[os.path.join(results, 'results.txt')]]),
        ('train end', [[os.path.join(results, 'train_end_plots_epoch_1', n) for n in names]],
         [[os.path.join(results, 'train_end_results.txt')]]),
    ]
    assert all(os.path.isfile(p) for _, plots, txts in reader.seen for p in plots[0] + txts[0])
    assert all(loop.message_service.read_messages(key) is None for key in MessageReader.KEYS)


def test_bad_file_formats():
    with pytest.raises(ValueError, match="'jpg'"):
        ModelTrainHistoryPlot(file_format='jpg')
    with pytest.raises(ValueError, match="'json'"):
        ModelTrainHistoryFileWriter(file_format='json')
    with pytest.raises(ValueError, match='both False'):
        ModelTrainHistoryFileWriter(epoch_end=False, train_end=False)


@pytest.mark.parametrize('skip_stale_values', [False, True])
@pytest.mark.parametrize('file_format, delimiter', [('csv', ','), ('tsv', '\t')])
def test_history_file_writer_table_rows_equal_history(file_format, delimiter, skip_stale_values):
    loop = make_loop(end_auto_eval=2)
    loop.fit(num_epochs=3, callbacks=[ModelPerformanceEvaluation(ClassificationResultPackage(), {}),
                                      ModelTrainHistoryFileWriter(file_format=file_format,
                                                                  skip_stale_values=skip_stale_values)])
    with open(os.path.join(_results_dir(), f'results.{file_format}'), newline='') as f:
        rows = list(csv.reader(f, delimiter=delimiter))
    history = loop.train_history
    header = rows[0]
    assert header[0] == 'Epoch' and set(header[1:]) == {'accumulated_loss', 'val_loss', 'val_Accuracy'}
    assert [r[0] for r in rows[1:]] == ['0', '1', '2']
    for name in header[1:]:
        column = [r[header.index(name)] for r in rows[1:]]
        expected = [''] * 3
        for epoch, value in zip(history.get_epochs(name), history[name]):
            expected[epoch] = str(value)
        if not skip_stale_values:
            # AIToolbox's rows: each metric's latest value, so an epoch without a new one repeats the last
            expected = [cell or expected[i - 1] for i, cell in enumerate(expected)]
        assert column == expected     # 'val_loss' is computed every 2nd epoch: epoch 1 is empty or repeated


def test_history_file_writer_writes_latest_values_of_a_prepared_history():
    # AIToolbox's rule, whatever the epochs of the values: the last value of every metric that has one
    loop = make_loop()
    writer = ModelTrainHistoryFileWriter(file_format='tsv')
    loop.callbacks_handler.register_callbacks([writer])
    loop.train_history.wrap_pre_prepared_history({'loss': [1.5, 2.5, 3.5], 'accumulated_loss': [], 'val_loss': [],
                                                  'acc': [0.25, 0.75]})
    writer.on_epoch_end()
    loop.epoch += 1
    loop.insert_metric_result_into_history('new', 7.0)
    writer.on_epoch_end()
    with open(writer.last_written_files[0], newline='') as f:
        rows = list(csv.reader(f, delimiter='\t'))
    assert rows == [['Epoch', 'loss', 'acc'], ['0', '3.5', '0.75'],
                    ['NEW_METRICS_DETECTED'], ['Epoch', 'loss', 'acc', 'new'], ['1', '3.5', '0.75', '7.0']]


def test_history_file_writer_txt_and_new_metrics():
    loop = make_loop()
    writer = ModelTrainHistoryFileWriter()
    loop.fit(num_epochs=1, callbacks=[writer])
    loop.fit(num_epochs=2, callbacks=[ModelPerformanceEvaluation(ClassificationResultPackage(), {})])
    with open(writer.last_written_files[0]) as f:
        text = f.read()
    assert text.count('Epoch: ') == 2
    assert f"val_Accuracy:\t{loop.train_history['val_Accuracy'][0]}" in text.split('Epoch: 1')[1]

    loop = make_loop()
    writer = ModelTrainHistoryFileWriter(file_format='csv')
    loop.fit(num_epochs=1, callbacks=[writer])
    loop.fit(num_epochs=2, callbacks=[ModelPerformanceEvaluation(ClassificationResultPackage(), {})])
    with open(writer.last_written_files[0], newline='') as f:
        rows = list(csv.reader(f))
    assert rows[2] == ['NEW_METRICS_DETECTED'] and rows[3][-1] == 'val_Accuracy'
    assert rows[4][-1] == str(loop.train_history['val_Accuracy'][0])


def test_ddp_metrics_cover_the_validation_set_once_and_rank0_reporters_do_not_hang():
    pytest.importorskip('tensorboard')
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from aitoolbox_like.callbacks.tensorboard import TensorboardFullTracking
    loop = make_loop(gpu_mode='ddp')
    tb = TensorboardFullTracking(histogram_frequency=1, log_graph=True)
    # 29 validation samples on 2 ranks: the DistributedSampler pads one duplicate that must not be counted
    loop.fit(num_epochs=2, num_gpus=2, on_gpu=False, callbacks=[
        ModelPerformanceEvaluation(ClassificationResultPackage(), {}), tb, ModelTrainHistoryPlot(),
        ModelPerformancePrintReport(['val_Accuracy'])])
    history = loop.train_history
    assert history['train_end_val_Accuracy'] == pytest.approx([accuracy_by_hand(loop.model, loop.validation_loader)])
    assert history['val_Accuracy'][-1] == history['train_end_val_Accuracy'][-1]
    assert os.path.exists(os.path.join(_results_dir(), 'plots_epoch_1', 'val_Accuracy.png'))
    log_dirs = glob.glob(os.path.join('experiments', 'default_project', 'experiment_*', 'tensorboard', '*'))
    acc = EventAccumulator(log_dirs[0], size_guidance={'scalars': 0})
    acc.Reload()
    assert [e.value for e in acc.Scalars('metrics/val_Accuracy')] == pytest.approx(history['val_Accuracy'])


FIRST_METRIC_SCRIPT = '''
import sys
import torch
from aitoolbox_like import AbstractCallback, TrainLoop
from aitoolbox_like.callbacks.performance_eval import ModelPerformanceEvaluation
from aitoolbox_like.results import {package}
from helpers import MLP, loaders

class Probe(AbstractCallback):
    def __init__(self):
        super().__init__('probe')
        self.at_epoch_begin = []
    def on_epoch_begin(self):
        self.at_epoch_begin.append('sklearn' in sys.modules)

torch.manual_seed(0)
train, val, _ = loaders()
model = MLP()
probe = Probe()
loop = TrainLoop(model, train, val, None, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.CrossEntropyLoss())
loop.fit(num_epochs=2, callbacks=[probe, ModelPerformanceEvaluation({package}(), {{}})])
print(probe.at_epoch_begin, 'sklearn' in sys.modules,
      sorted(k for k in loop.train_history.keys() if k.startswith('val_')))
'''


@pytest.mark.parametrize('package, expected', [
    # Accuracy (and the regression metrics) are computed with NumPy: scikit-learn is never imported.
    ('ClassificationResultPackage', "[False, False] False ['val_Accuracy', 'val_loss']"),
    # F1, precision, recall and the AUCs are scikit-learn's: imported before the first epoch, not inside it.
    ('BinaryClassificationResultPackage', None)])
def test_the_first_metric_imports_nothing_in_the_middle_of_the_run(package, expected):
    import subprocess
    import sys
    helpers_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'support')
    script = FIRST_METRIC_SCRIPT.format(package=package)
    if package == 'BinaryClassificationResultPackage':      # binary targets and positive-class probabilities
        script = script.replace('MLP()', 'MLP(out_features=1)').replace(
            'torch.nn.CrossEntropyLoss()', 'BinaryLoss()').replace(
            'from helpers import MLP, loaders', 'from helpers import MLP, loaders\n'
            'class BinaryLoss(torch.nn.Module):\n'
            '    def forward(self, out, y):\n'
            '        return torch.nn.functional.binary_cross_entropy_with_logits(out.squeeze(1), (y > 0).float())\n'
            'class Binary(MLP):\n'
            '    def get_predictions(self, batch, device):\n'
            '        y_pred, y, meta = MLP.get_predictions(self, batch, device)\n'
            '        return torch.sigmoid(y_pred).squeeze(1), (y > 0).long(), meta\n').replace(
            'model = MLP(out_features=1)', 'model = Binary(out_features=1)')
        expected = ("[True, True] True ['val_Accuracy', 'val_F1_score', 'val_Precision', 'val_PrecisionRecall_AUC', "
                    "'val_ROC_AUC', 'val_Recall', 'val_loss']")
    result = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYTHONPATH=helpers_dir))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == expected
