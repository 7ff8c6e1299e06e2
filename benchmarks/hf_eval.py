"""Evaluation plus saving per epoch on docs/huggingface.md's classifier: the TrainLoop against transformers' Trainer.

The model is the page's tiny BERT classifier (a ``BertConfig``, random weights), on the page's dict batches. Per
round, interleaved in one process (the order rotating from round to round):

- **TrainLoop**: the page's set-up with the loop's default arguments, as a user writes it: ``HFModelWrap(model)``,
  ``criterion=None``, a validation loader, ``ModelPerformanceEvaluation(ClassificationResultPackage(), None)`` for
  the accuracy, in a ``TrainLoopCheckpoint`` saving a full checkpoint every epoch (``cloud_save_mode='local'``, the
  default asynchronous write);
- **TrainLoop, evaluation**: the same in a plain ``TrainLoop``, without the checkpoint;
- **Trainer, evaluation**: transformers' ``Trainer`` with ``eval_strategy='epoch'`` and ``compute_metrics`` giving the
  same accuracy, ``save_strategy='no'``;
- **Trainer, evaluation + saving**: the same with ``save_strategy='epoch'``.

What is timed is what an epoch boundary costs, in two parts:

- **between epochs**: from the end of an epoch's last training step (the loop's ``on_batch_end``, the Trainer's
  ``on_step_end``) to the start of the next epoch (``on_epoch_begin``): evaluation, metrics, history, saving, logging;
- **after**: what the next epoch's first two training steps take beyond the run's usual step (the median of the
  steps after the second of each epoch). A checkpoint written in a background thread is serialised by
  ``torch.save`` while those steps run, and its pickling holds the interpreter lock that a Python-bound training
  step needs: on a CPU that time comes out of the steps. The part counts the next loader's iterator too, which every
  run pays alike.

The first epoch has no boundary before it, and the last epoch's end is the end of the fit: a run of ``--epochs``
epochs has ``--epochs - 1`` boundaries, and its figure is their mean. The table gives the median over the rounds,
with the ratio TrainLoop / this per round (median, min-max over the rounds).

``--write-docs`` rewrites the block between ``<!-- hf-eval:begin -->`` and ``<!-- hf-eval:end -->`` of
docs/huggingface.md with the table.

Usage: python benchmarks/hf_eval.py [--rounds N] [--epochs E] [--train N] [--val N] [--threads T] [--write-docs]
"""
import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import torch
from torch.utils.data import DataLoader

# The checkout this file is in, whatever aitoolbox_like the environment has installed.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from transformers import (BertConfig, BertForSequenceClassification, Trainer, TrainerCallback,  # noqa: E402
                          TrainingArguments)
from transformers.utils import logging as hf_logging  # noqa: E402

from aitoolbox_like import TrainLoop  # noqa: E402
from aitoolbox_like.callbacks.abstract import AbstractCallback  # noqa: E402
from aitoolbox_like.callbacks.performance_eval import ModelPerformanceEvaluation  # noqa: E402
from aitoolbox_like.model.huggingface import HFModelWrap  # noqa: E402
from aitoolbox_like.results import ClassificationResultPackage  # noqa: E402
from aitoolbox_like.tracking import TrainLoopCheckpoint  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, 'docs', 'huggingface.md')
BEGIN, END = '<!-- hf-eval:begin -->', '<!-- hf-eval:end -->'
SEQ, BATCH = 16, 16
AFTER_STEPS = 2     # the steps after a boundary that its background write may slow
HEADLINE = 'TrainLoop: evaluation + accuracy + checkpoint'


def page_model():
    """The classifier of docs/huggingface.md."""
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1,
                                                    num_attention_heads=2, intermediate_size=32, num_labels=2))


def examples(n, seed):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 100, (n, SEQ), generator=generator)
    return [{'input_ids': row, 'attention_mask': torch.ones(SEQ, dtype=torch.long), 'labels': int(row[0] % 2)}
            for row in ids]


class Boundaries:
    """The times of each epoch's start and each training step's end, and from them what an epoch boundary costs."""

    def __init__(self):
        self.epochs = []        # per epoch: [start, end of step 1, end of step 2, ...]

    def epoch_begin(self):
        self.epochs.append([time.perf_counter()])

    def step_end(self):
        self.epochs[-1].append(time.perf_counter())

    def cost(self):
        """(between epochs, after) in seconds: the means over the boundaries (see the module's docstring)."""
        steps = [[b - a for a, b in zip(marks, marks[1:])] for marks in self.epochs]
        usual = statistics.median(d for durations in steps[1:] for d in durations[AFTER_STEPS:])
        between = [marks[0] - previous[-1] for previous, marks in zip(self.epochs, self.epochs[1:])]
        after = [sum(d - usual for d in durations[:AFTER_STEPS]) for durations in steps[1:]]
        return statistics.mean(between), statistics.mean(after)


class LoopBoundaries(AbstractCallback):
    def __init__(self):
        super().__init__('epoch boundaries', execution_order=-1000)
        self.marks = Boundaries()

    def on_epoch_begin(self):
        self.marks.epoch_begin()

    def on_batch_end(self):
        self.marks.step_end()


class TrainerBoundaries(TrainerCallback):
    def __init__(self):
        self.marks = Boundaries()

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.marks.epoch_begin()

    def on_step_end(self, args, state, control, **kwargs):
        self.marks.step_end()


def accuracy(eval_prediction):
    logits, labels = eval_prediction
    return {'accuracy': float((logits.argmax(-1) == labels).mean())}


def run_trainloop(train, val, epochs, folder, save):
    model = page_model()
    timer = LoopBoundaries()
    pieces = (HFModelWrap(model), DataLoader(train, batch_size=BATCH, shuffle=True), DataLoader(val, batch_size=BATCH),
              None, torch.optim.AdamW(model.parameters(), lr=5e-4), None)
    if save:
        loop = TrainLoopCheckpoint(*pieces, project_name='bench', experiment_name='hf_eval',
                                   local_model_result_folder_path=folder, hyperparams={'lr': 5e-4},
                                   cloud_save_mode='local', progress_bar=False)
    else:
        loop = TrainLoop(*pieces, progress_bar=False)
    loop.fit(num_epochs=epochs, callbacks=[ModelPerformanceEvaluation(ClassificationResultPackage(), None), timer])
    return timer.marks.cost(), loop.train_history['val_Accuracy']


def run_trainer(train, val, epochs, folder, save):
    timer = TrainerBoundaries()
    args = TrainingArguments(output_dir=os.path.join(folder, 'trainer'), num_train_epochs=epochs,
                             per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH, learning_rate=5e-4,
                             eval_strategy='epoch', save_strategy='epoch' if save else 'no', report_to='none',
                             use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=page_model(), args=args, train_dataset=train, eval_dataset=val,
                      compute_metrics=accuracy, callbacks=[timer])
    trainer.train()
    accuracies = [entry['eval_accuracy'] for entry in trainer.state.log_history if 'eval_accuracy' in entry]
    return timer.marks.cost(), accuracies


def table(results, rounds, epochs, train_n, val_n):
    totals = {name: [between + after for between, after in values] for name, values in results.items()}
    ours = totals[HEADLINE]
    lines = [f'Milliseconds an epoch boundary costs (evaluation, metric, saving, logging, and what the next two '
             f'training steps take beyond the usual) on the classifier of the first block, {train_n} training and '
             f'{val_n} validation examples in batches of {BATCH}, one torch thread; median of {rounds} interleaved '
             f'rounds of {epochs} epochs each, each column its own median (`python benchmarks/hf_eval.py`):', '',
             f'| run | ms in all | of which between epochs | of which after | {HEADLINE} / this: median (min-max '
             f'over the rounds) |', '|---|---|---|---|---|']
    for name, values in results.items():
        ratios = [a / b for a, b in zip(ours, totals[name])]
        ratio = '' if name == HEADLINE else f'{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})'
        lines.append(f'| {name} | {statistics.median(totals[name]) * 1e3:.1f} | '
                     f'{statistics.median(v[0] for v in values) * 1e3:.1f} | '
                     f'{statistics.median(v[1] for v in values) * 1e3:.1f} | {ratio} |')
    return '\n'.join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=11)
    parser.add_argument('--threads', type=int, default=1,
                        help='torch threads (1: what other work on a shared machine takes is felt by every run alike)')
    parser.add_argument('--epochs', type=int, default=4)
    parser.add_argument('--train', type=int, default=64)
    parser.add_argument('--val', type=int, default=32)
    parser.add_argument('--write-docs', action='store_true')
    args = parser.parse_args()
    logging.disable(logging.INFO)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings('ignore')
    torch.set_num_threads(args.threads)
    train, val = examples(args.train, 1), examples(args.val, 2)
    runs = {HEADLINE: lambda folder: run_trainloop(train, val, args.epochs, folder, save=True),
            'TrainLoop: evaluation + accuracy': lambda folder: run_trainloop(train, val, args.epochs, folder,
                                                                             save=False),
            'Trainer: evaluation + accuracy': lambda folder: run_trainer(train, val, args.epochs, folder, save=False),
            'Trainer: evaluation + accuracy + checkpoint': lambda folder: run_trainer(train, val, args.epochs, folder,
                                                                                     save=True)}
    names = list(runs)
    results = {name: [] for name in names}
    for round_idx in range(args.rounds + 1):       # round 0 warms up (imports, first calls) and is not counted
        order = names[round_idx % len(names):] + names[:round_idx % len(names)]
        for name in order:
            folder = tempfile.mkdtemp(prefix='hf_eval_')
            try:
                (between, after), accuracies = runs[name](folder)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            if round_idx:
                results[name].append((between, after))
                print(f'round {round_idx} {name}: {between * 1e3:.2f} ms between epochs, {after * 1e3:.2f} ms after, '
                      f'val accuracy {accuracies}', flush=True)
    text = table(results, args.rounds, args.epochs, args.train, args.val)
    print(text)
    if args.write_docs:
        with open(DOCS) as f:
            page = f.read()
        start, end = page.index(BEGIN) + len(BEGIN), page.index(END)
        with open(DOCS, 'w') as f:
            f.write(page[:start] + '\n' + text + '\n' + page[end:])


if __name__ == '__main__':
    main()
