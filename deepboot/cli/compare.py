"""``deepboot compare``: a matrix of named runs on workloads, one table, CSV, figures, HTML.

A run is ``NAME=POLICY[:FLAG,FLAG...]`` (``NAME=`` may be left out). Each run is
simulated on each workload in its own process; the results are printed as one table
and written into the output folder:

* ``results.csv``: one row per (workload, run), every summary value;
* ``summaries/<workload>--<run>.json``: each run's full summary;
* ``jct-cdf-<workload>.png``, ``gpus-<workload>.png``, ``reclaims-<workload>.png``, and
  where the workload has inference requests ``waits-<workload>.png`` (their waits
  against the SLO) and, with two runs or more serving them, ``jct-vs-slo-<workload>.png``
  (average JCT against SLO attainment); none with ``--no-figures``;
* ``report.html``: all of it in one self-contained page.

Each workload is read once, before the runs, and handed to them: a pipe such as
``--workload <(cat w.csv)`` works. A sweep none of whose runs finished (every run
failed, it was interrupted first, or its worker processes broke) writes nothing and
removes the folders it made, so no empty report stands where a result would.

Only this module knows the run mini-syntax; it turns each run into a training policy
and a :class:`~deepboot.sim.config.SimConfig`, so a run means exactly what the
equivalent ``deepboot simulate`` flags mean.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from deepboot import __version__
from deepboot.cli import limits
from deepboot.cli.files import (
    PathArg,
    check_outputs,
    model_inputs,
    require_path,
    write_atomic,
    write_bytes,
    write_text,
)
from deepboot.cli.policy_params import add_interval_and_seed
from deepboot.cli.progress import format_sim_time
from deepboot.cli.services import SERVICES_EPILOG, add_services_flag, read_services_arg
from deepboot.core.cluster import ClusterSpec
from deepboot.core.errors import ConfigError, InputError
from deepboot.matrix import (
    RUN_SYNTAX,
    MatrixInterrupted,
    RunOutcome,
    RunSpec,
    RunTask,
    describe_config,
    parse_run,
    run_matrix,
    sim_config,
)
from deepboot.perf.apps import load_apps
from deepboot.report.html import FigureImage
from deepboot.report.table import MatrixRow, matrix_table, training_pool_only

if TYPE_CHECKING:
    from deepboot.core.jobs import Workload

log = logging.getLogger(__name__)

DEFAULT_RUNS: tuple[str, ...] = ("deepboot=deepboot", "pollux-only=pollux:no-lending,no-afe")
"""The headline pair, run when no ``--run`` is given: DeepBoot against training-pool-only
Pollux with cold restarts (AFE is part of DeepBoot; the reference artifact's baseline
had none)."""

_COMPARE_EPILOG = f"""\
{RUN_SYNTAX}

examples:
  # the headline: DeepBoot against training-pool-only Pollux, and the ablations
  deepboot compare --workload ../shared/traces/workloads/small.csv \\
      --cluster 16x4 --inference-nodes 8 --profiles ../shared/traces/profiles \\
      --run deepboot=deepboot --run pollux-only=pollux:no-lending,no-afe \\
      --run deepboot-noafe=deepboot:no-afe --run deepboot-random=deepboot:ats-i=random \\
      --out out/compare-small

  # the same matrix on two workloads, four processes
  deepboot compare --workload small.csv --workload middle.csv --inference-nodes 8 \\
      --run deepboot --run pollux:no-lending --out out/both --procs 4

  # inference services from a services file (every workload is read with it)
  deepboot compare --workload genai.csv --services services.toml --inference-nodes 8 \\
      --run deepboot --run pollux:no-lending --out out/genai

Outputs in --out: results.csv, summaries/*.json, *.png figures, report.html.

{SERVICES_EPILOG}"""


_LOCAL_RAY = "local"
"""``--ray`` with no address: start a private Ray instance for the sweep."""


class MatrixProgress:
    """A rich progress display: one overall bar plus one line per running cell."""

    def __init__(self, console: Console, tasks: Sequence[RunTask], enabled: bool) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
        )
        self._overall = self._progress.add_task("runs", total=len(tasks), detail="")
        self._rows: dict[int, TaskID] = {}
        self._tasks = {t.index: t for t in tasks}

    def __enter__(self) -> MatrixProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, index: int, now: float, completed: int, total: int) -> None:
        row = self._rows.get(index)
        if row is None:
            task = self._tasks[index]
            label = f"  {task.run.name} / {task.workload_name}"
            row = self._rows[index] = self._progress.add_task(label, total=total, detail="")
        self._progress.update(
            row, completed=completed, total=total, detail=f"jobs  sim {format_sim_time(now)}"
        )

    def finished(self, index: int) -> None:
        row = self._rows.get(index)
        if row is not None:
            self._progress.update(row, visible=False)
        self._progress.advance(self._overall)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's line breaks; shows a default only where there is one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        quiet = default is None or default is False or default == [] or default == argparse.SUPPRESS
        if "%(default)" not in text and action.option_strings and not quiet:
            text += " (default: %(default)s)"
        return text


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    """Register ``compare`` on the ``deepboot`` subcommand parser."""
    p = sub.add_parser(
        "compare",
        help="simulate a matrix of policies and variants; table, CSV, figures and HTML report",
        description="Simulate every --run on every --workload, in parallel processes.\n"
        "Print one table and write results.csv, per-run summary JSON, figures and a\n"
        "self-contained report.html into --out.",
        epilog=_COMPARE_EPILOG,
        formatter_class=_Formatter,
    )
    p.add_argument(
        "--workload", action="append", required=True, metavar="FILE", help="workload CSV; repeat"
    )
    add_services_flag(p)
    p.add_argument(
        "--run",
        action="append",
        default=[],
        metavar="SPEC",
        help="NAME=POLICY[:FLAG,...]; repeat (default: "
        + " ".join(DEFAULT_RUNS)
        + "); see the run syntax below",
    )
    p.add_argument(
        "--cluster",
        default="16x4",
        metavar="NODESxGPUS",
        help=f"cluster shape, {limits.CLUSTER_HELP}",
    )
    p.add_argument(
        "--inference-nodes",
        type=int,
        default=8,
        metavar="N",
        help=f"the last N nodes form the inference pool, {limits.INFERENCE_NODES_HELP}",
    )
    p.add_argument(
        "--profiles",
        metavar="DIR",
        help="measured profile directory (reference format); default: the built-in catalog",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output folder (created); its files are written atomically and never "
        "onto an input of the run",
    )
    p.add_argument(
        "--procs",
        type=int,
        default=None,
        metavar="N",
        help=f"parallel processes, {limits.PROCS_HELP} (default: min(CPUs, runs))",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const=_LOCAL_RAY,
        default=None,
        metavar="ADDRESS",
        help="run the matrix on a Ray cluster at ADDRESS (host:port; authenticate with "
        "RAY_AUTH_MODE/RAY_AUTH_TOKEN_PATH), or, with no ADDRESS, on a private Ray "
        "instance started for the sweep (loopback only, token authentication on). "
        "Needs the runtime extra; results are identical to the local processes'",
    )
    p.add_argument(
        "--baseline",
        metavar="NAME",
        help="run the average JCT is compared with (default: the first training-pool-"
        "only run, lending off, when the matrix has one; else the first run)",
    )
    p.add_argument(
        "--wide",
        action="store_true",
        help="print every column of the table, however wide (default: the columns that "
        "fit the terminal, most telling first; results.csv always has them all)",
    )
    add_interval_and_seed(p, "the policies'")
    p.add_argument(
        "--replications",
        type=int,
        default=1,
        metavar="K",
        help="run every (workload, run) K times, 1-100: replication i uses policy seed i "
        "and jitters every submission time by a uniform draw in +-30 s (the same K "
        "workloads for every run, so the comparison is paired); with K >= 2 a table of "
        "means with 95%% intervals and paired differences against the baseline follows, "
        "and intervals.csv is written (default: 1, the workload as is)",
    )
    p.add_argument(
        "--max-time",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"stop each run at this simulated time, {limits.MAX_TIME_HELP} "
        "(default: when every job is done)",
    )
    p.add_argument(
        "--no-figures",
        action="store_true",
        help="skip the PNG figures (a faster run; the table, CSV and HTML are still written)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=compare)


def command_line(args: argparse.Namespace) -> str:
    """The canonical ``deepboot compare`` command line equivalent to ``args``."""
    words = ["deepboot", "compare"]
    for w in args.workload:
        words += ["--workload", w]
    if getattr(args, "services", None):
        words += ["--services", args.services]
    words += ["--cluster", args.cluster, "--inference-nodes", str(args.inference_nodes)]
    if args.profiles:
        words += ["--profiles", args.profiles]
    for r in args.run or DEFAULT_RUNS:
        words += ["--run", r]
    words += ["--interval", f"{args.interval:g}", "--seed", str(args.seed)]
    if args.max_time is not None:
        words += ["--max-time", f"{args.max_time:g}"]
    if getattr(args, "replications", 1) > 1:
        words += ["--replications", str(args.replications)]
    if args.baseline:
        words += ["--baseline", args.baseline]
    if args.no_figures:
        words.append("--no-figures")
    words += ["--out", args.out]
    return shlex.join(words)


def _workload_names(paths: Sequence[str]) -> list[str]:
    names = [Path(p).stem for p in paths]
    seen: dict[str, str] = {}
    for path, name in zip(paths, names, strict=True):
        if name in seen:
            raise ConfigError(
                f"--workload {path} and {seen[name]} share the name {name!r}; "
                "rename one (its file stem names its outputs)"
            )
        seen[name] = path
    return names


FIGURE_KINDS = ("jct-vs-slo", "gpus", "jct-cdf", "waits", "reclaims")
"""The figures of a workload, ``<kind>-<workload>.png``, in the report's order."""


def output_files(args: argparse.Namespace, runs: Sequence[RunSpec]) -> list[PathArg]:
    """Every file ``compare`` may write into ``--out`` (see the module docstring)."""
    out_dir = Path(args.out)
    names = [Path(p).stem for p in args.workload]
    files = [out_dir / "results.csv", out_dir / "report.html"]
    files += [out_dir / "summaries" / f"{w}--{r.name}.json" for w in names for r in runs]
    if not args.no_figures:
        files += [out_dir / f"{kind}-{w}.png" for w in names for kind in FIGURE_KINDS]
    return [PathArg("--out", str(f)) for f in files]


def _validate(
    args: argparse.Namespace, runs: Sequence[RunSpec]
) -> tuple[Mapping[str, str], list[Workload]]:
    """Check everything before any simulation; returns run name -> description, and
    the workloads (each file read once, here, for every run of it).

    Raises:
        ConfigError, InputError, UnknownPolicyError: the first problem found (a flag
            out of its range, an empty path, an output that would overwrite an input).
    """
    from deepboot.policies import inference, registry
    from deepboot.sim.workload import load_workload

    if not 1 <= args.replications <= 100:
        raise ConfigError(f"--replications must be in [1, 100]; got {args.replications}")
    for path in args.workload:
        require_path(path, "--workload")
    if args.services is not None:
        require_path(args.services, "--services")
    if args.profiles is not None:
        require_path(args.profiles, "--profiles")
    require_path(args.out, "--out")
    limits.check_interval(args.interval)
    limits.check_seed(args.seed)
    limits.check_procs(args.procs)
    limits.check_max_time(args.max_time)
    limits.check_cluster(args.cluster, args.inference_nodes)
    ClusterSpec.parse(args.cluster, args.inference_nodes)
    seen: set[str] = set()
    for run in runs:
        if run.name in seen:
            raise ConfigError(f"two runs are named {run.name!r}; give each --run a unique NAME=")
        seen.add(run.name)
    if args.baseline and args.baseline not in seen:
        raise ConfigError(
            f"--baseline {args.baseline!r} is not a run name; runs: {', '.join(seen)}"
        )
    described: dict[str, str] = {}
    for run in runs:
        registry.create(run.policy, **dict(run.params))  # unknown policy or bad parameter
        config = sim_config(run, args.interval, args.seed, args.inference_nodes)
        # Unknown inference policy or bad parameter.
        inference.create(config.inference_policy, **config.inference_params)
        described[run.name] = describe_config(run, config)
    if not args.no_figures:
        from deepboot.report.figures import _matplotlib_figure_class

        _matplotlib_figure_class()  # missing matplotlib: fail now, not after the runs
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ConfigError(f"--out {args.out} is not a directory; give an output folder")
    inputs = [*(PathArg("--workload", w) for w in args.workload), *model_inputs(args.profiles)]
    if args.services is not None:
        inputs.append(PathArg("--services", args.services))
    check_outputs(output_files(args, runs), inputs, need_directory=False)
    services = read_services_arg(args.services)
    apps = load_apps(args.profiles)
    workloads = []
    for path in args.workload:
        workload = load_workload(
            path, apps.keys(), {n: a.limits for n, a in apps.items()}, services
        )
        if not workload.training:
            raise InputError(path, 0, "application", "the workload has no training jobs")
        workloads.append(workload)
    return described, workloads


def compare(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``deepboot compare``: run the matrix, print the table, write every output."""
    from deepboot.report.csvout import write_results_csv

    runs = [parse_run(text) for text in (args.run or DEFAULT_RUNS)]
    names = _workload_names(args.workload)
    described, workloads = _validate(args, runs)
    out_dir = Path(args.out)
    made = _make_folder(out_dir / "summaries")

    reps = args.replications
    tasks = [
        RunTask(
            index=(i * len(runs) + j) * reps + r,
            workload_path=path,
            workload_name=name,
            run=dataclasses.replace(run, name=f"{run.name}#{r}") if reps > 1 else run,
            cluster=args.cluster,
            inference_nodes=args.inference_nodes,
            profiles=args.profiles,
            interval=args.interval,
            seed=args.seed,
            max_time=args.max_time,
            replication=r if reps > 1 else None,
            workload=workload,
        )
        for i, (path, name, workload) in enumerate(
            zip(args.workload, names, workloads, strict=True)
        )
        for j, run in enumerate(runs)
        for r in range(reps)
    ]
    procs = args.procs or max(1, min(os.cpu_count() or 1, len(tasks)))
    show = not args.quiet and err.file.isatty()
    started = time.perf_counter()
    interrupted: MatrixInterrupted | None = None
    try:
        with MatrixProgress(err, tasks, enabled=show) as display:
            try:
                if args.ray is not None:
                    from deepboot.matrix_ray import run_matrix_ray

                    address = None if args.ray == _LOCAL_RAY else args.ray
                    outcomes = run_matrix_ray(tasks, address, procs, display)
                else:
                    outcomes = run_matrix(tasks, procs, display)
            except MatrixInterrupted as exc:
                # Keep what finished: it is written below like a complete sweep's.
                outcomes, interrupted = exc.outcomes, exc
    except BaseException:  # the matrix could not run (MatrixError): nothing to write
        _remove_empty(made)
        raise
    wall_s = time.perf_counter() - started

    failures = [
        f"run {t.run.name} on {t.workload_name}: {o.error}"
        for t, o in zip(tasks, outcomes, strict=True)
        if o.error is not None
    ]
    good = [(t, o) for t, o in zip(tasks, outcomes, strict=True) if o.error is None]
    if not good:
        # Nothing to report: no results.csv or report.html that would look like one.
        _remove_empty(made)
        if interrupted is not None:
            _line(err, f"deepboot: {interrupted}; nothing written to {out_dir}")
            return 130
        for line in failures:
            _line(err, f"deepboot: error: {line}")
        which = "the run" if len(tasks) == 1 else f"all {len(tasks)} runs"
        _line(err, f"deepboot: error: {which} failed; nothing written to {out_dir}")
        return 2
    if interrupted is not None:
        _line(err, f"deepboot: {interrupted}; writing the finished runs")
    # A no-inference run is the all-GPU bound, not a contender.
    rows = [
        MatrixRow(t.workload_name, t.run.name, o.summary, reference=t.run.no_inference)
        for t, o in good
    ]
    for t, o in good:
        data = {**o.summary, "run": {"name": t.run.name, "spec": t.run.text}}
        _write_json(out_dir / "summaries" / f"{t.workload_name}--{t.run.name}.json", data)
    specs = {r.name: r.text for r in runs}
    write_atomic(out_dir / "results.csv", lambda p: write_results_csv(p, rows, specs))
    baseline = args.baseline or training_pool_only(
        [(r.name, r.lending, r.no_inference) for r in runs]
    )
    if rows:
        title = f"Comparison ({len(rows)} runs; vs base: {baseline or 'the first run'})"
        table = matrix_table(
            rows,
            f"{baseline}#0" if baseline and reps > 1 else baseline,
            title,
            width=None if args.wide else out.width,
        )
        _print_wide(out, table)
    if reps > 1 and interrupted is None:
        _replications(out, out_dir, tasks, outcomes, runs, baseline, reps)

    from deepboot.report.html import ReportPage, render_report

    figures: list[FigureImage] = []
    if not args.no_figures and good:
        figures = _figures(good, names, out_dir)
    page = ReportPage(
        title="deepboot compare: " + ", ".join(names),
        command=command_line(args),
        settings=_settings(args, procs, wall_s),
        rows=rows,
        baseline=baseline,
        runs={r.name: f"{r.text}  ({described[r.name]})" for r in runs},
        figures=figures,
        notes=failures,
    )
    write_text(out_dir / "report.html", render_report(page))
    log.info("wrote %s", out_dir / "report.html")
    out.print(
        f"wrote {out_dir}/results.csv, report.html, {len(figures)} figures and "
        f"{len(rows)} summaries in {wall_s:.1f} s",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    for line in failures:
        _line(err, f"deepboot: error: {line}")
    if interrupted is not None:
        return 130
    return 2 if failures else 0


def _line(console: Console, text: str) -> None:
    """Print ``text`` as it is, on one line however long."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def _make_folder(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; returns those made, deepest first.

    Raises:
        InputError: a folder cannot be created.
    """
    made = [f for f in (folder, *folder.parents) if not f.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(str(folder), 0, "", f"cannot create: {exc.strerror or exc}") from None
    return made


def _remove_empty(folders: Sequence[Path]) -> None:
    """Remove ``folders`` (deepest first) while they are empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty: something else writes there
            return


def _replications(
    out: Console,
    out_dir: Path,
    tasks: Sequence[RunTask],
    outcomes: Sequence[RunOutcome],
    runs: Sequence[RunSpec],
    baseline: str | None,
    reps: int,
) -> None:
    """Print the intervals table and write intervals.csv (``--replications K``)."""
    from deepboot.report.intervals import interval_rows, interval_table, intervals_csv

    samples: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    spec_of = {r.text: r.name for r in runs}
    for t, o in zip(tasks, outcomes, strict=True):
        if o.error is None:
            samples.setdefault((t.workload_name, spec_of[t.run.text]), []).append(o.summary)
    rows = interval_rows(samples, baseline)
    if rows:
        _print_wide(out, interval_table(rows, baseline, reps))
    write_text(out_dir / "intervals.csv", intervals_csv(rows))


def _print_wide(console: Console, table: Table) -> None:
    """Print ``table`` at its natural width, past a narrow console if need be.

    Squeezed to 80 columns the numbers would turn into ellipses; a wide table that
    the terminal wraps, or a file with long lines, still reads right.
    """
    natural = console.measure(table, options=console.options.update(max_width=1000)).maximum
    saved = console.width
    console.width = max(saved, natural)
    try:
        console.print(table, crop=False)
    finally:
        console.width = saved


def _settings(args: argparse.Namespace, procs: int, wall_s: float) -> dict[str, str]:
    return {
        "workloads": ", ".join(args.workload),
        "cluster": f"{args.cluster}, last {args.inference_nodes} nodes = inference pool",
        "profiles": args.profiles or "built-in catalog",
        "scheduling interval": f"{args.interval:g} s",
        "seed": str(args.seed),
        "max simulated time": "none" if args.max_time is None else f"{args.max_time:g} s",
        "processes": str(procs),
        "wall time": f"{wall_s:.1f} s",
        "deepboot version": __version__,
        "generated": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _figures(
    good: Sequence[tuple[RunTask, RunOutcome]], names: Sequence[str], out_dir: Path
) -> list[FigureImage]:
    """Each workload's figures, in the report's order: JCT against SLO attainment (two
    runs or more serving inference), GPUs over time, the JCT CDF, the inference waits
    against the SLO (where there are requests), the reclaims. A figure of one of these
    workloads that an earlier run into ``out_dir`` drew and this one does not is
    removed, so that no figure beside the report is older than it."""
    figures: list[FigureImage] = []
    for name in names:
        cells = [(t, o) for t, o in good if t.workload_name == name]
        if not cells:
            continue
        made = [
            _jct_slo_scatter(name, cells),
            _gpus(name, cells),
            _jct_cdf(name, cells),
            _waits(name, cells),
            _reclaims(name, cells),
        ]
        for stem, title, png, caption in (m for m in made if m is not None):
            write_bytes(out_dir / f"{stem}.png", png)
            figures.append(FigureImage(title, png, caption, anchor=stem))
        drawn = {m[0] for m in made if m is not None}
        for kind in FIGURE_KINDS:
            if f"{kind}-{name}" not in drawn:
                (out_dir / f"{kind}-{name}.png").unlink(missing_ok=True)
    return figures


_Made = tuple[str, str, bytes, str]
"""A drawn figure: (file stem and anchor, title, PNG, caption)."""


def _gpus(name: str, cells: Sequence[tuple[RunTask, RunOutcome]]) -> _Made:
    from deepboot.report.figures import gpu_usage_figure

    png = gpu_usage_figure(
        [o.usage for _, o in cells if o.usage is not None],
        title=f"GPUs over time, stacked by use: {name}",
    )
    caption = (
        "Every GPU of the cluster by state, time-averaged per bin. Dark blue is "
        "training on the training pool, light blue training on lent inference "
        "GPUs; red, orange and purple are inference replicas serving, kept warm "
        "(PROTECT) and sleeping (lendable). The dashed line is the training-pool size."
    )
    return (f"gpus-{name}", f"GPUs over time: {name}", png, caption)


def _jct_cdf(name: str, cells: Sequence[tuple[RunTask, RunOutcome]]) -> _Made:
    from deepboot.report.figures import jct_cdf_figure

    png = jct_cdf_figure({t.run.name: o.jcts for t, o in cells}, title=f"Training JCT CDF: {name}")
    caption = (
        "Fraction of training jobs finished within a given JCT (log scale, hours); "
        "a curve further left and higher is better. The legend gives each run's "
        "average JCT."
    )
    return (f"jct-cdf-{name}", f"Training JCT CDF: {name}", png, caption)


def _reclaims(name: str, cells: Sequence[tuple[RunTask, RunOutcome]]) -> _Made:
    from deepboot.report.figures import reclaims_figure

    png = reclaims_figure(
        {t.run.name: o.reclaim_times for t, o in cells},
        title=f"Lent GPUs reclaimed for inference: {name}",
        end_s=max((o.end_s for _, o in cells), default=0.0),
    )
    caption = (
        "Cumulative number of lent GPUs taken back from training for inference "
        "(the legend gives each run's total)."
    )
    return (f"reclaims-{name}", f"Reclaims over time: {name}", png, caption)


def _waits(name: str, cells: Sequence[tuple[RunTask, RunOutcome]]) -> _Made | None:
    """The inference waits against the SLO, or None when no run had a request."""
    from deepboot.report.figures import inference_waits_figure

    curves = [o.waits for _, o in cells if o.waits is not None and o.waits.requests]
    if not curves:
        return None
    png = inference_waits_figure(curves, title=f"Inference request waits against the SLO: {name}")
    caption = (
        "Share of inference requests that waited longer than a given time before "
        "serving started (queueing plus any cold start, every service together; both "
        "axes log scale, the wait axis linear below 1 s). The vertical lines are the "
        "services' SLOs; with one SLO for every service, a curve's height at its line "
        "is the share of requests that missed it. Lower and further left is better. "
        "A request that never started counts as waiting forever: the curve keeps its "
        "share up to the right edge. The legend gives each run's SLO attainment (each "
        "request against its own service's SLO)."
    )
    return (f"waits-{name}", f"Inference waits against the SLO: {name}", png, caption)


def _jct_slo_scatter(name: str, cells: Sequence[tuple[RunTask, RunOutcome]]) -> _Made | None:
    """The JCT against SLO attainment scatter of one workload's runs, or None when
    fewer than two runs served inference requests."""
    from deepboot.report.figures import jct_slo_scatter_figure

    served = [(t, o) for t, o in cells if o.summary["inference"]["tasks"] > 0]
    if len(served) < 2:
        return None
    points = {
        t.run.name: (o.summary["training"]["avg_jct_s"], o.summary["inference"]["slo_attainment"])
        for t, o in served
        if o.summary["training"]["completed"] > 0
    }
    left_out = [t.run.name for t, _ in served if t.run.name not in points]
    if len(points) < 2:
        return None
    targets = {
        service["slo_target"]
        for _, o in served
        for service in o.summary["inference"]["per_service"].values()
    }
    target = targets.pop() if len(targets) == 1 else None
    caption = (
        "Each run that served inference requests: its average training JCT (hours) "
        "against the share of its requests that started within their service's SLO (the "
        "table's SLO column). Up and to the left is better on both counts; two runs of "
        "which one sits up and to the right of the other trade one for the other."
    )
    if target is not None:
        caption += f" The dashed line is the SLO target every service shares ({target * 100:g}%)."
    else:
        caption += " The services' SLO targets differ, so no target line is drawn."
    if left_out:
        caption += f" Left out, no training job completed: {', '.join(left_out)}."
    png = jct_slo_scatter_figure(
        points, target, title=f"Training JCT against inference SLO attainment: {name}"
    )
    return (f"jct-vs-slo-{name}", f"JCT against SLO attainment: {name}", png, caption)


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    write_text(path, json.dumps(data, indent=2) + "\n")
