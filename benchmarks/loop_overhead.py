"""Loop overhead: TrainLoop vs a hand-written PyTorch loop on the same model, data and steps.

Runs the variants interleaved in one process (raw loop, TrainLoop without callbacks, TrainLoop with 50
no-op callbacks on every per-step hook), repeats, and prints median ratios of steps/s, two of them:

- whole fit: from building the loop to ``fit`` returning (registration, defaults, device moves, the
  per-epoch RNG capture and loss history, the end of fit), against the raw loop from its first line
  to its last step;
- steady state: only the epochs' steps (timed from on_epoch_begin to on_epoch_end), so the fixed
  start / end cost of a fit is left out.

``--compile`` compares ``TrainLoop(..., compile=True)`` with a hand-written loop over the same
``torch.compile``'d model (compilation is warmed up first and never timed).

Usage: python benchmarks/loop_overhead.py [--repeats N] [--tiny] [--compile [--backend B]]
"""
import argparse
import statistics
import time

import torch
from torch import nn

from aitoolbox_like import TrainLoop, TTBasicModel
from aitoolbox_like.callbacks.abstract import AbstractCallback

PER_STEP_HOOKS = ('on_batch_begin', 'on_after_backward', 'on_after_gradient_update', 'on_after_optimizer_step',
                  'on_batch_end')


IN_FEATURES, HIDDEN, BATCH_SIZE = 784, 256, 64      # an MNIST-sized MLP; --tiny shrinks it
COMPILE = None      # None: eager; a dict of torch.compile kwargs with --compile


class SmallMLP(TTBasicModel):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10))

    def forward(self, x):
        return self.net(x)


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
    return [(torch.randn(BATCH_SIZE, IN_FEATURES, generator=g), torch.randint(0, 10, (BATCH_SIZE,), generator=g))
            for _ in range(num_batches)]


def new_model_and_optimizer():
    torch.manual_seed(0)
    model = SmallMLP()
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def run_raw(batches, epochs):
    """(whole, steady): the same time twice, a hand-written loop has no fixed cost of its own."""
    model, optimizer = new_model_and_optimizer()
    start = time.perf_counter()
    forward = torch.compile(model, **COMPILE) if COMPILE is not None else model
    criterion = nn.CrossEntropyLoss()
    model.train()
    for _ in range(epochs):
        for x, y in batches:
            loss = criterion(forward(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    elapsed = time.perf_counter() - start
    return elapsed, elapsed


def run_trainloop(batches, epochs, num_callbacks):
    """(whole, steady): building the loop + fit, and the epochs only."""
    model, optimizer = new_model_and_optimizer()
    callbacks = [NoOp(i) for i in range(num_callbacks)]
    times = []

    class EpochTimer(AbstractCallback):
        def __init__(self):
            super().__init__('timer', execution_order=-10**9)

        def on_epoch_begin(self):
            self.start = time.perf_counter()

        def on_epoch_end(self):
            times.append(time.perf_counter() - self.start)

    timer = EpochTimer()
    start = time.perf_counter()
    options = {} if COMPILE is None else {'compile': COMPILE}
    loop = TrainLoop(model, batches, None, None, optimizer, nn.CrossEntropyLoss(), end_auto_eval=False,
                     progress_bar=False, **options)
    loop.fit(num_epochs=epochs, callbacks=callbacks + [timer])
    whole = time.perf_counter() - start
    return whole, sum(times)


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
    args = parser.parse_args()
    global IN_FEATURES, HIDDEN, BATCH_SIZE, COMPILE
    if args.tiny:
        IN_FEATURES, HIDDEN, BATCH_SIZE = 64, 128, 32
    if args.compile:
        COMPILE = {'backend': args.backend}
    torch.set_num_threads(1)
    batches = make_batches(args.batches)
    steps = args.batches * args.epochs
    for _ in range(2):      # warm-up (and compilation with --compile)
        run_raw(batches, 1), run_trainloop(batches, 1, 0), run_trainloop(batches, 1, 50)
    whole_plain, steady_plain, whole_cbs, steady_cbs, per_callback_us, overhead_us, fixed_ms, fixed_cbs_ms = \
        ([] for _ in range(8))
    for _ in range(args.repeats):
        raw, _ = run_raw(batches, args.epochs)
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
    raw_step_us = run_raw(batches, args.epochs)[0] / steps * 1e6
    mode = f'torch.compile(backend={args.backend!r})' if args.compile else 'eager'
    print(f'model: MLP {IN_FEATURES}-{HIDDEN}-10, batch {BATCH_SIZE}, {steps} steps per run ({args.epochs} epochs), '
          f'{args.repeats} interleaved repeats, torch {torch.__version__}, 1 thread, {mode}; raw loop step '
          f'~{raw_step_us:.0f} us')
    print(f'TrainLoop overhead per step (steady state): {statistics.median(overhead_us):.1f} us (median)')
    print(f'fit start + end, outside the epochs:        {statistics.median(fixed_ms):.2f} ms per fit, '
          f'{statistics.median(fixed_cbs_ms):.2f} ms with 50 callbacks (median)')
    print('x raw-loop steps/s (median)      whole fit   steady state')
    print(f'TrainLoop, no callbacks:           {statistics.median(whole_plain):.3f}       '
          f'{statistics.median(steady_plain):.3f}')
    print(f'TrainLoop, 50 no-op callbacks:     {statistics.median(whole_cbs):.3f}       '
          f'{statistics.median(steady_cbs):.3f}')
    print(f'cost of one no-op callback per hook call: {statistics.median(per_callback_us):.3f} us (median)')


if __name__ == '__main__':
    main()
