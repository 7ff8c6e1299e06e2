"""orca-check's kill-and-resume script: an Orca setup with state in its callbacks and on its runner (Orca's own
MainCallback, from the wheel, with a StepLR scheduler on the runner; a user's Orca early stop keeping its best value
and patience in attributes and a count on the runner; an Orca 2.2-style callback counting batches; Orca's Accuracy),
on Orca's shuffling sampler, with the loop's checkpoint every epoch and ``fit(resume_from='auto')``.
tools/kill_resume.py runs it to its end, and killed and resumed; the rewritten modules importable as
``orca_callbacks``.

    python -m tools.orca_check.resumed FOLDER [KILL_AT]
"""
import importlib
from pathlib import Path
from typing import Any, Dict, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from aitoolbox_like import TrainLoop
from aitoolbox_like.adapters import orca
from aitoolbox_like.callbacks.model_save import ModelCheckpoint

from .. import kill_resume

EPOCHS = 12
#: 64 rows in batches of 8: 8 batches an epoch; killed before the 5th batch of epoch 6, the last checkpoint that of
#: epoch 5's end, where the early stop waits 1 of 2 epochs: epoch 6 does not improve enough, and the run stops.
KILL_AT = 8 * 6 + 4


class EarlyStop(orca.Callback):
    """An Orca user's early stopping: patience in attributes, the stop through the runner."""

    def __init__(self, patience: int, min_delta: float) -> None:
        self.patience, self.min_delta = patience, min_delta
        self.best = float('inf')
        self.wait = 0

    def after_train_epoch(self, runner: Any) -> None:
        loss = runner.epoch_stats['val_loss']
        if loss < self.best - self.min_delta:
            self.best, self.wait = loss, 0
        else:
            self.wait += 1
            if self.wait >= self.patience:
                runner.stop = True
        try:
            runner.update('validated', runner.get('validated') + 1)
        except RuntimeError:        # nothing stored yet: Orca's runner.get raises
            runner.put('validated', 1)


class CountBatches(orca.Callback):
    """An Orca 2.2-style (Keras) callback."""

    def __init__(self) -> None:
        self.batches = 0
        self.losses = []

    def on_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.batches += 1
        self.losses.append(logs['train_loss'])


def data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, ((x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()).clamp(max=2))


def main(folder: Path, kill_at: Optional[int]) -> Dict[str, Any]:
    main_callback = importlib.import_module('orca_callbacks.maincallback').MainCallback()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    train = data(64, 0)
    loop = TrainLoop(model, DataLoader(train, batch_size=8, sampler=DistributedSampler(train, 1, 0, shuffle=True)),
                     DataLoader(data(24, 1), batch_size=8), None, torch.optim.SGD(model.parameters(), lr=0.1),
                     nn.CrossEntropyLoss(), progress_bar=False, eval_loss_weighting='sample')
    runner = orca.runner_for(loop)
    runner.scheduler = torch.optim.lr_scheduler.StepLR(loop.optimizer, step_size=2, gamma=0.7)
    runner.metrics = [orca.Accuracy()]
    early, counter = EarlyStop(patience=2, min_delta=0.03), CountBatches()

    class SamplerEpoch(orca.Callback):
        def before_train_epoch(self, runner: Any) -> None:
            runner.train_loader.sampler.set_epoch(runner.epochs)

    stats = []

    class Stats(orca.Callback):
        def after_train_epoch(self, runner: Any) -> None:
            stats.append(dict(runner.epoch_stats))

    loop.fit(num_epochs=EPOCHS, resume_from='auto', callbacks=[
        main_callback, SamplerEpoch(), early, counter, Stats(),
        ModelCheckpoint('orca-check', 'resume', str(folder), hyperparams={}, cloud_save_mode='local'),
        *kill_resume.kill_at_batch(kill_at)])
    return {
        'weights': {k: v.clone() for k, v in loop.model.state_dict().items()},
        'epochs': loop.epochs_completed,
        'last_epoch_stats': stats[-1],
        'history': {name: list(values) for name, values in loop.train_history.items()},
        'early_stop': [early.best, early.wait],
        'batches': counter.batches, 'batch_losses': counter.losses,
        'validated': runner.get('validated'),
        'lr': loop.optimizer.param_groups[0]['lr'],
        'scheduler': runner.scheduler.state_dict(),
    }


if __name__ == '__main__':
    kill_resume.script_main(main)
