"""Training against validation on one chart: what a user of ModelTrainHistoryPlot finds after a fit with validation
and a metric (the paired charts beside AIToolbox's per-metric ones, which keep exactly their files), and what each
paired chart draws (the history's values of the right metrics)."""
import io
import os

import numpy as np
import pytest
import torch

from aitoolbox_like.callbacks.performance_eval import ModelPerformanceEvaluation, ModelTrainHistoryPlot
from aitoolbox_like.results.reporting import TrainingHistoryPlotter, train_val_pairs
from aitoolbox_like.results.basic import ClassificationResultPackage
from aitoolbox_like.tracking import TrainLoopCheckpointEndSave
from helpers import MLP, experiment_dir, loaders

pytest.importorskip('matplotlib')

EPOCHS = 4


def _pixels(png):
    import matplotlib.image
    return matplotlib.image.imread(png, format='png')


def _lines(fig):
    """{label: (x, y)} of the chart's data lines (the best-epoch marker apart)."""
    [ax] = fig.axes
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines
            if not line.get_label().startswith('best ')}


@pytest.fixture(scope='module')
def fitted(tmp_path_factory):
    root = tmp_path_factory.mktemp('paired')
    torch.manual_seed(0)
    train, val, test = loaders()
    model = MLP()
    loop = TrainLoopCheckpointEndSave(model, train, val, test, torch.optim.SGD(model.parameters(), lr=0.1),
                                      torch.nn.CrossEntropyLoss(), 'proj', 'exp', str(root), {'lr': 0.1},
                                      val_result_package=ClassificationResultPackage(),
                                      test_result_package=ClassificationResultPackage(), cloud_save_mode='local',
                                      progress_bar=False)
    callbacks = [ModelPerformanceEvaluation(ClassificationResultPackage(), {}, on_train_data=True, on_val_data=True),
                 ModelTrainHistoryPlot(epoch_end=False, train_end=True)]
    loop.fit(num_epochs=EPOCHS, callbacks=callbacks)
    return loop, os.path.join(experiment_dir(str(root)), 'results')


def test_a_fit_with_validation_and_a_metric_writes_a_paired_chart_per_metric_beside_aitoolboxs(fitted):
    loop, results = fitted
    last = f'train_end_plots_epoch_{EPOCHS - 1}'
    paired = ['Accuracy_train_val.png', 'loss_train_val.png']
    assert sorted(os.listdir(os.path.join(results, f'{last}_train_val'))) == paired
    # AIToolbox's folders keep exactly their files: one chart per metric, and the tracking loop's end-of-training
    # results/plots (AIToolbox's tests list it and the bucket's keys exactly).
    per_metric = sorted(f'{m}.png' for m in ['accumulated_loss', 'val_loss', 'train_Accuracy', 'val_Accuracy'])
    assert sorted(os.listdir(os.path.join(results, last))) == per_metric
    assert sorted(os.listdir(os.path.join(results, 'plots'))) == per_metric
    assert sorted(name for name in os.listdir(results) if not name.endswith('.p')) == [
        'plots', last, f'{last}_train_val']
    for name in paired:
        image = _pixels(os.path.join(results, f'{last}_train_val', name))
        assert image.shape[0] > 200 and image.shape[1] > 300 and image.std() > 0


def test_each_paired_chart_draws_the_training_and_validation_values_of_its_metric(fitted):
    loop, results = fitted
    history = loop.train_history
    epochs = list(range(EPOCHS))
    charts = dict(TrainingHistoryPlotter(results).generate_train_val_plots(history))
    assert sorted(charts) == ['Accuracy', 'loss']

    loss = charts['loss']
    assert _lines(loss) == {name: (epochs, list(history[name])) for name in ['accumulated_loss', 'val_loss']}
    best_epoch = int(np.argmin(history['val_loss']))
    [marker] = [line for line in loss.axes[0].lines if line.get_label() == 'best val_loss']
    assert list(marker.get_xdata()) == [best_epoch, best_epoch]
    assert loss.axes[0].get_title() == (f'loss: training and validation\n'
                                        f'best val_loss: {min(history["val_loss"]):.5g} at epoch {best_epoch}')

    accuracy = charts['Accuracy']
    assert _lines(accuracy) == {name: (epochs, list(history[name])) for name in ['train_Accuracy', 'val_Accuracy']}
    best_epoch = int(np.argmax(history['val_Accuracy']))       # higher is better: the first epoch of the highest
    assert accuracy.axes[0].get_title().endswith(
        f'best val_Accuracy: {max(history["val_Accuracy"]):.5g} at epoch {best_epoch}')

    # The files are these charts: the same pixels as the figures inspected above.
    for name, fig in charts.items():
        buffer = io.BytesIO()
        fig.savefig(buffer, format='png')
        buffer.seek(0)
        folder = os.path.join(results, f'train_end_plots_epoch_{EPOCHS - 1}_train_val')
        drawn = _pixels(os.path.join(folder, f'{name}_train_val.png'))
        assert np.array_equal(drawn, _pixels(buffer))


def test_the_pairs_are_a_validation_metric_and_its_training_counterparts():
    names = ['loss', 'accumulated_loss', 'val_loss', 'train_F1', 'val_F1', 'val_Precision', 'train_Recall',
             'train_end_train_F1', 'train_end_val_F1', 'loss_train_val', 'val_counts_c0', 'train_counts_c0']
    assert train_val_pairs(names) == {'loss': (['loss', 'accumulated_loss'], 'val_loss'),
                                      'F1': (['train_F1'], 'val_F1'),
                                      'train_end_F1': (['train_end_train_F1'], 'train_end_val_F1'),
                                      'counts_c0': (['train_counts_c0'], 'val_counts_c0')}
    # 'loss_train_val' is a metric of its own (its chart in AIToolbox's folder; the paired ones have a folder of their
    # own); a validation metric alone, or a training metric alone, is no pair.
    assert train_val_pairs(['val_loss']) == {} and train_val_pairs(['accumulated_loss', 'val_loss']) == {
        'loss': (['accumulated_loss'], 'val_loss')}


def test_the_paired_charts_can_be_turned_off_and_wait_for_two_values(tmp_path):
    torch.manual_seed(0)
    train, val, test = loaders()
    model = MLP()
    from aitoolbox_like import TrainLoop
    loop = TrainLoop(model, train, val, test, torch.optim.SGD(model.parameters(), lr=0.1),
                     torch.nn.CrossEntropyLoss(), progress_bar=False)
    on = ModelTrainHistoryPlot(project_name='p', experiment_name='on', local_model_result_folder_path=str(tmp_path))
    off = ModelTrainHistoryPlot(project_name='p', experiment_name='off', local_model_result_folder_path=str(tmp_path),
                                train_val=False)
    loop.fit(num_epochs=2, callbacks=[on, off])
    [on_dir] = [d for d in os.listdir(tmp_path / 'p') if d.startswith('on_')]
    [off_dir] = [d for d in os.listdir(tmp_path / 'p') if d.startswith('off_')]
    # epoch 0: one value each, no paired chart and no folder for it; epoch 1: loss_train_val.png
    assert sorted(os.listdir(tmp_path / 'p' / on_dir / 'results')) == ['plots_epoch_0', 'plots_epoch_1',
                                                                       'plots_epoch_1_train_val']
    assert os.listdir(tmp_path / 'p' / on_dir / 'results' / 'plots_epoch_1_train_val') == ['loss_train_val.png']
    assert sorted(os.listdir(tmp_path / 'p' / off_dir / 'results')) == ['plots_epoch_0', 'plots_epoch_1']
    assert on.last_written_files[-1] == str(tmp_path / 'p' / on_dir / 'results' / 'plots_epoch_1_train_val' /
                                            'loss_train_val.png')
