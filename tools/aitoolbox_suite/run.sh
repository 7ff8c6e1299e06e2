#!/usr/bin/env bash
# Run AIToolbox 1.8.0's own upstream tests (every test folder its wheel ships: tests/test_experiment,
# test_utils, test_cloud, test_nlp, test_torchtrain) against TARGET through an import alias.
# The project's own copy of ../shared/aitoolbox-suite (README.md says what changed).
#
#   run.sh [options] TARGET
#     TARGET            'aitoolbox' (the original 1.8.0 wheel, the oracle) or a path to a
#                       checkout of our project (pip install -e'd into the harness venv)
#   options
#     --group G         blackbox (default) | internal | all       (see groups.md)
#     --suite S         all (default) or a comma-separated list of folders:
#                       experiment, utils, cloud, nlp, torchtrain (tests/test_<folder> of the wheel)
#     --mapping FILE    alias table (default: 'compat', the project's own aitoolbox_like.compat.install(),
#                       what a migrating user gets; mapping.aitoolbox.toml, identity, for 'aitoolbox')
#     --strict-imports  an unmapped aitoolbox.* import fails at import time (whole test module
#                       fails) instead of at first use of the name
#     --fresh           rebuild the venv and re-download the wheel
#     --keep            keep the extracted test tree ($TMPDIR/aitoolbox-suite-run.*) after the run
#     --jobs N          run on N pytest-xdist workers (one directory per worker at a time; default 1)
#     --with-broken     also select the tests the original 1.8.0 fails today (lists/oracle_broken.txt) and
#                       the Keras ones (lists/keras.txt); they are then counted like the others
#     --exit-zero       exit 0 even when tests fail (still non-zero on harness errors)
#     -- ARGS           extra pytest arguments (e.g. -- -k e2e); deselected tests are not counted
#
# The last line printed is exactly "N passed, M failed" over the selected tests.
# Environment: AITB_CACHE (default ~/.cache/aitoolbox-suite) holds the venv, the wheel and the
# oracle install; runs sharing it take turns (flock). PYTHON (default python3, needs >= 3.11);
# AITB_TEST_TIMEOUT (per test, default 600 s: the heaviest torchtrain test, ~7,000 steps twice, needs over 300 s on
# two cores shared with other work); AITB_RUN_TIMEOUT (whole pytest run, default 1800 s).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${AITB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/aitoolbox-suite}
VENV=$CACHE/venv
PY=${PYTHON:-python3}
AITB_VERSION=1.8.0
WHEEL_NAME=aitoolbox-$AITB_VERSION-py3-none-any.whl
WHEEL_SHA256=da66141cfa3df85f6494736a9b45ab6aeb321503bcd4af86d847551870715b43

GROUP=blackbox
SUITE=all
MAPPING=
STRICT=0
FRESH=0
KEEP=0
EXIT_ZERO=0
WITH_BROKEN=0
JOBS=1
TARGET=
EXTRA=()

die() { echo "run.sh: $*" >&2; echo "0 passed, 0 failed" ; exit 2; }
log() { echo "[run.sh $(date +%H:%M:%S)] $*"; }

while [[ $# -gt 0 ]]; do
  case $1 in
    --group) GROUP=${2:?}; shift 2 ;;
    --group=*) GROUP=${1#*=}; shift ;;
    --suite) SUITE=${2:?}; shift 2 ;;
    --suite=*) SUITE=${1#*=}; shift ;;
    --mapping) MAPPING=${2:?}; shift 2 ;;
    --mapping=*) MAPPING=${1#*=}; shift ;;
    --strict-imports) STRICT=1; shift ;;
    --fresh) FRESH=1; shift ;;
    --keep) KEEP=1; shift ;;
    --exit-zero) EXIT_ZERO=1; shift ;;
    --with-broken) WITH_BROKEN=1; shift ;;
    --jobs) JOBS=${2:?}; shift 2 ;;
    --jobs=*) JOBS=${1#*=}; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    -*) die "unknown option $1" ;;
    *) [[ -z $TARGET ]] || die "only one TARGET allowed"; TARGET=$1; shift ;;
  esac
done
[[ -n $TARGET ]] || die "usage: run.sh [--group blackbox|internal|all] [--suite all|FOLDER,...] TARGET"
case $GROUP in blackbox|internal|all) ;; *) die "bad --group $GROUP" ;; esac
ALL_FOLDERS=(experiment utils cloud nlp torchtrain)
if [[ $SUITE == all ]]; then FOLDERS=("${ALL_FOLDERS[@]}"); else IFS=, read -r -a FOLDERS <<< "$SUITE"; fi
for f in "${FOLDERS[@]}"; do
  [[ " ${ALL_FOLDERS[*]} " == *" $f "* ]] || die "bad --suite $SUITE (folders: ${ALL_FOLDERS[*]})"
done
has_folder() { [[ " ${FOLDERS[*]} " == *" $1 "* ]]; }
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || die "bad --jobs $JOBS"

T0=$(date +%s)
mkdir -p "$CACHE"
# one run at a time per cache: target runs pip install -e into the shared venv
exec 9> "$CACHE/.lock"
if ! flock -n 9; then
  log "waiting for another run.sh using $CACHE"
  flock 9
fi

pipq() {  # quiet pip; show the tail of its output only when it fails
  "$VENV/bin/pip" --disable-pip-version-check "$@" > "$CACHE/pip.log" 2>&1 && return 0
  grep -v 'is ignored: it is neither' "$CACHE/pip.log" | tail -20 >&2
  return 1
}

# ---------------------------------------------------------------- venv
ensure_venv() {
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "$PY must be Python >= 3.11 (tomllib)"
  local want have=
  want=$(cat "$HERE/requirements.txt" "$HERE/constraints.txt" <("$PY" -V) | sha256sum | cut -c1-16)
  [[ -f $VENV/.aitb-stamp ]] && have=$(cat "$VENV/.aitb-stamp")
  if [[ $FRESH == 0 && $have == "$want" && -x $VENV/bin/python ]] \
     && "$VENV/bin/python" -c 'import torch, pytest, moto' 2>/dev/null; then
    return
  fi
  log "creating venv $VENV (torch pinned by constraints.txt; a few minutes)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  pipq install -q -c "$HERE/constraints.txt" -r "$HERE/requirements.txt" || die "venv install failed"
  "$VENV/bin/python" -c 'import torch, pytest, moto, boto3' || die "venv install failed"
  drop_broken_torchvision
  echo "$want" > "$VENV/.aitb-stamp"
}

drop_broken_torchvision() {
  # torchvision 0.28.0 does not import against the CPU torch 2.13 wheel used here.
  if "$VENV/bin/python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torchvision") is None)' 2>/dev/null \
     && ! "$VENV/bin/python" -c 'import torchvision' >/dev/null 2>&1; then
    log "uninstalling torchvision (installed but does not import)"
    pipq uninstall -q -y torchvision || true
  fi
}

# ---------------------------------------------------------------- wheel
ensure_wheel() {
  local dir=$CACHE/wheel
  WHEEL=$dir/$WHEEL_NAME
  if [[ $FRESH == 1 || ! -f $WHEEL ]] || ! echo "$WHEEL_SHA256  $WHEEL" | sha256sum -c --quiet - 2>/dev/null; then
    log "downloading aitoolbox==$AITB_VERSION (pip download --no-deps)"
    rm -rf "$dir"
    pipq download -q --no-deps "aitoolbox==$AITB_VERSION" -d "$dir" || die "pip download aitoolbox==$AITB_VERSION failed"
    [[ -f $WHEEL ]] || die "pip download did not produce $WHEEL_NAME"
    echo "$WHEEL_SHA256  $WHEEL" | sha256sum -c --quiet - || die "sha256 mismatch for $WHEEL_NAME"
  fi
}

ensure_oracle() {
  ORACLE_SITE=$CACHE/oracle-site
  if [[ $FRESH == 1 || ! -f $ORACLE_SITE/.aitb-stamp ]]; then
    log "installing the original aitoolbox $AITB_VERSION into $ORACLE_SITE (--no-deps --target)"
    rm -rf "$ORACLE_SITE"
    pipq install -q --no-deps --target "$ORACLE_SITE" "$WHEEL" || die "oracle install failed"
    # the wheel also installs top-level 'tests' and 'tests_gpu' packages: they must not shadow ours
    rm -rf "$ORACLE_SITE/tests" "$ORACLE_SITE/tests_gpu"
    [[ -f $ORACLE_SITE/aitoolbox/__init__.py ]] || die "oracle install failed"
    touch "$ORACLE_SITE/.aitb-stamp"
  fi
}

# ---------------------------------------------------------------- setup
ensure_venv
ensure_wheel
ensure_oracle   # also needed for target runs: it builds the e2e reference weights (see below)

ORACLE=0
if [[ $TARGET == aitoolbox ]]; then
  ORACLE=1
  : "${MAPPING:=$HERE/mapping.aitoolbox.toml}"
  TARGET_DESC="original aitoolbox $AITB_VERSION ($ORACLE_SITE)"
else
  [[ -d $TARGET ]] || die "TARGET '$TARGET' is neither 'aitoolbox' nor a directory"
  TARGET_PATH=$(cd "$TARGET" && pwd)
  : "${MAPPING:=compat}"
  # drop editable installs left by earlier targets: two checkouts under different project names would
  # both claim the same import package and mix (the first finder wins the top level, the other submodules)
  OLD_EDITABLES=$("$VENV/bin/python" -m pip list --editable --format=json 2>/dev/null \
      | "$VENV/bin/python" -c 'import json, sys; print(" ".join(d["name"] for d in json.load(sys.stdin)))' || true)
  if [[ -n $OLD_EDITABLES ]]; then
    log "uninstalling earlier editable installs: $OLD_EDITABLES"
    pipq uninstall -q -y $OLD_EDITABLES || die "could not uninstall $OLD_EDITABLES"
  fi
  # with the extras a user of AIToolbox's nlp package installs (rouge-score, nltk, sacrebleu, seaborn)
  log "pip install -e $TARGET_PATH[nlp] (torch pinned)"
  pipq install -q -c "$HERE/torch-pin.txt" -e "$TARGET_PATH[nlp]" || die "pip install -e $TARGET_PATH[nlp] failed"
  drop_broken_torchvision
  # the real aitoolbox must not be importable here, or an identity entry could hide a gap
  if "$VENV/bin/python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("aitoolbox") is None)' 2>/dev/null; then
    log "removing an installed 'aitoolbox' from the harness venv (target runs must not see it)"
    pipq uninstall -q -y aitoolbox || true
  fi
  TARGET_DESC="$TARGET_PATH"
fi
if [[ $MAPPING != compat ]]; then
  [[ -f $MAPPING ]] || die "mapping file $MAPPING not found"
  MAPPING=$(cd "$(dirname "$MAPPING")" && pwd)/$(basename "$MAPPING")
fi

RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/aitoolbox-suite-run.XXXXXX")
cleanup() { if [[ $KEEP == 0 ]]; then rm -rf "$RUN_DIR"; fi; }
trap cleanup EXIT

# extract the selected tests/test_<folder> trees from the wheel; add our own tests/__init__.py, utils.py,
# setup_moto_env.py (fakes/: the wheel does not ship them)
"$VENV/bin/python" - "$WHEEL" "$RUN_DIR" "${FOLDERS[@]}" <<'PYEOF'
import sys, zipfile
wheel, dest, folders = sys.argv[1], sys.argv[2], sys.argv[3:]
prefixes = tuple(f'tests/test_{folder}/' for folder in folders)
n = 0
with zipfile.ZipFile(wheel) as zf:
    for name in zf.namelist():
        if name.startswith(prefixes):
            zf.extract(name, dest)
            n += 1
if n == 0:
    sys.exit('no test files extracted from the wheel')
PYEOF
cp "$HERE/fakes/__init__.py" "$HERE/fakes/utils.py" "$HERE/fakes/setup_moto_env.py" "$RUN_DIR/tests/"
printf '[pytest]\npython_files = test_*.py\n' > "$RUN_DIR/pytest.ini"

# left out of every group unless --with-broken: what the original itself fails today, and the Keras tests
ID_ARGS=(--broken "$HERE/lists/oracle_broken.txt" --broken "$HERE/lists/keras.txt")
if [[ $WITH_BROKEN == 1 ]]; then ID_ARGS+=(--with-broken); fi
PATHS=()
for folder in "${FOLDERS[@]}"; do
  ID_ARGS+=(--ids "$HERE/lists/$folder.txt" --internal "$HERE/lists/${folder}_internal.txt")
  PATHS+=("tests/test_$folder")
done
if has_folder torchtrain; then
  # test_e2e_ff_net_train_loop_model_weights loads resources/{init_model,trained_model_e5}.pth, which the
  # wheel does not ship: build them once with the original aitoolbox (harness/make_e2e_resources.py)
  RES_DIR=$CACHE/e2e-resources/$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')
  if [[ ! -f $RES_DIR/trained_model_e5.pth ]]; then
    log "building e2e reference weights with the original aitoolbox -> $RES_DIR"
    ( cd "$RUN_DIR" && CUDA_VISIBLE_DEVICES="" PYTHONPATH="$HERE/harness:$ORACLE_SITE" \
        AITB_ALIAS_MAPPING="$HERE/mapping.aitoolbox.toml" AITB_ORACLE_SITE="$ORACLE_SITE" MPLBACKEND=Agg \
        "$VENV/bin/python" "$HERE/harness/make_e2e_resources.py" "$RES_DIR" ) > "$RUN_DIR/make_e2e_resources.log" 2>&1 9>&- \
      || { tail -5 "$RUN_DIR/make_e2e_resources.log" >&2; die "could not build the e2e reference weights"; }
  fi
  mkdir -p "$RUN_DIR/tests/test_torchtrain/test_train_loop/test_e2e_train_loop/resources"
  cp "$RES_DIR/init_model.pth" "$RES_DIR/trained_model_e5.pth" \
     "$RUN_DIR/tests/test_torchtrain/test_train_loop/test_e2e_train_loop/resources/"
fi
if has_folder cloud; then
  # test_data_access uploads and downloads resources/ (file.txt, upload_folder/{file_2,some_file}.txt), which the
  # wheel does not ship either; the tests compare contents and key names only, so fakes/cloud_resources has
  # files of our own under those names
  cp -r "$HERE/fakes/cloud_resources" "$RUN_DIR/tests/test_cloud/test_AWS/resources"
fi
# tests outside the selected group are dropped by exact node id (harness/aitb_pytest.py)
"$VENV/bin/python" "$HERE/harness/summarize.py" --report /dev/null "${ID_ARGS[@]}" --group "$GROUP" \
    --print-selection > "$RUN_DIR/deselect.txt"

# ---------------------------------------------------------------- run
export PYTHONPATH=$HERE/harness
if [[ $ORACLE == 1 ]]; then PYTHONPATH=$PYTHONPATH:$ORACLE_SITE; fi
export AITB_ALIAS_MAPPING=$MAPPING
if [[ $STRICT == 1 ]]; then export AITB_ALIAS_UNMAPPED=error; else unset AITB_ALIAS_UNMAPPED; fi
export AITB_REPORT_JSON=$RUN_DIR/report.jsonl
export AITB_DESELECT_FILE=$RUN_DIR/deselect.txt
XDIST=()
if [[ $JOBS -gt 1 ]]; then
  XDIST=(-n "$JOBS" --dist loadscope)   # scopes = directories, see harness/aitb_pytest.py
  export AITB_XDIST_GROUPS=1
else
  unset AITB_XDIST_GROUPS
fi
export CUDA_VISIBLE_DEVICES=""          # CPU semantics everywhere, also on a GPU machine
export MPLBACKEND=Agg
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1
export AWS_EC2_METADATA_DISABLED=true   # no credential lookups off this machine
export WANDB_MODE=disabled WANDB_SILENT=true

log "target: $TARGET_DESC"
log "alias table: $MAPPING (unmapped names: $([[ $STRICT == 1 ]] && echo 'error at import' || echo 'per table, default defer'))"
log "folders: ${FOLDERS[*]}, group: $GROUP, jobs: $JOBS ($(grep -c . "$RUN_DIR/deselect.txt" || true) tests deselected), tests in $RUN_DIR"
T1=$(date +%s)
set +e
( cd "$RUN_DIR" && timeout -k 30 "${AITB_RUN_TIMEOUT:-1800}" "$VENV/bin/python" -m pytest \
    -p aitb_pytest -p no:cacheprovider --continue-on-collection-errors \
    --timeout "${AITB_TEST_TIMEOUT:-600}" --timeout-method signal \
    -q -rN --tb=short "${XDIST[@]}" "${PATHS[@]}" "${EXTRA[@]}" ) > "$RUN_DIR/pytest.log" 2>&1 9>&-
PYTEST_RC=$?
set -e
T2=$(date +%s)
log "pytest exit $PYTEST_RC after $((T2 - T1)) s (setup $((T1 - T0)) s); pytest says: $(grep -E '(passed|failed|error|no tests ran)' "$RUN_DIR/pytest.log" | tail -1)"
if [[ $KEEP == 1 ]]; then log "kept $RUN_DIR (pytest.log, report.jsonl, failures.tsv)"; fi

set +e
"$VENV/bin/python" "$HERE/harness/summarize.py" --report "$RUN_DIR/report.jsonl" "${ID_ARGS[@]}" \
    --group "$GROUP" --failures-out "$RUN_DIR/failures.tsv"
SUM_RC=$?
set -e
if [[ $SUM_RC -gt 1 ]]; then exit 2; fi
if [[ $EXIT_ZERO == 1 ]]; then exit 0; fi
exit $SUM_RC
