"""DeepBoot headline and ablations (issue 3), one command.

Runs ``deepboot compare`` on DeepBoot's mixed workloads (``small.csv`` and
``middle.csv``) on 16 x 4 GPUs with 8 inference nodes and the measured profiles, with
the headline pair, the all-GPU limit and the ablations side by side:

    .venv/bin/python bench/deepboot_vs_baselines.py          # full matrix, both workloads (long)
    .venv/bin/python bench/deepboot_vs_baselines.py --quick  # headline runs, small.csv

The table is printed; results.csv and each run's summary land in ``--out``. It runs
the matrix through the library (``deepboot.compare``); for the figures and the HTML
report of the same runs, use ``deepboot compare`` with the same ``--run`` values.
"""

# ruff: noqa: E402  (BLAS threads must be limited before numpy is imported)
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console

import deepboot
from deepboot.report.csvout import write_results_csv
from deepboot.report.table import MatrixRow, matrix_table

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"

HEADLINE = (
    "deepboot=deepboot",
    # Ours beyond the paper: DeepBoot plus the predictive lending reserve, and Pollux's
    # allocator with DeepBoot's lending, lifecycle and AFE plus the reserve.
    "deepboot+=deepboot:reserve",
    "pollux+=pollux:reserve",
    # The paper's baseline: Pollux on the training pool alone, with the cold restarts of
    # a scheduler without AFE (as the reference artifact ran it).
    "pollux-only=pollux:no-lending,no-afe",
    "limit=pollux:no-inference",
)
ABLATIONS = (
    "pollux-only-afe=pollux:no-lending,afe",
    "deepboot-noafe=deepboot:no-afe",
    "deepboot-nolifecycle=deepboot:no-lifecycle",
    "deepboot-random=deepboot:ats-i=random",
    "deepboot-lyra=deepboot:ats-i=lyra",
    "deepboot-p8=deepboot:protect-factor=8",
    "deepboot-pack=deepboot:ats-i=ats-i-pack",
    "deepboot+random=deepboot:reserve,ats-i=random",
    # Each baseline without DeepBoot's parts (training pool only, cold restarts) and
    # with them (ATS-I lending, lifecycle, AFE), as the paper's ablation reports them.
    "pollux-lending=pollux",
    "afs-only=afs:no-lending,no-afe",
    "afs-lending=afs",
    "tiresias-only=tiresias:no-lending,no-afe",
    "tiresias-lending=tiresias",
    "optimus-only=optimus:no-lending,no-afe",
    "optimus-lending=optimus",
    "lyra=lyra",
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="the headline runs (deepboot, deepboot+, pollux+, pollux-only, limit) on small.csv",
    )
    ap.add_argument("--profiles", default=str(TRACES / "profiles"))
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "deepboot"))
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)

    workloads = ["small.csv"] if args.quick else ["small.csv", "middle.csv"]
    runs = HEADLINE if args.quick else HEADLINE + ABLATIONS
    started = time.perf_counter()
    cells = deepboot.compare(
        [TRACES / "workloads" / w for w in workloads],
        list(runs),
        cluster="16x4",
        inference_nodes=8,
        profiles=args.profiles,
        procs=args.procs,
    )
    wall_s = time.perf_counter() - started
    rows = [MatrixRow(c.workload, c.run, c.summary, c.reference) for c in cells if not c.error]
    out = Path(args.out)
    (out / "summaries").mkdir(parents=True, exist_ok=True)
    for c in cells:
        if not c.error:
            data = {**c.summary, "run": {"name": c.run, "spec": c.spec}}
            path = out / "summaries" / f"{c.workload}--{c.run}.json"
            path.write_text(json.dumps(data, indent=2) + "\n")
    write_results_csv(out / "results.csv", rows, {c.run: c.spec for c in cells})
    Console(width=250).print(matrix_table(rows, "pollux-only", f"Comparison ({len(rows)} runs)"))
    failed = [f"{c.run} on {c.workload}: {c.error}" for c in cells if c.error]
    for line in failed:
        print(f"failed: {line}", file=sys.stderr)
    print(f"wrote {out}/results.csv and {len(rows)} summaries in {wall_s:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
