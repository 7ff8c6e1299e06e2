"""Peers: the TrainLoop side by side with a hand-written PyTorch loop and the training libraries people use instead.

The same model, data (the same pre-made batches, in the same order), optimizer (SGD, lr 0.01), loss and number of
steps, trained on the CPU with one thread, interleaved in one process: each repeat runs every variant once, in a
new (seeded) random order, so no variant always runs after the same one. Each variant is configured like for like:
no logging, no checkpoints, no progress bar, no evaluation, no sanity check (docs/performance.md lists each one's
configuration); after one epoch every variant's weights are compared with the hand-written loop's, so that all are
seen to train the same (the last column of the tables). Printed per model (the MNIST-sized MLP 784-256-10 on batches of 64, and the tiny
64-128-10 on batches of 32, where the step is ~115 us and a loop's own time shows most), as the median over the
repeats of steps/s against the hand-written loop:

- whole fit: from building the library's objects (loop, trainer, engine, accelerator; Keras's model and optimizer)
  to the fit returning, against the hand-written loop from its first line to its last step;
- steady state: the epochs only, timed by each library's own epoch-begin / epoch-end callback (around the epochs'
  loop for the hand-written loops).

First of all, the default path: the TrainLoop as a user gets it, ``TrainLoop(model, train, val, None, optimizer,
criterion).fit(...)`` with nothing else (its end-of-epoch evaluation: the validation loss, the epoch's training loss
from its batches), against the hand-written loop that validates once per epoch (the mean validation loss in eval
mode, without gradients); beside it AIToolbox 1.8.0's TrainLoop with its defaults (its end-of-epoch evaluation also
runs the training set) and our TrainLoop with ``eval_train_set=True`` (the same evaluation as AIToolbox's). Whole
fits, interleaved, the hand-written loop against itself as the noise floor.

The noise floor is the hand-written loop against itself (a second copy in the same rotation, raw vs raw): a ratio
inside its spread is indistinguishable from the hand-written loop. Peers that need a ``torch.utils.data.DataLoader``
get one over the same pre-made batches (batch_size=1, an identity collate, no workers, no shuffling); the row
"hand-written loop over that DataLoader" shows what the DataLoader costs on its own. A peer that is not installed
is reported as skipped, with the command that installs it.

The original AIToolbox 1.8.0 is measured from its published wheel (pinned by sha256, ``pip download --no-deps``
into ``~/.cache/aitoolbox-like-bench-peers``, imported from the wheel, never installed); its imports need seaborn,
scikit-learn, tensorboard, boto3, google-cloud-storage and wandb (the ``bench`` extra).

Usage: python benchmarks/peers.py [--repeats N] [--models mlp,tiny] [--peers NAME,...] [--plot PATH]
                                  [--write-docs [--docs PATH] [--image PATH]]

``--write-docs`` rewrites the marked block of docs/performance.md (the tables, the date, machine, versions and
commit) and writes the plot to docs/images/loop-overhead.png. No test asserts a timing.
"""
import argparse
import contextlib
import datetime
import gc
import io
import logging
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
import warnings
from importlib import metadata
from pathlib import Path

# CPU only, whatever the machine has: Keras and the TrainLoop would otherwise take a GPU where there is one.
os.environ['CUDA_VISIBLE_DEVICES'] = ''
os.environ['KERAS_BACKEND'] = 'torch'       # read when keras is first imported

import torch  # noqa: E402
from torch import nn  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# The checkout this file is in, whatever aitoolbox_like the environment has installed.
sys.path.insert(0, str(ROOT))
from aitoolbox_like import TrainLoop, TTBasicModel  # noqa: E402
from aitoolbox_like.callbacks.abstract import AbstractCallback  # noqa: E402
from tools.cpu_torchvision import declare_torchvision_ops  # noqa: E402
from tools.published_wheel import PublishedWheel  # noqa: E402

# Off sys.path again (the packages imported stay importable through their own __path__): a longer sys.path would
# slow down every lookup of a module that is not there, which accelerate's optimizer step makes twice per step.
sys.path.remove(str(ROOT))

MODELS = {      # name: (in features, hidden, batch size, label)
    'mlp': (784, 256, 64, 'MLP 784-256-10, batch 64'),
    'tiny': (64, 128, 32, 'tiny MLP 64-128-10, batch 32'),
}
LR = 0.01
CPU = torch.device('cpu')
BEGIN = '<!-- peers:begin -->'
END = '<!-- peers:end -->'
DOCS = ROOT / 'docs' / 'performance.md'
IMAGE = ROOT / 'docs' / 'images' / 'loop-overhead.png'
INSTALL = "pip install -c .venv/torch-constraint.txt -e '.[bench]'"
AITOOLBOX_WHEEL = PublishedWheel(
    'bench-peers', 'aitoolbox', '1.8.0', 'aitoolbox-1.8.0-py3-none-any.whl',
    'da66141cfa3df85f6494736a9b45ab6aeb321503bcd4af86d847551870715b43')


class Skipped(Exception):
    """A peer that cannot run here: the message says why and how to install it."""


# ---------------------------------------------------------------------------------------------------- the model


def mlp(in_features, hidden):
    """The same initial weights for every variant: seeded just before it is built."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def make_batches(in_features, batch_size, num_batches):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(batch_size, in_features, generator=g), torch.randint(0, 10, (batch_size,), generator=g))
            for _ in range(num_batches)]


def _first(items):
    return items[0]


def batch_loader(batches):
    """A DataLoader yielding the pre-made batches as they are, in order (for peers that need a DataLoader)."""
    return torch.utils.data.DataLoader(batches, batch_size=1, shuffle=False, num_workers=0, collate_fn=_first)


class Batches:
    """The pre-made batches as a plain iterable with a length (Lightning reads a list as a list of loaders)."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


# ------------------------------------------------------------------------------------------------- the variants
# Each factory imports its library (outside any timing) and returns run(model_config, batches, epochs) ->
# (seconds of the whole fit, seconds of its epochs, the trained torch module), or raises Skipped. Every run builds
# its model and optimizer first, untimed (but Keras, whose compile makes the optimizer).


def hand_written(dataloader=False):
    """The loop people write, over the list of batches or (``dataloader``) over a DataLoader of them."""
    def run(cfg, batches, epochs):
        model = mlp(*cfg)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        start = time.perf_counter()
        data = batch_loader(batches) if dataloader else batches
        device = CPU
        model.to(device)
        criterion = nn.CrossEntropyLoss()
        model.train()
        epochs_start = time.perf_counter()
        for _ in range(epochs):
            for x, y in data:
                x, y = x.to(device), y.to(device)
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
        end = time.perf_counter()
        return end - start, end - epochs_start, model
    return run


def hand_written_dataloader():
    return hand_written(dataloader=True)


class EpochTimes:
    """Seconds of each epoch, from the library's epoch-begin hook to its epoch-end hook."""

    def __init__(self):
        self.times = []
        self.start = None

    def begin(self):
        self.start = time.perf_counter()

    def end(self):
        self.times.append(time.perf_counter() - self.start)


def aitoolbox_style(train_loop_class, model_class, callback_class, **loop_options):
    """A run of a TrainLoop with AIToolbox's API (this checkout's, or AIToolbox's own): a TTBasicModel over the MLP
    and an epoch timer as a callback of that library's kind."""
    class Model(model_class):
        def __init__(self, cfg):
            super().__init__()
            self.net = mlp(*cfg)

        def forward(self, x):
            return self.net(x)

    class Timer(callback_class):
        def __init__(self, epochs):
            super().__init__('epoch timer', execution_order=-10**9)
            self.epochs = epochs

        def on_epoch_begin(self):
            self.epochs.begin()

        def on_epoch_end(self):
            self.epochs.end()

    def run(cfg, batches, epochs):
        model = Model(cfg)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        times = EpochTimes()
        timer = Timer(times)
        start = time.perf_counter()
        loop = train_loop_class(model, batches, None, None, optimizer, nn.CrossEntropyLoss(), end_auto_eval=False,
                                **loop_options)
        loop.fit(num_epochs=epochs, callbacks=[timer])
        return time.perf_counter() - start, sum(times.times), model.net
    return run


def trainloop():
    return aitoolbox_style(TrainLoop, TTBasicModel, AbstractCallback, progress_bar=False)


_AITOOLBOX_CLASSES = []


def aitoolbox_classes():
    """AIToolbox 1.8.0's (TrainLoop, TTBasicModel, AbstractCallback), imported from its wheel once, its batch bar off."""
    if _AITOOLBOX_CLASSES:
        return _AITOOLBOX_CLASSES[0]
    try:
        wheel = AITOOLBOX_WHEEL.fetch(AITOOLBOX_WHEEL.default_cache())
    except (Exception, SystemExit) as error:
        raise Skipped(f'the aitoolbox==1.8.0 wheel could not be fetched ({error}); '
                      f'pip download --no-deps aitoolbox==1.8.0 -d {AITOOLBOX_WHEEL.default_cache()}') from None
    sys.path.append(str(wheel))     # a pure-Python wheel imports as it is (zipimport); nothing is installed
    try:
        from aitoolbox.torchtrain import train_loop as aitb_train_loop
        from aitoolbox.torchtrain.callbacks.abstract import AbstractCallback as AitbCallback
        from aitoolbox.torchtrain.model import TTBasicModel as AitbBasicModel
        from aitoolbox.torchtrain.train_loop import TrainLoop as AitbTrainLoop
    except ImportError as error:
        raise Skipped(f'AIToolbox 1.8.0 imports {error.name or error}, not installed: {INSTALL}') from None
    finally:
        sys.path.remove(str(wheel))     # imported: its modules import each other through the package's __path__
    # AIToolbox always shows a tqdm bar over the batches: disabled, as every other variant runs without one.
    module = sys.modules[AitbTrainLoop.__module__]
    tqdm = module.tqdm
    module.tqdm = lambda iterable, **kwargs: tqdm(iterable, **{**kwargs, 'disable': True})
    del aitb_train_loop
    _AITOOLBOX_CLASSES.append((AitbTrainLoop, AitbBasicModel, AitbCallback))
    return _AITOOLBOX_CLASSES[0]


def aitoolbox():
    return aitoolbox_style(*aitoolbox_classes())


def hf_accelerate():
    try:
        from accelerate import Accelerator
    except ImportError:
        raise Skipped(f'pip install accelerate (or {INSTALL})') from None

    def run(cfg, batches, epochs):
        model = mlp(*cfg)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        start = time.perf_counter()
        accelerator = Accelerator(cpu=True)
        model, optimizer, loader = accelerator.prepare(model, optimizer, batch_loader(batches))
        criterion = nn.CrossEntropyLoss()
        model.train()
        epochs_start = time.perf_counter()
        for _ in range(epochs):
            for x, y in loader:     # the prepared loader places the batches on accelerator.device
                loss = criterion(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        end = time.perf_counter()
        return end - start, end - epochs_start, model
    return run


def pytorch_accelerated():
    try:
        from pytorch_accelerated import Trainer
        from pytorch_accelerated.callbacks import MoveModulesToDeviceCallback, TrainerCallback
    except ImportError:
        raise Skipped(f'pip install pytorch-accelerated (or {INSTALL})') from None

    class Timer(TrainerCallback):
        def __init__(self, epochs):
            self.epochs = epochs

        def on_train_epoch_start(self, trainer, **kwargs):
            self.epochs.begin()

        def on_train_epoch_end(self, trainer, **kwargs):
            self.epochs.end()

    def run(cfg, batches, epochs):
        model = mlp(*cfg)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        times = EpochTimes()
        timer = Timer(times)
        start = time.perf_counter()
        # PTA's default callbacks less its printing, progress bar, metric logging and per-step NaN check.
        trainer = Trainer(model, nn.CrossEntropyLoss(), optimizer, callbacks=(MoveModulesToDeviceCallback, timer))
        trainer.train(train_dataset=batches, num_epochs=epochs, collate_fn=_first,
                      train_dataloader_kwargs={'batch_size': 1, 'shuffle': False, 'num_workers': 0})
        return time.perf_counter() - start, sum(times.times), model
    return run


def ignite():
    try:
        from ignite.engine import Events, create_supervised_trainer
    except ImportError:
        raise Skipped(f'pip install pytorch-ignite (or {INSTALL})') from None

    def run(cfg, batches, epochs):
        model = mlp(*cfg)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        times = EpochTimes()
        start = time.perf_counter()
        trainer = create_supervised_trainer(model, optimizer, nn.CrossEntropyLoss(), device=CPU)
        trainer.add_event_handler(Events.EPOCH_STARTED, lambda engine: times.begin())
        trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda engine: times.end())
        trainer.run(batches, max_epochs=epochs)
        return time.perf_counter() - start, sum(times.times), model
    return run


def lightning(barebones=False):
    try:
        import lightning.pytorch as pl
    except ImportError:
        raise Skipped(f'pip install lightning (or {INSTALL})') from None

    class Module(pl.LightningModule):
        def __init__(self, cfg):
            super().__init__()
            self.net = mlp(*cfg)
            self.criterion = nn.CrossEntropyLoss()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return self.criterion(self.net(x), y)

        def configure_optimizers(self):
            return self.optimizer

    class Timer(pl.Callback):
        def __init__(self, epochs):
            self.epochs = epochs

        def on_train_epoch_start(self, trainer, pl_module):
            self.epochs.begin()

        def on_train_epoch_end(self, trainer, pl_module):
            self.epochs.end()

    def run(cfg, batches, epochs):
        module = Module(cfg)
        module.optimizer = torch.optim.SGD(module.parameters(), lr=LR)
        times = EpochTimes()
        timer = Timer(times)
        start = time.perf_counter()
        if barebones:
            trainer = pl.Trainer(barebones=True, accelerator='cpu', devices=1, max_epochs=epochs, callbacks=[timer])
        else:
            trainer = pl.Trainer(accelerator='cpu', devices=1, max_epochs=epochs, logger=False,
                                 enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                 num_sanity_val_steps=0, callbacks=[timer])
        trainer.fit(module, train_dataloaders=Batches(batches))
        return time.perf_counter() - start, sum(times.times), module.net
    return run


def keras_torch():
    try:
        import keras
    except ImportError:
        raise Skipped(f'pip install keras (or {INSTALL})') from None
    if keras.backend.backend() != 'torch':
        raise Skipped(f'keras was imported with the {keras.backend.backend()!r} backend, not torch')

    class Model(keras.Model):
        def __init__(self, net):
            super().__init__()
            self.net = keras.layers.TorchModuleWrapper(net)

        def call(self, x):
            return self.net(x)

    class Timer(keras.callbacks.Callback):
        def __init__(self, epochs):
            super().__init__()
            self.epochs = epochs

        def on_epoch_begin(self, epoch, logs=None):
            self.epochs.begin()

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.end()

    def run(cfg, batches, epochs):
        net = mlp(*cfg)
        times = EpochTimes()
        timer = Timer(times)
        # Keras makes its optimizer in compile, and its model around the torch module: both inside the timed fit.
        start = time.perf_counter()
        model = Model(net)
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=LR),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
        model.fit(batch_loader(batches), epochs=epochs, verbose=0, shuffle=False, callbacks=[timer])
        return time.perf_counter() - start, sum(times.times), net
    return run


# key, row label, what it is fed, factory, the distribution whose version is reported (None: none of its own)
VARIANTS = [
    ('raw', 'hand-written loop (reference)', 'list', hand_written, None),
    ('raw-again', 'hand-written loop, again (noise floor)', 'list', hand_written, None),
    ('raw-dataloader', 'hand-written loop over a DataLoader', 'DataLoader', hand_written_dataloader, None),
    ('trainloop', 'aitoolbox_like TrainLoop', 'list', trainloop, 'aitoolbox_like'),
    ('aitoolbox', 'AIToolbox 1.8.0 TrainLoop', 'list', aitoolbox, 'aitoolbox'),
    ('accelerate', 'HF accelerate, hand-written loop', 'DataLoader', hf_accelerate, 'accelerate'),
    ('pta', 'pytorch-accelerated Trainer', 'DataLoader', pytorch_accelerated, 'pytorch-accelerated'),
    ('ignite', 'PyTorch Ignite', 'list', ignite, 'pytorch-ignite'),
    ('lightning', 'PyTorch Lightning', 'list', lightning, 'lightning'),
    ('lightning-barebones', 'PyTorch Lightning, barebones=True', 'list', lambda: lightning(barebones=True),
     'lightning'),
    ('keras', 'Keras 3, torch backend', 'DataLoader', keras_torch, 'keras'),
]
REFERENCE = ('raw', 'raw-again')


# ------------------------------------------------------------------------------------------------- the default path
# Each run(model_config, batches, val_batches, epochs) -> (seconds of the whole fit, the trained torch module).


def hand_written_validating():
    """The hand-written loop that validates once per epoch: the mean validation loss, eval mode, no gradients."""
    def run(cfg, batches, val_batches, epochs):
        model = mlp(*cfg)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        start = time.perf_counter()
        criterion = nn.CrossEntropyLoss()
        val_losses = []
        for _ in range(epochs):
            model.train()
            for x, y in batches:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            model.eval()
            with torch.no_grad():
                val_losses.append(torch.stack([criterion(model(x), y) for x, y in val_batches]).mean().item())
        return time.perf_counter() - start, model
    return run


def loop_with_defaults(train_loop_class, model_class, **loop_kwargs):
    """A TrainLoop built with nothing but its positional arguments (and ``loop_kwargs``) and a validation loader."""
    class Model(model_class):
        def __init__(self, cfg):
            super().__init__()
            self.net = mlp(*cfg)

        def forward(self, x):
            return self.net(x)

    def run(cfg, batches, val_batches, epochs):
        model = Model(cfg)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        start = time.perf_counter()
        loop = train_loop_class(model, batches, val_batches, None, optimizer, nn.CrossEntropyLoss(), **loop_kwargs)
        loop.fit(num_epochs=epochs)
        return time.perf_counter() - start, model.net
    return run


DEFAULT_PATH = [
    ('raw', 'hand-written loop validating once per epoch (reference)', hand_written_validating),
    ('raw-again', 'hand-written loop validating once per epoch, again (noise floor)', hand_written_validating),
    ('trainloop', "aitoolbox_like TrainLoop, its defaults", lambda: loop_with_defaults(TrainLoop, TTBasicModel)),
    ('trainloop-train-pass', "aitoolbox_like TrainLoop, eval_train_set=True (AIToolbox's evaluation)",
     lambda: loop_with_defaults(TrainLoop, TTBasicModel, eval_train_set=True)),
    ('aitoolbox', 'AIToolbox 1.8.0 TrainLoop, its defaults', lambda: loop_with_defaults(*aitoolbox_classes()[:2])),
]


def version_of(distribution):
    if distribution == 'aitoolbox_like':
        from aitoolbox_like import __version__
        return f'{__version__} (this checkout)'
    if distribution == 'aitoolbox':
        return f'{AITOOLBOX_WHEEL.version} (its published wheel)'
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return '?'


# ------------------------------------------------------------------------------------------------- measuring


def quartiles(values):
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method='inclusive')
    return q[0], q[2]


def timed_run(run, cfg, batches, epochs):
    """One run, with the collector emptied first (another variant's garbage is not collected on this one's time),
    its prints swallowed and the thread count checked."""
    gc.collect()
    with contextlib.redirect_stdout(io.StringIO()):
        whole, steady, trained = run(cfg, batches, epochs)
    if torch.get_num_threads() != 1:
        raise RuntimeError(f'a run changed torch.get_num_threads() to {torch.get_num_threads()}')
    return whole, steady, trained


def weight_differences(runners, cfg, batches):
    """{key: the largest difference of a weight from the hand-written loop's after one epoch}: all train the same."""
    def weights(key):
        trained = timed_run(runners[key], cfg, batches, 1)[2]
        return [tensor.detach().clone() for tensor in trained.state_dict().values()]
    reference = weights('raw')
    differences = {}
    for key in runners:
        got = weights(key)
        if len(got) != len(reference) or any(a.shape != b.shape for a, b in zip(got, reference)):
            raise RuntimeError(f'{key}: trained a model of another shape')
        differences[key] = max(float((a - b).abs().max()) for a, b in zip(got, reference))
    return differences


def measure(model_key, runners, args, log):
    """{key: {'whole': [ratios], 'steady': [...], 'per_step_us': [...], 'fixed_ms': [...]}} against 'raw'."""
    in_features, hidden, batch_size, _ = MODELS[model_key]
    cfg = (in_features, hidden)
    batches = make_batches(in_features, batch_size, args.batches)
    steps = args.batches * args.epochs
    keys = list(runners)
    for _ in range(args.warmup):
        for key in keys:
            timed_run(runners[key], cfg, batches, 1)
    differences = weight_differences(runners, cfg, batches)
    # Every library's objects live in this one process: frozen, so that no variant pays for the others' objects
    # in a collection (pytorch-accelerated collects at every train(); Python's own full collections scan them too).
    gc.collect()
    gc.freeze()
    results = {key: {'whole': [], 'steady': [], 'per_step_us': [], 'fixed_ms': []} for key in keys}
    raw_seconds = []
    shuffle = random.Random(0).shuffle
    for repeat in range(args.repeats):
        order = list(keys)
        shuffle(order)      # a new order each repeat: no variant always runs after the same one (caches, heap)
        times = {key: timed_run(runners[key], cfg, batches, args.epochs)[:2] for key in order}
        raw_whole, raw_steady = times['raw']
        raw_seconds.append(raw_steady)
        for key, (whole, steady) in times.items():
            result = results[key]
            result['whole'].append(raw_whole / whole)
            result['steady'].append(raw_steady / steady)
            result['per_step_us'].append((steady - raw_steady) / steps * 1e6)
            result['fixed_ms'].append((whole - steady) * 1e3)
        log(f'  {model_key}: repeat {repeat + 1}/{args.repeats}')
    summary = {}
    for key, result in results.items():
        summary[key] = {name: statistics.median(values) for name, values in result.items()}
        summary[key]['whole_q'] = quartiles(result['whole'])
        summary[key]['steady_q'] = quartiles(result['steady'])
        summary[key]['whole_range'] = (min(result['whole']), max(result['whole']))
        summary[key]['weight_difference'] = differences[key]
    step_us = statistics.median(raw_seconds) / steps * 1e6
    return summary, step_us


def measure_default_path(model_key, args, log):
    """({key: {'whole': median ratio, 'whole_q': quartiles}}, skipped) of the default path against the hand-written
    loop that validates once per epoch; the trained weights are checked equal after one epoch."""
    in_features, hidden, batch_size, label = MODELS[model_key]
    cfg = (in_features, hidden)
    batches = make_batches(in_features, batch_size, args.batches)
    val_batches = make_batches(in_features, batch_size, max(args.batches // 4, 1))[::-1]
    runners, skipped = {}, {}
    for key, name, factory in DEFAULT_PATH:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                runners[key] = factory()
        except Skipped as why:
            skipped[key] = (name, str(why))

    def timed(key, epochs):
        gc.collect()
        with contextlib.redirect_stdout(io.StringIO()):
            return runners[key](cfg, batches, val_batches, epochs)
    reference = [t.detach().clone() for t in timed('raw', 1)[1].state_dict().values()]
    differences = {key: max(float((a - b).abs().max()) for a, b in zip(
        [t.detach() for t in timed(key, 1)[1].state_dict().values()], reference)) for key in runners}
    ratios = {key: [] for key in runners}
    shuffle = random.Random(1).shuffle
    for repeat in range(args.repeats):
        order = list(runners)
        shuffle(order)
        seconds = {key: timed(key, args.epochs)[0] for key in order}
        for key in runners:
            ratios[key].append(seconds['raw'] / seconds[key])
        log(f'  {model_key}, default path: repeat {repeat + 1}/{args.repeats}')
    summary = {key: {'whole': statistics.median(values), 'whole_q': quartiles(values),
                     'weight_difference': differences[key]} for key, values in ratios.items()}
    return summary, skipped, len(val_batches)


def default_path_table(model_key, summary, skipped, num_val_batches, args):
    noise = summary['raw-again']
    lines = [f'**{MODELS[model_key][3]}, the default path**: {args.epochs} epochs of {args.batches} training and '
             f'{num_val_batches} validation batches, whole fits, median of {args.repeats} interleaved repeats. '
             f'Noise floor (the hand-written loop against itself): {noise["whole"]:.3f}, middle half '
             f'{noise["whole_q"][0]:.3f}-{noise["whole_q"][1]:.3f}.', '',
             '| x the hand-written loop validating once per epoch, whole fit | median | middle half '
             '| weights after 1 epoch, max difference |',
             '|---|---:|---:|---:|']
    for key, name, _ in DEFAULT_PATH:
        if key == 'raw':
            continue
        if key in skipped:
            lines.append(f'| {name} | skipped | | |')
        else:
            s = summary[key]
            lines.append(f'| {name} | {s["whole"]:.3f} | {s["whole_q"][0]:.3f}-{s["whole_q"][1]:.3f} '
                         f'| {s["weight_difference"]:.1g} |')
    return '\n'.join(lines)


# ------------------------------------------------------------------------------------------------- reporting


def markdown_table(model_key, summary, skipped, step_us, args):
    label = MODELS[model_key][3]
    steps = args.batches * args.epochs
    noise = summary['raw-again']
    lines = [f'**{label}**: {steps} steps per fit ({args.epochs} epochs of {args.batches} batches), hand-written '
             f'loop step ~{step_us:.0f} us, median of {args.repeats} interleaved repeats. Noise floor (the '
             f'hand-written loop against itself): {noise["whole"]:.3f}, middle half of the repeats '
             f'{noise["whole_q"][0]:.3f}-{noise["whole_q"][1]:.3f}, all {noise["whole_range"][0]:.3f}-'
             f'{noise["whole_range"][1]:.3f}.', '',
             '| x hand-written loop, steps/s | fed | whole fit | steady state | us per step over the loop '
             '| ms per fit outside the epochs | weights after 1 epoch, max difference |',
             '|---|---|---:|---:|---:|---:|---:|']
    for key, name, fed, _, _ in VARIANTS:
        if key == 'raw':
            continue
        if key in skipped:
            lines.append(f'| {name} | {fed} | skipped | | | | |')
        elif key in summary:
            s = summary[key]
            lines.append(f'| {name} | {fed} | {s["whole"]:.3f} | {s["steady"]:.3f} | {s["per_step_us"]:+.1f} '
                         f'| {s["fixed_ms"]:.1f} | {s["weight_difference"]:.1g} |')
    return '\n'.join(lines)


def plot(all_results, path, args):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    with plt.style.context('default'):     # whatever a library imported here set (seaborn's style)
        _plot(all_results, path, args, plt, Patch)


def _plot(all_results, path, args, plt, Patch):
    models = list(all_results)
    keys = [key for key, *_ in VARIANTS
            if key != 'raw' and any(key in all_results[m][0] or key in all_results[m][2] for m in models)]
    names = {key: name for key, name, *_ in VARIANTS}
    fields = (('whole', '#4c72b0', 'whole fit'), ('steady', '#dd8452', 'steady state (epochs only)'))
    fig, axes = plt.subplots(1, len(models), figsize=(6.4 * len(models), 1.6 + 0.46 * len(keys)), sharey=True,
                             squeeze=False)
    for ax, model_key in zip(axes[0], models):
        summary, step_us, skipped = all_results[model_key]
        noise = summary['raw-again']
        ax.axvspan(*noise['whole_q'], color='0.8', zorder=0)
        ax.axvline(1.0, color='0.3', linewidth=0.8, zorder=1)
        right = 1.0
        for offset, (field, color, _) in enumerate(fields):
            for y, key in enumerate(keys):
                if key not in summary:
                    continue
                value, (low, high) = summary[key][field], summary[key][field + '_q']
                y += (offset - 0.5) * 0.38
                ax.barh(y, value, height=0.36, color=color, zorder=2, alpha=0.45 if key in REFERENCE else 1)
                ax.errorbar(value, y, xerr=[[max(value - low, 0)], [max(high - value, 0)]], fmt='none',
                            elinewidth=0.8, capsize=2, ecolor='0.2', zorder=3)
                ax.text(max(value, high) + 0.012, y, f'{value:.3f}', va='center', fontsize=7, zorder=3)
                right = max(right, high, value)
        for y, key in enumerate(keys):
            if key in skipped:
                ax.text(0.02, y, 'skipped (not installed)', va='center', fontsize=8, color='0.35')
        ax.set_yticks(range(len(keys)), [names[key] for key in keys])
        for label, key in zip(ax.get_yticklabels(), keys):
            label.set_fontweight('bold' if key == 'trainloop' else 'normal')
        ax.set_xlim(0, right + 0.12)
        ax.set_title(f'{MODELS[model_key][3]}\n(hand-written loop step ~{step_us:.0f} us)', fontsize=10)
        ax.set_xlabel('steps/s x the hand-written loop (median; whiskers: middle half of the repeats)', fontsize=8)
        ax.grid(axis='x', linewidth=0.4, alpha=0.5)
    axes[0][0].invert_yaxis()       # shared: once for all panels
    handles = [Patch(color=color, label=label) for _, color, label in fields]
    handles.append(Patch(color='0.8', label='noise floor: the hand-written loop against itself, middle half'))
    fig.legend(handles=handles, loc='lower center', ncol=3, fontsize=8, frameon=False)
    fig.suptitle(f'Training-loop overhead on the CPU, 1 thread, torch {torch.__version__} '
                 f'({args.epochs} epochs x {args.batches} batches, {args.repeats} interleaved repeats)', fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path('/proc/cpuinfo').read_text().splitlines():
            if line.startswith('model name'):
                cpu = line.split(':', 1)[1].strip()
                break
    except OSError:
        pass
    return f'{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}'


def commit():
    def git(*args):
        return subprocess.run(['git', '--no-optional-locks', *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    try:
        head = git('rev-parse', '--short=10', 'HEAD')
        dirty = git('status', '--porcelain', '--untracked-files=no')
    except (OSError, subprocess.SubprocessError):
        return 'unknown commit'
    if not head:
        return 'unknown commit'
    return f'commit {head}' + (' with uncommitted changes' if dirty else '')


def docs_block(tables, skipped, versions, args, image_path, docs_path):
    today = datetime.date.today().isoformat()
    image = os.path.relpath(image_path, docs_path.parent).replace(os.sep, '/')
    lines = [BEGIN,
             '<!-- Written by `python benchmarks/peers.py --write-docs`: run it again rather than editing this block. -->',
             '',
             f'Measured {today} on {machine()}; torch {torch.__version__}, 1 thread; {commit()}. '
             f'Command: `python benchmarks/peers.py --write-docs` ({args.repeats} repeats).',
             '',
             f'![Steps/s of each loop against the hand-written loop, for the MLP and the tiny MLP]({image})',
             '']
    for table in tables:
        lines += [table, '']
    lines.append('Versions: ' + ', '.join(f'{name} {version}' for name, version in versions) + '.')
    if skipped:
        lines += ['', 'Skipped: ' + '; '.join(f'{name}: {why}' for name, why in skipped.values()) + '.']
    lines.append(END)
    return '\n'.join(lines)


def write_docs(path, block):
    text = path.read_text()
    pattern = re.compile(re.escape(BEGIN) + r'.*?' + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f'{path}: no {BEGIN} ... {END} block to rewrite')
    path.write_text(pattern.sub(lambda _: block, text, count=1))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--repeats', type=int, default=11)
    parser.add_argument('--warmup', type=int, default=1, help='untimed one-epoch runs of every variant first')
    parser.add_argument('--batches', type=int, default=200)
    parser.add_argument('--epochs', type=int, default=2)
    parser.add_argument('--models', default='mlp,tiny', help=f'comma-separated, of {", ".join(MODELS)}')
    parser.add_argument('--peers', default='all',
                        help='comma-separated variants to run besides the two hand-written references: '
                             + ', '.join(key for key, *_ in VARIANTS if key not in REFERENCE))
    parser.add_argument('--plot', type=Path, default=None, help='write the bar chart (PNG) here')
    parser.add_argument('--write-docs', action='store_true',
                        help='rewrite the marked block of --docs and write the plot to --image')
    parser.add_argument('--docs', type=Path, default=DOCS)
    parser.add_argument('--image', type=Path, default=IMAGE)
    parser.add_argument('--quiet', action='store_true', help='no progress lines on stderr')
    parser.add_argument('--default-path-only', action='store_true',
                        help='only the default path (needs none of the peers: the bench extra is not required)')
    args = parser.parse_args()
    models = [m.strip() for m in args.models.split(',') if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        parser.error(f'--models: unknown {unknown}; choose from {list(MODELS)}')
    known = [key for key, *_ in VARIANTS]
    args.peers = [key for key in known if key not in REFERENCE] if args.peers == 'all' else \
        [p.strip() for p in args.peers.split(',') if p.strip()]
    unknown = [p for p in args.peers if p not in known]
    if unknown:
        parser.error(f'--peers: unknown {unknown}; choose from {known}')
    if args.write_docs and not args.docs.exists():
        parser.error(f'--docs {args.docs}: no such file')

    def log(message):
        if not args.quiet:
            print(message, file=sys.stderr, flush=True)

    torch.set_num_threads(1)
    # Logging configured, as a program would: the libraries' INFO lines (the TrainLoop's per-epoch loss, Lightning's
    # "GPU available") are not printed; prints (AIToolbox's per-epoch loss) go to a buffer during the runs.
    logging.basicConfig(level=logging.WARNING)
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.WARNING)       # also for loggers set to INFO (pytorch_accelerated's)
    warnings.simplefilter('ignore')     # the peers' deprecation and "few workers" warnings; no effect on timings
    torchvision_ops = declare_torchvision_ops()     # lightning imports torchmetrics, which imports torchvision
    runners, skipped, versions = {}, {}, {'torch': torch.__version__}
    for key, name, _, factory, distribution in VARIANTS:
        if args.default_path_only and key not in ('trainloop', 'aitoolbox'):
            continue
        if key not in REFERENCE and key not in args.peers:
            continue
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                runners[key] = factory()
        except Skipped as why:
            skipped[key] = (name, str(why))
            continue
        if distribution is not None:
            versions[distribution] = version_of(distribution)
    versions = list(versions.items())
    torch.set_num_threads(1)
    # Loggers that their libraries set to INFO on import (Lightning's with a handler of its own): WARNING, as the rest.
    for name in ('lightning.pytorch', 'lightning.fabric', 'pytorch_accelerated'):
        logging.getLogger(name).setLevel(logging.WARNING)

    all_results, tables = {}, []
    for model_key in models:
        summary, default_skipped, num_val = measure_default_path(model_key, args, log)
        tables.append(default_path_table(model_key, summary, default_skipped, num_val, args))
    for model_key in ([] if args.default_path_only else models):
        log(f'{MODELS[model_key][3]}: {len(runners)} variants, {args.repeats} repeats')
        summary, step_us = measure(model_key, runners, args, log)
        all_results[model_key] = (summary, step_us, skipped)
        tables.append(markdown_table(model_key, summary, skipped, step_us, args))
    del torchvision_ops

    print(f'torch {torch.__version__}, 1 thread, CPU; {machine()}; {commit()}')
    print('versions: ' + ', '.join(f'{name} {version}' for name, version in versions))
    for name, why in skipped.values():
        print(f'skipped: {name}: {why}')
    for table in tables:
        print()
        print(table)
    image = args.image if args.write_docs else args.plot
    if args.default_path_only:
        if args.write_docs:
            parser.error('--write-docs needs the whole run (without --default-path-only)')
        return
    if image is not None:
        plot(all_results, image, args)
        print(f'\nplot: {image}')
    if args.write_docs:
        write_docs(args.docs, docs_block(tables, skipped, versions, args, image, args.docs))
        print(f'docs: {args.docs} (the block between {BEGIN} and {END})')


if __name__ == '__main__':
    main()
