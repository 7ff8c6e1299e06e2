"""Summarise the harness JSON-lines report (harness/aitb_pytest.py) against the fixed lists of expected test ids.

Every expected id that did not pass (failed, errored, skipped, or never
collected because its module failed to import) counts as failed, so the
totals always add up to the size of the selected group (minus tests the user
deselected with pytest options).  The last line printed is exactly
``N passed, M failed``.
"""

import argparse
import collections
import json
import sys


def read_ids(path):
    ids = []
    with open(path) as fh:
        for line in fh:
            line = line.split('#', 1)[0].strip()
            if line:
                ids.append(line)
    return ids


def load_report(path):
    phases = collections.defaultdict(dict)
    messages = {}
    durations = collections.Counter()
    collect_errors = {}
    deselected = set()
    finish = None
    try:
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a kill
                kind = rec.get('kind')
                if kind == 'phase':
                    nodeid = rec['nodeid']
                    phases[nodeid][rec['when']] = rec['outcome']
                    durations[nodeid] += rec.get('duration', 0.0)
                    if rec['outcome'] != 'passed' and nodeid not in messages:
                        messages[nodeid] = f"{rec['outcome']} in {rec['when']}: {rec.get('message', '')}"
                elif kind == 'collect_error':
                    collect_errors[rec['nodeid']] = rec.get('message', '')
                elif kind == 'deselected':
                    deselected.add(rec['nodeid'])
                elif kind == 'finish':
                    finish = rec
    except OSError as exc:
        print(f'ERROR: no pytest report ({exc}); counting every selected test as failed')
    outcome = {}
    for nodeid, ph in phases.items():
        ok = ph.get('setup') == 'passed' and ph.get('call') == 'passed' and ph.get('teardown') == 'passed'
        outcome[nodeid] = 'passed' if ok else 'failed'
    return outcome, messages, durations, collect_errors, deselected, finish


FOLDERS = ('experiment', 'utils', 'cloud', 'nlp', 'torchtrain')


def folder_of(nodeid):
    """'tests/test_nlp/test_core/test_core.py::...' -> 'nlp'"""
    return nodeid.split('/', 2)[1][len('test_'):]


def print_per_folder(all_ids, expected, outcome, internal, broken, group):
    """One line per test folder of the wheel: passed of the counted tests, and how many tests are not counted."""
    print(f'--- per folder: passed/counted ({group} group) ---')
    chosen = set(expected)
    for folder in FOLDERS:
        ids = [i for i in all_ids if folder_of(i) == folder]
        if not ids:
            continue
        counted = [i for i in ids if i in chosen]
        passed = sum(outcome.get(i) == 'passed' for i in counted)
        not_counted = []
        if group == 'blackbox':
            not_counted.append(f'{sum(i in internal for i in ids)} internal')
        not_counted.append(f'{sum(i in broken for i in ids)} left out (lists/oracle_broken.txt, lists/keras.txt)')
        print(f'{folder:<11} {passed:4d}/{len(counted):<4d} of {len(ids)} tests; not counted: {", ".join(not_counted)}')


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument('--report', required=True)
    ap.add_argument('--ids', action='append', required=True, help='expected ids of a suite (repeatable)')
    ap.add_argument('--internal', action='append', default=[], help='group (b) ids (repeatable)')
    ap.add_argument('--broken', action='append', default=[],
                    help='ids the oracle itself fails; left out of every group unless --with-broken')
    ap.add_argument('--with-broken', action='store_true')
    ap.add_argument('--group', choices=['blackbox', 'internal', 'all'], default='blackbox')
    ap.add_argument('--print-selection', action='store_true',
                    help='only print the ids NOT selected by --group (for --deselect) and exit')
    ap.add_argument('--failures-out', help='write every failing id and its message here (TSV)')
    ap.add_argument('--max-list', type=int, default=40)
    args = ap.parse_args(argv)

    all_ids = []
    for path in args.ids:
        all_ids += read_ids(path)
    internal = set()
    for path in args.internal:
        internal.update(read_ids(path))
    broken = set()
    if not args.with_broken:
        for path in args.broken:
            broken.update(read_ids(path))
    if args.group == 'blackbox':
        expected = [i for i in all_ids if i not in internal]
    elif args.group == 'internal':
        expected = [i for i in all_ids if i in internal]
    else:
        expected = list(all_ids)
    expected = [i for i in expected if i not in broken]

    if args.print_selection:
        chosen = set(expected)
        for nodeid in all_ids:
            if nodeid not in chosen:
                print(nodeid)
        return 0

    unknown_internal = internal - set(all_ids)
    if unknown_internal:
        print(f'WARNING: {len(unknown_internal)} ids in the internal list are not expected ids, '
              f'e.g. {sorted(unknown_internal)[0]}')

    outcome, messages, durations, collect_errors, deselected, finish = load_report(args.report)
    user_deselected = [i for i in expected if i in deselected]
    expected = [i for i in expected if i not in deselected]

    per_file = collections.OrderedDict()
    failures = []
    passed = failed = 0
    for nodeid in expected:
        counts = per_file.setdefault(nodeid.split('::', 1)[0], [0, 0])
        if outcome.get(nodeid) == 'passed':
            passed += 1
            counts[0] += 1
            continue
        failed += 1
        counts[1] += 1
        if nodeid not in outcome:
            why = 'not run (its module failed to import, the run was cut short, or it was not collected)'
        else:
            why = ' '.join(messages.get(nodeid, 'failed').split())
        failures.append((nodeid, why))

    print(f'--- per file: passed/selected ({args.group} group, {len(expected)} tests) ---')
    for fname, (p, f) in per_file.items():
        print(f'{p:4d}/{p + f:<4d} {fname.replace("tests/test_", "")}')
    if collect_errors:
        print(f'--- modules that failed to import: {len(collect_errors)} ---')
        for nodeid, msg in sorted(collect_errors.items()):
            lines = [l for l in msg.strip().splitlines() if l.strip()]
            print(f'{nodeid}: {(lines[-1] if lines else "")[:220]}')
    if failures:
        print(f'--- failing tests: {len(failures)} (first {min(len(failures), args.max_list)}; '
              f'all in failures.tsv) ---')
        for nodeid, why in failures[:args.max_list]:
            print(f'{nodeid}\n    {why[:260]}')
    if args.failures_out:
        with open(args.failures_out, 'w') as fh:
            for nodeid, why in failures:
                fh.write(f'{nodeid}\t{why}\n')
    slow = [(d, n) for n, d in durations.items() if n in set(expected)]
    slow.sort(reverse=True)
    if slow:
        print('--- slowest: ' + '; '.join(f'{n.rsplit("::", 1)[-1]} {d:.1f}s' for d, n in slow[:5]))
    extra = sorted(set(outcome) - set(all_ids))
    if extra:
        print(f'WARNING: {len(extra)} tests ran that are not in the expected lists (not counted), e.g. {extra[0]}')
    if user_deselected:
        print(f'note: {len(user_deselected)} selected tests were deselected by extra pytest options (not counted)')
    if finish is None:
        print('WARNING: pytest did not finish normally (killed or crashed); unrecorded tests count as failed')
    print_per_folder(all_ids, expected, outcome, internal, broken, args.group)
    print(f'{passed} passed, {failed} failed')
    return 0 if failed == 0 else 1


if __name__ == '__main__':
    sys.exit(main())
