"""What make pta-check runs: PTA's 14 callback classes side by side on PTA's Trainer and on the TrainLoop, and the
expectations of PTA's own tests (test/test_trainer.py, test_run_history.py, test_loss_tracking.py, test_utils.py of
pytorch-accelerated 0.1.61), each turned from a mock trainer into a real run on the TrainLoop."""
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set

import torch
from torch import nn, optim
from torch.utils.data import DataLoader

from aitoolbox_like import TrainLoop
from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.adapters.pytorch_accelerated import AcceleratedCallbacks

from . import runs

#: PTA 0.1.61's built-in callback classes (callbacks.py), TrainerCallback's subclasses.
PTA_CLASSES = ('LogMetricsCallback', 'ProgressBarCallback', 'PrintProgressCallback', 'SaveBestModelCallback',
               'EarlyStoppingCallback', 'TerminateOnNaNCallback', 'MoveModulesToDeviceCallback', 'LimitBatchesCallback',
               'ModelEmaCallback', 'ConvertSyncBatchNormCallback', 'StepBasedEvaluationCallback',
               'LimitEvalStepsCallback', 'SaveTrainingStateCallback', 'WSDCheckpointCallback')


#: The WSD decay phase's share of a period: PTA's default 0.1 leaves no decay step in a period of 14 steps (PTA's
#: WSDLrScheduler then divides by zero), so the short runs here decay over 30% of each period.
WSD_DECAY_RATIO = 0.3


@dataclass
class Outcome:
    name: str
    holds: bool
    detail: str = ''


@dataclass
class Tally:
    ran: Set[str] = field(default_factory=set)
    outcomes: List[Outcome] = field(default_factory=list)

    def expect(self, name: str, check: Callable[[], Optional[str]]) -> bool:
        """Run ``check`` (None: holds; a string: what differs); an exception is a failed expectation."""
        try:
            problem = check()
        except BaseException as error:     # SystemExit included: a check must not end the tool
            problem = f'{type(error).__name__}: {error}'
        self.outcomes.append(Outcome(name, problem is None, problem or ''))
        return problem is None


def _pta() -> Any:
    import pytorch_accelerated.callbacks as callbacks
    return callbacks


# ---- side by side: PTA's Trainer and the TrainLoop, same everything -------------------------------------------

def side_by_side(tally: Tally, work: Path) -> None:
    cb = _pta()
    from pytorch_accelerated.schedulers import CosineLrScheduler, WSDLrScheduler
    cosine = CosineLrScheduler.create_scheduler_fn(num_warmup_epochs=1, warmup_starting_lr=0.01)
    scenarios: List[Dict[str, Any]] = [
        dict(name='progress, metrics, early stopping and the best model, under PTA\'s cosine schedule',
             callbacks=lambda: [cb.PrintProgressCallback, cb.LogMetricsCallback(),
                                cb.EarlyStoppingCallback(early_stopping_patience=1, early_stopping_threshold=0.02),
                                cb.SaveBestModelCallback()],
             num_epochs=8, create_scheduler_fn=cosine,
             classes={'PrintProgressCallback', 'LogMetricsCallback', 'EarlyStoppingCallback', 'SaveBestModelCallback'}),
        dict(name='the same on shuffled data, as PTA users train (PTA seeds its run and its evaluation draws a seed)',
             callbacks=lambda: [cb.PrintProgressCallback, cb.LogMetricsCallback(),
                                cb.EarlyStoppingCallback(early_stopping_patience=2, early_stopping_threshold=0.001),
                                cb.SaveBestModelCallback(), cb.ModelEmaCallback(decay=0.8)],
             num_epochs=10, create_scheduler_fn=cosine, shuffle=True,
             classes={'EarlyStoppingCallback', 'SaveBestModelCallback', 'ModelEmaCallback'}),
        dict(name="PTA's default callbacks, PT_ACC_LIMIT_BATCHES=3 and SyncBatchNorm conversion, a BatchNorm model",
             callbacks=lambda: [cb.MoveModulesToDeviceCallback, cb.TerminateOnNaNCallback, cb.PrintProgressCallback,
                                cb.ProgressBarCallback, cb.LogMetricsCallback, cb.ConvertSyncBatchNormCallback],
             num_epochs=2, model_kwargs={'batch_norm': True}, env={'PT_ACC_LIMIT_BATCHES': '3'},
             classes={'MoveModulesToDeviceCallback', 'TerminateOnNaNCallback', 'ProgressBarCallback',
                      'LimitBatchesCallback', 'ConvertSyncBatchNormCallback'}),
        dict(name='an EMA model evaluated every epoch and every 3 steps, intermediate evaluations limited to 2 steps',
             callbacks=lambda: [cb.LimitEvalStepsCallback(2), cb.StepBasedEvaluationCallback(3),
                                cb.ModelEmaCallback(decay=0.9), cb.PrintProgressCallback, cb.LogMetricsCallback],
             num_epochs=2, classes={'ModelEmaCallback', 'StepBasedEvaluationCallback', 'LimitEvalStepsCallback'}),
        dict(name='a NaN loss: the run stops, then the process exits',
             callbacks=lambda: [cb.PrintProgressCallback, cb.TerminateOnNaNCallback],
             num_epochs=2, model_kwargs={'nan': True}, classes={'TerminateOnNaNCallback'}),
        dict(name='training states every epoch, the last two kept',
             callbacks=lambda: [cb.SaveTrainingStateCallback(save_every_n_epochs=1, max_checkpoints=2),
                                cb.PrintProgressCallback],
             num_epochs=3, classes={'SaveTrainingStateCallback'}),
        dict(name="WSD checkpoints under PTA's WSD schedule (two decay periods)",
             callbacks=lambda: [cb.WSDCheckpointCallback(), cb.PrintProgressCallback, cb.LogMetricsCallback],
             num_epochs=4, create_scheduler_fn=WSDLrScheduler.create_scheduler_fn(
                 num_checkpoints=2, num_warmup_epochs=1, decay_phase_ratio=WSD_DECAY_RATIO),
             classes={'WSDCheckpointCallback'}),
        dict(name='gradient accumulation over 2 batches with the cosine schedule',
             callbacks=lambda: [cb.PrintProgressCallback, cb.LogMetricsCallback], num_epochs=3,
             create_scheduler_fn=cosine, accumulation=2, classes=set()),
    ]
    for index, scenario in enumerate(scenarios):
        folder = work / f'side_by_side_{index}'
        kwargs = {k: scenario[k] for k in ('num_epochs', 'model_kwargs', 'create_scheduler_fn', 'accumulation', 'env',
                                           'shuffle') if k in scenario}

        def compare(scenario: Dict[str, Any] = scenario, folder: Path = folder,
                    kwargs: Dict[str, Any] = kwargs) -> Optional[str]:
            theirs = runs.on_ptas_trainer(folder / 'pta', scenario['callbacks'](), **kwargs)
            ours = runs.on_the_loop(folder / 'loop', scenario['callbacks'](), **kwargs)
            if not theirs.lines:
                return "PTA's Trainer printed nothing: the scenario shows nothing"
            return runs.first_difference(ours, theirs)
        if tally.expect(f'side by side with PTA\'s Trainer: {scenario["name"]}', compare):
            tally.ran.update(scenario['classes'])


# ---- PTA's TestSaveTrainingStateCallback, on real runs ---------------------------------------------------------

def _loop(num_batches: Optional[int] = None, batch_size: int = runs.BATCH, model: Optional[nn.Module] = None) -> TrainLoop:
    """A loop over the 53 training rows (batches of 8, the last of 5), or over ``num_batches`` full batches of
    them, repeated as needed."""
    torch.manual_seed(0)
    model = model or runs.Net()
    data: Any = runs.TRAIN
    if num_batches is not None:
        rows = num_batches * batch_size
        data = torch.utils.data.Subset(torch.utils.data.ConcatDataset([runs.TRAIN] * (rows // len(runs.TRAIN) + 1)),
                                       range(rows))
    return TrainLoop(model, DataLoader(data, batch_size=batch_size), DataLoader(runs.VAL, batch_size=batch_size),
                     None, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), progress_bar=False)


def _quiet_fit(loop: TrainLoop, **kwargs: Any) -> None:
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):
        loop.fit(**kwargs)


def _listing(folder: Path) -> List[str]:
    return sorted(os.listdir(folder)) if folder.exists() else []


def save_training_state(tally: Tally, work: Path) -> None:
    cb = _pta()
    cases = [
        ('saves at the end by default', dict(), dict(num_epochs=2), ['final']),
        ('saves every n epochs', dict(save_every_n_epochs=2, save_at_end=False), dict(num_epochs=4),
         ['epoch_2', 'epoch_4']),
        ('saves every n steps', dict(save_every_n_steps=3, save_at_end=False), dict(num_iterations=6),
         ['step_3', 'step_6']),
        ('max checkpoints cleanup', dict(save_every_n_epochs=1, save_at_end=False, max_checkpoints=2),
         dict(num_epochs=3), ['epoch_2', 'epoch_3']),
        ('no save at end when disabled', dict(save_at_end=False), dict(num_epochs=2), []),
    ]
    for name, arguments, fit, expected in cases:
        folder = work / f'states_{name.replace(" ", "_")}'

        def check(arguments: Dict[str, Any] = arguments, fit: Dict[str, Any] = fit, folder: Path = folder,
                  expected: List[str] = expected) -> Optional[str]:
            _quiet_fit(_loop(), callbacks=[cb.SaveTrainingStateCallback(save_dir=str(folder), **arguments)], **fit)
            got = _listing(folder)
            if got != expected:
                return f'saved {got}, expected {expected}'
            for state in got:
                if not (folder / state / 'trainer_metadata.pt').exists():
                    return f'{state} has no trainer_metadata.pt'
            return None
        tally.expect(f'TestSaveTrainingStateCallback: {name}', check)


# ---- PTA's TestWSDCheckpointCallback, on real runs -------------------------------------------------------------

def wsd_checkpoints(tally: Tally, work: Path) -> None:
    cb = _pta()
    from pytorch_accelerated.schedulers import WSDLrScheduler
    folder = work / 'wsd'
    scheduler = WSDLrScheduler.create_scheduler_fn(num_checkpoints=2, num_warmup_epochs=1,
                                                   decay_phase_ratio=WSD_DECAY_RATIO)
    loop = _loop()
    adapter = AcceleratedCallbacks(create_scheduler_fn=scheduler)
    try:
        _quiet_fit(loop, num_epochs=4, callbacks=[adapter, cb.WSDCheckpointCallback(save_dir=str(folder))])
    except Exception as error:
        for name in ('pre-decay uses save_training_state', 'post-decay uses save_checkpoint',
                     'load directory uses load_training_state', 'load file uses load_checkpoint',
                     'training run end saves post decay'):
            tally.outcomes.append(Outcome(f'TestWSDCheckpointCallback: {name}', False,
                                          f'the WSD run failed: {type(error).__name__}: {error}'))
        return
    trainer = adapter.trainer
    assert trainer is not None
    periods = trainer.scheduler.get_decay_info()
    names = _listing(folder)

    def pre_decay() -> Optional[str]:
        wanted = [f'checkpoint_{p["pre_decay_step"]}_wsd_pre_decay' for p in periods]
        missing = [w for w in wanted if not (folder / w / 'trainer_metadata.pt').exists()]
        return f'no training-state folder {missing} among {names}' if missing else None

    def post_decay() -> Optional[str]:
        wanted = f'checkpoint_{periods[0]["period_end"]}_wsd_post_decay.pt'
        if not (folder / wanted).is_file():
            return f'no model export {wanted} among {names}'
        saved = torch.load(folder / wanted, weights_only=True)
        return None if saved['checkpoint_type'] == 'wsd_post_decay' and 'model_state_dict' in saved else \
            f'{wanted} holds {sorted(saved)}'

    def run_end() -> Optional[str]:
        # PTA's checkpoint spacing ends the last of several periods before the run ends: one period here.
        single = work / 'wsd_single'
        last = _loop()
        _quiet_fit(last, num_epochs=2, callbacks=[
            AcceleratedCallbacks(create_scheduler_fn=WSDLrScheduler.create_scheduler_fn(
                num_checkpoints=1, num_warmup_epochs=1, decay_phase_ratio=WSD_DECAY_RATIO)),
            cb.WSDCheckpointCallback(save_dir=str(single))])
        wanted = 'checkpoint_14_wsd_post_decay.pt'
        if not (single / wanted).is_file():
            return f'no final model export {wanted} among {_listing(single)}'
        return None if runs.same(torch.load(single / wanted, weights_only=True)['model_state_dict'],
                                 last.model.state_dict()) else f'{wanted} is not the final model'

    def load(initial: str, expected_step: int, expected_weights: Dict[str, torch.Tensor]) -> Optional[str]:
        loading = cb.WSDCheckpointCallback(save_dir=str(work / 'wsd_again'), initial_checkpoint=str(folder / initial))
        seen: Dict[str, Any] = {}

        class Snapshot(cb.TrainerCallback):
            def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
                seen['step'] = loading.last_checkpoint_step
                seen['weights'] = {k: v.clone() for k, v in trainer.model.state_dict().items()}

        _quiet_fit(_loop(), num_epochs=1, callbacks=[AcceleratedCallbacks(create_scheduler_fn=scheduler), loading,
                                                     Snapshot()])
        if seen['step'] != expected_step:
            return f'last_checkpoint_step {seen["step"]}, expected {expected_step}'
        return None if runs.same(seen['weights'], expected_weights) else 'the loaded weights differ from the saved'

    pre = f'checkpoint_{periods[0]["pre_decay_step"]}_wsd_pre_decay'
    post = f'checkpoint_{periods[0]["period_end"]}_wsd_post_decay.pt'
    tally.expect('TestWSDCheckpointCallback: pre-decay uses save_training_state', pre_decay)
    tally.expect('TestWSDCheckpointCallback: post-decay uses save_checkpoint', post_decay)
    tally.expect('TestWSDCheckpointCallback: load directory uses load_training_state',
                 lambda: load(pre, periods[0]['pre_decay_step'], _safetensors(folder / pre / 'model.safetensors')))
    tally.expect('TestWSDCheckpointCallback: load file uses load_checkpoint',
                 lambda: load(post, periods[0]['period_end'],
                              torch.load(folder / post, weights_only=True)['model_state_dict']))
    tally.expect('TestWSDCheckpointCallback: training run end saves post decay', run_end)


def _safetensors(path: Path) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    return load_file(str(path))


# ---- PTA's TestCheckpointRoundTrip, on the trainer a fit's PTA callbacks get --------------------------------------

def checkpoint_round_trips(tally: Tally, work: Path) -> None:
    from pytorch_accelerated.schedulers import CosineLrScheduler

    def trainer() -> Any:
        torch.manual_seed(0)
        model = runs.Net()
        loop = TrainLoop(model, DataLoader(runs.TRAIN, batch_size=8), None, None,
                         optim.SGD(model.parameters(), lr=0.05, momentum=0.9), nn.CrossEntropyLoss(),
                         progress_bar=False)
        adapter = AcceleratedCallbacks([_pta().PrintProgressCallback])
        _quiet_fit(loop, num_iterations=1, callbacks=[adapter])
        return adapter.trainer

    def steps(t: Any, n: int, scheduler: Any = None) -> None:
        x, y = runs.TRAIN.tensors
        for _ in range(n):
            t.optimizer.zero_grad()
            t.loss_func(t.model(x[:4]), y[:4]).backward()
            t.optimizer.step()
            if scheduler is not None:
                scheduler.step()

    def cosine(t: Any) -> Any:
        return CosineLrScheduler(optimizer=t.optimizer, total_num_epochs=10, num_update_steps_per_epoch=100)

    def path(name: str) -> str:
        return str(Path(tempfile.mkdtemp(dir=work)) / name)

    def weights() -> Optional[str]:
        t = trainer()
        original = {k: v.clone() for k, v in t.model.state_dict().items()}
        p = path('checkpoint.pt')
        t.save_checkpoint(p)
        with torch.no_grad():
            for param in t.model.parameters():
                param.fill_(999.0)
        t.load_checkpoint(p)
        return None if runs.same(t.model.state_dict(), original) else 'weights not restored'

    def optimizer() -> Optional[str]:
        t = trainer()
        steps(t, 3)
        original = {k: dict(v) for k, v in t.optimizer.state_dict()['state'].items()}
        p = path('checkpoint.pt')
        t.save_checkpoint(p, save_optimizer=True)
        t.optimizer = optim.SGD(t.model.parameters(), lr=0.05, momentum=0.9)
        t.load_checkpoint(p, load_optimizer=True)
        loaded = t.optimizer.state_dict()['state']
        return None if runs.same({k: dict(v) for k, v in loaded.items()}, original) else 'optimizer state differs'

    def scheduler_updates_after_reload(load_scheduler: bool) -> int:
        """A scheduler stepped 50 times, saved, replaced by a new one, the checkpoint loaded: its num_updates."""
        t = trainer()
        t.scheduler = cosine(t)
        for _ in range(50):
            t.scheduler.step()
        p = path('checkpoint.pt')
        t.save_checkpoint(p, save_scheduler=True)
        t.scheduler = cosine(t)
        t.load_checkpoint(p, load_scheduler=load_scheduler)
        return t.scheduler.state_dict()['num_updates']

    def scheduler() -> Optional[str]:
        got = scheduler_updates_after_reload(True)
        return None if got == 49 else f'num_updates {got}, expected 49'

    def custom_kwargs() -> Optional[str]:
        t = trainer()
        kwargs = {'step': 42, 'checkpoint_type': 'wsd_post_decay', 'decay_fraction': 0.1, 'total_steps': 1000}
        p = path('checkpoint.pt')
        t.save_checkpoint(p, checkpoint_kwargs=kwargs)
        checkpoint = t.load_checkpoint(p)
        return None if all(checkpoint.get(k) == v for k, v in kwargs.items()) else f'got {checkpoint.keys()}'

    def skip_optimizer() -> Optional[str]:
        t = trainer()
        steps(t, 1)
        p = path('checkpoint.pt')
        t.save_checkpoint(p, save_optimizer=True)
        t.optimizer = optim.SGD(t.model.parameters(), lr=0.05, momentum=0.9)
        t.load_checkpoint(p, load_optimizer=False)
        return None if len(t.optimizer.state_dict()['state']) == 0 else 'the optimizer state was loaded'

    def skip_scheduler() -> Optional[str]:
        return None if scheduler_updates_after_reload(False) == -1 else 'the scheduler state was loaded'

    def weights_only_file() -> Optional[str]:
        t = trainer()
        p = path('checkpoint.pt')
        t.save_checkpoint(p, save_optimizer=False, save_scheduler=False)
        keys = set(torch.load(p, map_location='cpu', weights_only=True))
        return None if keys == {'model_state_dict'} else f'holds {sorted(keys)}'

    def wsd_metadata() -> Optional[str]:
        t = trainer()
        kwargs = {'step': 9000, 'checkpoint_type': 'wsd_post_decay', 'total_steps': 10000, 'decay_fraction': 0.1,
                  'timestamp': '2026-02-09T12:00:00'}
        p = path('wsd_checkpoint.pt')
        t.save_checkpoint(p, save_optimizer=True, save_scheduler=False, checkpoint_kwargs=kwargs)
        checkpoint = t.load_checkpoint(p, load_scheduler=False)
        ok = all(checkpoint[k] == v for k, v in kwargs.items()) and 'model_state_dict' in checkpoint
        return None if ok else f'got {checkpoint}'

    def full() -> Optional[str]:
        t = trainer()
        t.scheduler = cosine(t)
        steps(t, 25, t.scheduler)
        original = {k: v.clone() for k, v in t.model.state_dict().items()}
        updates = t.scheduler.state_dict()['num_updates']
        p = path('full_checkpoint.pt')
        t.save_checkpoint(p, save_optimizer=True, save_scheduler=True, checkpoint_kwargs={'epoch': 3})
        with torch.no_grad():
            for param in t.model.parameters():
                param.fill_(0.0)
        t.optimizer = optim.SGD(t.model.parameters(), lr=0.05, momentum=0.9)
        t.scheduler = cosine(t)
        checkpoint = t.load_checkpoint(p)
        ok = runs.same(t.model.state_dict(), original) and len(t.optimizer.state_dict()['state']) > 0 \
            and t.scheduler.state_dict()['num_updates'] == updates and checkpoint['epoch'] == 3
        return None if ok else 'not everything was restored'

    for name, check in [('save load checkpoint weights roundtrip', weights),
                        ('save load checkpoint optimizer roundtrip', optimizer),
                        ('save load checkpoint scheduler roundtrip', scheduler),
                        ('save load checkpoint custom kwargs roundtrip', custom_kwargs),
                        ('load checkpoint skip optimizer', skip_optimizer),
                        ('load checkpoint skip scheduler', skip_scheduler),
                        ('save checkpoint without optimizer or scheduler', weights_only_file),
                        ('wsd metadata roundtrip', wsd_metadata),
                        ('full roundtrip weights and training resume', full)]:
        tally.expect(f'TestCheckpointRoundTrip: {name}', check)


# ---- PTA's run-history, loss-tracking, accumulation, run-config, max-steps and LimitBatches tests ------------------

class _Spy:
    """A PTA callback class made on demand (PTA must be imported first) that keeps what the trainer offers."""

    @staticmethod
    def make(seen: Dict[str, Any]) -> Any:
        class Spy(_pta().TrainerCallback):
            def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
                seen['run_config'] = trainer.run_config
                seen['first'] = type(trainer.callback_handler.callbacks[0]).__name__
                seen['trainer'] = trainer

            def on_train_step_end(self, trainer: Any, batch: Any, batch_output: Any, step: int, **kwargs: Any) -> None:
                seen.setdefault('losses', []).append((batch_output['loss'].detach().clone(),
                                                      batch_output['batch_size']))
                seen['steps'] = seen.get('steps', 0) + 1

            def on_train_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
                tracker = trainer._loss_tracker
                seen.setdefault('trackers', []).append((tracker.total_loss, tracker.running_count, tracker.average,
                                                        tracker.loss_value))
                seen.setdefault('train_loss_epoch', []).append(trainer.run_history.get_latest_metric(
                    'train_loss_epoch'))

            def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
                if seen.get('stop_at_first_epoch'):
                    raise _pta().StopTrainingError('run config seen')
        return Spy()


def run_history_and_losses(tally: Tally, work: Path) -> None:
    seen: Dict[str, Any] = {}
    loop = _loop()
    _quiet_fit(loop, num_epochs=2, callbacks=[_Spy.make(seen)])
    history = seen['trainer'].run_history

    def fresh() -> Any:
        history.reset()
        return history

    def increment() -> Optional[str]:
        h = fresh()
        start = h.current_epoch
        h._increment_epoch()
        h._increment_epoch()
        return None if h.current_epoch == start + 2 else f'{start} -> {h.current_epoch}'

    def metric_values() -> Optional[str]:
        h = fresh()
        h._metrics['my_metric'].extend([0, 1, 2])
        return None if h.get_metric_values('my_metric') == [0, 1, 2] else 'other values'

    def update() -> Optional[str]:
        h = fresh()
        for value in [0, 1, 2]:
            h.update_metric('my_metric', value)
        ok = h.get_metric_values('my_metric') == [0, 1, 2] and loop.train_history['my_metric'][-3:] == [0, 1, 2]
        return None if ok else "the values are not in the run history and the loop's history"

    def latest() -> Optional[str]:
        h = fresh()
        for value in [0, 1, 2]:
            h.update_metric('my_metric', value)
        return None if h.get_latest_metric('my_metric') == 2 else 'other value'

    def not_recorded() -> Optional[str]:
        try:
            fresh().get_latest_metric('my_metric')
        except ValueError:
            return None
        return 'no ValueError'

    def names() -> Optional[str]:
        h = fresh()
        h.update_metric('my_metric_1', 0)
        h.update_metric('my_metric_2', 1)
        return None if h.get_metric_names() == {'my_metric_1', 'my_metric_2'} else f'{h.get_metric_names()}'

    def reset() -> Optional[str]:
        h = fresh()
        h.update_metric('my_metric_1', 0)
        h.reset()
        return None if len(h.get_metric_names()) == 0 else 'names left'

    def set_epoch() -> Optional[str]:
        h = fresh()
        h._set_epoch(5)
        first = h.current_epoch
        h._increment_epoch()
        return None if (first, h.current_epoch) == (5, 6) else f'{first}, {h.current_epoch}'

    # Before the history is reset by the checks above: the fit's own figures.
    losses, trackers = seen['losses'], seen['trackers']
    per_epoch = len(losses) // 2
    first_epoch = losses[:per_epoch]

    def incremental() -> Optional[str]:
        total, count, average, last = trackers[0]
        expected_last = first_epoch[-1][0].mean().item()
        return None if count == len(runs.TRAIN) and last == expected_last else f'count {count}, last {last}'

    def varying_batch_sizes() -> Optional[str]:
        values = torch.tensor([loss.item() for loss, _ in first_epoch])
        sizes = torch.tensor([n for _, n in first_epoch])
        expected = ((values.double() * sizes).sum() / sizes.sum()).item()
        got = seen['train_loss_epoch'][0]
        sizes_seen = sorted({n for _, n in first_epoch})
        if sizes_seen != [5, 8]:
            return f'batch sizes {sizes_seen}: the scenario needs varying sizes'
        return None if abs(got - expected) <= 1e-6 * abs(expected) else f'{got}, expected {expected}'

    def average() -> Optional[str]:
        total, count, average, _ = trackers[0]
        return None if total / count == average else f'{total}/{count} != {average}'

    for name, check in [('test_run_history: can increment epoch', increment),
                        ('test_run_history: can get metric values', metric_values),
                        ('test_run_history: can update metric', update),
                        ('test_run_history: can get latest metric', latest),
                        ('test_run_history: can not get latest metric if not recorded', not_recorded),
                        ('test_run_history: can get metric names', names),
                        ('test_run_history: can reset', reset),
                        ('test_trainer: set epoch on run history', set_epoch),
                        ('test_loss_tracking: can track loss incrementally', incremental),
                        ('test_loss_tracking: can track loss for varying batch sizes', varying_batch_sizes),
                        ('test_loss_tracking: calculate loss average calculation', average)]:
        tally.expect(name, check)


def trainer_behaviour(tally: Tally, work: Path) -> None:
    class ConstantLoss(runs.Net):
        def get_loss(self, batch: Any, criterion: Any, device: Any) -> torch.Tensor:
            return super().get_loss(batch, criterion, device) * 0 + 1.0

    def accumulation() -> Optional[str]:
        seen: Dict[str, Any] = {}
        _quiet_fit(_loop(model=ConstantLoss()), num_epochs=1, grad_accumulation=2, callbacks=[_Spy.make(seen)])
        values = {loss.item() for loss, _ in seen['losses']}
        return None if values == {0.5} else f'losses {values}, expected 0.5'

    def run_config() -> Optional[str]:
        seen: Dict[str, Any] = {'stop_at_first_epoch': True}
        loop = _loop(num_batches=20, batch_size=64)
        _quiet_fit(loop, num_epochs=300, callbacks=[_Spy.make(seen)])
        config = seen['run_config']
        got = (config.num_update_steps_per_epoch, config.num_local_update_steps_per_epoch,
               config.max_num_train_steps, config.num_epochs, config['train_per_device_batch_size'])
        # PTA's test has 4 processes (80 update steps, 24001); one process here: 20, 6001.
        return None if got == (20, 20, 300 * 20 + 1, 300, 64) else f'got {got}'

    def max_steps() -> Optional[str]:
        seen: Dict[str, Any] = {}
        loop = _loop(num_batches=40)
        updates: List[int] = []
        _quiet_fit(loop, num_iterations=30, grad_accumulation=2, callbacks=[_Spy.make(seen), UpdateCounter(updates)])
        got = (seen['run_config'].max_num_train_steps, len(updates))
        return None if got == (15, 15) else f'max_num_train_steps, updates: {got}, expected (15, 15)'

    def limit_batches() -> Optional[str]:
        from pytorch_accelerated.utils import LimitBatches
        seen: Dict[str, Any] = {}
        with LimitBatches(4):
            _quiet_fit(_loop(), num_epochs=2, callbacks=[_Spy.make(seen)])
        return None if (seen['first'], seen['steps']) == ('LimitBatchesCallback', 8) else \
            f'first callback {seen["first"]}, {seen["steps"]} steps'

    def no_limit_outside() -> Optional[str]:
        seen: Dict[str, Any] = {}
        _quiet_fit(_loop(), num_epochs=1, callbacks=[_Spy.make(seen)])
        return None if seen['first'] == 'Spy' and seen['steps'] == 7 else f'first callback {seen["first"]}'

    for name, check in [('test_trainer: gradient accumulation no scaling without distributed (0.5)', accumulation),
                        ('test_trainer: run config per process', run_config),
                        ('test_trainer: max steps stops training correctly', max_steps),
                        ('test_utils: can limit batches with manager', limit_batches),
                        ('test_utils: limit batches not present outside manager', no_limit_outside)]:
        tally.expect(name, check)


class UpdateCounter(AbstractCallback):
    """One of the loop's callbacks: counts the optimizer updates the loop applies."""

    def __init__(self, updates: List[int]) -> None:
        super().__init__('counts updates')
        self.updates = updates

    def on_after_optimizer_step(self) -> None:
        self.updates.append(self.train_loop_obj.iteration)


# ---- a Trainer subclass, ported as the PTA page maps its overrides ----------------------------------------------

L2 = 1e-3


def _l2(model: nn.Module) -> torch.Tensor:
    return L2 * sum(p.pow(2).sum() for p in model.parameters())


def trainer_subclass(tally: Tally, work: Path) -> None:
    """A PTA Trainer subclass whose calculate_train_batch_loss adds an L2 term (its evaluation loss is PTA's default,
    the plain loss), against its port as docs/callbacks/pytorch_accelerated.md maps the overrides:
    calculate_train_batch_loss -> get_loss, calculate_eval_batch_loss (here PTA's default) -> get_loss_eval."""
    from pytorch_accelerated import Trainer
    cb = _pta()

    class L2Trainer(Trainer):
        def calculate_train_batch_loss(self, batch: Any) -> Dict[str, Any]:
            xb, yb = batch
            outputs = self.model(xb)
            return {'loss': self.loss_func(outputs, yb) + _l2(self.model), 'model_outputs': outputs,
                    'batch_size': yb.size(0)}

    class L2Net(runs.Net):
        def get_loss(self, batch: Any, criterion: Any, device: Any) -> torch.Tensor:
            return super().get_loss(batch, criterion, device) + _l2(self)

        def get_loss_eval(self, batch: Any, criterion: Any, device: Any) -> torch.Tensor:
            return super().get_loss(batch, criterion, device)      # PTA's default calculate_eval_batch_loss

    def compare() -> Optional[str]:
        make = lambda: [cb.PrintProgressCallback, cb.LogMetricsCallback(),  # noqa: E731
                        cb.EarlyStoppingCallback(early_stopping_patience=1), cb.SaveBestModelCallback()]
        theirs = runs.on_ptas_trainer(work / 'subclass' / 'pta', make(), 4, trainer_class=L2Trainer, shuffle=True)
        ours = runs.on_the_loop(work / 'subclass' / 'loop', make(), 4, model_class=L2Net, shuffle=True)
        return runs.first_difference(ours, theirs)
    tally.expect("a Trainer subclass (calculate_train_batch_loss adds an L2 term) ported as the PTA page says: "
                 "get_loss, and get_loss_eval the plain loss as PTA's default calculate_eval_batch_loss; the same "
                 "run as PTA's Trainer", compare)


# ---- kill -9 and resume -------------------------------------------------------------------------------------------

def kill_and_resume(tally: Tally, work: Path) -> None:
    """tools/pta_check/resumed.py (PTA's early stopping, best model, EMA model, run history and cosine schedule,
    shuffled data, a checkpoint every 5 batches) killed with SIGKILL inside epoch 5 and resumed in a new process,
    against the same script run to its end."""
    from .. import kill_resume
    from . import resumed

    def compare() -> Optional[str]:
        whole, again, _ = kill_resume.uninterrupted_and_resumed('tools.pta_check.resumed', work / 'kill_resume',
                                                               resumed.KILL_AT)
        if whole['epochs'] >= resumed.EPOCHS:
            return f'the uninterrupted run did not stop early ({whole["epochs"]} epochs): the scenario shows nothing'
        return kill_resume.first_difference(again, whole)
    if tally.expect('kill -9 inside epoch 5 and fit(resume_from=\'auto\') in a new process: the same weights, run '
                    'history, early-stopping counter and stop, best model (value, epoch, file), EMA model and '
                    'learning rate as the run never killed, to the bit', compare):
        tally.ran.update({'EarlyStoppingCallback', 'SaveBestModelCallback', 'ModelEmaCallback'})
