"""Loop overhead: TrainLoop vs a hand-written PyTorch loop on the same model, data and steps.

First, the default path: ``TrainLoop(model, train, val, None, optimizer, criterion).fit(num_epochs=N)``, nothing
but the loaders and the model (the evaluation a user gets without asking: the validation loss after every epoch,
the epoch's training loss from its batches), against the hand-written loop that validates once per epoch (the mean
validation loss, in eval mode without gradients), with the raw loop against itself as the noise floor; the runs'
order rotates from repeat to repeat.

Then the loop's own cost, without evaluation: the variants interleaved in one process (raw loop, the raw loop again
as the noise floor, TrainLoop without callbacks, TrainLoop with 50 no-op callbacks on every per-step hook), repeated,
as median ratios of steps/s, two of them:

- whole fit: from building the loop to ``fit`` returning (registration, defaults, device moves, the
  per-epoch RNG capture and loss history, the end of fit), against the raw loop from its first line
  to its last step;
- steady state: only the epochs' steps (timed from on_epoch_begin to on_epoch_end), so the fixed
  start / end cost of a fit is left out.

``--compile`` compares ``TrainLoop(..., compile=True)`` with a hand-written loop over the same
``torch.compile``'d model (compilation is warmed up first and never timed).

Last, what a ``LossSpikeGuard`` costs per step, interleaved with the same runs (``action='skip'``, and
``action='rollback'`` with its snapshot every 100 updates), and the memory one rollback snapshot takes, against the
weights' (with the benchmark's SGD, and with Adam, whose two moments are in it too).

``--device cuda --model resnet18`` times a ResNet-18 step (3x224x224 images by default) on the GPU, the data
already on the device. CUDA runs asynchronously, so every timer waits for the device first
(``torch.cuda.synchronize``); neither loop reads a value on the host inside an epoch. ``make gpu-check`` runs it.

``--host-data`` keeps the batches in (pinned) host memory, as a loader delivers them: the hand-written loop is the
one people write, ``x.to(device)`` at the top of each step, the copy and the compute one after the other; the
TrainLoop prefetches (``prefetch_to_device=True``: the next batch is copied on a side stream while the current step
runs). ``--model tinyconv`` is a small convolution net on large images: a transfer-bound step.

Usage: python benchmarks/loop_overhead.py [--repeats N] [--tiny] [--compile [--backend B]]
                                          [--device cuda] [--model resnet18|tinyconv [--image-size S]
                                          [--batch-size B]] [--host-data]
"""
import argparse
import logging
import os
import statistics
import sys
import time

import torch
from torch import nn

# The checkout this file is in, whatever aitoolbox_like the environment has installed (a second worktree measured
# with the first one's venv would otherwise time the other code).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from aitoolbox_like import TrainLoop, TTBasicModel  # noqa: E402
from aitoolbox_like.callbacks.abstract import AbstractCallback  # noqa: E402
from aitoolbox_like.callbacks.health import LossSpikeGuard  # noqa: E402

PER_STEP_HOOKS = ('on_batch_begin', 'on_after_backward', 'on_after_gradient_update', 'on_after_optimizer_step',
                  'on_batch_end')


IN_FEATURES, HIDDEN, BATCH_SIZE = 784, 256, 64      # an MNIST-sized MLP; --tiny shrinks it
COMPILE = None      # None: eager; a dict of torch.compile kwargs with --compile
MODEL, IMAGE_SIZE = 'mlp', 224      # --model resnet18: 3 x IMAGE_SIZE x IMAGE_SIZE images, 1000 classes
DEVICE = torch.device('cpu')
DISTINCT_BATCHES = 4    # ResNet batches: this many distinct tensors, reused, so the data fits on any GPU
HOST_DATA = False       # --host-data: batches in pinned host memory, moved by the loop


class SmallMLP(TTBasicModel):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10))

    def forward(self, x):
        return self.net(x)


class BasicBlock(nn.Module):
    def __init__(self, in_channels, channels, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, channels, 1, stride, bias=False),
                                          nn.BatchNorm2d(channels))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet18(TTBasicModel):
    """torchvision's resnet18 layout (11.7M parameters), written out so the benchmark needs no torchvision."""

    def __init__(self, num_classes=1000):
        super().__init__()
        layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
        in_channels = 64
        for channels, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(in_channels, channels, stride), BasicBlock(channels, channels, 1)]
            in_channels = channels
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        return self.fc(self.features(x))


class TinyConv(TTBasicModel):
    """One strided convolution, pooled, and a linear layer: little compute for a large image (--model tinyconv)."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 5, stride=4)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def sync():
    """Wait for the device: a CUDA timer must not stop while queued work still runs."""
    if DEVICE.type == 'cuda':
        torch.cuda.synchronize(DEVICE)


class NoOp(AbstractCallback):
    def __init__(self, i):
        super().__init__(f'noop {i}')

    def on_batch_begin(self):
        pass

    def on_after_backward(self):
        pass

    def on_after_gradient_update(self, optimizer_idx):
        pass

    def on_after_optimizer_step(self):
        pass

    def on_batch_end(self):
        pass


def make_batches(num_batches):
    g = torch.Generator().manual_seed(0)
    pin = HOST_DATA and DEVICE.type == 'cuda'

    def placed(tensor):
        if HOST_DATA:
            return tensor.pin_memory() if pin else tensor
        return tensor.to(DEVICE)
    if MODEL in ('resnet18', 'tinyconv'):
        classes = 1000 if MODEL == 'resnet18' else 10
        distinct = [(placed(torch.randn(BATCH_SIZE, 3, IMAGE_SIZE, IMAGE_SIZE, generator=g)),
                     placed(torch.randint(0, classes, (BATCH_SIZE,), generator=g)))
                    for _ in range(min(num_batches, DISTINCT_BATCHES))]
        return [distinct[i % len(distinct)] for i in range(num_batches)]
    return [(placed(torch.randn(BATCH_SIZE, IN_FEATURES, generator=g)),
             placed(torch.randint(0, 10, (BATCH_SIZE,), generator=g))) for _ in range(num_batches)]


def new_model_and_optimizer():
    torch.manual_seed(0)
    model = {'resnet18': ResNet18, 'tinyconv': TinyConv, 'mlp': SmallMLP}[MODEL]().to(DEVICE)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def run_raw(batches, epochs):
    """(whole, steady): the same time twice, a hand-written loop has no fixed cost of its own."""
    model, optimizer = new_model_and_optimizer()
    sync()
    start = time.perf_counter()
    forward = torch.compile(model, **COMPILE) if COMPILE is not None else model
    criterion = nn.CrossEntropyLoss()
    model.train()
    for _ in range(epochs):
        for x, y in batches:
            if HOST_DATA:       # the loop people write: the copy at the top of the step, then the compute
                x, y = x.to(DEVICE), y.to(DEVICE)
            loss = criterion(forward(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    sync()
    elapsed = time.perf_counter() - start
    return elapsed, elapsed


def run_raw_validating(batches, val_batches, epochs):
    """The hand-written loop a user compares with: the training steps, then the validation loss once per epoch."""
    model, optimizer = new_model_and_optimizer()
    sync()
    start = time.perf_counter()
    criterion = nn.CrossEntropyLoss()
    val_losses = []
    for _ in range(epochs):
        model.train()
        for x, y in batches:
            if HOST_DATA:
                x, y = x.to(DEVICE), y.to(DEVICE)
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        with torch.no_grad():
            losses = [criterion(model(x.to(DEVICE)), y.to(DEVICE)) for x, y in val_batches]
        val_losses.append(torch.stack(losses).mean().item())
    sync()
    return time.perf_counter() - start


def run_default_trainloop(batches, val_batches, epochs, **loop_kwargs):
    """The TrainLoop with nothing but its positional arguments (and ``loop_kwargs``, for the second figures)."""
    model, optimizer = new_model_and_optimizer()
    sync()
    start = time.perf_counter()
    loop = TrainLoop(model, batches, val_batches, None, optimizer, nn.CrossEntropyLoss(), **loop_kwargs)
    loop.move_to_device(DEVICE)
    loop.fit(num_epochs=epochs)
    sync()
    return time.perf_counter() - start, loop


def default_path(batches, val_batches, epochs, repeats):
    """Ratios of the whole fit's speed per repeat: the default TrainLoop, and AIToolbox's end-of-epoch evaluation
    (eval_train_set=True), against the hand-written loop that validates once per epoch; the noise floor; and whether
    a default TrainLoop shows its progress bar here."""
    for _ in range(2):
        _, warm_up = run_raw_validating(batches, val_batches, 1), run_default_trainloop(batches, val_batches, 1)[1]
    runs = {'raw': lambda: run_raw_validating(batches, val_batches, epochs),
            'again': lambda: run_raw_validating(batches, val_batches, epochs),
            'default': lambda: run_default_trainloop(batches, val_batches, epochs)[0],
            'aitoolbox': lambda: run_default_trainloop(batches, val_batches, epochs, eval_train_set=True)[0]}
    names = list(runs)
    default, aitoolbox, floor = [], [], []
    for repeat in range(repeats):
        # The order rotates from repeat to repeat: a run's place in the sequence (what ran just before it, how long
        # the process has run) weighs on each variant alike, the raw loop's second run included.
        seconds = {name: runs[name]() for name in names[repeat % len(names):] + names[:repeat % len(names)]}
        floor.append(seconds['raw'] / seconds['again'])
        default.append(seconds['raw'] / seconds['default'])
        aitoolbox.append(seconds['raw'] / seconds['aitoolbox'])
    return default, aitoolbox, floor, warm_up.progress_bar


def run_trainloop(batches, epochs, num_callbacks, guard=None):
    """(whole, steady): building the loop + fit, and the epochs only. ``guard``: with a LossSpikeGuard of that
    action (its defaults otherwise)."""
    model, optimizer = new_model_and_optimizer()
    callbacks = [NoOp(i) for i in range(num_callbacks)]
    if guard is not None:
        callbacks.append(LossSpikeGuard(action=guard))
    times = []

    class EpochTimer(AbstractCallback):
        def __init__(self):
            super().__init__('timer', execution_order=-10**9)

        def on_epoch_begin(self):
            sync()
            self.start = time.perf_counter()

        def on_epoch_end(self):
            sync()
            times.append(time.perf_counter() - self.start)

    timer = EpochTimer()
    sync()
    start = time.perf_counter()
    options = {} if COMPILE is None else {'compile': COMPILE}
    if HOST_DATA:
        options['prefetch_to_device'] = True    # a list of batches has no workers: prefetching is asked for
    loop = TrainLoop(model, batches, None, None, optimizer, nn.CrossEntropyLoss(), end_auto_eval=False,
                     progress_bar=False, **options)
    loop.move_to_device(DEVICE)     # the loop would take a GPU whenever there is one; --device decides
    loop.fit(num_epochs=epochs, callbacks=callbacks + [timer])
    sync()
    whole = time.perf_counter() - start
    return whole, sum(times)


def guard_hooks_us(batches, number=20000, action='skip'):
    """The LossSpikeGuard's own work per update, timed alone (its three hooks on a fitted loop's state, a new update
    each time, minus the timing loop): what the guard adds to a step, without the run-to-run noise of whole fits."""
    model, optimizer = new_model_and_optimizer()
    guard = LossSpikeGuard(action=action)
    loop = TrainLoop(model, batches[:2], None, None, optimizer, nn.CrossEntropyLoss(), end_auto_eval=False,
                     progress_bar=False)
    loop.move_to_device(DEVICE)
    loop.fit(num_epochs=1, callbacks=[guard])
    loop.loss = torch.tensor(2.3, device=DEVICE, requires_grad=True) * 1.0
    loop.update_applied, loop.iteration = [True], 0
    timings = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(number):
            loop.total_iteration_idx += 1
            guard.on_after_loss()
            guard.on_after_gradient_update(0)
            guard.on_batch_end()
        hooks = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(number):
            loop.total_iteration_idx += 1
        timings.append((hooks - (time.perf_counter() - start)) / number * 1e6)
    return statistics.median(timings)


def snapshot_sizes(batches):
    """The bytes of one rollback snapshot over the bytes of the weights: with the benchmark's SGD, and with Adam."""
    ratios = []
    for optimizer_class in (torch.optim.SGD, torch.optim.Adam):
        model, _ = new_model_and_optimizer()
        guard = LossSpikeGuard(action='rollback')
        loop = TrainLoop(model, batches[:2], None, None, optimizer_class(model.parameters(), lr=0.01),
                         nn.CrossEntropyLoss(), end_auto_eval=False, progress_bar=False)
        loop.move_to_device(DEVICE)
        loop.fit(num_epochs=1, callbacks=[guard])
        weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        ratios.append((guard.snapshot_bytes, guard.snapshot_bytes / weights))
    return ratios


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--repeats', type=int, default=15)
    parser.add_argument('--batches', type=int, default=200)
    parser.add_argument('--epochs', type=int, default=2)
    parser.add_argument('--tiny', action='store_true',
                        help='worst case: a 64-128-10 MLP on batches of 32, where the step itself is tiny')
    parser.add_argument('--compile', action='store_true',
                        help='TrainLoop(compile=True) vs a hand-written loop over torch.compile(model)')
    parser.add_argument('--backend', default='inductor', help='torch.compile backend with --compile')
    parser.add_argument('--device', default='cpu', help="where both loops train: 'cpu' or 'cuda' (or 'cuda:N')")
    parser.add_argument('--model', choices=('mlp', 'resnet18', 'tinyconv'), default='mlp')
    parser.add_argument('--host-data', action='store_true',
                        help='batches in pinned host memory: the hand-written loop copies each at the top of its '
                             'step, the TrainLoop prefetches')
    parser.add_argument('--image-size', type=int, default=224, help='--model resnet18: images are 3 x S x S')
    parser.add_argument('--batch-size', type=int, default=None,
                        help='default: 64 for the MLP (32 with --tiny), 32 for ResNet-18')
    parser.add_argument('--val-batches', type=int, default=None,
                        help='validation batches of the default-path comparison (default: a quarter of --batches)')
    args = parser.parse_args()
    global IN_FEATURES, HIDDEN, BATCH_SIZE, COMPILE, MODEL, IMAGE_SIZE, DEVICE, HOST_DATA
    if args.tiny:
        IN_FEATURES, HIDDEN, BATCH_SIZE = 64, 128, 32
    if args.compile:
        COMPILE = {'backend': args.backend}
    MODEL, IMAGE_SIZE, DEVICE, HOST_DATA = args.model, args.image_size, torch.device(args.device), args.host_data
    if MODEL in ('resnet18', 'tinyconv'):
        BATCH_SIZE = 32
    if args.batch_size is not None:
        BATCH_SIZE = args.batch_size
    if DEVICE.type == 'cuda' and not torch.cuda.is_available():
        parser.error(f'--device {args.device}: CUDA is not available (torch {torch.__version__})')
    torch.set_num_threads(1)
    # The loop's per-epoch INFO lines (printed when nothing configures logging) would drown the figures.
    logging.getLogger('aitoolbox_like').setLevel(logging.WARNING)
    batches = make_batches(args.batches)
    steps = args.batches * args.epochs
    val_batches = make_batches(args.val_batches or max(args.batches // 4, 1))
    default, aitoolbox, floor, bar = default_path(batches, val_batches, args.epochs, args.repeats)
    print(f'the default path: TrainLoop(model, train, val, None, optimizer, criterion).fit(num_epochs={args.epochs}), '
          f'{len(batches)} training and {len(val_batches)} validation batches per epoch (progress bar '
          f'{"on" if bar else "off: stderr is not a terminal"}), against the hand-written loop validating once per '
          f'epoch; x its speed, whole fit (median of {args.repeats}, middle half):')
    for name, ratios in (('default TrainLoop', default), ('raw loop again (noise floor)', floor),
                         ("eval_train_set=True (AIToolbox's evaluation)", aitoolbox)):
        low, _, high = statistics.quantiles(ratios, n=4)
        print(f'  {name + ":":<48} {statistics.median(ratios):.3f}  ({low:.3f}-{high:.3f})')
    print()
    for _ in range(2):      # warm-up (and compilation with --compile)
        run_raw(batches, 1), run_trainloop(batches, 1, 0), run_trainloop(batches, 1, 50)
    whole_plain, steady_plain, whole_cbs, steady_cbs, per_callback_us, overhead_us, fixed_ms, fixed_cbs_ms = \
        ([] for _ in range(8))
    noise_floor, noise_us = [], []      # the raw loop against itself: how far apart two equal runs come out
    guard_us = {'skip': [], 'rollback': []}
    for _ in range(args.repeats):
        raw, _ = run_raw(batches, args.epochs)
        again, _ = run_raw(batches, args.epochs)
        noise_floor.append(raw / again)
        noise_us.append((again - raw) / steps * 1e6)
        plain = run_trainloop(batches, args.epochs, 0)
        with_cbs = run_trainloop(batches, args.epochs, 50)
        whole_plain.append(raw / plain[0])
        steady_plain.append(raw / plain[1])
        whole_cbs.append(raw / with_cbs[0])
        steady_cbs.append(raw / with_cbs[1])
        per_callback_us.append((with_cbs[1] - plain[1]) / (steps * 50 * len(PER_STEP_HOOKS)) * 1e6)
        overhead_us.append((plain[1] - raw) / steps * 1e6)
        fixed_ms.append((plain[0] - plain[1]) * 1e3)
        fixed_cbs_ms.append((with_cbs[0] - with_cbs[1]) * 1e3)
        for action, costs in guard_us.items():
            costs.append((run_trainloop(batches, args.epochs, 0, guard=action)[1] - plain[1]) / steps * 1e6)
    raw_step_us = run_raw(batches, args.epochs)[0] / steps * 1e6
    mode = f'torch.compile(backend={args.backend!r})' if args.compile else 'eager'
    if DEVICE.type == 'cuda':
        mode += f', on {torch.cuda.get_device_name(DEVICE)}'
    model = {'resnet18': f'ResNet-18 on 3x{IMAGE_SIZE}x{IMAGE_SIZE} images',
             'tinyconv': f'a one-convolution net on 3x{IMAGE_SIZE}x{IMAGE_SIZE} images',
             'mlp': f'MLP {IN_FEATURES}-{HIDDEN}-10'}[MODEL]
    if HOST_DATA:
        model += ', batches in host memory (the TrainLoop prefetches)'
    print(f'model: {model}, batch {BATCH_SIZE}, {steps} steps per run ({args.epochs} epochs), '
          f'{args.repeats} interleaved repeats, torch {torch.__version__}, 1 thread, {mode}; raw loop step '
          f'~{raw_step_us:.0f} us')
    print(f'TrainLoop overhead per step (steady state): {statistics.median(overhead_us):.1f} us (median; the raw '
          f'loop against itself: {statistics.median(noise_us):+.1f} us)')
    print(f'fit start + end, outside the epochs:        {statistics.median(fixed_ms):.2f} ms per fit, '
          f'{statistics.median(fixed_cbs_ms):.2f} ms with 50 callbacks (median)')
    print('x raw-loop steps/s (median)      whole fit   steady state')
    quartiles = statistics.quantiles(noise_floor, n=4)
    print(f'raw loop again (noise floor):      {statistics.median(noise_floor):.3f}       (middle half of the '
          f'repeats {quartiles[0]:.3f}-{quartiles[2]:.3f})')
    print(f'TrainLoop, no callbacks:           {statistics.median(whole_plain):.3f}       '
          f'{statistics.median(steady_plain):.3f}')
    print(f'TrainLoop, 50 no-op callbacks:     {statistics.median(whole_cbs):.3f}       '
          f'{statistics.median(steady_cbs):.3f}')
    print(f'cost of one no-op callback per hook call: {statistics.median(per_callback_us):.3f} us (median)')
    (sgd_bytes, sgd_ratio), (adam_bytes, adam_ratio) = snapshot_sizes(batches)
    print(f"LossSpikeGuard per step (steady state): {statistics.median(guard_us['skip']):+.1f} us with "
          f"action='skip', {statistics.median(guard_us['rollback']):+.1f} us with action='rollback' (a snapshot "
          f"every 100 updates) (median; the noise floor above); its hooks timed alone: "
          f"{guard_hooks_us(batches):.1f} us per update ('skip'), {guard_hooks_us(batches, action='rollback'):.1f} us "
          f"('rollback', snapshots included)")
    print(f'one rollback snapshot: {sgd_bytes / 2**20:.2f} MiB = {sgd_ratio:.2f} x the weights with SGD, '
          f'{adam_bytes / 2**20:.2f} MiB = {adam_ratio:.2f} x with Adam (two are kept)')


if __name__ == '__main__':
    main()
