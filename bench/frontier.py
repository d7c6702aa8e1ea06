"""The SLO frontier (issue 20): average training JCT against inference SLO attainment.

Every lending policy trades training JCT for inference SLO attainment; this bench puts
them on one plane, per workload and SLO setting, with 95% intervals on both axes:

- ``dedicated``: ``pollux:no-lending`` (the inference pool is never lent);
- ``deepboot-pP``: DeepBoot at protect factors P = 1, 2, 4, 8, 16;
- ``reserve-Q``: ``deepboot:reserve`` at targets Q = 0.5, 0.7, 0.9;
- ``pollux+``: ``pollux:lending,reserve``;
- ``warm-pool``: the non-clairvoyant reference (Erlang-B replicas at each service's
  true mean load, held warm and never lent; the rest as deepboot);
- ``slo-Q``: ``deepboot:slo`` at targets 0.9, 0.95, 0.99, and ``pollux-slo-0.99``
  (Pollux's allocator under the same guard, to set beside ``pollux+``);
- ``oracle``: the clairvoyant reference (``deepboot:oracle``).

Workloads: DeepBoot's ``small.csv`` and ``middle.csv`` (16x4, 8 inference nodes,
measured profiles) and ``examples/genai-day.csv`` (Pollux workload-6 plus a GenAI day,
Alibaba GenAI 2026, CC-BY-4.0). SLO settings: ``1s`` (every service's ``slo_wait_s``
1 s: the pre-warm regime, below every cold start but the GenAI's two shortest) and
``2xcold`` (twice each service's cold start: the relaxed regime). Each setting is a
services file written into ``--out`` (the cold starts of DeepBoot's artifact for
small/middle, ``examples/genai-day.toml``'s for genai-day). K replications
(``--replications``, default 5): replication i has policy seed i and submissions
jittered by +-30 s, the same K workloads for every run.

    .venv/bin/python bench/frontier.py --procs 2                 # 5 replications
    .venv/bin/python bench/frontier.py --quick --only small      # 1 replication, small
    .venv/bin/python bench/frontier.py --idle-sweep --procs 2    # the relaxed idle pool
    .venv/bin/python bench/frontier.py --host-cache --procs 2    # issue 23: host memory
    .venv/bin/python bench/frontier.py --host-cache --interval 30   # rounds every 30 s
    .venv/bin/python bench/frontier.py --host-cache --only azure-70b --procs 2  # 4-GPU replicas

Every run rounds every ``--interval`` seconds, the limits included (default 60:
Pollux's and DeepBoot's; with the host cache, 30 s rounds close most of the rest of
``middle``'s gap to the limit: docs/benchmarks.md, "30 s rounds").

``--host-cache`` (issue 23) runs instead, per workload: ``limit`` (Pollux on every
GPU, the inference dropped: the all-GPU limit the issue's probe ratios are against)
and ``limit-deepboot`` (DeepBoot's allocator so), ``slo-0.99`` and
``pollux-slo-0.99`` without and with the host cache (``+cache``: preloaded with the
services' models, ``--host-cache-preload``; ``pollux-slo-0.99+lazy``: the cache
filled only by evicted replicas), ``deepboot+cache``
(DeepBoot's reactive lending with the cache) and ``probe-0.5s`` (every cold start
set to 0.5 s, reactive DeepBoot without the replica lifecycle: the rough probe the
issue sets the bar by), in the ``1s`` setting; genai-day also in ``5s`` (every
``slo_wait_s`` 5 s: above its host start of 2.84 s, below five of its eleven cold
starts, 19-44 s: the SLO the cache makes reachable) and ``2xcold`` (its ``1s`` is
out of reach: its measured host start, below, exceeds 1 s, and the oracle attains
96%). The cache per inference node: ``--cache-gb`` on small and middle (default
1 GB: the catalog's six models total 1.0 GB), ``--genai-cache-gb`` on genai-day
(default 320 GB: all eleven of its models, 308 GB; 128 GB holds four). The GenAI
trace names no model sizes: each genai-day
service gets ``GENAI_MODEL_GB`` (28 GB, chosen so that a host start at the default
12 GB/s and 0.5 s init takes 2.84 s, the median of the fast mode of the trace's
measured base-model loads: 35% of them take under 8 s, median 2.84 s, the loads of
a model already in the node's memory).

Prints the table, the dominance check of ``--slo`` against deepboot, the reserve and
pollux+, and writes ``--out/frontier.csv``, ``--out/frontier.png`` (``--figure`` also
copies it, e.g. to docs/img/frontier.png) and each run's summary.
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
import math
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matrixbench import Ticker, add_matrix_flags, bench_task, matrix_setup, summary_value
from rich.console import Console
from rich.table import Table

from deepboot.core.service import ServiceSpec
from deepboot.core.servicefile import dump_services, load_services
from deepboot.matrix import RunTask, parse_run, run_matrix
from deepboot.report.stats import Interval, mean_interval
from deepboot.sim.config import DEEPBOOT_COLD_START

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
CLUSTER, INFERENCE_NODES = "16x4", 8
RUNS: tuple[tuple[str, str], ...] = (
    ("dedicated", "pollux:no-lending"),
    *((f"deepboot-p{p}", f"deepboot:protect-factor={p}") for p in (1, 2, 4, 8, 16)),
    *((f"reserve-{q}", f"deepboot:reserve-target={q}") for q in (0.5, 0.7, 0.9)),
    ("pollux+", "pollux:lending,reserve"),
    ("warm-pool", "deepboot:warm-pool"),
    *((f"slo-{q}", f"deepboot:slo,slo-target={q}") for q in (0.9, 0.95, 0.99)),
    ("pollux-slo-0.99", "pollux:slo,slo-target=0.99"),
    ("oracle", "deepboot:oracle"),
)
SLO_RUNS = ("slo-0.9", "slo-0.95", "slo-0.99", "pollux-slo-0.99")
RIVALS = tuple(n for n, _ in RUNS if n.startswith(("deepboot-p", "reserve-")) or n == "pollux+")
SETTINGS = ("1s", "2xcold")
AZURE_70B = "azure-70b"
"""``examples/azure-70b.csv``: one service of 4 GPUs a replica (a 70B-class model, 140
GB); run only when named (``--only azure-70b``), in the ``5s`` setting (its host
start, 3.4 s, meets it; its cold start, 90 s, does not), with ``--azure-cache-gb``."""
GENAI_MODEL_GB = 28.0
"""genai-day's ``model_gb`` for every service (see the module docstring)."""
PROBE_COLD_S = 0.5
"""``probe-0.5s``: every service's cold start, seconds."""


def cache_runs(gb: float) -> tuple[tuple[str, str, bool], ...]:
    """``--host-cache``'s runs, each (name, run text, with the probe's services).
    ``+cache``: the cache preloaded with the services' models; ``+lazy``: filled
    only by evicted replicas."""
    cache = f"host-cache-gb={gb:g},host-cache-preload"
    return (
        ("limit", "pollux:no-inference", False),
        ("limit-deepboot", "deepboot:no-inference", False),
        ("slo-0.99", "deepboot:slo,slo-target=0.99", False),
        ("slo-0.99+cache", f"deepboot:slo,slo-target=0.99,{cache}", False),
        ("pollux-slo-0.99", "pollux:slo,slo-target=0.99", False),
        ("pollux-slo-0.99+cache", f"pollux:slo,slo-target=0.99,{cache}", False),
        ("pollux-slo-0.99+lazy", f"pollux:slo,slo-target=0.99,host-cache-gb={gb:g}", False),
        ("deepboot+cache", f"deepboot:{cache}", False),
        ("probe-0.5s", "deepboot:no-lifecycle", True),
    )


IDLE_TARGETS = (0.5, 0.75, 0.9, 0.99)
IDLE_SWEEP: tuple[tuple[str, str], ...] = (
    ("deepboot-p1", "deepboot:protect-factor=1"),
    ("pollux+", "pollux:lending,reserve"),
    *((f"slo-idle-{q}", f"deepboot:slo,slo-target=0.99,slo-idle={q}") for q in IDLE_TARGETS),
)
"""``--idle-sweep``: the relaxed regime's idle pool at each target, beside DeepBoot
and pollux+ (the ``2xcold`` setting only)."""


@dataclass(frozen=True, slots=True)
class Workload:
    """One workload: its name, CSV and the base services (cold starts) of its rows."""

    name: str
    csv: Path
    services: tuple[ServiceSpec, ...]


def _deepboot_services(path: Path) -> tuple[ServiceSpec, ...]:
    """DeepBoot's rows name ``infer-<model>-<k>``: one service each, the artifact's
    cold start of its model."""
    names: dict[str, None] = {}
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            app = row["application"]
            if app.startswith("infer-"):
                names[app[len("infer-") :]] = None
    specs = []
    for name in names:
        model = name.rsplit("-", 1)[0]
        specs.append(ServiceSpec(name, model, cold_start_s=DEEPBOOT_COLD_START[model]))
    return tuple(specs)


def workloads(only: str) -> list[Workload]:
    out = [
        Workload(w, TRACES / "workloads" / f"{w}.csv", ()) for w in ("small", "middle") if only in w
    ]
    out = [dataclasses.replace(w, services=_deepboot_services(w.csv)) for w in out]
    if only in "genai-day":
        genai = REPO / "examples" / "genai-day.csv"
        out.append(Workload("genai-day", genai, load_services(genai.with_suffix(".toml"))))
    if only and only in AZURE_70B:  # asked for by name only (--only azure-70b)
        azure = REPO / "examples" / f"{AZURE_70B}.csv"
        out.append(Workload(AZURE_70B, azure, load_services(azure.with_suffix(".toml"))))
    return out


def _wait_s(setting: str, cold_start_s: float | None) -> float:
    """A service's ``slo_wait_s`` in ``setting``: ``2xcold``, or ``<seconds>s``."""
    if setting == "2xcold":
        return 2.0 * max(cold_start_s or 0.0, 0.5)
    return float(setting.removesuffix("s"))


def services_file(folder: Path, w: Workload, setting: str, probe: bool = False) -> Path:
    """``w``'s services with every ``slo_wait_s`` set for ``setting`` (genai-day's
    with their ``model_gb``); ``probe``: every cold start :data:`PROBE_COLD_S` too."""
    specs = [
        dataclasses.replace(
            s,
            slo_wait_s=_wait_s(setting, s.cold_start_s),
            model_gb=GENAI_MODEL_GB if w.name == "genai-day" else s.model_gb,
        )
        for s in w.services
    ]
    if probe:
        specs = [dataclasses.replace(s, cold_start_s=PROBE_COLD_S) for s in specs]
    stem = f"{w.name}-{setting}{'-probe' if probe else ''}"
    path = folder / f"{stem}.toml"
    path.write_text(dump_services(specs, [f"{w.name}, SLO setting {setting}"]), "utf-8")
    return path


def make_cells(
    folder: Path,
    works: Sequence[Workload],
    profiles: str,
    reps: int,
    runs: Sequence[tuple[str, str]] = RUNS,
    settings: Sequence[str] = SETTINGS,
    interval: float = 60.0,
) -> list[tuple[str, str, str, int, RunTask]]:
    plan = [
        (w, setting, name, text, services_file(folder, w, setting))
        for w in works
        for setting in settings
        for name, text in runs
    ]
    return _expand(plan, profiles, reps, interval)


def cache_cells(
    folder: Path,
    works: Sequence[Workload],
    profiles: str,
    reps: int,
    gb: float,
    genai_gb: float,
    interval: float = 60.0,
    azure_gb: float = 160.0,
) -> list[tuple[str, str, str, int, RunTask]]:
    """``--host-cache``'s cells (see the module docstring)."""
    plan = []
    sizes = {"genai-day": genai_gb, AZURE_70B: azure_gb}
    for w in works:
        settings = {"genai-day": ("1s", "5s", "2xcold"), AZURE_70B: ("5s",)}.get(w.name, ("1s",))
        for setting in settings:
            for name, text, probe in cache_runs(sizes.get(w.name, gb)):
                if setting != settings[0] and name.startswith(("limit", "probe")):
                    continue  # the same runs as in 1s (the probe meets both settings)
                plan.append((w, setting, name, text, services_file(folder, w, setting, probe)))
    return _expand(plan, profiles, reps, interval)


def _expand(
    plan: Sequence[tuple[Workload, str, str, str, Path]],
    profiles: str,
    reps: int,
    interval: float = 60.0,
) -> list[tuple[str, str, str, int, RunTask]]:
    """Each (workload, setting, run name, run text, services file) of ``plan``,
    ``reps`` times, with a round every ``interval`` seconds: (workload, setting,
    run, replication, task)."""
    cells: list[tuple[str, str, str, int, RunTask]] = []
    for w, setting, name, text, services in plan:
        run = parse_run(f"{name}={text}")
        for r in range(reps):
            task = bench_task(len(cells), w.csv, w.name, run, services, profiles, r, reps,
                              (CLUSTER, INFERENCE_NODES), interval)  # fmt: skip
            cells.append((w.name, setting, name, r, task))
    return cells


@dataclass(frozen=True, slots=True)
class Point:
    workload: str
    setting: str
    run: str
    jct: Interval
    attainment: Interval
    cold: float
    reclaims: float
    proactive: float
    lent_h: float
    host: float = 0.0


def points(samples: Mapping[tuple[str, str, str], list[Mapping[str, Any]]]) -> list[Point]:
    out = []
    for (w, setting, run), summaries in samples.items():

        def mean(path: str, ss: Sequence[Mapping[str, Any]] = summaries) -> float:
            return sum(summary_value(s, path) for s in ss) / len(ss)

        # A run without inference (``limit``) attains nothing: its interval is empty.
        attained = (
            mean_interval([summary_value(s, "inference.slo_attainment") for s in summaries])
            if all(s["inference"]["tasks"] for s in summaries)
            else Interval(math.nan, math.nan, 0)
        )

        out.append(
            Point(
                w,
                setting,
                run,
                mean_interval([summary_value(s, "training.avg_jct_s") for s in summaries]),
                attained,
                mean("inference.cold_starts"),
                mean("cluster.reclaims"),
                mean("inference.reclaims_proactive"),
                mean("cluster.lent_gpu_s") / 3600.0,
                sum(s.get("inference", {}).get("host_starts", 0) for s in summaries)
                / len(summaries),
            )
        )
    return out


def _pm(iv: Interval, fmt: str, scale: float = 1.0) -> str:
    if iv.n == 0:
        return "-"
    text = format(iv.mean * scale, fmt)
    return text if iv.n < 2 else f"{text} ± {format(iv.half * scale, fmt)}"


HEADERS = ("workload", "SLO", "run", "avg JCT (s)", "attainment (%)", "cold starts",
           "reclaims", "proactive", "lent GPU-h")  # fmt: skip


def cells_of(p: Point) -> list[str]:
    return [
        p.workload,
        p.setting,
        p.run,
        _pm(p.jct, ",.0f"),
        _pm(p.attainment, ".2f", 100.0),
        f"{p.cold:,.0f}",
        f"{p.reclaims:,.0f}",
        f"{p.proactive:,.0f}",
        f"{p.lent_h:,.1f}",
    ]


def dominance(pts: Sequence[Point]) -> list[list[str]]:
    """Per workload and setting, each rival: the ``--slo`` runs that dominate it
    (attainment >= and JCT <= by the means), and whether the JCT intervals overlap."""
    rows = []
    by = {(p.workload, p.setting, p.run): p for p in pts}
    for w, setting in dict.fromkeys((p.workload, p.setting) for p in pts):
        for rival in RIVALS:
            c = by.get((w, setting, rival))
            if c is None:
                continue
            wins = []
            for s in SLO_RUNS:
                p = by.get((w, setting, s))
                if p and p.attainment.mean >= c.attainment.mean and p.jct.mean <= c.jct.mean:
                    clear = p.jct.mean + p.jct.half < c.jct.mean - c.jct.half
                    wins.append(f"{s}{'' if clear else ' (JCT intervals overlap)'}")
            rows.append([w, setting, rival, "; ".join(wins) or "no"])
    return rows


def figure(pts: Sequence[Point], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((p.workload, p.setting) for p in pts))
    cols = len({p.setting for p in pts})
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.6 * rows), squeeze=False)
    style = {"dedicated": ("k", "s"), "warm-pool": ("tab:brown", "D"), "oracle": ("tab:red", "*"),
             "pollux+": ("tab:purple", "^")}  # fmt: skip
    for ax, (w, setting) in zip(axes.flat, panels, strict=False):
        # A limit (no inference) runs in one setting and stands under every one.
        here = [q for q in pts if (q.workload, q.setting) == (w, setting)]
        here += [q for q in pts if q.workload == w and q.attainment.n == 0 and q not in here]
        for p in here:
            if p.attainment.n == 0:  # no inference: the all-GPU limit, a line
                ax.axhline(p.jct.mean, color="k", linestyle="--", linewidth=1)
                ax.annotate(p.run, (0.01, p.jct.mean), xycoords=("axes fraction", "data"),
                            fontsize=7, xytext=(0, 3), textcoords="offset points")  # fmt: skip
                continue
            if p.run.startswith("deepboot-p"):
                color, marker = "tab:blue", "o"
            elif p.run.startswith("reserve-"):
                color, marker = "tab:cyan", "v"
            elif p.run.endswith("+cache") and "slo" in p.run:
                color, marker = "darkgreen", "*"
            elif p.run.endswith("+lazy"):
                color, marker = "yellowgreen", "*"
            elif p.run in SLO_RUNS or p.run.startswith("slo-idle-"):
                color, marker = "tab:green", "P"
            else:
                color, marker = style.get(p.run, ("gray", "x"))
            ax.errorbar(
                100 * p.attainment.mean, p.jct.mean,
                xerr=100 * p.attainment.half if p.attainment.n > 1 else None,
                yerr=p.jct.half if p.jct.n > 1 else None,
                color=color, marker=marker, markersize=7, capsize=2, linestyle="none",
            )  # fmt: skip
            ax.annotate(p.run, (100 * p.attainment.mean, p.jct.mean), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")  # fmt: skip
        ax.set_title(f"{w}, SLO {setting}")
        ax.set_xlabel("SLO attainment (%)  ->  better")
        ax.set_ylabel("average training JCT (s)  (lower is better)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


CACHE_HEADERS = ("workload", "SLO", "run", "avg JCT (s)", "vs limit", "attainment (%)",
                 "cold starts", "host starts", "reclaims", "proactive", "lent GPU-h")  # fmt: skip


def cache_rows(pts: Sequence[Point]) -> list[list[str]]:
    """``--host-cache``'s table: :func:`cells_of` plus host starts and JCT over the
    workload's ``limit``."""
    limits = {p.workload: p.jct.mean for p in pts if p.run == "limit"}
    # A limit runs once per workload, in 1s; it stands under every setting.
    rows = []
    for p in pts:
        cells = cells_of(p)
        limit = limits.get(p.workload)
        ratio = f"{p.jct.mean / limit:.3f}x" if limit else "-"
        rows.append([*cells[:4], ratio, *cells[4:6], f"{p.host:,.0f}", *cells[6:]])
    return rows


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    t = Table(title=title, title_justify="left")
    for i, h in enumerate(headers):
        t.add_column(h, justify="left" if i < 3 else "right")
    for r in rows:
        t.add_row(*r)
    return t


def markdown(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_matrix_flags(ap, TRACES)
    ap.add_argument("--only", default="", help="workloads whose name contains this")
    ap.add_argument("--figure", help="also copy the figure here (e.g. docs/img/frontier.png)")
    ap.add_argument("--markdown", action="store_true", help="also print the tables as Markdown")
    ap.add_argument(
        "--idle-sweep",
        action="store_true",
        help="instead: the relaxed regime (2xcold) only, slo at 0.99 with each idle "
        f"target {', '.join(map(str, IDLE_TARGETS))}, beside deepboot-p1 and pollux+",
    )
    ap.add_argument(
        "--host-cache",
        action="store_true",
        help="instead: issue 23's runs with the host-memory model cache (module docstring)",
    )
    ap.add_argument(
        "--cache-gb",
        type=float,
        default=1.0,
        help="--host-cache: GB per inference node on small and middle (default 1)",
    )
    ap.add_argument(
        "--genai-cache-gb",
        type=float,
        default=320.0,
        help="--host-cache: GB per inference node on genai-day (default 320: all 11 models)",
    )
    ap.add_argument(
        "--azure-cache-gb",
        type=float,
        default=160.0,
        help="--host-cache: GB per inference node on azure-70b (default 160: its 140 GB model)",
    )
    ap.add_argument(
        "--interval",
        type=float,
        default=60.0,
        help="seconds between scheduling rounds for every run, the limits included "
        "(default 60: Pollux's and DeepBoot's; docs/benchmarks.md measures 30 with "
        "--host-cache)",
    )
    args = ap.parse_args(argv)
    if not 1.0 <= args.interval <= 3600.0:
        ap.error(f"--interval must be in [1, 3600] seconds; got {args.interval:g}")
    reps, out = matrix_setup(ap, args, TRACES, "deepboot-frontier-")
    out.mkdir(parents=True, exist_ok=True)
    works = workloads(args.only)
    if not works:
        ap.error(
            f"--only {args.only!r} matches no workload (small, middle, genai-day, {AZURE_70B})"
        )

    started = time.perf_counter()
    if args.host_cache:
        cells = cache_cells(
            out, works, args.profiles, reps, args.cache_gb, args.genai_cache_gb, args.interval,
            args.azure_cache_gb,
        )  # fmt: skip
    elif args.idle_sweep:
        cells = make_cells(out, works, args.profiles, reps, IDLE_SWEEP, ("2xcold",), args.interval)
    else:
        cells = make_cells(out, works, args.profiles, reps, interval=args.interval)
    print(f"{len(cells)} runs on {args.procs} processes", file=sys.stderr, flush=True)
    outcomes = run_matrix([c[4] for c in cells], args.procs, Ticker(len(cells), every=20))
    samples: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    (out / "summaries").mkdir(exist_ok=True)
    failed = 0
    for (w, setting, run, r, _), o in zip(cells, outcomes, strict=True):
        if o.error:
            failed += 1
            print(f"{w} {setting} {run} #{r}: {o.error}", file=sys.stderr)
            continue
        samples.setdefault((w, setting, run), []).append(o.summary)
        path = out / "summaries" / f"{w}--{setting}--{run}#{r}.json"
        path.write_text(json.dumps(o.summary, indent=2) + "\n", encoding="utf-8")
    pts = points(samples)
    headers = CACHE_HEADERS if args.host_cache else HEADERS
    rows = cache_rows(pts) if args.host_cache else [cells_of(p) for p in pts]
    dom = dominance(pts)
    console = Console(width=160)
    title = (
        f"SLO frontier, {CLUSTER} with {INFERENCE_NODES} inference nodes, "
        f"{args.interval:g} s rounds: "
    ) + (f"means over {reps} replications ± 95% interval" if reps > 1 else "one run")
    console.print(table(title, headers, rows))
    dom_headers = ("workload", "SLO", "rival", "dominated by (attainment >=, JCT <=)")
    plain = not (args.idle_sweep or args.host_cache)
    if plain:
        console.print(table("Does --slo dominate?", dom_headers, dom))
    with (out / "frontier.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["workload", "setting", "run", "n", "jct_mean", "jct_half",
                         "attainment_mean", "attainment_half", "cold_starts", "reclaims",
                         "reclaims_proactive", "lent_gpu_h", "host_starts"])  # fmt: skip
        for p in pts:
            writer.writerow([p.workload, p.setting, p.run, p.jct.n, repr(p.jct.mean),
                             repr(p.jct.half), repr(p.attainment.mean), repr(p.attainment.half),
                             p.cold, p.reclaims, p.proactive, p.lent_h, p.host])  # fmt: skip
    figure(pts, out / "frontier.png")
    if args.figure:
        shutil.copyfile(out / "frontier.png", args.figure)
    if args.markdown:
        print(markdown(headers, rows))
        if plain:
            print()
            print(markdown(dom_headers, dom))
    took = time.perf_counter() - started
    print(f"{len(cells) - failed} runs in {took:.0f} s; outputs in {out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
