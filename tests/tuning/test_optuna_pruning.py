"""OptunaPruning in an objective written around TrainLoop.fit: each epoch's value reaches the trial, a pruned trial
stops after its epoch with the weights of a run that trained only that far, every callback's on_train_end runs, and
Optuna records the trial as pruned; a NaN or a monitor that is never recorded fails the trial."""
import math
import subprocess
import sys

import optuna
import pytest
import torch

from aitoolbox_like import TrainLoop
from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.recipes.registry import lookup
from aitoolbox_like.tuning import MonitorNotRecorded, OptunaPruning
from helpers import MLP, loaders, state_equal


class PruneFromStep(optuna.pruners.BasePruner):
    """Prunes every trial once it has reported step ``step``."""

    def __init__(self, step):
        self.step = step

    def prune(self, study, trial):
        return trial.last_step is not None and trial.last_step >= self.step


class TrainEndSeen(AbstractCallback):
    def __init__(self):
        super().__init__('train end seen')
        self.calls = 0

    def on_train_end(self):
        self.calls += 1


def _loop(criterion=None):
    torch.manual_seed(0)
    model = MLP()
    train, val, test = loaders()
    return TrainLoop(model, train, val, test, torch.optim.SGD(model.parameters(), lr=0.1),
                     criterion or torch.nn.CrossEntropyLoss(), progress_bar=False)


def test_a_pruned_trial_stops_after_its_epoch_and_optuna_records_it_as_pruned():
    seen = {}

    def objective(trial):
        loop = _loop()
        pruning, end = OptunaPruning(trial, 'val_loss'), TrainEndSeen()
        loop.fit(num_epochs=5, callbacks=[pruning, end])
        seen.update(loop=loop, pruning=pruning, end=end)
        pruning.check_pruned()
        return loop.train_history['val_loss'][-1]

    study = optuna.create_study(pruner=PruneFromStep(1))
    study.optimize(objective, n_trials=1)
    loop, pruning, end = seen['loop'], seen['pruning'], seen['end']
    [trial] = study.trials
    assert trial.state == optuna.trial.TrialState.PRUNED
    assert pruning.pruned and loop.epochs_completed == 2 and end.calls == 1
    # Optuna got every epoch's value, and keeps the last one as the pruned trial's value.
    assert trial.intermediate_values == dict(enumerate(loop.train_history['val_loss']))
    assert trial.value == loop.train_history['val_loss'][-1]
    # Stopping is clean: the weights are those of a run asked for exactly these two epochs.
    reference = _loop()
    reference.fit(num_epochs=2)
    assert state_equal(loop.model.state_dict(), reference.model.state_dict())


def test_a_trial_that_is_not_pruned_trains_all_its_epochs():
    def objective(trial):
        loop = _loop()
        pruning = OptunaPruning(trial, 'val_loss')
        loop.fit(num_epochs=3, callbacks=[pruning])
        pruning.check_pruned()
        assert loop.epochs_completed == 3 and not pruning.pruned
        return loop.train_history['val_loss'][-1]

    study = optuna.create_study(pruner=optuna.pruners.NopPruner())
    study.optimize(objective, n_trials=1)
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE
    assert sorted(study.trials[0].intermediate_values) == [0, 1, 2]


def test_a_nan_value_or_an_unrecorded_monitor_fails_the_fit():
    trial = optuna.create_study().ask()

    def nan_loss(prediction, target):
        return torch.nn.functional.cross_entropy(prediction, target) * math.nan

    with pytest.raises(ValueError, match='val_loss is nan in epoch 0'):
        _loop(nan_loss).fit(num_epochs=2, callbacks=[OptunaPruning(trial, 'val_loss')])
    with pytest.raises(MonitorNotRecorded, match='the first epoch recorded no val_los; did you mean val_loss'):
        _loop().fit(num_epochs=2, callbacks=[OptunaPruning(optuna.create_study().ask(), 'val_los')])
    with pytest.raises(TypeError, match='trial must be an optuna Trial'):
        OptunaPruning('trial', 'val_loss')


def test_it_is_a_registered_callback_and_importing_it_needs_no_optuna():
    assert lookup('callback', 'OptunaPruning') is OptunaPruning
    code = ('import sys; sys.modules["optuna"] = None\n'           # `import optuna` now fails
            'import aitoolbox_like.tuning, aitoolbox_like.adapters.optuna as m\n'
            'from aitoolbox_like.recipes.registry import lookup\n'
            'assert lookup("callback", "OptunaPruning") is aitoolbox_like.tuning.OptunaPruning\n'
            'try:\n'
            '    m.import_optuna()\n'
            'except ImportError as error:\n'
            '    print(error)\n')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "this needs Optuna: pip install 'aitoolbox_like[tune]'"
