"""Real inference workloads beside Pollux training (issue 19), one command.

Pollux workload-6's 160 training jobs on 16 x 4 GPUs, nodes 8-15 the inference pool,
measured profiles, each with one production inference stream scaled to a peak busy
fraction of the inference pool of 0.5 and of 0.8:

- ``genai``: the busiest 24 hours of the Alibaba GenAI 2026 text-to-image trace
  compressed to 8 hours (10 busiest models as services, the rest merged), cold starts
  drawn from the measured base-model loads (the commands of ``examples/genai-day.toml``);
- ``azure``: the Azure LLM 2023 conversation hour (its one hour, not tiled), durations
  from tokens with the loader's default cost model, concurrency 1 (one request per
  replica: the durations are batch-1 measurements, so a higher concurrency with the
  same durations would be optimistic, and at concurrency 8 a peak of 0.8 needs
  ~245,000 requests), the loader's estimated 20 s cold start.

Runs: ``pollux-only`` (the baseline, ``pollux:no-lending,no-afe``), ``deepboot``,
``deepboot+`` (``deepboot:reserve``), ``pollux+`` (``pollux:lending,reserve``) and
``limit`` (Pollux on every GPU with the inference removed, ``pollux:no-inference``).
Each runs K times (``--replications``, default 5): replication i has policy seed i and
every submission jittered by a draw in +-30 s, the same K workloads for every run (as
``deepboot compare --replications K``), so the JCT change against the baseline is
paired. The limit drops the inference rows, and every workload holds the same training
rows, so it is run once per replication and shown under each workload.

    .venv/bin/python bench/real_workloads.py --procs 2           # 5 replications
    .venv/bin/python bench/real_workloads.py --quick --procs 2   # 1 replication

The workloads are built with the loaders (``deepboot workload from-genai``,
``from-azure-llm``, ``compose``) into ``--out`` (default: a new temporary folder),
never into the repository; each run's summary lands in ``--out/summaries``, the table
in ``--out/table.csv``. Needs ``../shared/traces``. Sources, both CC-BY-4.0: Alibaba
cluster-trace-v2026-GenAI (github.com/alibaba/clusterdata; SoCC'25 / EuroSys'26) and
the Azure LLM inference trace 2023 (github.com/Azure/AzurePublicDataset; Patel et al.,
Splitwise, ISCA'24).
"""

# ruff: noqa: E402  (BLAS threads must be limited before numpy is imported)
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import csv
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matrixbench import Ticker, add_matrix_flags, bench_task, matrix_setup, summary_value
from rich.console import Console
from rich.table import Table

from deepboot.cli.main import main as deepboot_cli
from deepboot.matrix import RunOutcome, RunTask, parse_run, run_matrix
from deepboot.report.stats import Interval, mean_interval, paired_difference

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
GENAI = TRACES / "inference" / "alibaba-genai-2026"
AZURE = TRACES / "inference" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
TRAINING = TRACES / "workloads" / "pollux" / "workload-6.csv"
CLUSTER, INFERENCE_NODES = "16x4", 8
FRACTIONS = ("0.5", "0.8")
AZURE_CONCURRENCY = 1
BASELINE, LIMIT = "pollux-only", "limit"
RUNS = (
    f"{BASELINE}=pollux:no-lending,no-afe",
    "deepboot=deepboot",
    "deepboot+=deepboot:reserve",
    "pollux+=pollux:lending,reserve",
    f"{LIMIT}=pollux:no-inference",
)
STREAMS = {
    "genai": [
        "from-genai", "--trace", str(GENAI / "lora_request_trace.csv"),
        "--load-latency", str(GENAI / "basemodel_update_latency_anon.csv"),
        "--window", "busiest-24h", "--compress", "3", "--top", "10", "--seed", "1",
    ],
    "azure": [
        "from-azure-llm", "--trace", str(AZURE),
        "--concurrency", str(AZURE_CONCURRENCY), "--seed", "1",
    ],
}  # fmt: skip
"""The loader of each stream (``deepboot workload ...``, without ``--out``)."""


@dataclass(frozen=True, slots=True)
class Workload:
    """One composed workload: its name, CSV and services file."""

    name: str
    csv: Path
    services: Path


def _cli(argv: Sequence[str]) -> None:
    code = deepboot_cli(list(argv))
    if code != 0:
        raise SystemExit(f"deepboot {' '.join(argv)}: exit {code}")


def build_workloads(folder: Path) -> list[Workload]:
    """Each stream with the loaders, then workload-6 plus it at each peak busy fraction."""
    folder.mkdir(parents=True, exist_ok=True)
    built = []
    for stream, argv in STREAMS.items():
        raw = folder / f"{stream}-stream.csv"
        _cli(["workload", *argv, "--out", str(raw)])
        for fraction in FRACTIONS:
            name = f"{stream}-{fraction}"
            out = folder / f"w6-{name}.csv"
            _cli(["workload", "compose", "--training", str(TRAINING),
                  "--inference", str(raw), "--services", str(raw.with_suffix(".toml")),
                  "--cluster", CLUSTER, "--inference-nodes", str(INFERENCE_NODES),
                  "--peak-busy", fraction, "--seed", "1", "--out", str(out)])  # fmt: skip
            built.append(Workload(name, out, out.with_suffix(".toml")))
    return built


def make_tasks(
    workloads: Sequence[Workload], profiles: str, reps: int
) -> list[tuple[str, str, int, RunTask]]:
    """(workload, run, replication, task) of every cell; the limit on the first workload
    only (it drops the inference, and every workload has the same training rows)."""
    cells = []
    for i, w in enumerate(workloads):
        for text in RUNS:
            run = parse_run(text)
            if run.name == LIMIT and i > 0:
                continue
            for r in range(reps):
                task = bench_task(len(cells), w.csv, w.name, run, w.services, profiles, r, reps,
                                  (CLUSTER, INFERENCE_NODES))  # fmt: skip
                cells.append((w.name, run.name, r, task))
    return cells


COLUMNS: tuple[tuple[str, str, float], ...] = (
    ("inference.cold_starts", "cold starts", 1.0),
    ("inference.avg_delay_s", "avg wait (s)", 1.0),
    ("inference.p99_delay_s", "p99 wait (s)", 1.0),
    ("cluster.reclaims", "reclaims", 1.0),
    ("cluster.lent_gpu_s", "lent GPU-h", 1 / 3600),
)
"""(summary path, header, scale) of the columns shown as means over the replications."""


@dataclass(frozen=True, slots=True)
class Row:
    workload: str
    run: str
    jct: Interval
    diff: Interval | None
    relative: float | None
    means: Mapping[str, float] | None  # None: the limit (no inference)


def make_rows(
    workloads: Sequence[Workload], samples: Mapping[tuple[str, str], list[Mapping[str, Any]]]
) -> list[Row]:
    rows = []
    first = workloads[0].name
    for w in workloads:
        base = [summary_value(s, "training.avg_jct_s") for s in samples.get((w.name, BASELINE), [])]
        for text in RUNS:
            run = parse_run(text).name
            summaries = samples.get((first if run == LIMIT else w.name, run), [])
            if not summaries:
                continue
            jcts = [summary_value(s, "training.avg_jct_s") for s in summaries]
            diff = relative = None
            if run != BASELINE and len(jcts) == len(base):
                diff = paired_difference(jcts, base) if len(jcts) > 1 else None
                relative = (sum(jcts) - sum(base)) / sum(base)
            means = None
            if run != LIMIT:
                means = {
                    path: scale * sum(summary_value(s, path) for s in summaries) / len(summaries)
                    for path, _, scale in COLUMNS
                }
            rows.append(Row(w.name, run, mean_interval(jcts), diff, relative, means))
    return rows


def _pm(iv: Interval) -> str:
    return f"{iv.mean:,.0f}" if iv.n < 2 else f"{iv.mean:,.0f} ± {iv.half:,.0f}"


def _cells(row: Row) -> list[str]:
    if row.run == BASELINE:
        change = "base"
    elif row.relative is None:
        change = "-"
    else:
        change = f"{100 * row.relative:+.1f}%"
        if row.diff is not None:  # the paired difference's interval, as % of the baseline
            half = 100 * row.diff.half / (row.jct.mean - row.diff.mean)
            change = f"{100 * row.relative:+.1f} ± {half:.1f}%"
    cells = [row.workload, row.run, _pm(row.jct), change]
    for path, _, _ in COLUMNS:
        if row.means is None:
            cells.append("-")
        elif path.endswith("_delay_s"):
            cells.append(f"{row.means[path]:,.2f}")
        else:
            cells.append(f"{row.means[path]:,.1f}" if "lent" in path else f"{row.means[path]:,.0f}")
    return cells


HEADERS = ["workload", "run", "avg JCT (s)", f"JCT vs {BASELINE}"] + [h for _, h, _ in COLUMNS]


def rich_table(rows: Sequence[Row], reps: int) -> Table:
    title = (
        f"Pollux workload-6 + real inference, {CLUSTER}, {INFERENCE_NODES} inference nodes: "
        + (f"means over {reps} replications, JCT ± 95% interval" if reps > 1 else "one run")
    )
    table = Table(title=title, title_justify="left")
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i < 2 else "right")
    for row in rows:
        table.add_row(*_cells(row))
    return table


def markdown(rows: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|---|---|" + "---:|" * (len(HEADERS) - 2)]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in rows]
    return "\n".join(lines)


def write_outputs(
    out: Path, cells: Sequence[tuple[str, str, int, RunTask]], outcomes: Sequence[RunOutcome]
) -> None:
    (out / "summaries").mkdir(parents=True, exist_ok=True)
    for (workload, run, r, task), o in zip(cells, outcomes, strict=True):
        if o.error:
            continue
        data = {**o.summary, "run": {"name": run, "spec": task.run.text, "replication": r}}
        path = out / "summaries" / f"{workload}--{run}#{r}.json"
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def write_table_csv(path: Path, rows: Sequence[Row]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["workload", "run", "n", "avg_jct_s.mean", "avg_jct_s.half",
                         "diff_avg_jct_s.mean", "diff_avg_jct_s.half", "relative",
                         *(p for p, _, _ in COLUMNS)])  # fmt: skip
        for r in rows:
            diff = ["", ""] if r.diff is None else [repr(r.diff.mean), repr(r.diff.half)]
            means = (
                [""] * len(COLUMNS)
                if r.means is None
                else [repr(r.means[p]) for p, _, _ in COLUMNS]
            )
            rel = "" if r.relative is None else repr(r.relative)
            writer.writerow([r.workload, r.run, r.jct.n, repr(r.jct.mean), repr(r.jct.half),
                             *diff, rel, *means])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_matrix_flags(ap, TRACES)
    ap.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    args = ap.parse_args(argv)
    reps, out = matrix_setup(ap, args, TRACES, "deepboot-real-")

    started = time.perf_counter()
    workloads = build_workloads(out / "workloads")
    cells = make_tasks(workloads, args.profiles, reps)
    print(f"{len(cells)} runs on {args.procs} processes", file=sys.stderr, flush=True)
    outcomes = run_matrix([c[3] for c in cells], args.procs, Ticker(len(cells)))
    wall_s = time.perf_counter() - started

    samples: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    failed = 0
    for (workload, run, r, _), o in zip(cells, outcomes, strict=True):
        if o.error:
            failed += 1
            print(f"failed: {workload} {run}#{r}: {o.error}", file=sys.stderr)
        else:
            samples.setdefault((workload, run), []).append(o.summary)
    write_outputs(out, cells, outcomes)
    rows = make_rows(workloads, samples)
    write_table_csv(out / "table.csv", rows)
    Console(width=250).print(rich_table(rows, reps))
    print(
        f"JCT vs {BASELINE}: the change of the mean average JCT"
        + (", ± the 95% interval of the paired difference" if reps > 1 else "")
        + "; the other columns are means over the replications (p99 wait: the mean of "
        "each run's p99)."
    )
    if args.markdown:
        print(markdown(rows))
    print(f"wrote {out}/table.csv and {len(cells)} summaries in {wall_s:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
