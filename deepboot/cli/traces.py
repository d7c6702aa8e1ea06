"""``deepboot workload from-genai | from-azure-llm | rate-shape | compose | week``:
workloads from the public production inference traces (see :mod:`deepboot.sim.traces`),
and a week of a large cluster from Philly and GenAI (:mod:`deepboot.sim.week`).

Every subcommand checks its flags against the ranges its help states (one error line,
exit 2), refuses an output that is one of its inputs, writes every file atomically and
prints one summary line that credits the trace (CC-BY-4.0).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from deepboot.cli import limits
from deepboot.cli.files import (
    PathArg,
    check_outputs,
    require_path,
    same_file,
    write_atomic,
    write_text,
)
from deepboot.core.errors import ConfigError
from deepboot.core.service import MAX_CONCURRENCY

_GENAI_EPILOG = """\
example: the busiest 24 hours of the trace, compressed to 8 hours, the 10 busiest
models as services and the rest merged into 'other':
  deepboot workload from-genai \\
      --trace ../shared/traces/inference/alibaba-genai-2026/lora_request_trace.csv \\
      --load-latency \\
      ../shared/traces/inference/alibaba-genai-2026/basemodel_update_latency_anon.csv \\
      --window busiest-24h --compress 3 --top 10 --seed 1 --out genai-day.csv

Writes genai-day.csv (DeepBoot format: one inference row per request, application
infer-<service>, duration = exec_time_seconds) and genai-day.toml (the services file:
one [[service]] per model, cold_start_s drawn from the measured base-model loads, or
--cold-start S for all). Simulate them with
  deepboot simulate --workload genai-day.csv --services genai-day.toml ...

Rows: SUCCEED kept; FAILED kept (each held its GPU for its exec time before failing:
load the pool carried; --drop-failed drops them); PROCESSING kept (its exec time so
far); PENDING dropped (never ran; exec time 0); rows without a model dropped (in the
real trace all 25 are PENDING); an exec time of 0 on a kept row becomes 0.5 s (the
trace has whole seconds; the workload loader refuses 0). Every count is in the
summary line. --top N merges the other models into one service 'other', which hides
their cold starts (one replica of 'other' serves them all). The busiest window is a
sliding window over the arrival times, not a calendar day.

Source: Alibaba cluster-trace-v2026-GenAI, CC-BY-4.0 (credited in the services file)."""

_AZURE_EPILOG = """\
example: the conversation trace tiled to 8 hours, 8 requests per replica:
  deepboot workload from-azure-llm \\
      --trace ../shared/traces/inference/azure-llm-2023/AzureLLMInferenceTrace_conv.csv \\
      --hours 8 --concurrency 8 --seed 1 --out conv-8h.csv

A request runs overhead + prefill x ContextTokens + decode x GeneratedTokens seconds.
Defaults, for a 7B model on one A100 80GB (one replica = one GPU): decode 0.012 s per
token (measured: NVIDIA NeMo's Llama-2-7B table, one A100, batch 1); prefill 0.0001 s
per token and overhead 0.05 s are estimates (FLOPs per token at about half the A100's
fp16 peak; request handling); the trace's mean request runs about 2.7 s. Each request
keeps its batch-1 duration whatever --concurrency (optimistic: at batch 8 NeMo
measures about 1.4x). --cold-start 20 s is an estimate (13.5 GB of weights at about
1 GB/s plus the engine's start).

A 70B-class model on 4 GPUs of one node (examples/azure-70b.toml): --gpus-per-replica 4
--model-gb 140 --decode-s-per-token 0.030 --prefill-s-per-token 0.00022 --cold-start
90 (estimates: 140 GB of fp16 weights read at 2 GB/s plus 20 s of engine start;
decode bound by reading the weights from 4 GPUs' HBM; the module
deepboot.sim.traces.azure_llm states each source).

--hours H: the trace covers one hour; the first tile is the trace, every later tile
the trace rotated by a seeded random shift (so bursts do not repeat at the same
minute), cut at H hours. Output stops at --max-requests (earliest first), said in
the summary line.

Source: Azure LLM inference trace 2023 (Splitwise, ISCA'24), CC-BY-4.0."""

_RATE_EPILOG = """\
example: the platform's day as a 22-hour profile peaking at 20 requests/s:
  deepboot workload rate-shape \\
      --qps ../shared/traces/inference/alibaba-genai-2026/qps.csv \\
      --peak-rps 20 --window-s 600 --out genai-shape.csv
  deepboot load SERVICE --rate-profile genai-shape.csv

The samples of each --window-s window are summed (per-container QPS, about one a
minute per container; a missing sample counts as 0), only whole windows are kept,
and the sums are scaled so that the largest is --peak-rps. --compress F shortens
the profile F times (22 h into 1 h with --compress 22) at the same rates. The last
row (rps 0) ends the profile, as 'deepboot load --rate-profile' requires.

Source: Alibaba cluster-trace-v2026-GenAI, CC-BY-4.0."""

_COMPOSE_EPILOG = """\
example: Pollux workload 6 with the busiest GenAI day, at a peak busy fraction of
0.8 of the inference pool (8 nodes x 4 GPUs):
  deepboot workload compose \\
      --training ../shared/traces/workloads/pollux/workload-6.csv \\
      --inference genai-day.csv --services genai-day.toml \\
      --cluster 16x4 --inference-nodes 8 --peak-busy 0.8 --seed 1 \\
      --out w6-genai.csv --services-out w6-genai.toml

Repeat --inference FILE --services FILE for more streams (paired in order; service
names must not clash). Each stream is shifted so that its first request arrives
with the first training job. The busy fraction of a 10-minute window (--window-s) is
the GPU-seconds the requests need in it (duration / concurrency, each run's part
inside the window) over the window's length times the inference GPUs. Requests are
thinned (kept with probability s) or replicated (copies delayed by a seeded draw
below the stream's mean gap) so that the largest window's fraction reaches
--peak-busy; the achieved peak and average are printed. Training rows are kept as
they are; inference rows of the training file are dropped (counted)."""

_WEEK_EPILOG = """\
example: a week of a 1,024-GPU cluster (256 nodes x 4 GPUs, the last 128 nodes the
inference pool), training at 0.8 of its pool's GPU-hours, the GenAI trace's busiest
week at a peak busy fraction of 0.8 of the inference pool:
  deepboot workload week --philly ../shared/traces/philly.csv \\
      --genai ../shared/traces/inference/alibaba-genai-2026/lora_request_trace.csv \\
      --load-latency \\
      ../shared/traces/inference/alibaba-genai-2026/basemodel_update_latency_anon.csv \\
      --cluster 256x4 --inference-nodes 128 --load 0.8 --peak-busy 0.8 --seed 1 \\
      --out week.csv

Training: the --days days of Philly (from midnight) in which the most of its jobs
arrive, drawn with replacement at their own times of day (plus under a minute) and
mapped to models as 'from-philly' maps them, until their nominal GPU-hours (each job
alone at its own request, on --profiles or the built-in catalog) reach --load times
the training pool's GPU-hours over the days. Inference: the GenAI trace's busiest
--days x 24 hours, its --top busiest models as services, composed as 'compose'
does: shifted to the first job, thinned or replicated to --peak-busy. The summary
counts the jobs, the requests and the load reached.

Sources: Microsoft Philly trace; Alibaba cluster-trace-v2026-GenAI, CC-BY-4.0."""


# ------------------------------------------------------------------ ranges

MAX_HOURS = 24.0 * 366
MAX_REQUESTS = 10_000_000


@dataclass(frozen=True, slots=True)
class _Range:
    """A numeric flag's valid range: ``[low, high]``, or ``(low, high]`` with ``open_low``;
    its help and its check come from here, so they cannot disagree."""

    kind: type
    low: float
    high: float
    open_low: bool = False

    def text(self, name: str) -> str:
        return f"{_n(self.low)} {'<' if self.open_low else '<='} {name} <= {_n(self.high)}"

    def check(self, flag: str, value: float | None) -> None:
        if value is None:
            return
        low_ok = self.low < value if self.open_low else self.low <= value
        if not (math.isfinite(value) and low_ok and value <= self.high):
            bracket = "(" if self.open_low else "["
            raise ConfigError(
                f"{flag} must be in {bracket}{_n(self.low)}, {_n(self.high)}], got {value}"
            )


def _n(x: float) -> str:
    return f"{x:g}" if x < 1e6 else f"{int(x):,}"


RANGES: dict[str, _Range] = {
    "--cold-start": _Range(float, 0, 86_400),
    "--hours": _Range(float, 0, MAX_HOURS, open_low=True),
    "--compress": _Range(float, 0, 1e4, open_low=True),
    "--top": _Range(int, 1, 100_000),
    "--prefill-s-per-token": _Range(float, 0, 10),
    "--decode-s-per-token": _Range(float, 0, 10),
    "--overhead-s": _Range(float, 0, 3600),
    "--concurrency": _Range(int, 1, MAX_CONCURRENCY),
    "--max-requests": _Range(int, 1, MAX_REQUESTS),
    "--peak-rps": _Range(float, 0, 100_000, open_low=True),  # runtime.rateprofile.MAX_RPS
    "--window-s": _Range(float, 1, 86_400),
    "--peak-busy": _Range(float, 0, 4, open_low=True),
    "--mean-rps": _Range(float, 0, 100_000, open_low=True),
    "--dispersion": _Range(float, 1, 1000),
    "--duration-s": _Range(float, 0, 86_400, open_low=True),
    "--model-gb": _Range(float, 0, 100_000, open_low=True),
    "--gpus-per-replica": _Range(int, 1, 64),  # core.service.MAX_GPUS_PER_REPLICA
    "--slo-wait": _Range(float, 0, 86_400, open_low=True),
    "--days": _Range(int, 1, 28),
    "--load": _Range(float, 0, 4, open_low=True),
}
"""Every numeric flag of these subcommands (``--seed`` and ``--cluster``: cli.limits)."""


def _number(
    p: argparse._ActionsContainer, flag: str, metavar: str, help: str, **kwargs: Any
) -> None:
    """Add the numeric ``flag`` with its range in the help (see :data:`RANGES`)."""
    r = RANGES[flag]
    p.add_argument(flag, type=r.kind, metavar=metavar, help=f"{help}, {r.text(metavar)}", **kwargs)


def _check_numbers(args: argparse.Namespace, *flags: str) -> None:
    for flag in flags:
        RANGES[flag].check(flag, getattr(args, flag.lstrip("-").replace("-", "_")))


# ------------------------------------------------------------------ parsers


def add_parsers(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add the trace subcommands to ``deepboot workload``."""
    _add_genai(sub, formatter)
    _add_azure(sub, formatter)
    _add_rate_shape(sub, formatter)
    _add_bursty(sub, formatter)
    _add_compose(sub, formatter)
    _add_week(sub, formatter)


def _cluster_flags(p: argparse.ArgumentParser, cluster: str, inference_nodes: int) -> None:
    """``--cluster`` and ``--inference-nodes``, with these defaults."""
    p.add_argument("--cluster", default=cluster, metavar="NODESxGPUS", help=limits.CLUSTER_HELP)
    p.add_argument(
        "--inference-nodes",
        type=int,
        default=inference_nodes,
        metavar="N",
        help="the last N nodes form the inference pool, 1 <= N < NODES",
    )


def _common(p: argparse.ArgumentParser, seed: str, inputs: str, *, services: bool = True) -> None:
    p.add_argument("--seed", type=int, default=0, help=f"seed of {seed}, {limits.SEED_HELP}")
    p.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help=f"output CSV (written atomically; not {inputs})",
    )
    if services:
        p.add_argument(
            "--services-out",
            metavar="FILE",
            help="output services file (default: --out with the suffix .toml)",
        )


def _add_genai(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "from-genai",
        help="an inference workload from the Alibaba GenAI 2026 request trace",
        description="Turn lora_request_trace.csv (Alibaba GenAI 2026) into a DeepBoot "
        "workload of inference requests and its services file.",
        epilog=_GENAI_EPILOG,
        formatter_class=formatter,
    )
    p.add_argument("--trace", required=True, metavar="FILE", help="lora_request_trace.csv")
    cold = p.add_mutually_exclusive_group(required=True)
    cold.add_argument(
        "--load-latency",
        metavar="FILE",
        help="basemodel_update_latency_anon.csv: draw each service's cold start from it",
    )
    _number(cold, "--cold-start", "S", "every service's cold start in seconds")
    p.add_argument(
        "--window",
        default="all",
        metavar="all|busiest-Hh",
        help="the arrivals kept: all, or the busiest H hours (e.g. busiest-24h)",
    )
    p.add_argument(
        "--start",
        metavar="'YYYY-MM-DD HH:MM:SS'",
        help="keep arrivals from this time (the trace's clock; not with --window busiest-)",
    )
    _number(p, "--hours", "H", "keep H hours (from --start, or the first arrival)")
    _number(
        p, "--compress", "F", "divide arrival times (from the window's start) by F; "
        "durations unchanged", default=1.0,
    )  # fmt: skip
    _number(
        p, "--top", "N", "keep the N busiest models as services and merge the rest into "
        "'other' (merging hides the merged models' cold starts; default: every model)",
    )  # fmt: skip
    p.add_argument(
        "--drop-failed", action="store_true", help="drop FAILED rows instead of keeping them"
    )
    p.add_argument(
        "--service-prefix",
        default="",
        metavar="P",
        help="put P before every service name (to compose two GenAI streams)",
    )
    _common(p, "the cold-start draws", "--trace or --load-latency")
    p.set_defaults(func=workload_from_genai)


def _add_azure(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    from deepboot.sim.traces.azure_llm import AzureConfig, CostModel

    conf, cost = AzureConfig(), CostModel()
    p: argparse.ArgumentParser = sub.add_parser(
        "from-azure-llm",
        help="an inference workload from the Azure LLM inference trace 2023",
        description="Turn an Azure LLM inference trace (TIMESTAMP,ContextTokens,"
        "GeneratedTokens) into a DeepBoot workload of one inference service and its "
        "services file.",
        epilog=_AZURE_EPILOG,
        formatter_class=formatter,
    )
    p.add_argument("--trace", required=True, metavar="FILE", help="AzureLLMInferenceTrace_conv.csv")
    p.add_argument("--service", default=conf.service, metavar="NAME", help="the service's name")
    p.add_argument("--model", default=conf.model, metavar="LABEL", help="its model label")
    for flag, default, what in (
        ("--prefill-s-per-token", cost.prefill_s_per_token, "seconds per context token (estimate)"),
        ("--decode-s-per-token", cost.decode_s_per_token, "seconds per generated token (measured)"),
        ("--overhead-s", cost.overhead_s, "fixed seconds per request (estimate)"),
        ("--cold-start", conf.cold_start_s, "the service's cold start in seconds (estimate)"),
    ):
        _number(p, flag, "S", what, default=default)
    _number(
        p, "--concurrency", "K", "requests one replica serves at once", default=conf.concurrency
    )
    _number(
        p, "--hours", "H", "tile the one-hour trace with seeded shifts to H hours "
        "(default: the trace as it is)",
    )  # fmt: skip
    _number(p, "--max-requests", "N", "stop after N requests", default=conf.max_requests)
    _number(
        p, "--gpus-per-replica", "K", "GPUs one replica spans, all on one node (a "
        "tensor-parallel server)", default=conf.gpus_per_replica,
    )  # fmt: skip
    _number(p, "--model-gb", "GB", "the model's weights, written into the services file (the "
            "host cache's size of it; default: not written)")  # fmt: skip
    _common(p, "the tiles' shifts", "--trace")
    p.set_defaults(func=workload_from_azure_llm)


def _add_rate_shape(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "rate-shape",
        help="a rate profile (time_s,rps) from the GenAI trace's QPS samples",
        description="Sum the QPS samples of qps.csv per window, scale the peak to "
        "--peak-rps and write a rate profile for 'deepboot load --rate-profile'.",
        epilog=_RATE_EPILOG,
        formatter_class=formatter,
    )
    p.add_argument("--qps", required=True, metavar="FILE", help="qps.csv")
    _number(p, "--peak-rps", "R", "the busiest window's rate in requests/s", required=True)
    _number(p, "--window-s", "S", "window in seconds", default=600.0)
    p.add_argument(
        "--request-type",
        metavar="TYPE",
        help="only samples of this request_type (e.g. 'Generative Requests'; default: all)",
    )
    _number(
        p, "--compress", "F", "divide the profile's times by F (rates unchanged; windows "
        "stay >= 1 s)", default=1.0,
    )  # fmt: skip
    p.add_argument("--out", required=True, metavar="FILE", help="output profile CSV (not --qps)")
    p.set_defaults(func=workload_rate_shape)


_BURSTY_EPILOG = """\
Requests come in batches (a compound Poisson process): batches arrive at random, and
every request of a batch at the batch's instant; batch sizes are geometric, so that
the one-second counts' index of dispersion (variance over mean) is --dispersion: 1 is
a Poisson stream, 13 what a production LLM trace showed (batches of 7 on average).
With --rate-profile the rate follows that shape (a 'deepboot load' profile,
time_s,rps), scaled to --mean-rps over it; without, a constant rate for --hours.

examples:
  # one hour at 2.6 requests/s, dispersion 10, a 28 GB model that takes 60 s cold
  deepboot workload bursty --mean-rps 2.6 --dispersion 10 --duration-s 4 \\
      --model-gb 28 --cold-start 60 --slo-wait 1 --hours 8 --out out/bursty-10.csv

  # a day's shape from the GenAI trace, with bursts on it
  deepboot workload bursty --rate-profile out/genai-shape.csv --mean-rps 2 \\
      --dispersion 3 --duration-s 2 --out out/genai-bursty.csv"""


def _add_bursty(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    from deepboot.sim.traces.bursty import BurstyConfig

    conf = BurstyConfig()
    p: argparse.ArgumentParser = sub.add_parser(
        "bursty",
        help="a generated inference stream of a chosen burstiness (compound Poisson)",
        description="Write a DeepBoot workload of one inference service whose requests "
        "come in bursts of a chosen index of dispersion, and its services file.",
        epilog=_BURSTY_EPILOG,
        formatter_class=formatter,
    )
    p.add_argument("--service", default=conf.service, metavar="NAME", help="the service's name")
    p.add_argument("--model", default=conf.model, metavar="LABEL", help="its model label")
    _number(p, "--mean-rps", "R", "requests per second, on average", required=True)
    _number(
        p, "--dispersion", "D", "index of dispersion of one-second counts (1: Poisson)",
        default=conf.dispersion,
    )  # fmt: skip
    _number(p, "--duration-s", "S", "seconds every request runs", default=conf.duration_s)
    _number(p, "--hours", "H", "length without --rate-profile", default=conf.hours)
    p.add_argument(
        "--rate-profile",
        metavar="FILE",
        help="the rate's shape: a rate profile CSV (time_s,rps), scaled to --mean-rps",
    )
    _number(p, "--cold-start", "S", "the service's cold start", default=conf.cold_start_s)
    _number(p, "--model-gb", "GB", "its model's size (a host-memory start copies it)")
    _number(p, "--slo-wait", "S", "its SLO's wait", default=conf.slo_wait_s)
    _number(p, "--concurrency", "K", "requests one replica serves at once", default=1)
    _number(p, "--max-requests", "N", "stop after N requests", default=conf.max_requests)
    _common(p, "the arrivals and the batch sizes", "--rate-profile")
    p.set_defaults(func=workload_bursty)


def _add_compose(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "compose",
        help="a training workload plus inference streams at a target peak busy fraction",
        description="Merge a training workload and inference streams (with their services "
        "files) into one DeepBoot workload, time-aligned, with the inference load scaled "
        "to a peak busy fraction of the inference pool.",
        epilog=_COMPOSE_EPILOG,
        formatter_class=formatter,
    )
    p.add_argument(
        "--training", required=True, metavar="FILE", help="Pollux or DeepBoot workload CSV"
    )
    p.add_argument(
        "--inference",
        action="append",
        required=True,
        metavar="FILE",
        help="an inference stream (DeepBoot CSV of infer-<service> rows); repeatable",
    )
    p.add_argument(
        "--services",
        action="append",
        required=True,
        metavar="FILE",
        help="the services file of the --inference at the same position; repeatable",
    )
    _cluster_flags(p, "16x4", 8)
    _number(
        p, "--peak-busy", "F", "scale the inference load to this peak busy fraction "
        "(default: no scaling)",
    )  # fmt: skip
    _number(p, "--window-s", "S", "window of the busy fraction in seconds", default=600.0)
    _number(p, "--max-requests", "N", "most inference requests written", default=1_000_000)
    _common(p, "the thinning and the copies", "an input")
    p.set_defaults(func=workload_compose)


def _add_week(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "week",
        help="a week of a large cluster: Philly's arrivals at a stated training load, "
        "with the GenAI trace's services",
        description="Generate a week (or --days days) of a large shared cluster: training "
        "jobs from the Philly trace's arrivals, scaled to a nominal load of the training "
        "pool, and the Alibaba GenAI trace's requests composed onto the inference pool.",
        epilog=_WEEK_EPILOG,
        formatter_class=formatter,
    )
    p.add_argument("--philly", required=True, metavar="FILE", help="philly.csv")
    p.add_argument("--genai", required=True, metavar="FILE", help="lora_request_trace.csv")
    p.add_argument(
        "--load-latency",
        required=True,
        metavar="FILE",
        help="basemodel_update_latency_anon.csv: each service's cold start is drawn from it",
    )
    p.add_argument(
        "--profiles",
        metavar="DIR",
        help="measured profiles for the nominal GPU times (default: the built-in catalog)",
    )
    _cluster_flags(p, "256x4", 128)
    _number(p, "--days", "D", "days of arrivals (default: 7)", default=7)
    _number(
        p, "--load", "F", "the training jobs' nominal GPU-hours over the training pool's "
        "(default: 0.8)", default=0.8,
    )  # fmt: skip
    _number(
        p, "--peak-busy", "F", "the inference load's peak busy fraction of the inference "
        "pool (default: 0.8)", default=0.8,
    )  # fmt: skip
    _number(p, "--top", "N", "busiest GenAI models kept as services, the rest 'other'", default=10)
    _number(
        p, "--model-gb", "GB", "every service's model size, for a host cache (default: 28, "
        "a host start of 2.84 s at 12 GB/s plus 0.5 s, the median of the trace's fast "
        "base-model loads; the trace names no sizes)", default=28.0,
    )  # fmt: skip
    _number(p, "--max-requests", "N", "most inference requests written", default=MAX_REQUESTS)
    _common(p, "every draw", "an input")
    p.set_defaults(func=workload_week)


# ------------------------------------------------------------------ handlers


@dataclass(frozen=True, slots=True)
class _Outputs:
    workload: str
    services: str


def _output_paths(args: argparse.Namespace, inputs: Sequence[PathArg]) -> _Outputs:
    """``--out`` and ``--services-out`` (default: ``--out`` with ``.toml``), checked."""
    out = require_path(args.out, "--out")
    services = (
        str(Path(out).with_suffix(".toml"))
        if args.services_out is None
        else require_path(args.services_out, "--services-out")
    )
    if same_file(out, services):
        raise ConfigError(f"--services-out {services} is --out; give --services-out another file")
    check_outputs([PathArg("--out", out), PathArg("--services-out", services)], inputs)
    return _Outputs(out, services)


def _write(outputs: _Outputs, command: str, rows: Any, specs: Any, notes: Sequence[str]) -> None:
    from deepboot.core.servicefile import dump_services
    from deepboot.sim.traces.common import write_rows

    header = [
        f"Services of {Path(outputs.workload).name}, written by 'deepboot workload {command}'.",
        *notes,
    ]
    header = [" ".join(line.split()) for line in header]  # one comment line each
    write_atomic(outputs.workload, lambda p: write_rows(p, rows))
    write_text(outputs.services, dump_services(specs, header))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _say(out: Console, text: str) -> None:
    out.print(text, markup=False, highlight=False, soft_wrap=True)


_BUSIEST = re.compile(r"busiest-(\d+(?:\.\d+)?)h")


def _window(args: argparse.Namespace) -> Any:
    from deepboot.sim.traces.genai import Window

    _check_numbers(args, "--hours")
    start = None
    if args.start is not None:
        try:
            when = datetime.fromisoformat(args.start.strip())
        except ValueError:
            raise ConfigError(
                f"--start {args.start!r} is not a date and time like '2024-11-20 08:00:00'"
            ) from None
        if when.tzinfo is not None:
            raise ConfigError("--start: give the time without a zone (the trace's clock)")
        start = (when - datetime(1970, 1, 1)).total_seconds()
    if args.window == "all":
        return Window(start=start, hours=args.hours)
    m = _BUSIEST.fullmatch(args.window)
    if m is None:
        raise ConfigError(f"--window {args.window!r}: use all or busiest-Hh (e.g. busiest-24h)")
    hours = float(m.group(1))
    RANGES["--hours"].check("--window busiest-Hh hours", hours)
    if start is not None or args.hours is not None:
        raise ConfigError("--window busiest-Hh takes neither --start nor --hours")
    return Window(busiest_hours=hours)


def workload_from_genai(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``deepboot workload from-genai``."""
    from deepboot.sim.traces.genai import (
        GenaiConfig,
        genai_stream,
        read_load_latencies,
        read_requests,
    )

    trace = require_path(args.trace, "--trace")
    inputs = [PathArg("--trace", trace)]
    if args.load_latency is not None:
        inputs.append(PathArg("--load-latency", require_path(args.load_latency, "--load-latency")))
    limits.check_seed(args.seed)
    _check_numbers(args, "--cold-start", "--compress", "--top")
    window = _window(args)
    config = GenaiConfig(
        window=window,
        compress=args.compress,
        top=args.top,
        drop_failed=args.drop_failed,
        cold_start_s=args.cold_start,
        service_prefix=args.service_prefix,
    )
    outputs = _output_paths(args, inputs)
    requests = read_requests(trace)
    loads = None if args.load_latency is None else read_load_latencies(args.load_latency)
    stream = genai_stream(requests, config, np.random.default_rng(args.seed), loads)
    return _finish(out, outputs, "from-genai", stream)


def workload_from_azure_llm(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``deepboot workload from-azure-llm``."""
    from deepboot.sim.traces.azure_llm import AzureConfig, CostModel, azure_stream, read_requests

    trace = require_path(args.trace, "--trace")
    limits.check_seed(args.seed)
    _check_numbers(
        args, "--prefill-s-per-token", "--decode-s-per-token", "--overhead-s", "--cold-start",
        "--concurrency", "--hours", "--max-requests", "--gpus-per-replica", "--model-gb",
    )  # fmt: skip
    if not args.model.strip():
        raise ConfigError("--model is empty; give a label")
    cost = CostModel(args.prefill_s_per_token, args.decode_s_per_token, args.overhead_s)
    config = AzureConfig(
        service=args.service,
        model=args.model.strip(),
        concurrency=args.concurrency,
        cold_start_s=args.cold_start,
        hours=args.hours,
        max_requests=args.max_requests,
        cost=cost,
        gpus_per_replica=args.gpus_per_replica,
        model_gb=args.model_gb,
    )
    outputs = _output_paths(args, [PathArg("--trace", trace)])
    stream = azure_stream(read_requests(trace), config, np.random.default_rng(args.seed))
    return _finish(out, outputs, "from-azure-llm", stream)


def workload_bursty(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``deepboot workload bursty``."""
    from deepboot.runtime.client.rateprofile import RateProfile
    from deepboot.sim.traces.bursty import BurstyConfig, bursty_stream

    limits.check_seed(args.seed)
    _check_numbers(
        args, "--mean-rps", "--dispersion", "--duration-s", "--hours", "--cold-start",
        "--slo-wait", "--concurrency", "--max-requests",
    )  # fmt: skip
    if args.model_gb is not None:
        _check_numbers(args, "--model-gb")
    for flag in ("service", "model"):
        if not getattr(args, flag).strip():
            raise ConfigError(f"--{flag} is empty; give a name")
    config = BurstyConfig(
        service=args.service.strip(),
        model=args.model.strip(),
        mean_rps=args.mean_rps,
        dispersion=args.dispersion,
        duration_s=args.duration_s,
        hours=args.hours,
        cold_start_s=args.cold_start,
        model_gb=args.model_gb,
        slo_wait_s=args.slo_wait,
        concurrency=args.concurrency,
        max_requests=args.max_requests,
    )
    inputs: list[PathArg] = []
    shape = None
    if args.rate_profile is not None:
        path = require_path(args.rate_profile, "--rate-profile")
        inputs.append(PathArg("--rate-profile", path))
        shape = list(RateProfile.load(path).pieces())
    outputs = _output_paths(args, inputs)
    stream = bursty_stream(config, np.random.default_rng(args.seed), shape)
    return _finish(out, outputs, "bursty", stream)


def _finish(out: Console, outputs: _Outputs, command: str, stream: Any) -> int:
    from deepboot.sim.traces.common import request_rows

    _write(outputs, command, request_rows(stream.requests), stream.services, stream.notes)
    _say(out, stream.summary)
    _say(
        out,
        f"wrote {outputs.workload} ({len(stream.requests):,} requests) and "
        f"{outputs.services} ({_plural(len(stream.services), 'service')})",
    )
    return 0


def workload_rate_shape(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``deepboot workload rate-shape``."""
    from deepboot.runtime.client.rateprofile import MAX_PROFILE_TIME_S
    from deepboot.runtime.client.rateprofile import MAX_REQUESTS as LOAD_MAX_REQUESTS
    from deepboot.sim.traces.rateshape import rate_shape, read_qps, write_profile

    qps = require_path(args.qps, "--qps")
    out_path = require_path(args.out, "--out")
    _check_numbers(args, "--peak-rps", "--window-s", "--compress")
    if args.window_s / args.compress < 1:
        raise ConfigError(
            f"--compress {args.compress:g} leaves windows of {args.window_s / args.compress:g} "
            "s; they must last at least 1 s"
        )
    check_outputs([PathArg("--out", out_path)], [PathArg("--qps", qps)])
    shape = rate_shape(
        read_qps(qps, args.request_type), args.peak_rps, args.window_s, args.compress
    )
    if shape.times[-1] > MAX_PROFILE_TIME_S:
        raise ConfigError(
            f"the profile lasts {shape.times[-1]:g} s, more than 'deepboot load' accepts "
            f"({MAX_PROFILE_TIME_S:g} s); raise --compress"
        )
    if shape.expected_requests() > LOAD_MAX_REQUESTS:
        raise ConfigError(
            f"the profile asks for {shape.expected_requests():,.0f} requests, more than "
            f"'deepboot load' sends ({LOAD_MAX_REQUESTS:,}); lower --peak-rps or raise --compress"
        )
    write_atomic(out_path, lambda p: write_profile(p, shape))
    _say(out, shape.summary())
    _say(out, f"wrote {out_path} ({len(shape.rates) + 1} rows)")
    return 0


def workload_compose(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``deepboot workload compose``."""
    from deepboot.core.cluster import ClusterSpec, Pool
    from deepboot.core.servicefile import parse_services, read_document
    from deepboot.sim.traces.compose import (
        ComposeConfig,
        comments_of,
        compose,
        read_stream,
        read_training,
    )

    training = require_path(args.training, "--training")
    pairs = list(zip(args.inference, args.services, strict=False))
    if len(args.inference) != len(args.services):
        raise ConfigError(
            f"{len(args.inference)} --inference but {len(args.services)} --services: give "
            "one services file per inference stream, in the same order"
        )
    inputs = [PathArg("--training", training)]
    for stream, services in pairs:
        inputs += [
            PathArg("--inference", require_path(stream, "--inference")),
            PathArg("--services", require_path(services, "--services")),
        ]
    limits.check_seed(args.seed)
    limits.check_cluster(args.cluster, args.inference_nodes)
    if args.inference_nodes < 1:
        raise ConfigError("--inference-nodes must be at least 1: compose needs an inference pool")
    cluster = ClusterSpec.parse(args.cluster, args.inference_nodes)
    gpus = sum(node.gpus for node in cluster.pool_nodes(Pool.INFERENCE))
    _check_numbers(args, "--peak-busy", "--window-s", "--max-requests")
    config = ComposeConfig(gpus, args.peak_busy, args.window_s, args.max_requests)
    outputs = _output_paths(args, inputs)
    train = read_training(training)
    streams = []
    for w, s in pairs:
        raw, text = read_document(s)  # once: a pipe (<(...)) reads only once
        streams.append(read_stream(w, parse_services(raw, str(s), text), s, comments_of(text)))
    result = compose(train, streams, config, np.random.default_rng(args.seed))
    _write(outputs, "compose", result.rows, result.services, result.notes)
    _say(out, result.summary)
    _say(
        out,
        f"wrote {outputs.workload} ({len(result.rows):,} rows) and {outputs.services} "
        f"({_plural(len(result.services), 'service')})",
    )
    return 0


def workload_week(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``deepboot workload week``."""
    from deepboot.core.cluster import ClusterSpec, Pool
    from deepboot.perf.apps import load_apps
    from deepboot.sim.philly import read_philly
    from deepboot.sim.traces.compose import (
        ComposeConfig,
        Stream,
        TrainingFile,
        TrainingRow,
        compose,
    )
    from deepboot.sim.traces.genai import (
        GenaiConfig,
        Window,
        genai_stream,
        read_load_latencies,
        read_requests,
    )
    from deepboot.sim.week import WeekConfig, training_week

    philly = require_path(args.philly, "--philly")
    genai = require_path(args.genai, "--genai")
    latency = require_path(args.load_latency, "--load-latency")
    inputs = [PathArg("--philly", philly), PathArg("--genai", genai)]
    inputs.append(PathArg("--load-latency", latency))
    limits.check_seed(args.seed)
    limits.check_cluster(args.cluster, args.inference_nodes)
    if args.inference_nodes < 1:
        raise ConfigError("--inference-nodes must be at least 1: the week has inference")
    _check_numbers(args, "--days", "--load", "--peak-busy", "--top", "--model-gb", "--max-requests")
    cluster = ClusterSpec.parse(args.cluster, args.inference_nodes)
    training_gpus = sum(n.gpus for n in cluster.pool_nodes(Pool.TRAINING))
    inference_gpus = sum(n.gpus for n in cluster.pool_nodes(Pool.INFERENCE))
    outputs = _output_paths(args, inputs)
    rng = np.random.default_rng(args.seed)
    week = training_week(
        read_philly(philly),
        load_apps(args.profiles),
        WeekConfig(args.days, training_gpus, cluster.nodes[0].gpus, args.load),
        rng,
    )
    rows = tuple(
        TrainingRow(i + 2, j.name, j.submit_time, j.application, j.num_replicas, j.batch_size)
        for i, j in enumerate(week.jobs)
    )
    window = Window(busiest_hours=24.0 * args.days)
    stream = genai_stream(
        read_requests(genai),
        GenaiConfig(window=window, top=args.top),
        rng,
        read_load_latencies(latency),
    )
    specs = tuple(dataclasses.replace(v, model_gb=args.model_gb) for v in stream.services)
    streams = [Stream(genai, outputs.services, stream.requests, specs, stream.notes)]
    config = ComposeConfig(inference_gpus, args.peak_busy, 600.0, args.max_requests)
    result = compose(TrainingFile(philly, rows, 0), streams, config, rng)
    notes = (
        f"Training: the {args.days} busiest days of the Microsoft Philly trace from "
        f"{week.start:%Y-%m-%d}, {len(week.jobs):,} jobs drawn from its {week.philly_jobs:,}, "
        f"nominal load {week.load:.3f} of {training_gpus} GPUs.",
        *result.notes,
    )
    _write(outputs, "week", result.rows, result.services, notes)
    requests = len(result.rows) - len(rows)
    _say(
        out,
        f"training: {len(week.jobs):,} jobs over {args.days} days (Philly's busiest from "
        f"{week.start:%Y-%m-%d}: {week.philly_jobs:,} of its jobs, drawn with replacement), "
        f"nominal {week.nominal_gpu_hours:,.0f} GPU-hours = {week.load:.3f} of the "
        f"{training_gpus} training GPUs' {week.capacity_gpu_hours:,.0f}",
    )
    _say(out, f"inference: {requests:,} requests; {result.summary}")
    _say(
        out,
        f"wrote {outputs.workload} ({len(result.rows):,} rows) and {outputs.services} "
        f"({_plural(len(result.services), 'service')})",
    )
    return 0
