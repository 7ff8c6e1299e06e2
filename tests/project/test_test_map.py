"""tests/test_map.txt, the module -> tests map a contributor reads to find the tests of the module they change
(CONTRIBUTING.md), is the one the tests make today, and every module of more than tools/test_map.py's MIN_LINES lines
has a test file that uses it, or names in tools/test_map.py's THROUGH the tests that reach it through the loop."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tools import test_map  # noqa: E402


def test_the_checked_in_map_is_the_one_the_tests_make_today():
    made = test_map.render(test_map.build_map())
    assert test_map.MAP_FILE.read_text() == made, (
        'tests/test_map.txt is out of date: run `.venv/bin/python tools/test_map.py --update` and commit the file')


def test_every_module_of_more_than_min_lines_has_a_test_file():
    assert test_map.untested(test_map.build_map()) == []


def test_each_module_named_through_the_loop_is_reached_by_the_tests_named_for_it():
    for module, (word, tests) in test_map.THROUGH.items():
        assert (ROOT / module).is_file(), f'THROUGH names {module}, which is no module of the package'
        for test in tests:
            assert word in (ROOT / test).read_text(), f'{test} no longer mentions {word!r} ({module})'
