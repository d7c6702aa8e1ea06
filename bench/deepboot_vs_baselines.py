"""DeepBoot headline and ablations (issue 3), one command.

Runs ``deepboot compare`` on DeepBoot's mixed workloads (``small.csv`` and
``middle.csv``) on 16 x 4 GPUs with 8 inference nodes and the measured profiles, with
the headline pair, the all-GPU limit and the ablations side by side:

    .venv/bin/python bench/deepboot_vs_baselines.py          # full matrix, both workloads (long)
    .venv/bin/python bench/deepboot_vs_baselines.py --quick  # headline runs, small.csv

The table, results.csv, figures and report.html land in ``--out``.
"""

# ruff: noqa: E402  (BLAS threads must be limited before numpy is imported)
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import sys
from pathlib import Path

from deepboot.cli.main import main as deepboot_main

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
    cmd = ["compare"]
    for w in workloads:
        cmd += ["--workload", str(TRACES / "workloads" / w)]
    for r in runs:
        cmd += ["--run", r]
    cmd += [
        "--cluster", "16x4", "--inference-nodes", "8", "--profiles", args.profiles,
        "--baseline", "pollux-only", "--out", args.out, "--procs", str(args.procs),
    ]  # fmt: skip
    return deepboot_main(cmd)


if __name__ == "__main__":
    sys.exit(main())
