"""``aitoolbox-like tune``: the command line of :func:`aitoolbox_like.tuning.tune`.

    aitoolbox-like tune RECIPE [key.path=value ...] --trials N --param PATH=SPEC [--param ...] --monitor NAME
                        --mode min|max [--pruner median|none] [--storage URL] [--study-name NAME]
                        [--backend optuna|ray] [--concurrent K] [--address ADDRESS] --output DIR

:func:`add_tune_parser` adds the subcommand to the ``aitoolbox-like`` parser; its handler is :func:`cmd_tune`.
"""
import argparse
import shlex
import signal
import sys
from typing import Any, Sequence

from .search import BACKENDS, PRUNERS
from .trial import PROG


_SPEC_HELP = ('PATH=SPEC: a recipe key path as in overrides (optimizer.lr, vars.batch_size, callbacks.6.patience) '
              'and one of loguniform(a,b), uniform(a,b), int(a,b) (both ends included), choice(v1,v2,...) (each '
              'value typed as in an override); repeatable. Quote it for the shell: '
              "--param 'optimizer.lr=loguniform(1e-4,1e-2)'")


def add_tune_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``tune`` subcommand to the ``aitoolbox-like`` parser's subparsers; returns its parser (its handler,
    :func:`cmd_tune`, is set as ``handler``)."""
    tune = subparsers.add_parser(
        'tune', help='search hyper-parameters of a recipe (Optuna, or Ray Tune)',
        description='Train the recipe once per trial with sampled values (each trial as `train` would: its own '
                    'experiment folder, recipe and hyperparameters saved with it), prune trials doing worse than '
                    'the others, and write trials.csv, best.yaml and history.png into --output. The study lives in '
                    '--storage: the same command with the same --output continues it until it has --trials '
                    'finished trials. Everything is checked before any trial runs (docs/tuning.md).')
    tune.add_argument('recipe', help='the recipe YAML file')
    tune.add_argument('overrides', nargs='*', metavar='key.path=value',
                      help='overrides of every trial, e.g. fit.num_epochs=5')
    tune.add_argument('--trials', type=int, required=True, metavar='N',
                      help='finished trials (completed, pruned or failed) the study should have')
    tune.add_argument('--param', dest='params', action='append', required=True, metavar='PATH=SPEC', help=_SPEC_HELP)
    tune.add_argument('--monitor', required=True, metavar='NAME',
                      help='the history value reported after every epoch and optimised (val_loss, val_Accuracy...); '
                           "a trial's value is the one of its last epoch")
    tune.add_argument('--mode', required=True, choices=['min', 'max'], help='whether a smaller or a larger value '
                                                                            'is better')
    tune.add_argument('--pruner', default='median', choices=PRUNERS,
                      help='median (default): stop a trial whose value at an epoch is worse than the median of the '
                           'earlier trials at that epoch (once 5 trials have finished); none: never prune')
    tune.add_argument('--storage', default=None, metavar='URL',
                      help='where the study lives, a database URL (default sqlite:///DIR/study.db); processes on '
                           'other machines sharing it work on the same study')
    tune.add_argument('--study-name', default=None, metavar='NAME',
                      help="the study's name in the storage (default: the recipe file's name)")
    tune.add_argument('--backend', default='optuna', choices=list(BACKENDS),
                      help='optuna (default): trials run on this machine; ray: Ray Tune runs them on a Ray cluster '
                           '(the same study, pruning and results)')
    tune.add_argument('--concurrent', type=int, default=1, metavar='K',
                      help='trials run at once, in K processes (default 1); under --backend ray each gets 1/K of '
                           "the cluster's CPUs and GPUs")
    tune.add_argument('--address', default=None, metavar='ADDRESS',
                      help='--backend ray: the Ray cluster to run on (e.g. ray://head:10001 or auto); default: a '
                           'local one started for the search')
    tune.add_argument('--output', required=True, metavar='DIR', help='the results folder (and the study\'s '
                                                                      'default storage)')
    tune.set_defaults(handler=cmd_tune)
    return tune


#: The exit status of a search stopped by Ctrl-C (or SIGTERM), as a shell reports a command ended by Ctrl-C.
EXIT_INTERRUPTED = 130


def cmd_tune(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the search ``args`` describes and print the best value and values; returns the exit status (0, or 130
    when Ctrl-C stopped it: the running trials are FAIL (interrupted), not counted, and the same command continues)."""
    from . import tune
    command = f'{PROG} {shlex.join(argv)}'       # noted in every trial's command_line.txt
    try:
        result = tune(args.recipe, args.overrides, params=args.params, trials=args.trials, monitor=args.monitor,
                      mode=args.mode, output=args.output, pruner=args.pruner, storage=args.storage,
                      study_name=args.study_name, backend=args.backend, concurrent=args.concurrent,
                      command=command, address=args.address)
    except KeyboardInterrupt as interruption:
        # The command is ending with its checkpoints written: another Ctrl-C must not raise in the exit handlers.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        why = f' ({interruption})' if str(interruption) else ''
        running = 'trials are' if args.concurrent > 1 else 'trial is'
        print(f'search interrupted{why}: the running {running} recorded as FAIL (interrupted) and not counted; run '
              f'the same command again to continue the study to its {args.trials} trials', file=sys.stderr,
              flush=True)
        return EXIT_INTERRUPTED
    for line in result.summary():
        print(line, flush=True)
    return 0
