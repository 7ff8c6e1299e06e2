# Self-installing targets: each one builds .venv from nothing when it is missing.
# torch is pinned to the local CPU build first; any range admitting a newer torch would
# pull several GB of CUDA packages.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test bench clean

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/digits_cnn.py --epochs 8 --output-dir demo_output

test: $(STAMP)
	$(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) benchmarks/loop_overhead.py

clean:
	rm -rf $(VENV) demo_output .pytest_cache
