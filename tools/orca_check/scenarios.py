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
from typing import Any, Callable, Dict, List, Sequence

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
