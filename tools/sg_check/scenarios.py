"""SG's callback classes, run by SG's trainer (trainer.py) on the TrainLoop, and what SG's own unit tests expect.

Each expected value below is the one SG's test named beside it asserts (tests/unit_tests of
Deci-AI/super-gradients: lr_warmup_test.py, lr_cooldown_test.py, test_train_with_torch_scheduler.py,
early_stop_test.py), with the test's training params; the data, models, metrics and losses are ours, of the
kind the test uses (SG's zero images, a classifier, a metric or loss returning the test's values).

A class *runs* when an instance of it (or, for SG's abstract bases, of a subclass) takes part in a fit that
completes, and the adapter called its SG methods; each scenario also checks what the class is for (the learning
rates it sets, the stage it switches, the file it writes, the images it logs: drawing_scenarios.py). A class with
no scenario is listed in NOT_RUN with the service it needs.
"""
import csv
import math
import os
import tempfile
from collections import namedtuple
from typing import Any, Callable, Dict, List, Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from .drawing_scenarios import DrawingScenarios
from .fixtures import ConstantMetric, EpochLoss, Net, loader, named
from ..published_wheel import Watch
from .tally import Expectation, Tally
from .trainer import ParamsTrainer, Run, Trainer

# SG callback classes the check does not run, and why (docs/callbacks/supergradients.md lists them too).
NOT_RUN = {
    'ModelConversionCheckCallback': 'exports the model to ONNX and runs it in onnxruntime: a model-export check before '
                                    'training, not a training step (needs onnx and onnxruntime; SG pins 1.15)',
    'DeciLabUploadCallback': "uploads the trained model to Deci's platform (needs Deci's DeciClient and an account)",
    'PPYoloETrainingStageSwitchCallback': "switches SG's PPYoloELoss to its task-aligned assigner and refuses any "
                                          "other criterion (needs SG's PP-YOLOE detection loss as the fit's criterion)",
    'WandBDetectionValidationPredictionLoggerCallback': "logs SG detection-model predictions to Weights & Biases "
                                                        "(needs a W&B run, which SG's W&B logger starts, and SG's "
                                                        'prediction classes)',
}

# The scenarios run a second time through the adapter's TrainingParamsCallback (what a user moving an SG setup
# over runs), against the same numbers of SG's tests.
PARAMS_SCENARIOS = ('scenario_lr_warmup', 'scenario_lr_warmup_with_lr_scheduling', 'scenario_warmup_linear_batch_step',
                    'scenario_warmup_linear_epoch_step', 'scenario_custom_lr_warmup', 'scenario_lr_cooldown',
                    'scenario_torch_schedulers')
PARAMS_LABEL = ' [TrainingParamsCallback]'


# ---- the scenarios -----------------------------------------------------------------------------------------------

class Scenarios(DrawingScenarios):
    """Each ``scenario_*`` method trains with SG's callbacks through ``attempt``, which records the classes that ran
    and the expectations measured."""

    SGD = {'weight_decay': 1e-4, 'momentum': 0.9}

    def __init__(self, sg: Any, adapter: Any, trainer: Trainer, tally: Tally, rewritten: Any = None) -> None:
        self.rewritten = rewritten      # the folder of the rewritten modules (the kill-and-resume runs import them)
        self.sg = sg
        self.cb = sg.callbacks
        self.adapter = adapter
        self.trainer = trainer
        self.tally = tally
        self.method_names = list(getattr(adapter, 'SG_METHOD_HOOKS', {})) + [
            'on_average_best_models_validation_start', 'on_average_best_models_validation_end']
        self.via: Any = trainer     # who trains: SG's trainer (SG's classes) or the adapter's TrainingParamsCallback
        self.label = ''

    def run_all(self) -> None:
        for name in sorted(n for n in dir(self) if n.startswith('scenario_')):
            getattr(self, name)()
        if hasattr(self.adapter, 'TrainingParamsCallback'):
            self.via, self.label = ParamsTrainer(self.adapter), PARAMS_LABEL
            try:
                for name in PARAMS_SCENARIOS:
                    getattr(self, name)()
            finally:
                self.via, self.label = self.trainer, ''

    def expect(self, test: str, expected: Any, **tolerance: Any) -> Expectation:
        """An expectation of SG's ``test``, named with the way it was trained."""
        return Expectation(test + self.label, expected, **tolerance)

    def attempt(self, subjects: Sequence[str], expectations: Sequence[Expectation],
                body: Callable[['Watch'], None]) -> None:
        """Run ``body`` (which trains and fills ``expectations``' actual values); an exception is the error of each
        subject that has not run and of each expectation left without a value."""
        watch = Watch(self.tally.sg_classes, self.tally.ran, self.method_names)
        if self.label:      # SG's classes named here are replaced by the adapter's in these runs
            subjects = [subject for subject in subjects if subject == 'TestLRCallback']
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
                    self.tally.errors.setdefault(subject, 'its SG methods were never called')
        self.tally.expectations.extend(expectations)

    def train(self, watch: Watch, params: Dict[str, Any], train: DataLoader, valid: DataLoader,
              criterion: Any = None, model: Any = None, test: Any = None) -> Run:
        return self.via.train(params, model or Net(), criterion if criterion is not None else nn.CrossEntropyLoss(),
                              train, valid, test, watch=watch)

    # ---- lr_warmup_test.py -------------------------------------------------------------------------------------

    def lr_params(self, **params: Any) -> Dict[str, Any]:
        """The params of SG's learning-rate tests: an Accuracy metric watched (a constant here), SGD."""
        accuracy = named(ConstantMetric, 'Accuracy')
        return {'initial_lr': 1, 'optimizer_params': self.SGD, 'train_metrics_list': [accuracy([1])],
                'valid_metrics_list': [accuracy([1])], 'metric_to_watch': 'Accuracy', **params}

    def scenario_lr_warmup(self) -> None:
        expectation = self.expect('lr_warmup_test.test_lr_warmup', [0.25, 0.5, 0.75, 1.0, 1.0])

        def body(watch: Watch) -> None:
            lrs: List[float] = []
            self.train(watch, self.lr_params(
                max_epochs=5, lr_updates=[10], lr_decay_factor=0.1, lr_mode='StepLRScheduler', lr_warmup_epochs=3,
                phase_callbacks=[self.cb.TestLRCallback(lr_placeholder=lrs)], warmup_mode='LinearEpochLRWarmup'),
                loader(4), loader(4))
            expectation.actual = lrs
        self.attempt(['TestLRCallback', 'LinearEpochLRWarmup', 'StepLRScheduler', 'LRCallbackBase'],
                     [expectation], body)

    def scenario_lr_warmup_with_lr_scheduling(self) -> None:
        expectation = self.expect('lr_warmup_test.test_lr_warmup_with_lr_scheduling',
                                  [0.25, 0.5, 0.75, 0.9236067977499791, 0.4763932022500211], rtol=1e-6)

        def body(watch: Watch) -> None:
            lrs: List[float] = []
            self.train(watch, self.lr_params(
                max_epochs=5, cosine_final_lr_ratio=0.2, lr_mode='CosineLRScheduler', lr_warmup_epochs=3,
                phase_callbacks=[self.cb.TestLRCallback(lr_placeholder=lrs)], warmup_mode='LinearEpochLRWarmup'),
                loader(4, 5), loader(4, 5))
            expectation.actual = lrs
        self.attempt(['CosineLRScheduler'], [expectation], body)

    def collector(self) -> Any:
        """An SG callback collecting the learning rate after each training batch and at each training epoch end."""
        class CollectLR(self.adapter.Callback):
            def __init__(self) -> None:
                self.per_step: List[float] = []
                self.per_epoch: List[float] = []

            def on_train_batch_end(self, context: Any) -> None:
                self.per_step.append(context.optimizer.param_groups[0]['lr'])

            def on_train_loader_end(self, context: Any) -> None:
                self.per_epoch.append(context.optimizer.param_groups[0]['lr'])
        return CollectLR()

    def scenario_warmup_linear_batch_step(self) -> None:
        warmup = self.expect('lr_warmup_test.test_warmup_linear_batch_step (the 100 warm-up steps)',
                             np.linspace(0.05, 1, 100).tolist(), rtol=1e-4)
        cosine = self.expect('lr_warmup_test.test_warmup_linear_batch_step (the cosine steps after them)',
                             None, rtol=1e-4)

        def body(watch: Watch) -> None:
            collect = self.collector()
            train = loader(4, 1024)
            total = 5 * len(train) - 100
            cosine.expected = self.cb.CosineLRScheduler.compute_learning_rate(
                step=np.arange(0, total), total_steps=total, initial_lr=1, final_lr_ratio=0.2).tolist()
            self.train(watch, self.lr_params(
                max_epochs=5, lr_mode='CosineLRScheduler', cosine_final_lr_ratio=0.2, warmup_initial_lr=0.05,
                warmup_mode='LinearBatchLRWarmup', lr_warmup_steps=100, phase_callbacks=[collect]),
                train, loader(4, 5))
            warmup.actual, cosine.actual = collect.per_step[:100], collect.per_step[100:]
        self.attempt(['LinearBatchLRWarmup'], [warmup, cosine], body)

    def scenario_warmup_linear_epoch_step(self) -> None:
        expectation = self.expect('lr_warmup_test.test_warmup_linear_epoch_step', [4.0, 3.0, 2.0, 1.0, 1.0])

        def body(watch: Watch) -> None:
            collect = self.collector()
            self.train(watch, self.lr_params(
                max_epochs=5, lr_updates=[10], lr_decay_factor=0.1, lr_mode='StepLRScheduler', lr_warmup_epochs=3,
                warmup_initial_lr=4.0, phase_callbacks=[collect], warmup_mode='LinearEpochLRWarmup'),
                loader(4, 5), loader(4, 5))
            expectation.actual = collect.per_epoch
        self.attempt(['LinearEpochLRWarmup'], [expectation], body)

    def exponential_warmup_class(self) -> type:
        """A user's warm-up on SG's LRCallbackBase, as the test's: from warmup_initial_lr at epoch 0 to initial_lr
        at epoch lr_warmup_epochs, along exp(epoch)."""
        phase = self.adapter.Phase.TRAIN_EPOCH_START
        # a user's class on SG's base; moved over, on the adapter's
        base = self.adapter.LRCallbackBase if self.label else self.cb.LRCallbackBase

        class ExponentialWarmup(base):
            def __init__(self, **kwargs: Any) -> None:
                super().__init__(phase, **kwargs)
                start = self.training_params.warmup_initial_lr
                self.start = start if isinstance(start, dict) else {group: start for group in self.lr}
                self.epochs = self.training_params.lr_warmup_epochs

            def is_lr_scheduling_enabled(self, context: Any) -> bool:
                return context.epoch <= self.epochs

            def perform_scheduling(self, context: Any) -> None:
                progress = math.expm1(context.epoch) / math.expm1(self.epochs)
                for group in self.lr:
                    self.lr[group] = self.start[group] + (self.initial_lr[group] - self.start[group]) * progress
                self.update_lr(context.optimizer, context.epoch, None)
        return ExponentialWarmup

    def scenario_custom_lr_warmup(self) -> None:
        expectation = self.expect('lr_warmup_test.test_custom_lr_warmup',
                                  [0.1, 0.18102751585334242, 0.40128313980266034, 1.0, 1.0], rtol=1e-6)

        def body(watch: Watch) -> None:
            lrs: List[float] = []
            self.train(watch, self.lr_params(
                max_epochs=5, lr_updates=[10], lr_decay_factor=0.1, lr_mode='StepLRScheduler', lr_warmup_epochs=3,
                phase_callbacks=[self.cb.TestLRCallback(lr_placeholder=lrs)],
                warmup_mode=self.exponential_warmup_class(), initial_lr=1.0, warmup_initial_lr=0.1),
                loader(4), loader(4))
            expectation.actual = lrs
        self.attempt(['LRCallbackBase'], [expectation], body)

    # ---- lr_cooldown_test.py -----------------------------------------------------------------------------------

    def scenario_lr_cooldown(self) -> None:
        expectation = self.expect('lr_cooldown_test.test_lr_cooldown_with_lr_scheduling',
                                  [0.25, 0.5, 0.75, 0.9236067977499791, 0.4763932022500211, 0.4763932022500211,
                                   0.4763932022500211], rtol=1e-6)

        def body(watch: Watch) -> None:
            lrs: List[float] = []
            self.train(watch, self.lr_params(
                max_epochs=7, cosine_final_lr_ratio=0.2, lr_mode='CosineLRScheduler', lr_cooldown_epochs=2,
                lr_warmup_epochs=3, phase_callbacks=[self.cb.TestLRCallback(lr_placeholder=lrs)]),
                loader(4, 5), loader(4, 5))
            expectation.actual = lrs
        self.attempt(['CosineLRScheduler'], [expectation], body)

    # ---- test_train_with_torch_scheduler.py --------------------------------------------------------------------

    TORCH_SCHEDULERS = [
        # (test, scheduler, its params, expected final lr, epochs, resumed to one more epoch)
        ('StepLR', 'StepLR', {'gamma': 0.1, 'step_size': 1}, 0.001, 2, False),
        ('LambdaLR', 'LambdaLR', {'lr_lambda': lambda epoch: 1 / (epoch + 10)}, 0.1 / 12, 2, False),
        ('MultiStepLR', 'MultiStepLR', {'milestones': [0, 1]}, 0.001, 2, False),
        ('ConstantLR', 'ConstantLR', {'factor': 0.5, 'total_iters': 4}, 0.05, 2, False),
        ('CosineAnnealingLR', 'CosineAnnealingLR', {'T_max': 3}, 0.025, 2, False),
        ('CosineAnnealingWarmRestarts', 'CosineAnnealingWarmRestarts', {'T_0': 2}, 0.1, 4, False),
        ('CyclicLR', 'CyclicLR', {'base_lr': 0.01, 'max_lr': 0.1}, 0.01018, 4, False),
        ('ExponentialLR', 'ExponentialLR', {'gamma': 0.01}, 1e-09, 4, False),
        ('LinearLR', 'LinearLR', {}, 0.08666666666666668, 4, False),
        ('ReduceLROnPlateau', 'ReduceLROnPlateau', {'patience': 0, 'metric_name': 'DummyMetric'}, 0.01, 2, False),
        ('resume StepLR', 'StepLR', {'gamma': 0.1, 'step_size': 1}, 0.0001, 2, True),
        ('resume ReduceLROnPlateau', 'ReduceLROnPlateau', {'patience': 0, 'metric_name': 'DummyMetric'}, 0.001, 2,
         True),
    ]

    def scenario_torch_schedulers(self) -> None:
        for test, scheduler, params, expected, epochs, resume in self.TORCH_SCHEDULERS:
            name = f'test_train_with_torch_scheduler ({test}{", a second fit continues" if resume else ""})'
            expectation = self.expect(name, expected, atol=1e-8)

            def body(watch: Watch, scheduler: str = scheduler, params: Dict[str, Any] = params,
                     epochs: int = epochs, resume: bool = resume, expectation: Expectation = expectation) -> None:
                dummy = named(ConstantMetric, 'DummyMetric')
                lr_mode = {scheduler: {**params, 'phase': self.adapter.Phase.TRAIN_EPOCH_END}}
                run = self.train(watch, {
                    'max_epochs': epochs, 'lr_mode': lr_mode,
                    'lr_warmup_epochs': 0, 'initial_lr': 0.1, 'optimizer_params': self.SGD,
                    'train_metrics_list': [dummy([1])], 'valid_metrics_list': [dummy([1])],
                    'metric_to_watch': 'DummyMetric', 'greater_metric_to_watch_is_better': True},
                    loader(10), loader(10))
                if resume:
                    run.fit(epochs + 1)
                expectation.actual = run.lr
            self.attempt(['LRSchedulerCallback', 'MetricsUpdateCallback'], [expectation], body)

    # ---- early_stop_test.py ------------------------------------------------------------------------------------

    def early_stop_params(self, **params: Any) -> Dict[str, Any]:
        return {'max_epochs': 10, 'lr_updates': [1], 'lr_decay_factor': 0.1, 'lr_mode': 'StepLRScheduler',
                'lr_warmup_epochs': 0, 'initial_lr': 0.1, 'optimizer_params': self.SGD, 'train_metrics_list': [],
                'average_best_models': False, **params}

    def early_stop_on_loss(self, test: str, values: Sequence[float], expected_epochs: int, **stop: Any) -> None:
        """EarlyStop watching SG's loss name ('LossTest', the criterion's class name) at the validation end."""
        expectation = Expectation(f'early_stop_test.{test} (epochs trained)', expected_epochs)

        def body(watch: Watch) -> None:
            criterion = named(EpochLoss, 'LossTest')(values)
            early_stop = self.sg.early_stopping.EarlyStop(self.adapter.Phase.VALIDATION_EPOCH_END,
                                                          monitor='LossTest', mode='min', verbose=True, **stop)
            run = self.trainer.train(self.early_stop_params(phase_callbacks=[early_stop]), Net(), criterion,
                                     loader(5), loader(5), watch=watch, on_loop=criterion.bind)
            expectation.actual = run.loop.epochs_completed
        self.attempt(['EarlyStop'], [expectation], body)

    def early_stop_on_metric(self, test: str, values: Sequence[float], expected_count: int, **stop: Any) -> None:
        """EarlyStop watching a validation metric ('MetricTest') at the validation end; SG counts its compute()s."""
        expectation = Expectation(f'early_stop_test.{test} (compute() calls: epochs validated)', expected_count)

        def body(watch: Watch) -> None:
            metric = named(ConstantMetric, 'MetricTest')(torch.tensor(values))
            early_stop = self.sg.early_stopping.EarlyStop(self.adapter.Phase.VALIDATION_EPOCH_END,
                                                          monitor='MetricTest', mode='max', verbose=True, **stop)
            self.train(watch, self.early_stop_params(phase_callbacks=[early_stop], valid_metrics_list=[metric],
                                                     metric_to_watch='MetricTest'), loader(5), loader(5))
            expectation.actual = metric.computed
        self.attempt(['EarlyStop', 'MetricsUpdateCallback'], [expectation], body)

    def scenario_early_stop(self) -> None:
        self.early_stop_on_loss('test_min_mode_patience_metric', [1.0, 0.8, 0.81, 0.8, 0.9, 0.2, 0.1, 0.3, 0.05, 0.9],
                                5, patience=3)
        self.early_stop_on_metric('test_max_mode_patience_metric',
                                  [0.2, 0.1, 0.3, 0.28, 0.2, 0.1, 0.33, 0.05, 0.9, 0.99], 6, patience=3)
        self.early_stop_on_loss('test_min_mode_threshold_metric',
                                [1.0, 0.8, 0.4, 0.2, 0.09, 0.11, 0.105, 0.3, 0.05, 0.02], 5, threshold=0.1)
        self.early_stop_on_metric('test_max_mode_threshold_metric',
                                  [0.2, 0.1, 0.6, 0.8, 0.9, 0.92, 0.95, 0.94, 0.948, 0.99], 7, threshold=0.94)
        self.early_stop_on_loss('test_no_finite_stoppage (NaN)',
                                [1.0, float('nan'), 0.81, 0.8, 0.9, 0.2, 0.1, 0.3, 0.05, 0.9], 2, check_finite=True)
        self.early_stop_on_loss('test_no_finite_stoppage (Inf)',
                                [1.0, 0.8, float('inf'), 0.8, 0.9, 0.2, 0.1, 0.3, 0.05, 0.9], 3, patience=3)
        self.early_stop_on_metric('test_min_delta', [0.1, 0.2, 0.305, 0.31, 0.34, 0.42, 0.6, 0.8, 0.9, 0.99], 5,
                                  patience=2, min_delta=0.1)

    # ---- the other training callbacks: each run with what it is for ------------------------------------------

    def scenario_other_lr_schedulers(self) -> None:
        for mode, extra in (('ExponentialLRScheduler', {'lr_decay_factor': 0.5}),
                            ('PolyLRScheduler', {}),
                            ('FunctionLRScheduler', {'lr_schedule_function': _half_lr})):
            def body(watch: Watch, mode: str = mode, extra: Dict[str, Any] = extra) -> None:
                lrs: List[float] = []
                self.train(watch, self.lr_params(max_epochs=3, lr_mode=mode, lr_warmup_epochs=1,
                                                 phase_callbacks=[self.cb.TestLRCallback(lr_placeholder=lrs)],
                                                 **extra), loader(4, 8), loader(4))
                if not lrs[-1] < 1.0:
                    raise AssertionError(f'{mode} left the learning rate at {lrs[-1]}')
            self.attempt([mode], [], body)

    def scenario_phase_context_test(self) -> None:
        def body(watch: Watch) -> None:
            keep = self.cb.PhaseContextTestCallback('TRAIN_EPOCH_END')    # a phase as SG's YAML recipes write it
            self.train(watch, self.lr_params(max_epochs=2, phase_callbacks=[keep]), loader(4), loader(4))
            context = keep.context      # the run's context, which SG keeps updating after the phase, as here
            if not isinstance(context, self.adapter.PhaseContext) or context.epoch != 1:
                raise AssertionError(f'PhaseContextTestCallback kept {context!r}')
        self.attempt(['PhaseContextTestCallback'], [], body)

    def scenario_kd_metrics_update(self) -> None:
        class KDNet(Net):
            """A knowledge-distillation model: its output has the student's and the teacher's predictions."""
            def forward(self, x: torch.Tensor) -> Any:
                student = self.fc(x.flatten(1))
                return KDOutput(student, student.detach() * 0)

            def get_loss(self, batch_data: Any, criterion: Any, device: Any) -> torch.Tensor:
                x, y = batch_data[0], batch_data[1]
                return criterion(self(x.to(device)).student_output, y.to(device))

        class StudentPreds:
            def __init__(self) -> None:
                self.seen: List[Any] = []

            def update(self, preds: Any, target: Any) -> None:
                self.seen.append(preds)

            def compute(self) -> float:
                return float(len(self.seen))

            def reset(self) -> None:
                pass

        def body(watch: Watch) -> None:
            metric = StudentPreds()
            kd_update = self.cb.KDModelMetricsUpdateCallback(self.adapter.Phase.TRAIN_BATCH_END)
            model = KDNet()
            built = self.trainer.build(self.lr_params(max_epochs=2, train_metrics_list=[metric]), model, loader(2, 4))
            built['callbacks'] = [kd_update if type(cb) is self.cb.MetricsUpdateCallback
                                  and cb.phase == self.adapter.Phase.TRAIN_BATCH_END else cb
                                  for cb in built['callbacks']]
            self.trainer.fit(built, model, nn.CrossEntropyLoss(), loader(2, 4), loader(2), watch=watch)
            if len(metric.seen) != 4 or not all(isinstance(p, torch.Tensor) and p.shape == (2, 5)
                                                for p in metric.seen):
                raise AssertionError(f'the metric got {[type(p).__name__ for p in metric.seen]}')
        self.attempt(['KDModelMetricsUpdateCallback'], [], body)

    def scenario_stage_switch(self) -> None:
        class SwitchCriterion(self.cb.TrainingStageSwitchCallbackBase):
            """A user's stage switch on SG's base: a label-smoothing criterion from the next stage on."""
            def apply_stage_change(self, context: Any) -> None:
                context.criterion.label_smoothing = 0.1

        def body(watch: Watch) -> None:
            criterion = named(nn.CrossEntropyLoss, 'YoloXLoss')()
            criterion.use_l1 = False
            train = loader(4)
            yolox = self.cb.YoloXTrainingStageSwitchCallback(next_stage_start_epoch=1)
            switch = SwitchCriterion(next_stage_start_epoch=2)
            self.train(watch, self.lr_params(max_epochs=3, phase_callbacks=[yolox, switch]), train, loader(4),
                       criterion=criterion)
            if not (criterion.use_l1 and train.dataset.transforms[0].closed and criterion.label_smoothing == 0.1):
                raise AssertionError('the stage switches did not apply their stage change')
        self.attempt(['YoloXTrainingStageSwitchCallback', 'TrainingStageSwitchCallbackBase'], [], body)

    def scenario_sliding_window(self) -> None:
        class SlidingNet(Net):
            def bind(self, loop: Any) -> None:
                self.loop = loop

            def enable_sliding_window_validation(self) -> None:
                self.sliding.append(('enable', self.loop.epoch))

            def disable_sliding_window_validation(self) -> None:
                self.sliding.append(('disable', self.loop.epoch))

        def body(watch: Watch) -> None:
            model = SlidingNet()
            valid, test = loader(4), loader(4)
            callback = self.cb.SlidingWindowValidationCallback(transforms_for_sliding_window=['sliding'])
            built = self.trainer.build(self.lr_params(max_epochs=2, phase_callbacks=[callback]), model, loader(4))
            self.trainer.fit(built, model, nn.CrossEntropyLoss(), loader(4), valid, test, watch=watch,
                             on_loop=model.bind)
            # the last epoch's validation and the test pass run with the sliding window (SG leaves the validation
            # transforms swapped and restores the test ones)
            expected = [('enable', 1), ('disable', 1), ('enable', 1), ('disable', 1)]
            if model.sliding != expected or valid.dataset.transforms.transforms != ['sliding'] \
                    or test.dataset.transforms.transforms != ['default']:
                raise AssertionError(f'sliding window calls {model.sliding}, transforms '
                                     f'{valid.dataset.transforms.transforms} / {test.dataset.transforms.transforms}')
        self.attempt(['SlidingWindowValidationCallback'], [], body)

    def scenario_roboflow_result(self) -> None:
        class DetectionMetrics:
            """A metric with components, as SG's detection metrics: compute() gives a dict of them."""
            def update(self, *args: Any, **kwargs: Any) -> None:
                pass

            def compute(self) -> Dict[str, torch.Tensor]:
                return {'mAP@0.50': torch.tensor(0.5), 'mAP@0.50:0.95': torch.tensor(0.25)}

            def reset(self) -> None:
                pass

        def body(watch: Watch) -> None:
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, 'results.csv')
                callback = self.cb.RoboflowResultCallback(dataset_name='digits', output_path=path)
                self.train(watch, self.lr_params(max_epochs=2, phase_callbacks=[callback],
                                                 valid_metrics_list=[DetectionMetrics()]), loader(4), loader(4))
                with open(path, newline='') as file:
                    rows = list(csv.reader(file))
            if rows != [['digits', '0.25']]:
                raise AssertionError(f'results.csv has {rows}')
        self.attempt(['RoboflowResultCallback'], [], body)


    # ---- the callbacks writing into SG's logger (context.sg_logger, the adapter's facade) ------------------------

    def logger_keeper(self) -> Any:
        """An SG callback keeping the run's ``context.sg_logger``."""
        class KeepLogger(self.adapter.Callback):
            sg_logger: Any = None

            def on_training_end(self, context: Any) -> None:
                self.sg_logger = context.sg_logger
        return KeepLogger()

    def scenario_timer(self) -> None:
        def body(watch: Watch) -> None:
            keep = self.logger_keeper()
            train, valid = loader(2, 6), loader(2, 4)
            run = self.train(watch, self.lr_params(max_epochs=2, phase_callbacks=[self.cb.TimerCallback(), keep]),
                             train, valid)
            scalars = keep.sg_logger.scalars
            per_epoch = len(train) + len(valid)         # SG's global batch step counts both loaders
            steps = [step for step, _ in scalars['timer/train_batch_total_time_ms']]
            expected = [epoch * per_epoch + i for epoch in range(2) for i in range(len(train))]
            history = run.loop.train_history
            if steps != expected or not all(ms >= 0 for _, ms in scalars['timer/train_batch_total_time_ms']) \
                    or history.get_epochs('timer/epoch_total_time_sec') != [0, 1] \
                    or len(scalars['timer/validation_batch_total_time_ms']) != 2 * len(valid):
                raise AssertionError(f'TimerCallback logged {sorted(scalars)}, train steps {steps}')
        self.attempt(['TimerCallback'], [], body)

    def scenario_extreme_batch(self) -> None:
        class HighestLossInputs(self.cb.ExtremeBatchCaseVisualizationCallback):
            """A user's visualisation on SG's base: the inputs of the batch of highest loss, as HWC images."""
            def process_extreme_batch(self) -> np.ndarray:
                return (self.extreme_batch.permute(0, 2, 3, 1) * 255).to(torch.uint8).numpy()

        def body(watch: Watch) -> None:
            g = torch.Generator().manual_seed(0)
            valid = DataLoader(torch.utils.data.TensorDataset(torch.rand(6, 3, 4, 4, generator=g),
                                                              torch.randint(0, 5, (6,), generator=g)), batch_size=2)
            keep = self.logger_keeper()
            callback = HighestLossInputs(loss_to_monitor='CrossEntropyLoss', max=True)
            run = self.train(watch, self.lr_params(max_epochs=2, phase_callbacks=[callback, keep]), loader(2, 4),
                             valid)
            model = run.loop.model.eval()
            with torch.no_grad():
                losses = [float(nn.functional.cross_entropy(model(x), y)) for x, y in valid]
            x = list(valid)[int(np.argmax(losses))][0]
            step, images = keep.sg_logger.images['valid/max_CrossEntropyLoss_batch']
            if step != 1 or not np.array_equal(images, (x.permute(0, 2, 3, 1) * 255).to(torch.uint8).numpy()):
                raise AssertionError(f'the logged batch is not the one of highest loss (losses {losses})')
        self.attempt(['ExtremeBatchCaseVisualizationCallback'], [], body)

    def scenario_extreme_batch_segmentation(self) -> None:
        class SegNet(Net):
            """Per-pixel classes of 4x4 images (a 1x1 convolution)."""
            def __init__(self) -> None:
                super().__init__()
                self.fc = nn.Conv2d(3, 5, 1)

            def forward(self, x: torch.Tensor) -> Any:
                return self.fc(x)

        def body(watch: Watch) -> None:
            g = torch.Generator().manual_seed(1)
            gray = torch.rand(6, 1, 4, 4, generator=g).expand(-1, 3, -1, -1).contiguous()
            data = torch.utils.data.TensorDataset(gray, torch.randint(0, 5, (6, 4, 4), generator=g))
            valid = DataLoader(data, batch_size=2)
            keep = self.logger_keeper()
            callback = self.cb.ExtremeBatchSegVisualizationCallback(loss_to_monitor='CrossEntropyLoss', max=False)
            run = self.train(watch, self.lr_params(max_epochs=1, phase_callbacks=[callback, keep]),
                             DataLoader(data, batch_size=2), valid, model=SegNet())
            model = run.loop.model.eval()
            with torch.no_grad():
                batches = [(x, y, model(x)) for x, y in valid]
            x, y, out = min(batches, key=lambda b: float(nn.functional.cross_entropy(b[2], b[1])))
            # SG's drawing: the inputs scaled to 0..255, right pixels blended 40% green, wrong ones 40% red
            scaled = ((x - x.min()) / (x - x.min()).max() * 255).to(torch.uint8).to(torch.float64)
            right = (out.argmax(1) == y)[:, None]
            colour = torch.where(right, torch.tensor([0., 128., 0.])[None, :, None, None],
                                 torch.tensor([255., 0., 0.])[None, :, None, None])
            expected = (scaled * 0.6 + colour * 0.4).to(torch.uint8).permute(0, 2, 3, 1).numpy()
            step, images = keep.sg_logger.images['valid/min_CrossEntropyLoss_batch']
            if images.shape != (2, 4, 4, 3) or np.abs(images.astype(int) - expected.astype(int)).max() > 1:
                raise AssertionError('the logged segmentation batch is not the lowest-loss one drawn green / red')
        self.attempt(['ExtremeBatchSegVisualizationCallback'], [], body)


KDOutput = namedtuple('KDOutput', ['student_output', 'teacher_output'])


def _half_lr(initial_lr: float, epoch: int, iter: int, max_epoch: int, iters_per_epoch: int) -> float:
    return initial_lr / 2


def kill_and_resume(scenarios: Scenarios) -> None:
    """tools/sg_check/resumed.py (SG's EarlyStop and LRSchedulerCallback over StepLR, a warm-up, a user's callback
    saving into ckpt_dir at the best epoch, SG's metrics; shuffled data; the loop's checkpoint every epoch) killed with
    SIGKILL inside epoch 5 and resumed in a new process, against the same script run to its end: built as SG's
    trainer builds it (SG's own classes), and through TrainingParamsCallback."""
    import os
    import tempfile
    from pathlib import Path
    from .. import kill_resume
    from . import resumed
    work = Path(tempfile.mkdtemp(prefix='kill-resume-', dir=scenarios.rewritten))
    # The classes run in the scripts' own processes: the expectations count, the classes are counted where they run
    # in this process (the other scenarios).
    for via, label in (('trainer', "SG's own EarlyStop and LRSchedulerCallback over a StepLR, built as SG's trainer "
                                   "builds them"),
                       ('params', 'the same training params through TrainingParamsCallback')):
        expectation = Expectation(f'check: kill -9 inside epoch 5 and fit(resume_from=\'auto\') in a new process '
                                  f'({label}): the weights, history, early-stop state, learning rate and scheduler, '
                                  f'ckpt_dir/my_best.pth and the checkpoints\' ranking of the run never killed, to '
                                  f'the bit', None)

        def body(watch: Any, via: str = via, expectation: Expectation = expectation) -> None:
            os.environ['SG_CHECK_RESUME_VIA'] = via
            try:
                whole, again, _ = kill_resume.uninterrupted_and_resumed('tools.sg_check.resumed', work / via,
                                                                       resumed.KILL_AT, [str(scenarios.rewritten)])
            finally:
                os.environ.pop('SG_CHECK_RESUME_VIA', None)
            if whole['epochs'] >= resumed.EPOCHS:
                expectation.actual = f'the run never stopped early ({whole["epochs"]} epochs): the scenario shows nothing'
            else:
                expectation.actual = kill_resume.first_difference(again, whole)
            if expectation.actual is None:
                expectation.actual = 'the same'
        expectation.expected = 'the same'
        scenarios.attempt([], [expectation], body)
