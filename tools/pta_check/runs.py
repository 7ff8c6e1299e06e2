"""The same training run two ways: on PTA's own Trainer and on the TrainLoop with the same PTA callbacks. Same model
(one class: PTA calls it as a module, the TrainLoop through get_loss), same initial weights, same data in the same
order, same optimizer; each run in a folder of its own as its working directory, so the callbacks' default file
names land side by side. A run reports the lines its callbacks printed, the files they wrote, the final weights,
and how the process would have ended (``SystemExit``)."""
import contextlib
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TrainLoop, TTBasicModel
from aitoolbox_like.adapters.pytorch_accelerated import AcceleratedCallbacks

#: Values that differ between two runs by nature (the time a checkpoint was written).
VOLATILE_KEYS = {'timestamp'}
#: Files whose content differs between two runs by nature: accelerate's RNG snapshot (the two trainers draw random
#: numbers differently outside training, e.g. a sampler's seed): they must exist, their bytes are not compared.
VOLATILE_FILES = ('random_states_0.pkl',)


class Net(TTBasicModel):
    def __init__(self, batch_norm: bool = False, nan: bool = False) -> None:
        super().__init__()
        layers: List[nn.Module] = [nn.Linear(6, 16)]
        layers += [nn.BatchNorm1d(16)] if batch_norm else []
        self.net = nn.Sequential(*layers, nn.ReLU(), nn.Linear(16, 3))
        self.nan = nan

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        return out * float('nan') if self.nan else out


def dataset(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = ((x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()).clamp(max=2)
    return TensorDataset(x, y)


TRAIN, VAL = dataset(53, 0), dataset(29, 1)
BATCH = 8


@dataclass
class Run:
    lines: List[str] = field(default_factory=list)
    files: Dict[str, Any] = field(default_factory=dict)
    weights: Dict[str, torch.Tensor] = field(default_factory=dict)
    exit: Optional[str] = None
    trainer: Any = None


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


@contextlib.contextmanager
def _in(folder: Path, env: Optional[Dict[str, str]]):
    folder.mkdir(parents=True, exist_ok=True)
    before, saved = os.getcwd(), {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _finish(run: Run, folder: Path, printed: io.StringIO, model: nn.Module) -> Run:
    run.lines = [line for line in printed.getvalue().splitlines() if line.strip()]
    run.files = read_files(folder)
    run.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return run


def on_ptas_trainer(folder: Path, callbacks: Sequence[Any], num_epochs: int, model_kwargs: Optional[dict] = None,
                    create_scheduler_fn: Optional[Callable[..., Any]] = None, accumulation: int = 1,
                    env: Optional[Dict[str, str]] = None, trainer_class: Any = None, shuffle: bool = False) -> Run:
    from pytorch_accelerated import Trainer
    torch.manual_seed(0)
    model = Net(**(model_kwargs or {}))
    run, printed = Run(), io.StringIO()
    with _in(folder, env), contextlib.redirect_stdout(printed):
        trainer = (trainer_class or Trainer)(model, nn.CrossEntropyLoss(), _optimizer(model), callbacks=callbacks)
        run.trainer = trainer
        try:
            trainer.train(train_dataset=TRAIN, eval_dataset=VAL, num_epochs=num_epochs, per_device_batch_size=BATCH,
                          train_dataloader_kwargs={'shuffle': shuffle, 'num_workers': 0},
                          eval_dataloader_kwargs={'num_workers': 0}, create_scheduler_fn=create_scheduler_fn,
                          gradient_accumulation_steps=accumulation)
        except SystemExit as stop:
            run.exit = str(stop.code)
    return _finish(run, folder, printed, model)


def on_the_loop(folder: Path, callbacks: Sequence[Any], num_epochs: int, model_kwargs: Optional[dict] = None,
                create_scheduler_fn: Optional[Callable[..., Any]] = None, accumulation: int = 1,
                env: Optional[Dict[str, str]] = None, extra: Sequence[Any] = (), shuffle: bool = False,
                model_class: Any = None) -> Run:
    torch.manual_seed(0)
    model = (model_class or Net)(**(model_kwargs or {}))
    run, printed = Run(), io.StringIO()
    loop = TrainLoop(model, DataLoader(TRAIN, batch_size=BATCH, shuffle=shuffle), DataLoader(VAL, batch_size=BATCH), None,
                     _optimizer(model), nn.CrossEntropyLoss(), progress_bar=False)
    with _in(folder, env), contextlib.redirect_stdout(printed):
        given = list(callbacks) + list(extra)
        if create_scheduler_fn is not None:
            given.insert(0, AcceleratedCallbacks(create_scheduler_fn=create_scheduler_fn))
        try:
            loop.fit(num_epochs=num_epochs, callbacks=given, grad_accumulation=accumulation)
        except SystemExit as stop:
            run.exit = str(stop.code)
    run.trainer = next((cb.trainer for cb in loop.callbacks if isinstance(cb, AcceleratedCallbacks)), None)
    return _finish(run, folder, printed, model)


def read_files(folder: Path) -> Dict[str, Any]:
    """relative path -> content: tensors' files loaded, the volatile ones as a mark that they exist."""
    files: Dict[str, Any] = {}
    for path in sorted(folder.rglob('*')):
        if not path.is_file():
            continue
        name = str(path.relative_to(folder))
        if path.name in VOLATILE_FILES:
            files[name] = 'present'
        elif path.suffix == '.safetensors':
            from safetensors.torch import load_file
            files[name] = load_file(str(path))
        elif path.suffix in ('.pt', '.bin'):
            files[name] = _without_volatile(torch.load(path, map_location='cpu', weights_only=False))
        else:
            files[name] = path.read_bytes()
    return files


def _without_volatile(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_volatile(v) for k, v in value.items() if k not in VOLATILE_KEYS}
    return value


def same(a: Any, b: Any) -> bool:
    """Equal to the bit: tensors by value, containers element by element."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype \
            and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def first_difference(ours: Run, theirs: Run) -> Optional[str]:
    """None when the two runs printed the same lines, wrote the same files with the same contents, ended the same
    way and trained the same weights; else what differs first."""
    for index, (a, b) in enumerate(zip(ours.lines + [None], theirs.lines + [None])):
        if a != b:
            return f'printed line {index + 1}: TrainLoop {a!r}, PTA Trainer {b!r}'
    if ours.files.keys() != theirs.files.keys():
        return f'files: TrainLoop {sorted(ours.files)}, PTA Trainer {sorted(theirs.files)}'
    for name in ours.files:
        if not same(ours.files[name], theirs.files[name]):
            return f'the content of {name}'
    if ours.exit != theirs.exit:
        return f'how the run ended: TrainLoop {ours.exit!r}, PTA Trainer {theirs.exit!r}'
    if not same(ours.weights, theirs.weights):
        return 'the final weights'
    return None
