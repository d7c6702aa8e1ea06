# Front door. `make demo` and `make test` work on a clean clone with only python3
# (>= 3.11) and a package registry: the virtualenv is created on first use.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The demo: DeepBoot against the training-pool-only baseline on a small cluster whose
# last DEMO_INFERENCE_NODES nodes form the inference pool, on a shipped workload with
# a day of inference traffic (examples/make_demo_workload.py writes it). Under a
# minute, figures included (matplotlib is in the base install).
DEMO_WORKLOAD        := examples/demo-deepboot.csv
DEMO_CLUSTER         := 4x4
DEMO_INFERENCE_NODES := 2
DEMO_OUT             := out/demo

.PHONY: demo demo-runtime test test-slow test-determinism test-runtime test-gpu gpu-check test-browser runtime-install lint clean-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Stamps: reinstall only when pyproject.toml changes (the install is editable).
# constraints.txt pins every version, so that CI and a fresh clone get the same.
$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install -q -c constraints.txt -e .
	touch $@

# The tests also cover the example policy plug-in (examples/plugin): installed beside
# deepboot (--no-deps: deepboot is its only requirement), it must pass the contract
# tests every registered policy passes.
$(VENV)/.installed-test: pyproject.toml constraints.txt examples/plugin/pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	$(BIN)/python -m pip install -q --no-deps -e examples/plugin
	touch $@ $(VENV)/.installed

# The runtime extra: torch first, pinned to the CPU build that lies on disk here (a
# plain 'torch' would pull a CUDA build of several GB), then ray.
$(VENV)/.installed-runtime: pyproject.toml constraints.txt $(VENV)/.installed-test
	$(BIN)/python -m pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[runtime,test]'
	touch $@

runtime-install: $(VENV)/.installed-runtime

demo: $(VENV)/.installed
	$(BIN)/deepboot compare --workload $(DEMO_WORKLOAD) \
		--cluster $(DEMO_CLUSTER) --inference-nodes $(DEMO_INFERENCE_NODES) \
		--run guarded --run deepboot=deepboot --run pollux-only=pollux:no-lending,no-afe \
		--baseline pollux-only --out $(DEMO_OUT)
	@echo "HTML report: $(DEMO_OUT)/report.html"

# The runtime demo (after `make runtime-install`; no GPU needed): a local Ray cluster
# with --slo, a service whose replicas take ~15 s to start, an elastic job that can
# use twice the training pool, and a load with a lull, a ramp and a spike. It prints
# the job's size over time, the GPUs lent and reclaimed, the SLO attainment, draws
# the timeline from the event log, and stops the cluster. About 3 minutes.
DEMO_RUNTIME_OUT := out/demo-runtime

demo-runtime: $(VENV)/.installed-runtime
	$(BIN)/python examples/runtime/demo.py --out $(DEMO_RUNTIME_OUT)

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q

# pytest exits 5 when no test is selected; that is not a failure here.
test-slow: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -m slow || [ $$? -eq 5 ]

# Real Ray clusters and torch processes on this machine (logical GPUs, gloo on CPU).
# Two pytest processes (pytest-xdist), each with its own shared Ray clusters: the tests
# mostly wait (jobs that train, loads against cold starts), so two overlap on 2 cores
# (measured: about one core busy on average, 40 -> 24 minutes); four saturate both
# cores and slow the timed scenarios past their bounds (docs/benchmarks.md).
test-runtime: $(VENV)/.installed-runtime
	$(BIN)/python -m pytest -q -m "runtime and not slow and not browser" -p no:cacheprovider \
		-n 2 --dist worksteal

# The GPU paths (tests/gpu): a worker's cuda:<i>, NCCL groups re-formed at resizes, a
# replica's model on cuda restored from host memory, a worker beside a sleeping
# server. Each test skips, saying why, without the CUDA devices it needs; on a GPU
# machine bench/gpu_check.sh runs them and writes a report (docs/runtime.md "GPU paths").
test-gpu: $(VENV)/.installed-runtime
	$(BIN)/python -m pytest -q -rs -m gpu -p no:cacheprovider -o junit_family=xunit1 tests/gpu $(GPU_PYTEST_ARGS)

# On a GPU machine, from a clean checkout: its packages (a torch that sees the GPUs),
# make test-gpu, the reclaim benchmark on the GPUs, and out/gpu-check/report.md.
gpu-check:
	bash bench/gpu_check.sh

# The live dashboard in headless Chromium on a real local cluster (Debian's chromium
# and chromium-driver; selenium, the `browser` extra). Skipped without a browser,
# unless DEEPBOOT_REQUIRE_BROWSER=1 (.ci/run sets it once Chromium is installed).
$(VENV)/.installed-browser: pyproject.toml constraints.txt $(VENV)/.installed-runtime
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[runtime,test,browser]'
	touch $@

test-browser: $(VENV)/.installed-browser
	$(BIN)/python -m pytest -q -m browser -p no:cacheprovider

# The golden results must not depend on the SIMD kernels NumPy picks for this CPU:
# run them under each setting of NPY_DISABLE_CPU_FEATURES (a feature this CPU lacks
# makes its setting a no-op). The OpenBLAS variables are left alone on purpose.
NPY_FEATURE_SETTINGS := "" "AVX512_ICL" "AVX512_ICL X86_V4" "AVX512_ICL X86_V4 X86_V3"
DETERMINISM_TESTS := tests/sim/test_golden.py tests/sim/test_golden_summary.py tests/perf/test_detmath.py

test-determinism: $(VENV)/.installed-test
	@for features in $(NPY_FEATURE_SETTINGS); do \
		echo "== NPY_DISABLE_CPU_FEATURES=\"$$features\""; \
		NPY_DISABLE_CPU_FEATURES="$$features" $(BIN)/python -m pytest -q -p no:cacheprovider \
			$(DETERMINISM_TESTS) || exit 1; \
	done

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy deepboot

clean-venv:
	rm -rf $(VENV)
