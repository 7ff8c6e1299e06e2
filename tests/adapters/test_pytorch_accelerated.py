"""pytorch-accelerated's own callbacks (the installed package, extra 'pta') passed to TrainLoop.fit as they are:
side by side with PTA's own Trainer (same model, data, callbacks: the same lines printed, the same files, the same
weights), PTA's events at PTA's points with PTA's arguments, its run history, stopping, and its file formats.
make pta-check runs all 14 of PTA's classes against the expectations of PTA's own tests (tools/pta_check)."""
import os
import pickle
import re

import pytest
import torch
from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    EarlyStoppingCallback, LimitBatchesCallback, LogMetricsCallback, PrintProgressCallback, SaveBestModelCallback,
    SaveTrainingStateCallback, StopTrainingError, TerminateOnNaNCallback, TrainerCallback)
from pytorch_accelerated.schedulers import CosineLrScheduler
from torch import nn
from torch.utils.data import DataLoader

from aitoolbox_like import TrainLoop, TTBasicModel
from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.adapters.pytorch_accelerated import AcceleratedCallbacks
from helpers import classification_data, state_equal


class Net(TTBasicModel):
    """One class for both trainers: PTA's Trainer calls it as a module, the TrainLoop through get_loss."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)


TRAIN, VAL = classification_data(53), classification_data(29, seed=1)


def make_loop(model, batch_size=8, **kwargs):
    return TrainLoop(model, DataLoader(TRAIN, batch_size=batch_size), DataLoader(VAL, batch_size=batch_size), None,
                     torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), nn.CrossEntropyLoss(),
                     progress_bar=False, **kwargs)


def run_on_ptas_trainer(model, callbacks, num_epochs, create_scheduler_fn=None, accumulation=1):
    trainer = Trainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                      callbacks=callbacks)
    trainer.train(train_dataset=TRAIN, eval_dataset=VAL, num_epochs=num_epochs, per_device_batch_size=8,
                  train_dataloader_kwargs={'shuffle': False, 'num_workers': 0},
                  eval_dataloader_kwargs={'num_workers': 0}, create_scheduler_fn=create_scheduler_fn,
                  gradient_accumulation_steps=accumulation)
    return trainer


def printed_lines(text):
    return [line for line in text.splitlines() if line.strip()]


def test_ptas_callbacks_print_save_and_stop_as_on_ptas_trainer_with_its_scheduler_to_the_same_weights(
        tmp_path, capsys):
    def callbacks(folder):
        return [PrintProgressCallback, LogMetricsCallback(), EarlyStoppingCallback(early_stopping_patience=1,
                                                                                   early_stopping_threshold=0.02),
                SaveBestModelCallback(save_path=str(folder / 'best_model.pt'))]
    scheduler = CosineLrScheduler.create_scheduler_fn(num_warmup_epochs=1, warmup_starting_lr=0.01)
    (tmp_path / 'pta').mkdir(), (tmp_path / 'ours').mkdir()

    torch.manual_seed(0)
    theirs = run_on_ptas_trainer(Net(), callbacks(tmp_path / 'pta'), num_epochs=8, create_scheduler_fn=scheduler)
    pta_lines = printed_lines(capsys.readouterr().out)

    torch.manual_seed(0)
    model = Net()
    loop = make_loop(model)
    loop.fit(num_epochs=8, callbacks=[AcceleratedCallbacks(create_scheduler_fn=scheduler),
                                      *callbacks(tmp_path / 'ours')])
    our_lines = printed_lines(capsys.readouterr().out)

    assert any(line.startswith('Stopping training due to no improvement') for line in pta_lines)
    assert our_lines == pta_lines, "\n".join(f"{a!r:60} {b!r}" for a, b in zip(our_lines + [""], pta_lines + [""]))
    assert loop.epoch < 7           # stopped early, as PTA's run
    ours, pta = torch.load(tmp_path / 'ours' / 'best_model.pt'), torch.load(tmp_path / 'pta' / 'best_model.pt')
    assert ours.keys() == pta.keys() == {'model_state_dict', 'optimizer_state_dict', 'scheduler_state_dict', 'loss'}
    assert state_equal(ours['model_state_dict'], pta['model_state_dict']) and ours['loss'] == pta['loss']
    assert ours['scheduler_state_dict'] == pta['scheduler_state_dict']
    # SaveBestModelCallback loads the best weights at the end of both runs.
    assert state_equal(model.state_dict(), theirs.model.state_dict())
    # What PTA's callbacks recorded is in the loop's history too.
    for name in ('train_loss_epoch', 'eval_loss_epoch'):
        assert loop.train_history[name] == theirs.run_history.get_metric_values(name)


class Recorder(TrainerCallback):
    """A user's own TrainerCallback: what each event receives, in order."""

    def __init__(self):
        self.events = []

    def _record(self, name, trainer, **kwargs):
        self.events.append((name, trainer.run_history.current_epoch, kwargs))

    def on_training_run_start(self, trainer, **kwargs):
        self._record('on_training_run_start', trainer, **kwargs)

    def on_train_epoch_start(self, trainer, **kwargs):
        self._record('on_train_epoch_start', trainer, **kwargs)

    def on_train_step_end(self, trainer, batch, batch_output, step, **kwargs):
        grads = [p.grad for p in trainer.model.parameters()]
        self._record('on_train_step_end', trainer, step=step, loss=batch_output['loss'].detach().clone(),
                     outputs=batch_output['model_outputs'].detach().clone(), batch=batch,
                     grads_zero=all(g is None or not g.any() for g in grads))

    def on_train_epoch_end(self, trainer, **kwargs):
        self._record('on_train_epoch_end', trainer, train_loss=trainer.run_history.get_latest_metric(
            'train_loss_epoch'))

    def on_eval_epoch_start(self, trainer, **kwargs):
        self._record('on_eval_epoch_start', trainer, **kwargs)

    def on_eval_step_end(self, trainer, batch, batch_output, **kwargs):
        self._record('on_eval_step_end', trainer, loss=batch_output['loss'].item())

    def on_eval_epoch_end(self, trainer, **kwargs):
        self._record('on_eval_epoch_end', trainer, eval_loss=trainer.run_history.get_latest_metric(
            'eval_loss_epoch'), **kwargs)
        trainer.run_history.update_metric('eval_steps', sum(e[0] == 'on_eval_step_end' for e in self.events))

    def on_training_run_epoch_end(self, trainer, **kwargs):
        self._record('on_training_run_epoch_end', trainer)

    def on_training_run_end(self, trainer, **kwargs):
        self._record('on_training_run_end', trainer)


def test_a_users_trainer_callback_gets_ptas_events_at_ptas_points_with_ptas_arguments():
    torch.manual_seed(0)
    model = Net()
    loop = make_loop(model, batch_size=16)     # 53 rows: 4 batches (16, 16, 16, 5)
    recorder = Recorder()
    loop.fit(num_epochs=2, callbacks=[recorder], grad_accumulation=2)

    names = [name for name, _, _ in recorder.events]
    epoch = (['on_train_epoch_start'] + ['on_train_step_end'] * 4 + ['on_train_epoch_end', 'on_eval_epoch_start']
             + ['on_eval_step_end'] * 2 + ['on_eval_epoch_end', 'on_training_run_epoch_end'])
    assert names == ['on_training_run_start'] + epoch * 2 + ['on_training_run_end']
    # run_history.current_epoch counts from 1 and goes up after on_training_run_epoch_end.
    assert [e for n, e, _ in recorder.events if n == 'on_training_run_epoch_end'] == [1, 2]
    assert recorder.events[-1][1] == 3

    steps = [kw for n, _, kw in recorder.events if n == 'on_train_step_end']
    assert [kw['step'] for kw in steps] == [0, 1, 2, 3] * 2
    for kw in steps:
        x, y = kw['batch']
        # model_outputs are the step's forward pass; the loss is already divided for gradient accumulation.
        assert kw['loss'] == nn.CrossEntropyLoss()(kw['outputs'], y) / 2
        assert kw['outputs'].shape == (len(x), 3)
    # Called before backward: no gradient yet at the first step of each accumulation window.
    assert [kw['grads_zero'] for kw in steps[:4]] == [True, False, True, False]

    # train_loss_epoch: PTA's batch-size-weighted mean of the (divided) step losses, recorded before the event.
    losses = [(float(kw['loss']), len(kw['batch'][0])) for kw in steps[:4]]
    first = [kw for n, _, kw in recorder.events if n == 'on_train_epoch_end'][0]['train_loss']
    total = torch.tensor(sum(loss * n for loss, n in losses))
    assert first == (total / torch.tensor(sum(n for _, n in losses))).item()
    ends = [kw for n, _, kw in recorder.events if n == 'on_eval_epoch_end']
    assert [kw['is_intermediate'] for kw in ends] == [False, False]
    assert loop.train_history['eval_loss_epoch'] == [kw['eval_loss'] for kw in ends]
    assert loop.train_history['eval_steps'] == [2, 4]       # update_metric lands in the loop's history
    eval_losses = [kw['loss'] for n, _, kw in recorder.events if n == 'on_eval_step_end'][:2]
    assert ends[0]['eval_loss'] == pytest.approx((eval_losses[0] * 16 + eval_losses[1] * 13) / 29, rel=1e-6)


def test_mixed_with_the_loops_callbacks_and_ptas_classes_passed_as_classes():
    calls = []

    class Ours(AbstractCallback):
        def on_epoch_end(self):
            calls.append(('ours', self.train_loop_obj.epoch))

    class Theirs(TrainerCallback):
        def on_training_run_epoch_end(self, trainer, **kwargs):
            calls.append(('theirs', trainer.run_history.current_epoch))

    loop = make_loop(Net())
    loop.fit(num_epochs=2, callbacks=[Ours('ours'), Theirs, LimitBatchesCallback(2)])
    # PTA's callbacks run where the first of them is in the list (execution_order being equal).
    assert calls == [('ours', 0), ('theirs', 1), ('ours', 1), ('theirs', 2)]
    # LimitBatchesCallback limited this fit's loaders; the loop has its own back.
    assert loop.total_iteration_idx == 3 and len(loop.train_loader) == 7
    [adapter] = [cb for cb in loop.callbacks if isinstance(cb, AcceleratedCallbacks)]
    assert [type(cb).__name__ for cb in adapter.callbacks] == ['Theirs', 'LimitBatchesCallback']


def test_stop_training_error_stops_the_run_and_calls_on_stop_training_error(capsys):
    class StopAtSecondEpoch(TrainerCallback):
        stopped = False

        def on_train_epoch_start(self, trainer, **kwargs):
            if trainer.run_history.current_epoch == 2:
                raise StopTrainingError('enough')

        def on_stop_training_error(self, trainer, **kwargs):
            StopAtSecondEpoch.stopped = True

    loop = make_loop(Net())
    loop.fit(num_epochs=5, callbacks=[StopAtSecondEpoch()])
    assert StopAtSecondEpoch.stopped and loop.epoch == 1
    assert 'enough' in capsys.readouterr().out


def test_terminate_on_nan_ends_the_process_after_the_run_ends_as_on_ptas_trainer():
    class NaNLoss(Net):
        def get_loss(self, batch, criterion, device):
            return super().get_loss(batch, criterion, device) * float('nan')

    ended = []

    class Ended(TrainerCallback):
        def on_training_run_end(self, trainer, **kwargs):
            ended.append(True)

    loop = make_loop(NaNLoss())
    with pytest.raises(SystemExit, match='Exiting due to NaN loss'):
        loop.fit(num_epochs=3, callbacks=[Ended, TerminateOnNaNCallback])
    assert ended == [True] and loop.total_iteration_idx == 0


def test_save_training_state_writes_ptas_folders_that_load_back(tmp_path):
    torch.manual_seed(0)
    model = Net()
    loop = make_loop(model)
    saver = SaveTrainingStateCallback(save_dir=str(tmp_path), save_every_n_epochs=1, max_checkpoints=2)
    loop.fit(num_epochs=3, callbacks=[saver])
    assert sorted(os.listdir(tmp_path)) == ['epoch_3', 'final']        # the last two of four saves
    final = tmp_path / 'final'
    assert {'model.safetensors', 'optimizer.bin', 'trainer_metadata.pt'} <= set(os.listdir(final))
    metadata = torch.load(final / 'trainer_metadata.pt')
    assert metadata == {'current_epoch': 4, 'global_step': 21}
    trained = {k: v.clone() for k, v in model.state_dict().items()}

    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
    [adapter] = [cb for cb in loop.callbacks if isinstance(cb, AcceleratedCallbacks)]
    assert adapter.trainer.load_training_state(final)['global_step'] == 21
    assert state_equal(model.state_dict(), trained)


def test_the_seed_pages_metrics_callback_runs_and_its_values_reach_the_loops_history():
    from torchmetrics import Accuracy, ConfusionMatrix

    # pytorch-accelerated's documentation example, with its class body indented and torchmetrics' task argument
    # (required since torchmetrics 0.11).
    class ClassificationMetricsCallback(TrainerCallback):
        def __init__(self, num_classes):
            self.cm_metrics = ConfusionMatrix(task='multiclass', num_classes=num_classes)
            self.accuracy = Accuracy(task='multiclass', num_classes=num_classes)

        def _move_to_device(self, trainer):
            self.cm_metrics.to(trainer._eval_dataloader.device)
            self.accuracy.to(trainer._eval_dataloader.device)

        def on_training_run_start(self, trainer, **kwargs):
            self._move_to_device(trainer)

        def on_evaluation_run_start(self, trainer, **kwargs):
            self._move_to_device(trainer)

        def on_eval_step_end(self, trainer, batch, batch_output, **kwargs):
            preds = batch_output["model_outputs"].argmax(dim=-1)
            self.cm_metrics.update(preds, batch[1])
            self.accuracy.update(preds, batch[1])

        def on_eval_epoch_end(self, trainer, **kwargs):
            trainer.run_history.update_metric(
                "confusion_matrix", self.cm_metrics.compute().cpu()
            )
            trainer.run_history.update_metric("accuracy", self.accuracy.compute().item())

            self.cm_metrics.reset()
            self.accuracy.reset()

    torch.manual_seed(0)
    model = Net()
    loop = make_loop(model)
    loop.fit(num_epochs=2, callbacks=[ClassificationMetricsCallback(num_classes=3)])
    x, y = VAL.tensors
    with torch.no_grad():
        predicted = model(x).argmax(dim=-1)
    assert loop.train_history['accuracy'][-1] == pytest.approx((predicted == y).float().mean().item())
    assert loop.train_history['confusion_matrix'][-1].sum() == len(y)


class VerifyBatchCallback(TrainerCallback):
    """The seed page's custom-event example, as written there."""

    def verify_train_batch(self, trainer, xb, yb):
        assert xb.shape[0] == trainer.run_config["train_per_device_batch_size"]
        assert xb.shape[1] == 1
        assert xb.shape[2] == 28
        assert xb.shape[3] == 28
        assert yb.shape[0] == trainer.run_config["train_per_device_batch_size"]


class CallVerifyBatch(AbstractCallback):
    """Where a TrainLoop user calls a custom event: a callback of ours, with the step's batch."""

    def __init__(self):
        super().__init__('calls verify_train_batch')
        self.calls = 0

    def on_batch_begin(self):
        xb, yb = self.train_loop_obj.batch
        self.train_loop_obj.callbacks_handler.call_event('verify_train_batch', trainer=self.train_loop_obj,
                                                         xb=xb, yb=yb)
        self.calls += 1


def test_the_seed_pages_custom_event_reaches_the_pta_callbacks_that_define_it():
    class Images(TTBasicModel):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(28 * 28, 10)

        def forward(self, x):
            return self.fc(x.flatten(1))

    images = torch.utils.data.TensorDataset(torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,)))
    model = Images()
    caller = CallVerifyBatch()
    loop = TrainLoop(model, DataLoader(images, batch_size=8), None, None, torch.optim.SGD(model.parameters(), lr=0.1),
                     nn.CrossEntropyLoss(), progress_bar=False)
    loop.fit(num_epochs=1, callbacks=[VerifyBatchCallback(), caller])
    assert caller.calls == 4

    wrong = TrainLoop(model, DataLoader(images, batch_size=8), None, None, torch.optim.SGD(model.parameters(), lr=0.1),
                      nn.CrossEntropyLoss(), progress_bar=False)
    wrong.train_loader = DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 1, 14, 14), torch.zeros(8).long()),
                                    batch_size=8)
    with pytest.raises(AssertionError):
        wrong.fit(num_epochs=1, callbacks=[VerifyBatchCallback(), CallVerifyBatch()])


def test_pta_callbacks_pickle_for_the_processes_of_a_ddp_fit():
    callbacks = AcceleratedCallbacks([SaveBestModelCallback(save_path='best.pt'), PrintProgressCallback])
    copy = pickle.loads(pickle.dumps(callbacks))
    assert [type(cb).__name__ for cb in copy.callbacks] == ['SaveBestModelCallback', 'PrintProgressCallback']
    assert copy.callbacks[0].save_path == 'best.pt'


def test_a_non_pta_object_given_to_the_adapter_is_refused_by_name():
    with pytest.raises(TypeError, match=re.escape('got Linear')):
        AcceleratedCallbacks([nn.Linear(2, 2)])


def test_a_resumed_fit_continues_ptas_scheduler_and_callbacks_state_to_the_uninterrupted_run(tmp_path):
    """PTA's callbacks have no state_dict and reset themselves in on_training_run_start: the adapter saves their
    attributes and the run history with the loop's checkpoint and restores them after that reset."""
    from aitoolbox_like.tracking import TrainLoopCheckpoint
    scheduler = CosineLrScheduler.create_scheduler_fn(num_warmup_epochs=1, warmup_starting_lr=0.01)

    def loop(folder, seed=0):
        torch.manual_seed(seed)
        model = Net()
        return TrainLoopCheckpoint(model, DataLoader(TRAIN, batch_size=8, shuffle=True),
                                   DataLoader(VAL, batch_size=8), None,
                                   torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), nn.CrossEntropyLoss(),
                                   'proj', 'run', str(folder), {}, cloud_save_mode='local', progress_bar=False)

    def pta(folder):
        return [AcceleratedCallbacks(create_scheduler_fn=scheduler),
                EarlyStoppingCallback(early_stopping_patience=3, early_stopping_threshold=0.3),
                SaveBestModelCallback(save_path=str(folder / 'best.pt'), load_saved_checkpoint=False)]

    reference = loop(tmp_path / 'reference')
    reference_callbacks = pta(tmp_path)
    reference.fit(num_epochs=4, callbacks=reference_callbacks)

    class Killed(AbstractCallback):        # the process dies at the start of the third epoch
        def on_epoch_begin(self):
            if self.train_loop_obj.epoch == 2:
                raise KeyboardInterrupt

    first = loop(tmp_path / 'interrupted')
    with pytest.raises(KeyboardInterrupt):
        first.fit(num_epochs=4, callbacks=[*pta(tmp_path / 'interrupted'), Killed('killed')])
    folder = os.path.join(first.experiment.dir_path, 'checkpoint_model')
    [last] = [name for name in os.listdir(folder) if name.endswith('_E1.pth')]

    resumed = loop(tmp_path / 'interrupted', seed=5)
    adapter, early, best = pta(tmp_path / 'interrupted')
    resumed.fit(num_epochs=4, callbacks=[adapter, early, best], resume_from=os.path.join(folder, last))
    assert state_equal(resumed.model.state_dict(), reference.model.state_dict())
    assert resumed.optimizer.param_groups[0]['lr'] == reference.optimizer.param_groups[0]['lr']
    # PTA's run history, the early-stopping counter and best value, the best model's value and epoch: as never killed
    history, expected = adapter.trainer.run_history, reference_callbacks[0].trainer.run_history
    assert history.current_epoch == expected.current_epoch == 5
    assert history.get_metric_values('eval_loss_epoch') == expected.get_metric_values('eval_loss_epoch')
    _, early_reference, best_reference = reference_callbacks
    assert early.early_stopping_patience_counter == early_reference.early_stopping_patience_counter > 0
    assert early.best_metric == early_reference.best_metric
    assert (best.best_metric, best.best_metric_epoch) == (best_reference.best_metric, best_reference.best_metric_epoch)
    assert resumed.train_history['train_loss_epoch'] == reference.train_history['train_loss_epoch']


def test_ptas_trainer_habits_get_errors_naming_the_fix():
    loop = make_loop(Net())
    with pytest.raises(TypeError, match=r"callbacks are fit's: loop.fit\(num_epochs=\.\.\., callbacks="):
        TrainLoop(Net(), None, None, None, None, None, callbacks=[LogMetricsCallback()])
    with pytest.raises(AttributeError, match=r"'train'.*fit\(num_epochs="):
        loop.train(TRAIN, num_epochs=2)
    with pytest.raises(AttributeError, match=r"'evaluate'.*evaluate_loss_on_validation_set"):
        loop.evaluate(VAL)
    with pytest.raises(TypeError, match=r"AcceleratedCallbacks\(create_scheduler_fn=\.\.\.\)"):
        loop.fit(num_epochs=1, create_scheduler_fn=CosineLrScheduler.create_scheduler_fn())
    with pytest.raises(TypeError, match=r"per_device_batch_size.*DataLoader\(dataset, batch_size="):
        loop.fit(num_epochs=1, per_device_batch_size=8)
