"""The SLO guard under bursty traffic (issue 45): attainment and JCT against the
burstiness of a service's arrivals, before and after the guard sizes for it.

Workloads: DeepBoot's ``middle.csv``'s 160 training jobs (its inference rows
dropped) plus one generated service shaped like the issue's held-out setting
(``deepboot workload bursty``): one request per replica, a 28 GB model, a 1 s SLO,
a mean of 2.6 requests/s over 8 hours, every request ``--duration-s`` long (default
2 s: an LLM answer of a few hundred tokens), a cold start of ``--cold-start`` (30 s),
at dispersions of one-second counts 1, 3, 10 and 30 (compound Poisson, geometric
batches; one seeded stream per dispersion, the same for every run). 16x4 GPUs with
8 inference nodes, measured profiles, rounds every ``--interval`` seconds (30, the
recommended configuration's), each inference node's host cache holding the model
(preloaded, 32 GB).

Runs (Pollux's allocator throughout, as the recommended configuration):

- ``dedicated``: ``pollux:no-lending,no-afe`` (the inference pool never lent);
- ``slo-poisson``: the guard sized as if arrivals were Poisson (before issue 45);
- ``slo``: the guard sized for the measured burstiness (Hayward; after);
- ``warm-pool``: the non-clairvoyant reference (Erlang-B replicas at the true mean
  load, held warm, never lent);
- ``oracle``: the clairvoyant reference.

K replications each (``--replications``, default 5): replication i draws the
stream again (seed ``--seed`` + i) and jitters the *training* submissions by
+-30 s (numpy seed i), with policy seed i; the requests keep their batches (the
matrix's own replications jitter every arrival, which would spread each burst
over a minute and leave Poisson traffic). Means with 95% intervals.

    .venv/bin/python bench/bursty.py --procs 2                 # 100 runs
    .venv/bin/python bench/bursty.py --quick --dispersions 10  # one replication, D = 10
"""

# ruff: noqa: E402  (BLAS threads must be limited before numpy is imported)
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import csv
import dataclasses
import json
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matrixbench import Ticker, add_matrix_flags, bench_task, matrix_setup, summary_value
from rich.console import Console
from rich.table import Table

from deepboot.core.servicefile import dump_services
from deepboot.matrix import parse_run, run_matrix
from deepboot.report.stats import Interval, mean_interval
from deepboot.sim.traces.bursty import BurstyConfig, bursty_stream
from deepboot.sim.traces.common import request_rows
from deepboot.sim.workload import DEEPBOOT_COLUMNS

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
DISPERSIONS = (1.0, 3.0, 10.0, 30.0)
CACHE = "host-cache-gb=32,host-cache-preload"
RUNS = (
    ("dedicated", "pollux:no-lending,no-afe"),
    ("slo-poisson", f"pollux:slo,slo-poisson,{CACHE}"),
    ("slo", f"pollux:slo,{CACHE}"),
    ("warm-pool", f"pollux:warm-pool,{CACHE}"),
    ("oracle", f"pollux:oracle,{CACHE}"),
)


def write_workload(
    folder: Path, dispersion: float, args: argparse.Namespace, replication: int
) -> tuple[Path, Path]:
    """middle.csv's training rows (jittered for ``replication``) plus the generated
    service at ``dispersion`` (drawn for it): the workload CSV and its services file."""
    config = BurstyConfig(
        service="llm",
        model="llm-28gb",
        mean_rps=args.mean_rps,
        dispersion=dispersion,
        duration_s=args.duration_s,
        hours=args.hours,
        cold_start_s=args.cold_start,
        model_gb=28.0,
        slo_wait_s=1.0,
    )
    stream = bursty_stream(config, np.random.default_rng(args.seed + replication))
    print(f"D={dispersion:g} #{replication}: {stream.summary}", file=sys.stderr)
    stem = f"middle-bursty-{dispersion:g}-{replication}"
    workload = folder / f"{stem}.csv"
    with (TRACES / "workloads" / "middle.csv").open(newline="") as f:
        training = [r for r in csv.DictReader(f) if not r["application"].startswith("infer")]
    if replication:
        rng = np.random.default_rng(replication)
        for r in training:
            r["time"] = f"{max(float(r['time']) + rng.uniform(-30.0, 30.0), 0.0):.3f}"
    with workload.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(DEEPBOOT_COLUMNS)
        for r in training:
            w.writerow([r.get(c, "") or ("-1" if c in ("duration", "num_task") else "")
                        for c in DEEPBOOT_COLUMNS])  # fmt: skip
        w.writerows(request_rows(stream.requests))
    services = folder / f"{stem}.toml"
    services.write_text(dump_services(stream.services, list(stream.notes)), "utf-8")
    return workload, services


def _pm(iv: Interval, scale: float = 1.0, digits: int = 0) -> str:
    text = f"{iv.mean * scale:,.{digits}f}"
    return text if iv.n < 2 else f"{text} ± {iv.half * scale:,.{digits}f}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_matrix_flags(ap, TRACES)
    ap.add_argument(
        "--dispersions", default=",".join(f"{d:g}" for d in DISPERSIONS),
        help="the dispersions to run, comma-separated (default 1,3,10,30)",
    )  # fmt: skip
    ap.add_argument("--mean-rps", type=float, default=2.6)
    ap.add_argument("--duration-s", type=float, default=2.0)
    ap.add_argument("--cold-start", type=float, default=30.0)
    ap.add_argument("--hours", type=float, default=8.0)
    ap.add_argument("--interval", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1, help="seed of the generated streams")
    ap.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    args = ap.parse_args(argv)
    reps, out = matrix_setup(ap, args, TRACES, "bursty-")
    out.mkdir(parents=True, exist_ok=True)
    chosen = [float(d) for d in args.dispersions.split(",") if d.strip()]
    cells = []
    for d in chosen:
        for r in range(reps):
            workload, services = write_workload(out, d, args, r)
            for name, text in RUNS:
                run = parse_run(f"{name}={text}")
                task = bench_task(len(cells), workload, f"D={d:g}", run, services,
                                  args.profiles, 0, 1, ("16x4", 8), args.interval)  # fmt: skip
                cells.append((d, name, dataclasses.replace(task, seed=r)))
    started = time.perf_counter()
    outcomes = run_matrix([t for _, _, t in cells], args.procs, Ticker(len(cells)))
    samples: dict[tuple[float, str], list[dict]] = defaultdict(list)
    for (d, name, _), outcome in zip(cells, outcomes, strict=True):
        if outcome.error:
            print(f"D={d:g} {name}: {outcome.error}", file=sys.stderr)
            continue
        samples[(d, name)].append(outcome.summary)
        (out / "summaries").mkdir(exist_ok=True)
        tag = f"D{d:g}-{name}-{len(samples[(d, name)])}"
        (out / "summaries" / f"{tag}.json").write_text(json.dumps(outcome.summary, indent=1))
    headers = ("D", "run", "avg JCT (s)", "attainment (%)", "p99 wait (s)", "cold starts",
               "host starts", "reclaims", "lent GPU-h")  # fmt: skip
    rows = []
    for d in chosen:
        for name, _ in RUNS:
            ss = samples.get((d, name), [])
            if not ss:
                continue
            jct = mean_interval([summary_value(s, "training.avg_jct_s") for s in ss])
            att = mean_interval([summary_value(s, "inference.slo_attainment") for s in ss])

            def mean(path: str, ss: list[dict] = ss) -> float:
                return sum(summary_value(s, path) for s in ss) / len(ss)

            host = sum(s["inference"].get("host_starts", 0) for s in ss) / len(ss)
            rows.append([
                f"{d:g}", name, _pm(jct), _pm(att, 100, 2), f"{mean('inference.p99_delay_s'):.2f}",
                f"{mean('inference.cold_starts'):,.0f}", f"{host:,.0f}",
                f"{mean('cluster.reclaims'):,.0f}", f"{mean('cluster.lent_gpu_s') / 3600:,.1f}",
            ])  # fmt: skip
    table = Table(title=f"The guard under bursts: {reps} replication(s), 95% intervals")
    for h in headers:
        table.add_column(h, justify="left" if h == "run" else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=160).print(table)
    print(f"{len(cells)} runs in {time.perf_counter() - started:.0f} s; outputs in {out}")
    if args.markdown:
        print("| " + " | ".join(headers) + " |")
        print("|" + "---|" * len(headers))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
