# Self-installing targets: each one builds .venv from nothing when it is missing, and installs what it uses:
# `make demo` the demo extra (what examples/digits_cnn.py imports), the other targets the dev extra (what the tests,
# the type check and the docs use). Each extra has its own stamp, so `make test` after `make demo` installs the rest.
# torch is pinned to the local CPU build first, and held there by a constraint while the extras install; any range
# admitting a newer torch would pull several GB of CUDA packages. The only torchvision the package index offers for
# it is a CUDA build, which cannot be imported beside CPU torch as it is: each install also writes a start-up hook
# into the venv (tools/cpu_torchvision.py) that makes it importable, for any script the venv runs. The extra installs
# with uv, told pip's configuration (tools/uv_install.py: about 12 s for the dev extra, against pip's 55 s), and with
# pip where uv cannot. Neither compiles every module of every package (pip's --no-compile: about 40 s); Python
# compiles a module when it is first imported, and most never are.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH := torch==2.13.0
CONSTRAINT := $(VENV)/torch-constraint.txt
DEMO_STAMP := $(VENV)/.installed-demo
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: install demo test test-prerequisites system-check test-area typecheck bench gpu-check docs clean compat-check sg-check pta-check orca-check bench-peers

# $(call install-extra,EXTRA): the venv, torch, then the package with EXTRA, torch held at $(TORCH).
define install-extra
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	echo '$(TORCH)' > $(CONSTRAINT)
	$(PY) -m pip install --quiet --no-compile -c $(CONSTRAINT) '$(TORCH)'
	$(PY) -m tools.uv_install -c $(CONSTRAINT) -e '.[$(1)]'
	$(PY) -m tools.cpu_torchvision
	touch $@
endef

$(DEMO_STAMP): setup.py tools/cpu_torchvision.py
	$(call install-extra,demo)

$(DEV_STAMP): setup.py tools/cpu_torchvision.py
	$(call install-extra,dev)

install: $(DEV_STAMP)

demo: $(DEMO_STAMP)
	$(PY) examples/digits_cnn.py --epochs 8 --output-dir demo_output

# Static type check of the package (configuration: [mypy] in setup.cfg).
typecheck: $(DEV_STAMP)
	$(PY) -m mypy aitoolbox_like

# Azurite (the Azure Blob Storage emulator the tests run) from npm, into a folder of the checkout; the tests' fixture
# installs it there too when it is missing (pytest run on its own).
AZURITE := .test-servers/azurite/node_modules/.bin/azurite-blob
$(AZURITE):
	mkdir -p .test-servers/azurite
	npm install --no-audit --no-fund --prefix .test-servers/azurite azurite@3 > /dev/null

# What the test targets need: the venv (pip) and Azurite (npm). On a fresh clone each install spends much of its time
# waiting on its registry (Azurite's npm install: about 35 s, 13 s of it on the CPU), so the two run side by side.
test-prerequisites:
	@$(MAKE) --no-print-directory -j2 $(DEV_STAMP) $(AZURITE)

# The type check runs beside the tests, at a lower priority (nice): the suite leaves about an eighth of the two cores
# idle while its processes wait (for servers, signals, subprocesses), and the check's ~25 s of CPU fit there instead
# of before the suite, or of slowing the workers' collection (both import every test module, the first time compiling
# what they import). Either failing fails `make test`; the check's output comes after the tests'. The tests run on
# every core (pytest-xdist; tests sharing a server or a cluster are one xdist_group). tests/gpu is `make gpu-check`'s.
# The tests start a few hundred Python processes that import the package: with PYTHONDONTWRITEBYTECODE set (as on
# these machines) each would compile it from source again, so it is unset here and the bytecode is written once.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -n auto --dist loadgroup --ignore=tests/gpu
# The system tests (marked `system`: on the SLURM cluster, a Ray node or under torchrun, or killing the ranks of a
# multi-process run) are `make system-check`'s, which CI runs after this.
test: test-prerequisites
	@log=$$(mktemp); nice -n 10 $(PY) -m mypy aitoolbox_like > $$log 2>&1 & typecheck=$$!; \
	echo "$(PYTEST) -m 'not system' --durations=30 tests"; $(PYTEST) -m 'not system' --durations=30 tests; tests=$$?; \
	wait $$typecheck; typed=$$?; echo '$(PY) -m mypy aitoolbox_like'; cat $$log; rm -f $$log; \
	test $$tests -eq 0 -a $$typed -eq 0

# The tests that run on a real cluster or launcher: SLURM jobs requeued and preempted, Ray Train and Ray Tune, fits
# under torchrun and workers killed and restarted by its elastic agent, the ranks of multi-process runs killed or hung
# (about 6 minutes on two cores, most of it the SLURM group's).
system-check: test-prerequisites
	$(PYTEST) -m system --durations=10 tests

# The tests of one area, e.g. `make test-area AREA=tests/saving` or AREA=tests/distributed/test_ddp.py (CONTRIBUTING.md).
AREA ?= tests
test-area: test-prerequisites
	$(PYTEST) --durations=10 $(AREA)

# AIToolbox 1.8.0's own test suite against this checkout: every test folder its published wheel ships (experiment,
# utils, cloud, nlp, torchtrain), run by the project's harness (tools/aitoolbox_suite, see its README) in a venv of its
# own built from the package registry. It prints a line per folder and "N passed, M failed" last, over the black-box
# tests AIToolbox 1.8.0 itself passes today (tools/aitoolbox_suite/groups.md). Fails when fewer than COMPAT_MIN pass:
# the figure reached so far, so it never drops (docs/migrating-from-aitoolbox.md).
COMPAT_MIN ?= 320
AITB_SUITE ?= tools/aitoolbox_suite
# A suite that fails to run, or a log without its closing count, fails the check too.
compat-check:
	@bash -o pipefail -c 'bash $(AITB_SUITE)/run.sh --jobs 2 --exit-zero . | tee compat-check.log'
	@tail -n 1 compat-check.log | awk -v min=$(COMPAT_MIN) '/^[0-9]+ passed/ { seen = 1; if ($$1 + 0 < min) { \
		print "compat-check: " $$1 " of AIToolbox 1.8.0 tests passed, fewer than the " min " reached before"; exit 1 } \
		else print "compat-check: " $$1 " passed (at least " min ")" } \
		END { if (!seen) { print "compat-check: no \"N passed\" line at the end of compat-check.log"; exit 1 } }'

# SuperGradients' own callback classes with only their import lines changed, run on the TrainLoop through the SG
# adapter against the numbers of SG's own unit tests (tools/sg_check: the published super-gradients wheel is
# fetched with pip download --no-deps, nothing installed). Prints "N of M SG callback classes run; K of L SG
# expectations hold" last and fails below the figures reached (docs/callbacks/supergradients.md lists the classes
# that do not run, and why).
SG_CLASSES_MIN ?= 26
SG_EXPECTATIONS_MIN ?= 47
sg-check: $(DEV_STAMP)
	$(PY) -m tools.sg_check --min-classes $(SG_CLASSES_MIN) --min-expectations $(SG_EXPECTATIONS_MIN)

# pytorch-accelerated's own callback classes (the installed package, checked equal to its published wheel) side by
# side on PTA's Trainer and on the TrainLoop, against the expectations of PTA's own tests and the examples of PTA's
# callbacks page in SEEDS (tools/pta_check). Prints "N of 14 PTA callback classes run; K of L PTA expectations hold"
# last and fails below the figures reached.
SEEDS ?= ../shared/seeds
PTA_CLASSES_MIN ?= 14
PTA_EXPECTATIONS_MIN ?= 48
pta-check: $(DEV_STAMP)
	$(PY) -m tools.pta_check --seeds $(SEEDS) --min-classes $(PTA_CLASSES_MIN) --min-expectations $(PTA_EXPECTATIONS_MIN)

# BigDL Orca 2.4.0's own callback classes with only their import lines changed, run on the TrainLoop through the
# Orca adapter against the expectations of Orca's own tests (tools/orca_check: the published bigdl-orca wheel is
# fetched with pip download --no-deps, nothing installed, BigDL never imported). Prints "N of M Orca callback
# classes run; K of L Orca expectations hold" last and fails below the figures reached (docs/callbacks/orca.md).
ORCA_CLASSES_MIN ?= 6
ORCA_EXPECTATIONS_MIN ?= 18
orca-check: $(DEV_STAMP)
	$(PY) -m tools.orca_check --min-classes $(ORCA_CLASSES_MIN) --min-expectations $(ORCA_EXPECTATIONS_MIN)

bench: $(DEV_STAMP)
	$(PY) benchmarks/loop_overhead.py

BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): setup.py tools/cpu_torchvision.py
	$(call install-extra,bench)

# The TrainLoop against a hand-written loop and the libraries people use instead (docs/performance.md); about 70 s.
# WRITE_DOCS=1 rewrites the figures of docs/performance.md and docs/images/loop-overhead.png from the run.
bench-peers: $(BENCH_STAMP)
	$(PY) benchmarks/peers.py $(if $(WRITE_DOCS),--write-docs)

# The GPU check (docs/gpu-check.md): tests/gpu and the loop-overhead benchmark on a ResNet-18 step, on a CUDA GPU.
# It needs no install: GPU_PYTHON is the venv's python when `make test` has installed it (pytest included), else python3.
# Exit status 0: passed; 1: a check failed; 3: no CUDA device, nothing checked.
GPU_PYTHON ?= $(if $(wildcard $(DEV_STAMP)),$(PY),python3)
gpu-check:
	PYTHONUNBUFFERED=1 $(GPU_PYTHON) benchmarks/gpu_check.py

# The documentation site (mkdocs.yml) into build/site; --strict: a broken link, anchor or API reference fails.
docs: $(DEV_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

clean:
	rm -rf $(VENV) demo_output .pytest_cache .mypy_cache compat-check.log .test-servers
