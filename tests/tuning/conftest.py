import csv
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIGITS_RECIPE = os.path.join(ROOT, 'examples', 'recipes', 'digits.yaml')


@pytest.fixture
def digits_recipe():
    """The digits recipe of examples/recipes (what docs/tuning.md searches)."""
    return DIGITS_RECIPE


@pytest.fixture
def digits_overrides(tmp_path, monkeypatch):
    """One-epoch trials whose experiment folders go under tmp_path/runs."""
    monkeypatch.delenv('DIGITS_OUTPUT_DIR', raising=False)
    return ['fit.num_epochs=1', f'vars.output_dir={tmp_path / "runs"}']


@pytest.fixture
def read_csv():
    """A CSV file's rows as dicts (trials.csv, a run's results/results.csv)."""
    def read(path):
        with open(path, newline='') as f:
            return list(csv.DictReader(f))
    return read
