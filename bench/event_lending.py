"""Decide on every event (issue 49, item 2): rounds only against the event-time top-up.

A GPU freed between rounds (a replica that ends its task, a reclaim's spare, a job that
finishes) waits for the next round to be lent; ``event-lending`` hands it out at the
event (``deepboot.policies.topup``). This runs, on the workloads of
``bench/frontier.py --host-cache`` (``small`` and ``middle`` with a 1 s SLO,
``examples/genai-day.csv`` with 5 s; 16x4 GPUs, 8 inference nodes, caches preloaded):

- ``limit``: Pollux on all 64 GPUs with the inference dropped;
- ``pollux-slo+cache``: Pollux's allocator with the SLO guard (target 0.99) and the
  host cache (the 1.052x of docs/benchmarks.md at 60 s rounds);
- ``guarded``: the recommended configuration (ATS-T under Pollux's objective, the
  guard at 0.99, the cache) at these rounds;
- each with ``+event``: the same with event-time lending.

Every cell is replicated (``--replications``, jittered workloads); the ratio to the
limit is paired by replication (the same jitter) and given with a 95% interval, and
so is each ``+event`` run's ratio to its round-only run. ::

    .venv/bin/python bench/event_lending.py --procs 2            # 75 runs, ~10 min
    .venv/bin/python bench/event_lending.py --only middle --quick  # a smoke test
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from frontier import TRACES, Workload, _expand, services_file, workloads
from matrixbench import Ticker, add_matrix_flags, matrix_setup, summary_value
from rich.console import Console
from rich.table import Table

from deepboot.matrix import run_matrix
from deepboot.report.stats import mean_interval

GUARDED = "deepboot:objective=power-mean,restart_delay=30,hysteresis=0.05,solver=core"


def runs(gb: float) -> list[tuple[str, str]]:
    """(name, run text) of each run, with a ``gb`` host cache per inference node."""
    guard = f"slo,slo-target=0.99,host-cache-gb={gb:g},host-cache-preload"
    base = [
        ("pollux-slo+cache", f"pollux:{guard}"),
        ("guarded", f"{GUARDED},{guard}"),
    ]
    out = [("limit", "pollux:no-inference")]
    for name, text in base:
        out += [(name, text), (f"{name}+event", f"{text},event-lending")]
    return out


def plan(
    folder: Path, works: Sequence[Workload], cache_gb: float, genai_gb: float
) -> list[tuple[Workload, str, str, str, Path]]:
    out = []
    for w in works:
        setting = "5s" if w.name == "genai-day" else "1s"
        gb = genai_gb if w.name == "genai-day" else cache_gb
        services = services_file(folder, w, setting)
        out += [(w, setting, name, text, services) for name, text in runs(gb)]
    return out


def _pm(xs: Sequence[float], fmt: str) -> str:
    if not xs:
        return "-"
    iv = mean_interval(xs)
    return f"{iv.mean:{fmt}} ± {iv.half:{fmt}}" if len(xs) > 1 else f"{iv.mean:{fmt}}"


def rows(samples: Mapping[tuple[str, str], dict[int, Mapping[str, Any]]]) -> list[list[str]]:
    """One row per (workload, run): JCT, paired ratio to the limit and to its
    round-only run, attainment, reclaims, lent GPU-hours."""
    out = []
    for (w, run), by_rep in samples.items():
        limit = samples.get((w, "limit"), {})
        plain = samples.get((w, run.removesuffix("+event")), {}) if run.endswith("+event") else {}
        jct = {r: summary_value(s, "training.avg_jct_s") for r, s in by_rep.items()}
        vs_limit = [
            jct[r] / summary_value(limit[r], "training.avg_jct_s") for r in jct if r in limit
        ]
        vs_plain = [
            jct[r] / summary_value(plain[r], "training.avg_jct_s") for r in jct if r in plain
        ]
        att = [100 * summary_value(s, "inference.slo_attainment") for s in by_rep.values()]
        inference = run != "limit"

        def mean(
            path: str, scale: float = 1.0, ss: Sequence[Mapping[str, Any]] = tuple(by_rep.values())
        ) -> float:
            return sum(summary_value(s, path) for s in ss) / len(ss) / scale

        out.append(
            [
                w,
                run,
                _pm(list(jct.values()), ",.0f"),
                _pm(vs_limit, ".3f") + "x" if vs_limit else "-",
                _pm(vs_plain, ".3f") + "x" if vs_plain else "-",
                _pm(att, ".2f") if inference else "-",
                f"{mean('cluster.reclaims'):,.0f}" if inference else "-",
                f"{mean('cluster.lent_gpu_s', 3600.0):,.1f}" if inference else "-",
            ]
        )
    return out


HEADERS = (
    "workload",
    "run",
    "avg JCT (s)",
    "vs limit",
    "vs round-only",
    "attainment (%)",
    "reclaims",
    "lent GPU-h",
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_matrix_flags(ap, TRACES)
    ap.add_argument("--only", default="", help="workloads whose name contains this")
    ap.add_argument("--interval", type=float, default=60.0, help="seconds between rounds (60)")
    ap.add_argument("--cache-gb", type=float, default=1.0, help="small and middle (1)")
    ap.add_argument("--genai-cache-gb", type=float, default=320.0, help="genai-day (320)")
    ap.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    ap.add_argument(
        "--runs", default="", help="only these runs, comma-separated (e.g. limit,guarded+event)"
    )
    args = ap.parse_args(argv)
    reps, out = matrix_setup(ap, args, TRACES, "deepboot-event-lending-")
    out.mkdir(parents=True, exist_ok=True)
    works = workloads(args.only)
    if not works:
        ap.error(f"--only {args.only!r} matches no workload (small, middle, genai-day)")
    chosen = plan(out, works, args.cache_gb, args.genai_cache_gb)
    if args.runs:
        wanted = set(args.runs.split(","))
        chosen = [c for c in chosen if c[2] in wanted]
        if not chosen:
            ap.error(f"--runs {args.runs!r} names no run ({', '.join(n for n, _ in runs(1))})")
    cells = _expand(chosen, args.profiles, reps, args.interval)
    print(f"{len(cells)} runs on {args.procs} processes", file=sys.stderr, flush=True)
    started = time.perf_counter()
    outcomes = run_matrix([c[4] for c in cells], args.procs, Ticker(len(cells), every=5))
    samples: dict[tuple[str, str], dict[int, Mapping[str, Any]]] = {}
    (out / "summaries").mkdir(exist_ok=True)
    failed = 0
    for (w, _setting, run, r, _), o in zip(cells, outcomes, strict=True):
        if o.error:
            failed += 1
            print(f"{w} {run} #{r}: {o.error}", file=sys.stderr)
            continue
        samples.setdefault((w, run), {})[r] = o.summary
        path = out / "summaries" / f"{w}--{run}#{r}.json"
        path.write_text(json.dumps(o.summary, indent=2) + "\n", encoding="utf-8")
    table = Table(
        title=f"Event-time lending, 16x4 GPUs (8 inference nodes), {args.interval:g} s rounds, "
        f"{reps} replication(s), ± 95% interval"
    )
    for h in HEADERS:
        table.add_column(h, justify="left" if h in ("workload", "run") else "right")
    body = rows(samples)
    for row in body:
        table.add_row(*row)
    Console(width=170).print(table)
    if args.markdown:
        print("| " + " | ".join(HEADERS) + " |")
        print("|" + "---|" * len(HEADERS))
        for row in body:
            print("| " + " | ".join(row) + " |")
    took = time.perf_counter() - started
    print(f"{len(cells) - failed} runs in {took:.0f} s; outputs in {out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
