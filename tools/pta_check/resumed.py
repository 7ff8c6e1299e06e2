"""pta-check's kill-and-resume script: PTA's stateful callbacks (early stopping, the best model, the EMA model, the
run history, PTA's cosine schedule) on shuffled data, with the loop's checkpoint every epoch and
``fit(resume_from='auto')``, as a PTA user's restartable script (tools/kill_resume.py runs it to its end, and killed
and resumed).

    python -m tools.pta_check.resumed FOLDER [KILL_AT]
"""
from pathlib import Path
from typing import Any, Dict, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader

from aitoolbox_like import TrainLoop
from aitoolbox_like.callbacks.model_save import ModelIterationCheckpoint
from aitoolbox_like.adapters.pytorch_accelerated import AcceleratedCallbacks

from .. import kill_resume
from . import runs

EPOCHS = 12
#: 53 rows in batches of 8: 7 batches an epoch, a checkpoint every 5 batches (and at every epoch's end). Killed before
#: the 4th batch of epoch 5 (the 6th): the last checkpoint was taken inside it, after its first batch, with the early
#: stopping counter at 1 of 2; epoch 5 then does not improve enough, and the run stops after it.
KILL_AT = 7 * 5 + 3


def main(folder: Path, kill_at: Optional[int]) -> Dict[str, Any]:
    import pytorch_accelerated.callbacks as cb
    from pytorch_accelerated.schedulers import CosineLrScheduler
    torch.manual_seed(0)
    model = runs.Net()
    loop = TrainLoop(model, DataLoader(runs.TRAIN, batch_size=runs.BATCH, shuffle=True),
                     DataLoader(runs.VAL, batch_size=runs.BATCH), None,
                     torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), nn.CrossEntropyLoss(),
                     progress_bar=False)
    early = cb.EarlyStoppingCallback(early_stopping_patience=2, early_stopping_threshold=0.03)
    best = cb.SaveBestModelCallback(save_path=str(folder / 'best_model.pt'))
    ema = cb.ModelEmaCallback(decay=0.8, save_path=str(folder / 'ema_model.pt'))
    scheduler = CosineLrScheduler.create_scheduler_fn(num_warmup_epochs=1, warmup_starting_lr=0.01)
    loop.fit(num_epochs=EPOCHS, resume_from='auto', callbacks=[
        AcceleratedCallbacks(create_scheduler_fn=scheduler), cb.PrintProgressCallback, cb.LogMetricsCallback(),
        ema, early, best, ModelIterationCheckpoint(5, 'pta-check', 'resume', str(folder), hyperparams={},
                                       cloud_save_mode='local'),
        *kill_resume.kill_at_batch(kill_at)])
    trainer = next(c.trainer for c in loop.callbacks if isinstance(c, AcceleratedCallbacks))
    history = trainer.run_history
    return {
        'weights': {k: v.clone() for k, v in loop.model.state_dict().items()},
        'epochs': loop.epochs_completed,
        'run_history': {name: list(history.get_metric_values(name)) for name in sorted(history.get_metric_names())},
        'early_stopping': [early.early_stopping_patience_counter, early.best_metric],
        'best_model': [best.best_metric, best.best_metric_epoch],
        'best_model.pt': torch.load(folder / 'best_model.pt', map_location='cpu', weights_only=True),
        'ema_model.pt': torch.load(folder / 'ema_model.pt', map_location='cpu', weights_only=True),
        'lr': loop.optimizer.param_groups[0]['lr'],
    }


if __name__ == '__main__':
    kill_resume.script_main(main)
