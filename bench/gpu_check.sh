#!/usr/bin/env bash
# The GPU check: proves deepboot's GPU paths on this machine in one command, from a
# clean checkout, and writes a report (docs/runtime.md "GPU paths" says what it covers).
#
#   bash bench/gpu_check.sh            # or: make gpu-check
#
# 1. The virtualenv (.venv) with the test and runtime extras and a torch that sees the
#    GPUs: the machine's own when its python3 has one that sees CUDA (the venv then
#    uses the system's packages, and keeps that torch), else the one pip finds for
#    torch==2.13.0 (PyPI's Linux build is a CUDA one). TORCH_SPEC overrides it, e.g.
#    TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128".
# 2. make test-gpu, with a JUnit report: every test passes, fails, or skips saying why
#    (too few CUDA devices, none at all).
# 3. The reclaim benchmark on the GPUs (bench/reclaim.py --cache): its cluster has 4
#    GPUs (1 training + 1 inference node x 2), so it runs with 4 CUDA devices or more;
#    with fewer the report says so, and the one-GPU test's figures stand for it.
# 4. bench/gpu_report.py: out/gpu-check/report.md and report.json (pass/skip per test
#    with reasons, the figures: copy rates, restore time, resize pauses).
#
# Without network (a lent machine often has none) the install uses what the machine
# has: pip without an index and without build isolation, else deepboot from the
# checkout itself (PYTHONPATH) when its dependencies import; if none of that works,
# the report says why. Exit status: 0 when nothing failed; 1 when a test failed, the
# install failed, or the machine has GPUs (nvidia-smi lists them) and no GPU test
# passed (a CPU build of torch, a driver too old for it). Skips on a machine without
# GPUs are not failures. Under 10 minutes on one GPU once the packages are installed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${GPU_CHECK_OUT:-out/gpu-check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
rm -f "$OUT/junit.xml" "$OUT/report.md" "$OUT/report.json"  # never a previous run's
log() { printf '[gpu-check %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
gpus_listed=0
if command -v nvidia-smi >/dev/null; then
  gpus_listed=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
expect=()
[ "$gpus_listed" -gt 0 ] && expect=(--expect-gpus)
# The report of a check that stopped before its tests (uses only python3).
stopped() {
  log "stopped: $1"
  local p
  for p in "$PY" python3; do
    if "$p" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      "$p" bench/gpu_report.py --junit /dev/null --out "$OUT" --machine \
        "${machine:-this machine}" --failed-before "$1" "${expect[@]}" >/dev/null
      break
    fi
  done
  [ -s "$OUT/report.md" ] || printf 'GPU check: stopped before the tests: %s\n' "$1" > "$OUT/report.md"
  log "report: $OUT/report.md"
  exit 1
}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  stopped "$PY is not Python 3.11 or later (set PYTHON=python3.11 or newer)"
fi

# -- 1. packages -----------------------------------------------------------------------
system_cuda=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
if [ ! -x .venv/bin/python ]; then
  if [ "$system_cuda" = 1 ] && [ -z "${TORCH_SPEC:-}" ]; then
    log "using the machine's torch (it sees CUDA): a virtualenv over the system's packages"
    "$PY" -m venv --system-site-packages .venv || stopped "could not create .venv"
  else
    "$PY" -m venv .venv || stopped "could not create .venv"
  fi
fi
pip() { .venv/bin/python -m pip install -q "$@"; }
if [ ! -e .venv/.installed-runtime ] || [ -n "${TORCH_SPEC:-}" ]; then
  # The project's pins, but not torch's: the machine's or TORCH_SPEC's torch stays.
  grep -v '^torch==' constraints.txt > "$OUT/constraints-gpu.txt"
  if [ -n "${TORCH_SPEC:-}" ]; then
    log "installing $TORCH_SPEC"
    # shellcheck disable=SC2086 # TORCH_SPEC is words (a requirement and pip options)
    pip $TORCH_SPEC || stopped "pip could not install $TORCH_SPEC"
  elif ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    log "installing torch==2.13.0 (the build pip finds)"
    pip torch==2.13.0 || log "pip could not install torch (no network?): going on without"
  fi
  log "installing deepboot with the runtime and test extras"
  if pip -c "$OUT/constraints-gpu.txt" -e '.[runtime,test]' \
    || pip --no-index --no-build-isolation -e '.[runtime,test]'; then
    pip --no-deps -e examples/plugin || true
    # make's stamps, so that a later make test-gpu does not reinstall (its rule pins
    # the CPU build's torch).
    touch .venv/.installed .venv/.installed-test .venv/.installed-runtime
  else
    # No index to reach: deepboot from the checkout, if what it needs imports.
    log "pip could not install deepboot (no network?): deepboot from the checkout (PYTHONPATH)"
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
missing=$(.venv/bin/python - <<'PYEOF' 2>&1
import importlib
gone = []
for name in ("deepboot", "torch", "ray", "aiohttp", "numpy", "scipy", "pytest"):
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001
        gone.append(f"{name} ({type(exc).__name__})")
print(", ".join(gone))
PYEOF
)
[ -z "$missing" ] || stopped "cannot import: $missing"
torch_line=$(.venv/bin/python -c 'import torch; c=torch.cuda.is_available(); print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count() if c else 0} device(s) seen")' 2>&1 | tail -1)
gpus=$(.venv/bin/python -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
if [ "$gpus_listed" -gt 0 ]; then
  cards=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd ';' -)
  [ "$gpus" -gt 0 ] || log "this machine has $gpus_listed NVIDIA GPU(s), but the torch in .venv" \
    "sees none (a CPU build?): rerun with TORCH_SPEC='torch==2.13.0 --index-url" \
    "https://download.pytorch.org/whl/cu128' (your CUDA's), or remove .venv"
else
  cards="no NVIDIA GPU listed"
fi
machine="$cards; $(nproc) CPU cores; $torch_line"
log "machine: $machine"

# -- 2. the GPU tests: make test-gpu's command -----------------------------------------
log "the GPU tests (make test-gpu)"
.venv/bin/python -m pytest -q -rs -m gpu -p no:cacheprovider -o junit_family=xunit1 tests/gpu \
  --junitxml="$OUT/junit.xml" 2>&1 | tee "$OUT/test-gpu.txt"
tests_status=${PIPESTATUS[0]}
[ -s "$OUT/junit.xml" ] || stopped "pytest wrote no report (exit $tests_status; $OUT/test-gpu.txt)"

# -- 3. the reclaim benchmark ----------------------------------------------------------
if [ "$gpus" -ge 4 ]; then
  log "bench/reclaim.py --cache on CUDA devices 0-3"
  timeout 420 .venv/bin/python bench/reclaim.py --cache --reclaims 3 --cuda-devices 0,1,2,3 \
    > "$OUT/reclaim.txt" 2>&1 || echo "(ended with status $?)" >> "$OUT/reclaim.txt"
else
  echo "not run: its cluster has 4 GPUs (1 training + 1 inference node x 2, a job of up to" \
    "4 NCCL ranks, which cannot share a device); this machine has $gpus CUDA device(s)." \
    "The one-GPU test's figures (copy rates, restore time) stand for it." > "$OUT/reclaim.txt"
fi

# -- 4. the report ---------------------------------------------------------------------
.venv/bin/python bench/gpu_report.py --junit "$OUT/junit.xml" --out "$OUT" \
  --machine "$machine" --reclaim "$OUT/reclaim.txt" "${expect[@]}"
status=$?
[ "$tests_status" -le 1 ] || status=1  # pytest itself broke (2: interrupted, 3: internal...)
log "report: $OUT/report.md"
exit "$status"
