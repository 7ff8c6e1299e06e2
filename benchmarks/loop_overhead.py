"""Loop overhead: TrainLoop vs a hand-written PyTorch loop on the same model, data and steps.

Runs the three variants interleaved in one process (raw loop, TrainLoop without callbacks, TrainLoop
with 50 no-op callbacks on every per-step hook), repeats, and prints the median ratio of steps/s and
the cost of one no-op callback per hook call. Usage: python benchmarks/loop_overhead.py [--repeats N]
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


def run_raw(batches, epochs):
    torch.manual_seed(0)
    model = SmallMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.CrossEntropyLoss()
    model.train()
    start = time.perf_counter()
    for _ in range(epochs):
        for x, y in batches:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return time.perf_counter() - start


def run_trainloop(batches, epochs, num_callbacks):
    torch.manual_seed(0)
    model = SmallMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loop = TrainLoop(model, batches, None, None, optimizer, nn.CrossEntropyLoss(), end_auto_eval=False,
                     progress_bar=False)
    callbacks = [NoOp(i) for i in range(num_callbacks)]
    loop.callbacks_handler.register_callbacks(callbacks)
    # Time only the epochs: registration and the once-per-epoch history reduction are not per-step costs.
    times = []

    class EpochTimer(AbstractCallback):
        def __init__(self):
            super().__init__('timer', execution_order=-10**9)

        def on_epoch_begin(self):
            self.start = time.perf_counter()

        def on_epoch_end(self):
            times.append(time.perf_counter() - self.start)

    loop.fit(num_epochs=epochs, callbacks=[EpochTimer()])
    return sum(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--repeats', type=int, default=15)
    parser.add_argument('--batches', type=int, default=200)
    parser.add_argument('--epochs', type=int, default=2)
    parser.add_argument('--tiny', action='store_true',
                        help='worst case: a 64-128-10 MLP on batches of 32, where the step itself is tiny')
    args = parser.parse_args()
    global IN_FEATURES, HIDDEN, BATCH_SIZE
    if args.tiny:
        IN_FEATURES, HIDDEN, BATCH_SIZE = 64, 128, 32
    torch.set_num_threads(1)
    batches = make_batches(args.batches)
    steps = args.batches * args.epochs
    run_raw(batches, 1), run_trainloop(batches, 1, 0)          # warm-up
    ratios_plain, ratios_cbs, per_callback_us, overhead_us = [], [], [], []
    for _ in range(args.repeats):
        raw = run_raw(batches, args.epochs)
        plain = run_trainloop(batches, args.epochs, 0)
        with_cbs = run_trainloop(batches, args.epochs, 50)
        ratios_plain.append(raw / plain)
        ratios_cbs.append(raw / with_cbs)
        per_callback_us.append((with_cbs - plain) / (steps * 50 * len(PER_STEP_HOOKS)) * 1e6)
        overhead_us.append((plain - raw) / steps * 1e6)
    raw_step_us = run_raw(batches, args.epochs) / steps * 1e6
    print(f'model: MLP {IN_FEATURES}-{HIDDEN}-10, batch {BATCH_SIZE}, {steps} steps per run, {args.repeats} '
          f'interleaved repeats, torch {torch.__version__}, 1 thread; raw loop step ~{raw_step_us:.0f} us')
    print(f'TrainLoop overhead per step: {statistics.median(overhead_us):.1f} us (median)')
    print(f'TrainLoop, no callbacks:     {statistics.median(ratios_plain):.3f} x raw-loop steps/s (median)')
    print(f'TrainLoop, 50 no-op callbacks: {statistics.median(ratios_cbs):.3f} x raw-loop steps/s (median)')
    print(f'cost of one no-op callback per hook call: {statistics.median(per_callback_us):.3f} us (median)')


if __name__ == '__main__':
    main()
