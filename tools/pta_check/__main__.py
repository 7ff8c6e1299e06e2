"""make pta-check: pytorch-accelerated's own callback classes on the TrainLoop.

    python -m tools.pta_check [--min-classes N] [--min-expectations K] [--seeds DIR] [--keep]

Downloads the pinned pytorch-accelerated wheel (pip download --no-deps) and checks that the installed package (the
extra ``pta``) is its code, file for file; then runs PTA's 14 callback classes side by side on PTA's own Trainer and
on the TrainLoop (the same lines printed, the same files, the same weights), the expectations of PTA's own tests on
real runs, and the examples of the PTA callbacks page in DIR (../shared/seeds). The last line printed is "N of 14
PTA callback classes run; K of L PTA expectations hold"; the exit status is 1 below either minimum.
"""
import argparse
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

from . import scenarios, seed, wheel

CHECKOUT = Path(__file__).resolve().parents[2]


def main() -> int:
    parser = argparse.ArgumentParser(prog='python -m tools.pta_check', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--min-classes', type=int, default=0)
    parser.add_argument('--min-expectations', type=int, default=0)
    parser.add_argument('--seeds', type=Path, default=CHECKOUT.parent / 'shared' / 'seeds')
    parser.add_argument('--cache', type=Path, default=wheel.default_cache())
    parser.add_argument('--keep', action='store_true', help='keep the runs\' folders and print where')
    args = parser.parse_args()
    if not (args.seeds / seed.PAGE).exists():
        print(f'pta-check: {args.seeds / seed.PAGE} not found; put the shared folder beside the checkout or pass '
              f'--seeds DIR (make pta-check SEEDS=DIR)')
        return 1
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger('pytorch_accelerated').setLevel(logging.WARNING)
    started = time.monotonic()
    published = wheel.fetch_wheel(args.cache)
    differences = wheel.differences_from_installed(published)
    if differences:
        print('pta-check: the installed pytorch-accelerated is not the published wheel:\n  ' + '\n  '.join(differences))
        return 1
    print(f'pytorch-accelerated {wheel.PTA_VERSION}: the installed package is the published wheel '
          f'({published.name}, sha256 {wheel.WHEEL_SHA256[:12]}...)')

    work = Path(tempfile.mkdtemp(prefix='pta-check-'))
    tally = scenarios.Tally()
    try:
        for part in (scenarios.side_by_side, scenarios.save_training_state, scenarios.wsd_checkpoints,
                     scenarios.checkpoint_round_trips, scenarios.run_history_and_losses, scenarios.trainer_behaviour,
                     scenarios.trainer_subclass, scenarios.kill_and_resume):
            part(tally, work)
        seed.seed_examples(tally, args.seeds, work)
    finally:
        if args.keep:
            print(f'runs kept in {work}')
        else:
            shutil.rmtree(work, ignore_errors=True)

    for outcome in tally.outcomes:
        print(f'  {"holds" if outcome.holds else "FAILS"}  {outcome.name}' + (f': {outcome.detail}' if outcome.detail else ''))
    not_run = [name for name in scenarios.PTA_CLASSES if name not in tally.ran]
    if not_run:
        print('PTA classes that did not run: ' + ', '.join(not_run))
    classes, held = len(tally.ran), sum(o.holds for o in tally.outcomes)
    print(f'({time.monotonic() - started:.0f} s)')
    print(f'{classes} of {len(scenarios.PTA_CLASSES)} PTA callback classes run; {held} of {len(tally.outcomes)} '
          f'PTA expectations hold')
    return 1 if classes < args.min_classes or held < args.min_expectations else 0


if __name__ == '__main__':
    sys.exit(main())
