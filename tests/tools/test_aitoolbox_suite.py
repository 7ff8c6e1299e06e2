"""The machinery of make compat-check (tools/aitoolbox_suite): its lists of AIToolbox 1.8.0's tests agree with each
other, and its summary counts a run per folder, every expected test that did not pass as failed, and ends with the
'N passed, M failed' line the Makefile reads. (The suite itself runs in make compat-check, not here: it builds a venv
of its own.)"""
import json
import subprocess
import sys
from pathlib import Path

SUITE = Path(__file__).resolve().parents[2] / 'tools' / 'aitoolbox_suite'
LISTS = SUITE / 'lists'
FOLDERS = ('experiment', 'utils', 'cloud', 'nlp', 'torchtrain')


def ids(path):
    found = []
    for line in path.read_text().splitlines():
        line = line.split('#', 1)[0].strip()
        if line:
            found.append(line)
    return found


def test_every_listed_test_is_one_of_the_wheel_s_and_every_left_out_one_says_why():
    expected = {folder: ids(LISTS / f'{folder}.txt') for folder in FOLDERS}
    everything = set()
    for folder, folder_ids in expected.items():
        assert len(folder_ids) == len(set(folder_ids)), folder
        assert all(i.startswith(f'tests/test_{folder}/') for i in folder_ids), folder
        everything.update(folder_ids)
    assert {folder: len(folder_ids) for folder, folder_ids in expected.items()} == \
        {'experiment': 103, 'utils': 27, 'cloud': 5, 'nlp': 27, 'torchtrain': 249}
    for name in [f'{folder}_internal.txt' for folder in FOLDERS] + ['oracle_broken.txt', 'keras.txt']:
        for line in (LISTS / name).read_text().splitlines():
            if line.split('#', 1)[0].strip():
                test_id, _, reason = line.partition('#')
                assert test_id.strip() in everything, (name, test_id)
                assert reason.strip(), (name, test_id)     # each test left out says why


def test_summary_counts_per_folder_and_ends_with_the_count(tmp_path):
    report = tmp_path / 'report.jsonl'
    nlp = ids(LISTS / 'nlp.txt')
    core = [i for i in nlp if 'test_NLP_metrics' not in i]
    records = [{'kind': 'phase', 'nodeid': i, 'when': when, 'outcome': 'passed', 'duration': 0.01}
               for i in core[1:] for when in ('setup', 'call', 'teardown')]
    records.append({'kind': 'phase', 'nodeid': core[0], 'when': 'call', 'outcome': 'failed', 'message': 'boom'})
    records.append({'kind': 'finish', 'exitstatus': 1, 'wall_s': 1.0})
    report.write_text('\n'.join(json.dumps(r) for r in records) + '\n')
    result = subprocess.run(
        [sys.executable, str(SUITE / 'harness' / 'summarize.py'), '--report', str(report),
         '--ids', str(LISTS / 'nlp.txt'), '--internal', str(LISTS / 'nlp_internal.txt'),
         '--broken', str(LISTS / 'oracle_broken.txt'), '--broken', str(LISTS / 'keras.txt')],
        capture_output=True, text=True, timeout=60)
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 1, result.stderr
    assert lines[-1] == f'{len(core) - 1} passed, 1 failed'
    assert lines[-2].split() == ['nlp', f'{len(core) - 1}/{len(core)}', 'of', '27', 'tests;', 'not', 'counted:', '0',
                                 'internal,', '14', 'left', 'out', '(lists/oracle_broken.txt,', 'lists/keras.txt)']
    assert f'{core[0]}\n    failed in call: boom' in result.stdout
