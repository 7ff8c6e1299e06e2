"""sg-check's kill-and-resume script: a SuperGradients setup with state in its callbacks (SG's own EarlyStop and
LRSchedulerCallback over a torch StepLR, from the wheel; a user's SG callback saving into ``context.ckpt_dir`` at the
best epoch; SG's metrics), on shuffled data, with the loop's checkpoint every epoch and ``fit(resume_from='auto')``.
tools/kill_resume.py runs it to its end, and killed and resumed.

    python -m tools.sg_check.resumed FOLDER [KILL_AT]

``SG_CHECK_RESUME_VIA`` chooses how the SG setup is built: ``trainer`` (default): as SG's trainer builds it, SG's own
classes (tools/sg_check/trainer.py), the rewritten modules importable as ``sg_callbacks``; ``params``: the adapter's
TrainingParamsCallback from the same training params, as a user moving an SG setup over writes it.
"""
import importlib
import os
import types
from pathlib import Path
from typing import Any, Dict, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TrainLoop, TTBasicModel
from aitoolbox_like.adapters import supergradients as adapter
from aitoolbox_like.callbacks.model_save import ModelCheckpoint

from .. import kill_resume

EPOCHS = 10
BATCH = 8
#: 60 rows in batches of 8: 8 batches an epoch; killed before the 4th batch of epoch 5, the last checkpoint that of
#: epoch 4's end.
KILL_AT = 8 * 5 + 3


class Net(TTBasicModel):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def dataset(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = ((x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()).clamp(max=2)
    return TensorDataset(x, y)


class Accuracy:
    """A metric as SG's metrics lists hold them (update, compute, reset; named by its class)."""

    def __init__(self) -> None:
        self.correct = torch.tensor(0)
        self.total = torch.tensor(0)

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        self.correct = self.correct + (preds.argmax(-1) == target).sum()
        self.total = self.total + target.numel()

    def compute(self) -> torch.Tensor:
        return self.correct.float() / self.total

    def reset(self) -> None:
        self.correct, self.total = torch.tensor(0), torch.tensor(0)


class SaveMyBest(adapter.Callback):
    """A user's SG callback: the best epoch's weights into the run's checkpoint folder, as SG code writes them."""

    def __init__(self) -> None:
        self.saved = 0

    def on_validation_end_best_epoch(self, context: Any) -> None:
        self.saved += 1
        torch.save({'net': context.net.state_dict(), 'epoch': context.epoch},
                   os.path.join(context.ckpt_dir, 'my_best.pth'))


def training_params(sg: Any, early: Any, best: Any) -> Dict[str, Any]:
    return dict(max_epochs=EPOCHS, initial_lr=0.1, lr_warmup_epochs=1, warmup_mode='LinearEpochLRWarmup',
                lr_mode={'StepLR': {'step_size': 3, 'gamma': 0.5, 'phase': adapter.Phase.TRAIN_EPOCH_END}},
                train_metrics_list=[Accuracy()], valid_metrics_list=[Accuracy()], metric_to_watch='Accuracy',
                greater_metric_to_watch_is_better=True, phase_callbacks=[early, best],
                optimizer_params={'momentum': 0.9})


def main(folder: Path, kill_at: Optional[int]) -> Dict[str, Any]:
    via = os.environ.get('SG_CHECK_RESUME_VIA', 'trainer')
    sg = types.SimpleNamespace(callbacks=importlib.import_module('sg_callbacks.callbacks'),
                               early_stopping=importlib.import_module('sg_callbacks.early_stopping'))
    torch.manual_seed(0)
    model = Net()
    train_loader = DataLoader(dataset(60, 0), batch_size=BATCH, shuffle=True)
    valid_loader = DataLoader(dataset(30, 1), batch_size=BATCH)
    early = sg.early_stopping.EarlyStop(adapter.Phase.VALIDATION_EPOCH_END, monitor='Accuracy', mode='max',
                                        patience=2, min_delta=0.02)
    best = SaveMyBest()
    params = training_params(sg, early, best)
    checkpoint = ModelCheckpoint('sg-check', 'resume', str(folder), hyperparams={}, cloud_save_mode='local')
    if via == 'params':
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        callbacks = [adapter.TrainingParamsCallback(params)]
    else:
        from .trainer import Trainer, sg_default_training_params
        from .wheel import default_cache, fetch_wheel, read_sources
        trainer = Trainer(sg, adapter, sg_default_training_params(read_sources(fetch_wheel(default_cache()))))
        built = trainer.build(params, model, train_loader)
        optimizer, callbacks = built['optimizer'], built['callbacks']
    loop = TrainLoop(model, train_loader, valid_loader, None, optimizer, nn.CrossEntropyLoss(), progress_bar=False)
    loop.fit(num_epochs=EPOCHS, resume_from='auto',
             callbacks=[*callbacks, checkpoint, *kill_resume.kill_at_batch(kill_at)])
    scheduler = next(cb.scheduler for cb in loop.callbacks if type(cb).__name__ == 'LRSchedulerCallback')
    my_best = torch.load(os.path.join(loop.experiment.dir_path, 'checkpoint_model', 'my_best.pth'),
                         weights_only=True)
    return {
        'weights': {k: v.clone() for k, v in loop.model.state_dict().items()},
        'epochs': loop.epochs_completed,
        'history': {name: list(values) for name, values in loop.train_history.items()},
        'early_stop': [early.wait_count, float(early.best_score)],
        'lr': [group['lr'] for group in loop.optimizer.param_groups],
        'scheduler': {k: v for k, v in scheduler.state_dict().items() if k != 'verbose'},
        'my_best.pth': my_best,
        'best_checkpoint': [entry[:2] for entry in checkpoint.scored],
    }


if __name__ == '__main__':
    kill_resume.script_main(main)
