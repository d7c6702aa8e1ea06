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
# Exit status: 0 when nothing failed (skips are not failures), 1 when a test failed.
# Under 10 minutes on one GPU once the packages are installed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${GPU_CHECK_OUT:-out/gpu-check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
log() { printf '[gpu-check %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

# -- 1. packages -----------------------------------------------------------------------
system_cuda=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
if [ ! -x .venv/bin/python ]; then
  if [ "$system_cuda" = 1 ] && [ -z "${TORCH_SPEC:-}" ]; then
    log "using the machine's torch (it sees CUDA): a virtualenv over the system's packages"
    "$PY" -m venv --system-site-packages .venv || exit 2
  else
    "$PY" -m venv .venv || exit 2
  fi
fi
venv_cuda=$(.venv/bin/python -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
if [ ! -e .venv/.installed-runtime ] || [ -n "${TORCH_SPEC:-}" ]; then
  # The project's pins, but not torch's: the machine's or TORCH_SPEC's torch stays.
  grep -v '^torch==' constraints.txt > "$OUT/constraints-gpu.txt"
  if [ -n "${TORCH_SPEC:-}" ]; then
    log "installing $TORCH_SPEC"
    # shellcheck disable=SC2086 # TORCH_SPEC is words (a requirement and pip options)
    .venv/bin/python -m pip install -q $TORCH_SPEC || exit 2
  elif [ "$venv_cuda" != 1 ] && ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    log "installing torch==2.13.0 (the build pip finds)"
    .venv/bin/python -m pip install -q torch==2.13.0 || exit 2
  fi
  log "installing deepboot with the runtime and test extras"
  .venv/bin/python -m pip install -q -c "$OUT/constraints-gpu.txt" -e '.[runtime,test]' || exit 2
  .venv/bin/python -m pip install -q --no-deps -e examples/plugin || exit 2
  # make's stamps: test-gpu must not reinstall (its rule pins the CPU build's torch).
  touch .venv/.installed .venv/.installed-test .venv/.installed-runtime
fi
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 \
  && ! .venv/bin/python -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  log "this machine has NVIDIA GPUs, but the torch in .venv sees none (a CPU build?):" \
    "rerun with TORCH_SPEC='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128'" \
    "(your CUDA's), or remove .venv; the tests will skip"
fi
torch_line=$(.venv/bin/python -c 'import torch; c=torch.cuda.is_available(); print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count() if c else 0} device(s) seen")' 2>&1 | tail -1)
gpus=$(.venv/bin/python -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
if command -v nvidia-smi >/dev/null; then
  cards=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd ';' -)
else
  cards="no nvidia-smi"
fi
machine="${cards:-no GPU listed}; $(nproc) CPU cores; $torch_line"
log "machine: $machine"

# -- 2. the GPU tests ------------------------------------------------------------------
log "make test-gpu"
make test-gpu GPU_PYTEST_ARGS="--junitxml=$OUT/junit.xml" 2>&1 | tee "$OUT/test-gpu.txt"

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
  --machine "$machine" --reclaim "$OUT/reclaim.txt"
status=$?
log "report: $OUT/report.md"
exit "$status"
