"""Orca's callback classes, run on the TrainLoop as Orca's estimator would run them, and what Orca's own tests
expect of them.

Orca's estimator always puts a MainCallback first (``make_only_mainCallback``) and appends
``MaxstepsCallback(max_step=max_steps)`` when ``fit(max_steps=...)`` is given; each scenario builds its callback list
the same way, with Orca's own MainCallback class. The expected values are those of Orca's own PyTorch estimator
tests (test_checkpoint_callback, test_checkpoint_callback_by_iter, test_tensorboard_callback and the max_steps test,
as ../shared/notes/pta-orca-callbacks.md records them), with the tests' shape of data: 100 rows in batches of 4.
Expectations marked ``check:`` are not from Orca's tests: they check what a class is for (Orca's step, bit for bit;
the W&B run written).

A class *runs* when an instance of it takes part in a fit that completes and the adapter called its Orca methods.
"""
import contextlib
import glob
import io
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch
from torch import nn

from .fixtures import BATCH_SIZE, LinearModel, loaders, make_loop
from ..published_wheel import Watch
from .tally import Expectation, Tally

# Orca callback classes the check does not run, and why (docs/callbacks/orca.md lists them too).
NOT_RUN: Dict[str, str] = {}


class Scenarios:
    """Each ``scenario_*`` method trains with Orca's callbacks through ``attempt``, which records the classes that ran
    and the expectations measured."""

    def __init__(self, orca: Any, adapter: Any, tally: Tally, workdir: str) -> None:
        self.orca = orca
        self.adapter = adapter
        self.tally = tally
        self.workdir = workdir
        # every Orca method the adapter calls, but the two tutorial names that are also loop hooks
        self.method_names = [name for name in adapter.ORCA_HOOKS if name not in ('on_epoch_begin', 'on_epoch_end')]

    def run_all(self) -> None:
        for name in sorted(n for n in dir(self) if n.startswith('scenario_')):
            getattr(self, name)()

    def folder(self, name: str) -> str:
        return tempfile.mkdtemp(prefix=f'{name}-', dir=self.workdir)

    def attempt(self, subjects: Sequence[str], expectations: Sequence[Expectation],
                body: Callable[[Watch], None]) -> None:
        """Run ``body`` (which trains and fills ``expectations``' actual values); an exception is the error of each
        subject that has not run and of each expectation left without a value."""
        watch = Watch(self.tally.orca_classes, self.tally.ran, self.method_names)
        try:
            body(watch)
        except Exception as exc:      # the check reports every failure and goes on
            message = f'{type(exc).__name__}: {exc}'
            for subject in subjects:
                self.tally.errors.setdefault(subject, message)
            for expectation in expectations:
                if expectation.actual is None:
                    expectation.error = message
        else:
            watch.credit()
            for subject in subjects:
                if subject not in self.tally.ran:
                    self.tally.errors.setdefault(subject, 'its Orca methods were never called')
        self.tally.expectations.extend(expectations)

    def main(self) -> Any:
        """Orca's own MainCallback, which its estimator puts first in every fit."""
        return self.orca.maincallback.MainCallback()

    # ---- MainCallback: Orca's step -----------------------------------------------------------------------------

    def scenario_main_callback(self) -> None:
        expectation = Expectation("check: MainCallback trains as Orca's runner steps (forward, zero_grad / backward "
                                  '/ step per batch, the scheduler per epoch): the weights of a hand-written loop, '
                                  'bit for bit', True)

        def body(watch: Watch) -> None:
            loop = make_loop(seed=0)
            runner = self.adapter.runner_for(loop)
            runner.scheduler = torch.optim.lr_scheduler.StepLR(loop.optimizer, step_size=1, gamma=0.5)
            loop.fit(num_epochs=2, callbacks=watch([self.main()]))

            torch.manual_seed(0)
            model = LinearModel()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            criterion = nn.MSELoss()
            for _ in range(2):
                for features, target in loaders()[0]:
                    output = model(features)
                    loss = criterion(output, target)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                scheduler.step()
            expectation.actual = all(torch.equal(a, b) for a, b in zip(loop.model.parameters(), model.parameters())) \
                and loop.optimizer.param_groups[0]['lr'] == optimizer.param_groups[0]['lr']
        self.attempt(['MainCallback'], [expectation], body)

    # ---- ModelCheckpoint ---------------------------------------------------------------------------------------

    def scenario_checkpoint_by_epoch(self) -> None:
        files = Expectation('test_checkpoint_callback: after 2 epochs the folder holds test-epoch=1.ckpt, '
                            'test-epoch=2.ckpt and last.ckpt', ['last.ckpt', 'test-epoch=1.ckpt', 'test-epoch=2.ckpt'])
        latest = Expectation('test_checkpoint_callback: ModelCheckpoint.get_latest_checkpoint(folder) is last.ckpt',
                             'last.ckpt')
        reloaded = Expectation('test_checkpoint_callback: a model loaded from the latest checkpoint evaluates as the '
                               'trained one', True)
        removed = Expectation('test_checkpoint_callback: get_latest_checkpoint raises RuntimeError once the folder is '
                              'removed', 'RuntimeError')

        def body(watch: Watch) -> None:
            checkpoint_class = self.orca.model_checkpoint.ModelCheckpoint
            folder = self.folder('checkpoints')
            loop = make_loop(seed=0)
            callbacks = [self.main(), checkpoint_class(filepath=os.path.join(folder, 'test-{epoch}'))]
            loop.fit(num_epochs=2, callbacks=watch(callbacks))
            files.actual = sorted(os.listdir(folder))
            path = checkpoint_class.get_latest_checkpoint(folder)
            latest.actual = os.path.basename(path)
            fresh = make_loop(seed=1)
            self.adapter.runner_for(fresh).load_checkpoint(path)
            trained = loop.evaluate_loss_on_validation_set(force_prediction=True)
            loaded = fresh.evaluate_loss_on_validation_set(force_prediction=True)
            reloaded.actual = bool(torch.equal(trained, loaded))
            shutil.rmtree(folder)
            try:
                checkpoint_class.get_latest_checkpoint(folder)
                removed.actual = 'no error'
            except Exception as exc:
                removed.actual = type(exc).__name__
        self.attempt(['MainCallback', 'ModelCheckpoint'], [files, latest, reloaded, removed], body)

    def scenario_checkpoint_by_iter(self) -> None:
        files = Expectation('test_checkpoint_callback_by_iter: interval=5 over 100 rows in batches of 4 (one epoch) '
                            'saves test-iter=5 ... test-iter=25.ckpt',
                            [f'test-iter={n}.ckpt' for n in (5, 10, 15, 20, 25)])

        def body(watch: Watch) -> None:
            folder = self.folder('iterations')
            loop = make_loop(seed=0)
            checkpoint = self.orca.model_checkpoint.ModelCheckpoint(filepath=os.path.join(folder, 'test-{iter}'),
                                                                   by_epoch=False, interval=5)
            loop.fit(num_epochs=1, callbacks=watch([self.main(), checkpoint]))
            files.actual = sorted((name for name in os.listdir(folder) if name.startswith('test-iter=')),
                                  key=lambda name: int(name[len('test-iter='):-len('.ckpt')]))
        self.attempt(['MainCallback', 'ModelCheckpoint'], [files], body)

    # ---- MaxstepsCallback --------------------------------------------------------------------------------------

    def scenario_max_steps(self) -> None:
        steps = Expectation('fit(max_steps=40) (MaxstepsCallback appended by the estimator): exactly 40 training steps '
                            f'over 100 rows in batches of {BATCH_SIZE}', 40)

        def body(watch: Watch) -> None:
            loop = make_loop(seed=0)
            counted: List[int] = []
            loop.optimizer.register_step_post_hook(lambda *args: counted.append(1))
            callbacks = [self.main(), self.orca.maxsteps.MaxstepsCallback(max_step=40)]
            loop.fit(num_epochs=1, callbacks=watch(callbacks))
            steps.actual = len(counted) if len(counted) == loop.total_iteration_idx + 1 else \
                f'{len(counted)} optimizer steps, {loop.total_iteration_idx + 1} batches'
        self.attempt(['MainCallback', 'MaxstepsCallback'], [steps], body)

    # ---- TensorBoardCallback -----------------------------------------------------------------------------------

    def scenario_tensorboard(self) -> None:
        expectations = {freq: Expectation(f"test_tensorboard_callback: freq='{freq}' writes the log folder "
                                          f'(not empty after fit)', True) for freq in ('epoch', 'batch')}

        def body(watch: Watch) -> None:
            for freq, expectation in expectations.items():
                log_dir = os.path.join(self.folder('tensorboard'), f'runs_{freq}')
                loop = make_loop(seed=0)
                callback = self.orca.tensorboard.TensorBoardCallback(log_dir=log_dir, freq=freq)
                loop.fit(num_epochs=2, callbacks=watch([self.main(), callback]))
                expectation.actual = os.path.isdir(log_dir) and bool(os.listdir(log_dir))
        self.attempt(['MainCallback', 'TensorBoardCallback'], list(expectations.values()), body)

    # ---- TqdmCallback ------------------------------------------------------------------------------------------

    def scenario_tqdm(self) -> None:
        def body(watch: Watch) -> None:
            loop = make_loop(seed=0)
            with contextlib.redirect_stderr(io.StringIO()):
                loop.fit(num_epochs=2, callbacks=watch([self.main(), self.orca.tqdm.TqdmCallback()]))
        self.attempt(['MainCallback', 'TqdmCallback'], [], body)

    # ---- WandbLoggerCallback -----------------------------------------------------------------------------------

    def scenario_wandb(self) -> None:
        written = Expectation('check: WandbLoggerCallback (WANDB_MODE=offline) writes an offline W&B run', True)

        def body(watch: Watch) -> None:
            module = getattr(self.orca, 'wandb', None)
            if module is None:
                raise RuntimeError('its module did not import')
            folder = self.folder('wandb')
            saved = {name: os.environ.get(name) for name in ('WANDB_MODE', 'WANDB_DIR', 'WANDB_SILENT')}
            os.environ.update(WANDB_MODE='offline', WANDB_DIR=folder, WANDB_SILENT='true')
            try:
                loop = make_loop(seed=0)
                callback = module.WandbLoggerCallback(project='orca-check')
                loop.fit(num_epochs=2, callbacks=watch([self.main(), callback]))
            finally:
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
            written.actual = bool(glob.glob(os.path.join(folder, 'wandb', 'offline-run-*')))
        self.attempt(['MainCallback', 'WandbLoggerCallback'], [written], body)


# ---- the adapter's built-in callbacks beside the wheel's own ------------------------------------------------------

def _scalars(folder: str) -> Dict[str, List[Any]]:
    """TensorBoard scalars of every event file under ``folder``: tag -> [(step, value)], in write order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    scalars: Dict[str, List[Any]] = {}
    for path in sorted(glob.glob(os.path.join(folder, '**', 'events.out.tfevents.*'), recursive=True)):
        events = EventAccumulator(path)
        events.Reload()
        for tag in events.Tags()['scalars']:
            scalars.setdefault(tag, []).extend((event.step, event.value) for event in events.Scalars(tag))
    return {tag: sorted(values) for tag, values in scalars.items()}


def _checkpoint_files(folder: str) -> Dict[str, Any]:
    """name -> content of Orca's checkpoint files (tensors compared by value through ``same``)."""
    return {name: torch.load(os.path.join(folder, name), weights_only=True) for name in sorted(os.listdir(folder))}


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and bool(torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def probe_class(adapter: Any) -> type:
    class BarProbe(adapter.Callback):
        def __init__(self) -> None:
            self.seen: List[Any] = []

        def _record(self, runner: Any) -> None:
            bar = runner._progress_bar
            self.seen.append((bar.desc, bar.n, bar.total, bar.postfix))

        def after_train_iter(self, runner: Any) -> None:
            self._record(runner)

        def after_val_iter(self, runner: Any) -> None:
            self._record(runner)
    return BarProbe


def builtins_against_the_wheel(scenarios: Any) -> None:
    """Each of Orca 2.4.0's built-in callbacks importable from the adapter (``aitoolbox_like.adapters.orca``), run
    in the same fit as the wheel's own class: the same files with the same contents, the same TensorBoard scalars,
    the same steps, the same progress bars, the same W&B calls."""
    orca, adapter = scenarios.orca, scenarios.adapter

    def pair(make: Callable[[Any, str], List[Any]], epochs: int = 2) -> List[Any]:
        results = []
        for side in (orca, adapter):
            folder = scenarios.folder('pair')
            loop = make_loop(seed=0)
            callbacks = make(side, folder)
            loop.fit(num_epochs=epochs, callbacks=[scenarios.main()] + callbacks)
            results.append((loop, folder, callbacks))
        return results

    def checkpoints() -> Any:
        out = []
        for by_epoch in (True, False):
            make = lambda side, folder, by_epoch=by_epoch: [  # noqa: E731
                _module(side, 'model_checkpoint').ModelCheckpoint(
                    filepath=os.path.join(folder, 'test-{epoch}' if by_epoch else 'test-{iter}'), by_epoch=by_epoch,
                    interval=-1 if by_epoch else 5)]
            (_, theirs, _), (_, ours, _) = pair(make)
            a, b = _checkpoint_files(theirs), _checkpoint_files(ours)
            out.append(same(a, b) and len(a) > 1)
        return out

    def tensorboard() -> Any:
        out = []
        for freq in ('epoch', 'batch', 3):
            make = lambda side, folder, freq=freq: [  # noqa: E731
                _module(side, 'tensorboard').TensorBoardCallback(log_dir=os.path.join(folder, 'runs'), freq=freq)]
            (_, theirs, _), (_, ours, _) = pair(make)
            a, b = _scalars(os.path.join(theirs, 'runs')), _scalars(os.path.join(ours, 'runs'))
            out.append(bool(a) and a == b)
        return out

    def max_steps() -> Any:
        (theirs, _, _), (ours, _, _) = pair(lambda side, folder: [_module(side, 'maxsteps').MaxstepsCallback(37)])
        return (theirs.total_iteration_idx, ours.total_iteration_idx, same(theirs.model.state_dict(),
                                                                           ours.model.state_dict()))

    def bars() -> Any:
        probe = probe_class(adapter)
        with contextlib.redirect_stderr(io.StringIO()):
            (_, _, a), (_, _, b) = pair(lambda side, folder: [_module(side, 'tqdm').TqdmCallback(), probe()])
        return a[1].seen == b[1].seen and len(a[1].seen) > 0

    def wandb_calls() -> Any:
        import wandb
        calls: List[Any] = []

        class Run:
            def log(self, values: Any) -> None:
                calls[-1].append(('log', dict(values)))

            def finish(self) -> None:
                calls[-1].append(('finish',))

        real = wandb.init
        wandb.init = lambda **kwargs: (calls.append([('init', kwargs)]), Run())[1]
        try:
            pair(lambda side, folder: [_module(side, 'wandb').WandbLoggerCallback(project='orca-check',
                                                                                 log_config=True)])
        finally:
            wandb.init = real
        return len(calls) == 2 and calls[0] == calls[1] and len(calls[0]) == 4

    checks = [
        ('ModelCheckpoint (by epoch; by_epoch=False, interval=5): the same files, the same contents',
         checkpoints, [True, True], ['ModelCheckpoint']),
        ("TensorBoardCallback (freq 'epoch', 'batch', 3): the same scalars at the same steps", tensorboard,
         [True, True, True], ['TensorBoardCallback']),
        ('MaxstepsCallback(37): the same 37 steps and weights', max_steps, (36, 36, True), ['MaxstepsCallback']),
        ("TqdmCallback: the same bars (description, position, total, loss)", bars, True, ['TqdmCallback']),
        ('WandbLoggerCallback(log_config=True): the same wandb.init arguments, logs and finish', wandb_calls, True,
         ['WandbLoggerCallback']),
    ]
    for name, check, expected, subjects in checks:
        expectation = Expectation(f"check: aitoolbox_like.adapters.orca's {name} as the wheel's", expected)

        def body(watch: Watch, check: Callable[[], Any] = check, expectation: Expectation = expectation) -> None:
            expectation.actual = check()
        scenarios.attempt([], [expectation], body)


def _module(side: Any, stem: str) -> Any:
    """The wheel's rewritten module ``stem``, or the adapter (whose package has every built-in class)."""
    return getattr(side, stem) if hasattr(side, 'model_checkpoint') else side


# ---- Orca 2.2's own Keras-style callbacks --------------------------------------------------------------------------

def orca22_callbacks(scenarios: Any, orca22: Any) -> None:
    """Orca 2.2.0's own ModelCheckpoint and TensorBoardCallback (Keras-style: on_train_begin(), on_epoch_end(epoch,
    logs), on_batch_end(batch, logs), set_trainer), from its published wheel with only their imports changed, give
    what Orca 2.4.0's give in the same fit."""
    adapter = scenarios.adapter

    def run(callback: Any) -> Tuple[str, Any]:
        loop = make_loop(seed=0)
        loop.fit(num_epochs=2, callbacks=[scenarios.main(), callback])
        return loop

    files = Expectation("check: Orca 2.2's ModelCheckpoint (Keras-style, from bigdl-orca 2.2.0): test-epoch=1.ckpt, "
                        "test-epoch=2.ckpt, last.ckpt, with the contents 2.4.0's writes", True)
    scalars = Expectation("check: Orca 2.2's TensorBoardCallback (freq 'epoch' and 'batch'): the scalars 2.4.0's "
                          "writes", [True, True])

    def body_files(watch: Watch) -> None:
        folder22, folder24 = scenarios.folder('orca22'), scenarios.folder('orca24')
        run(orca22.model_checkpoint.ModelCheckpoint(filepath=os.path.join(folder22, 'test-{epoch}')))
        run(adapter.ModelCheckpoint(filepath=os.path.join(folder24, 'test-{epoch}')))
        a, b = _checkpoint_files(folder22), _checkpoint_files(folder24)
        files.actual = sorted(a) == ['last.ckpt', 'test-epoch=1.ckpt', 'test-epoch=2.ckpt'] and same(a, b)

    def body_scalars(watch: Watch) -> None:
        out = []
        for freq in ('epoch', 'batch'):
            folder22, folder24 = scenarios.folder('tb22'), scenarios.folder('tb24')
            run(orca22.tensorboard.TensorBoardCallback(log_dir=os.path.join(folder22, 'runs'), freq=freq))
            run(adapter.TensorBoardCallback(log_dir=os.path.join(folder24, 'runs'), freq=freq))
            a, b = _scalars(os.path.join(folder22, 'runs')), _scalars(os.path.join(folder24, 'runs'))
            out.append(bool(a) and a == b)
        scalars.actual = out
    scenarios.attempt([], [files], body_files)
    scenarios.attempt([], [scalars], body_scalars)


# ---- kill -9 and resume --------------------------------------------------------------------------------------------

def kill_and_resume(scenarios: Any, rewritten: Any) -> None:
    """tools/orca_check/resumed.py (Orca's own MainCallback with a StepLR scheduler on the runner, a user's Orca
    early stop keeping its best value and patience in attributes, values stored on the runner, an Orca 2.2-style
    counter, Orca's metrics; Orca's shuffling sampler; the loop's checkpoint every epoch) killed with SIGKILL inside
    epoch 6 and resumed in a new process, against the same script run to its end."""
    from pathlib import Path
    from .. import kill_resume
    from . import resumed
    expectation = Expectation("check: kill -9 inside epoch 6 and fit(resume_from='auto') in a new process: the "
                              "weights, epoch_stats, history, stop epoch, the callbacks' and the runner's state and "
                              'the scheduler of the run never killed, to the bit', 'the same')

    def body(watch: Watch) -> None:
        whole, again, _ = kill_resume.uninterrupted_and_resumed(
            'tools.orca_check.resumed', Path(scenarios.folder('kill-resume')), resumed.KILL_AT, [str(rewritten)])
        if whole['epochs'] >= resumed.EPOCHS:
            expectation.actual = f'the run never stopped early ({whole["epochs"]} epochs): the scenario shows nothing'
        else:
            expectation.actual = kill_resume.first_difference(again, whole) or 'the same'
    scenarios.attempt([], [expectation], body)
