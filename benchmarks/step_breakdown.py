"""Where the TrainLoop's microseconds per step go: each piece of the step's own Python, timed alone.

``loop_overhead.py`` measures the whole difference between the TrainLoop and a hand-written loop; this script
splits it. A fit of the benchmark's tiny model sets the loop up as a real fit does (the feed, the precision
policy, the dispatch lists, no callbacks), then each piece of the step that a hand-written loop does not have is
timed on its own, on the loop's own objects, many thousand times, against the line a hand-written loop runs in
its place:

- the batch: the ``_batches`` generator and the three loop attributes it fills, against ``for batch in batches``;
- the loop's bookkeeping around the step: the iteration counter, the update flags reset, the two per-step hook
  dispatches (a call that does nothing for a hook no callback uses), the step's method
  call, the end-of-epoch test;
- the update decision (``_is_update_step``);
- the DDP and autocast contexts (no-ops here);
- ``TTBasicModel.get_loss`` around the forward pass (the batch unpacked, the device checks), against
  ``criterion(model(x), y)``, with an identity model so the forward's own time is nearly nothing;
- the loss kept for the epoch's mean (``loss.detach()`` appended);
- ``backward`` around ``loss.backward()``;
- the optimizer update around ``optimizer.step(); optimizer.zero_grad()``.

The sum is set beside the overhead a whole step shows (``_train_step`` over a list of batches against the raw
step on the same batches). A benchmark of the loop's internals: it calls private methods, no library code does.

Usage: python benchmarks/step_breakdown.py [--repeats N] [--number N]
"""
import argparse
import logging
import os
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from aitoolbox_like import TrainLoop, TTBasicModel  # noqa: E402
from aitoolbox_like.engine import train_loop as engine  # noqa: E402


class TinyMLP(TTBasicModel):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x):
        return self.net(x)


class Identity(TTBasicModel):
    def forward(self, x):
        return x


def _empty():
    pass


def per_call_us(fn, number, repeats, instead=_empty):
    """Median over ``repeats`` of the microseconds one call of ``fn`` takes beyond one call of ``instead`` (by
    default the bare call): the two are timed one after the other in each repeat, in alternating order, so that the
    machine's drift falls on both."""
    def timed(f):
        start = time.perf_counter()
        for _ in range(number):
            f()
        return time.perf_counter() - start
    samples = []
    for i in range(repeats):
        if i % 2:
            reference = timed(instead)
            samples.append((timed(fn) - reference) / number * 1e6)
        else:
            measured = timed(fn)
            samples.append((measured - timed(instead)) / number * 1e6)
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--repeats', type=int, default=9)
    parser.add_argument('--number', type=int, default=20000, help='calls per timing')
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)      # the fit that sets the loop up logs its epoch at INFO
    number, repeats = args.number, args.repeats

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(200)]
    torch.manual_seed(0)
    model = TinyMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.CrossEntropyLoss()
    loop = TrainLoop(model, batches, None, None, optimizer, criterion, end_auto_eval=False, progress_bar=False)
    loop.fit(num_epochs=1)          # the loop as a fit leaves it: feed, precision policy, dispatch lists
    loop.loss_batch_accum = []
    loop.iteration, loop._is_last_batch = 0, False
    device = loop.device
    dispatch = loop.callbacks_handler.dispatch
    x, y = batches[0]
    rows = []

    # The batch: the generator (one epoch's worth, per batch) and its three attributes, against a plain for.
    def loop_batches():
        for loop.iteration, loop.batch, loop._is_last_batch in loop._batches():
            pass

    def plain_batches():
        for _batch in batches:
            pass
    per_epoch = max(1, number // len(batches) // 10)
    rows.append(('batch taken: _batches generator and loop.iteration/batch/_is_last_batch',
                 per_call_us(loop_batches, per_epoch, repeats, plain_batches) / len(batches)))

    def bookkeeping():
        loop.total_iteration_idx += 1
        loop.update_applied = ()
        dispatch.on_batch_begin()
        engine_step(batches[0])
        dispatch.on_batch_end()
        if loop._is_last_batch:
            pass

    def engine_step(batch):
        pass
    rows.append(('bookkeeping: iteration counter, update reset, 2 hook dispatches, the step call, last-batch test',
                 per_call_us(bookkeeping, number, repeats)))
    rows.append(('update decision: _is_update_step()', per_call_us(loop._is_update_step, number, repeats)))

    amp = loop._amp

    def contexts():
        with engine._NOTHING if loop.ddp_model is None else None:
            with amp.autocast():
                pass
    rows.append(('DDP and autocast contexts (no-ops)', per_call_us(contexts, number, repeats)))

    ident = Identity()

    def ident_criterion(predicted, target):
        return predicted

    def feed_get_loss():
        ident.get_loss((x, y), ident_criterion, device)

    def raw_forward():
        ident_criterion(ident(x), y)
    rows.append(('TTBasicModel.get_loss around the forward: unpack, device checks',
                 per_call_us(feed_get_loss, number, repeats, raw_forward)))

    w = torch.zeros(4, requires_grad=True)
    loss = (w * 2).sum()
    accum = loop.loss_batch_accum

    def keep_loss():
        loop.loss = loss
        loop.callbacks_handler.dispatch.on_after_loss()
        kept = loop.loss
        accum.append(kept.detach() if isinstance(kept, torch.Tensor) else kept)
        if len(accum) > 1000:
            accum.clear()
    rows.append(('loss kept: loop.loss, on_after_loss dispatch, detach and append',
                 per_call_us(keep_loss, number, repeats)))

    def loop_backward():
        loop.backward((w * 2).sum())

    def raw_backward():
        (w * 2).sum().backward()
    rows.append(('backward() around loss.backward(): accumulation and scaler checks, hook dispatch',
                 per_call_us(loop_backward, number // 4, repeats * 3, raw_backward)))

    def loop_update():
        loop._update_optimizers()

    def raw_update():
        optimizer.step()
        optimizer.zero_grad()
    rows.append(('optimizer update around step() and zero_grad(): applied flags, skip decision, hook dispatches',
                 per_call_us(loop_update, number // 4, repeats * 3, raw_update)))

    # The whole step against the raw step on the same batches and model.
    def loop_steps():
        for loop.iteration, loop.batch, loop._is_last_batch in loop._batches():
            loop.total_iteration_idx += 1
            loop._train_step(loop.batch)
        loop.loss_batch_accum.clear()

    def raw_steps():
        for bx, by in batches:
            step_loss = criterion(model(bx), by)
            step_loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    epochs = max(3, number // len(batches) // 20)
    whole = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(epochs):
            raw_steps()
        raw = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(epochs):
            loop_steps()
        whole.append(((time.perf_counter() - start) - raw) / (epochs * len(batches)) * 1e6)

    width = max(len(name) for name, _ in rows)
    print(f'torch {torch.__version__}, 1 thread; median of {repeats} timings of {number} calls each')
    for name, us in rows:
        print(f'{name:<{width}}  {us:6.2f} us')
    print(f'{"sum of the pieces":<{width}}  {sum(us for _, us in rows):6.2f} us')
    print(f'{"whole step over the raw step (tiny MLP, batches of 32)":<{width}}  {statistics.median(whole):6.2f} us')


if __name__ == '__main__':
    main()
