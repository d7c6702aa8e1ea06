"""An inference stream from the Azure LLM inference trace 2023
(``AzureLLMInferenceTrace_conv.csv``, ``TIMESTAMP,ContextTokens,GeneratedTokens``).

One service; a request's duration follows from its tokens through a per-token cost
model (:class:`CostModel`)::

    duration = overhead_s + prefill_s_per_token x ContextTokens
                          + decode_s_per_token x GeneratedTokens

**Defaults** (one replica = one GPU, so a model that fits one GPU: a 7B model in fp16 on
an A100 80GB):

* ``decode_s_per_token = 0.012``: measured. NVIDIA's NeMo inference table for
  Llama-2-7B on one A100 80GB SXM4 at batch 1 gives 234 ms for 128 input and 20 output
  tokens, about 11-12 ms per generated token once the short prefill is taken out.
* ``prefill_s_per_token = 0.0001``: an estimate, not a measurement: a 7B model does
  about 2 x 7e9 = 1.4e10 FLOPs per prompt token, and an A100 sustains roughly half of
  its 312 TFLOP/s fp16 peak in prefill, about 0.09 ms per token (attention's growth
  with the context is left out).
* ``overhead_s = 0.05``: an estimate (request handling, scheduling, detokenising).
* With these, the conversation trace's mean request (1,155 context and 211 generated
  tokens) runs about 2.7 s.

The trace's own paper (Splitwise) measured 70B and 176B models on whole 8-GPU
machines; those figures do not describe a one-GPU replica and are not used.

**A 70B-class model on 4 GPUs** (``gpus_per_replica = 4``; ``examples/azure-70b.toml``
records the flags): Llama-2-70B in fp16 (140 GB of weights, ``model_gb``), tensor
parallel over 4 A100 80GB of one node. Every figure is an estimate, stated:

* ``decode_s_per_token = 0.030``: decode at batch 1 reads every weight once per token;
  140 GB over 4 x 2.0 TB/s of HBM is 17.5 ms at the bandwidth's peak, about 30 ms at
  the ~60% a serving engine sustains; PyTorch's compiled Llama-2-70B measured
  29 ms/token at batch 1 on 8 A100s (pytorch.org/blog/pytorch-compile-to-speed-up-
  inference), which this does not beat with half the GPUs.
* ``prefill_s_per_token = 0.00022``: 2 x 70e9 = 1.4e11 FLOPs per prompt token over 4
  A100s at half of their 312 TFLOP/s fp16 peak (624 TFLOP/s together).
* ``overhead_s = 0.05``, ``concurrency = 8``: as for the 7B default.
* With these the conversation trace's mean request (1,155 context and 211 generated
  tokens) runs about 6.6 s.
* ``cold_start_s = 90``: the 140 GB read from the node's disk or a model store at
  about 2 GB/s (70 s) plus the engine's start over 4 GPUs (workers, NCCL, CUDA
  graphs: about 20 s). A host start (the simulator's host cache) copies a 4th of the
  weights to each GPU over its own link at once: ``init + 35 GB / gbps``, 3.4 s at
  the cache's default 12 GB/s and 0.5 s.

**Concurrency** (default 8): requests one replica serves at once (continuous
batching), written into the services file. Each request keeps its batch-1 duration:
optimistic, since the same NeMo table shows a batch of 8 taking about 1.4x the batch-1
latency.

**Cold start** (default 20 s): an estimate, not a measurement: reading about 13.5 GB of
fp16 weights at about 1 GB/s plus the serving engine's start.

**Longer than the trace** (``hours``): the trace covers one hour. It is tiled: tile 0
is the trace itself (arrivals from its first request); tile ``k >= 1`` covers
``[k P, (k+1) P)`` and holds every request of the trace, its arrival rotated by a
seeded shift ``s_k`` drawn uniformly from ``[0, P)``: ``k P + ((t - t0 + s_k) mod P)``.
``P`` is the trace's span times ``n / (n - 1)`` (so a tile has the trace's mean rate;
3600 s for a trace of one request or one instant). Rotating keeps the within-hour
shape (with one seam per tile) while no two tiles put their bursts at the same minute.
Arrivals at or after ``hours`` are cut. Output stops at ``max_requests`` (earliest
first) and the summary says so.

**Valid rows** (else an :class:`~deepboot.core.errors.InputError` naming the file, the
line and the column): ``TIMESTAMP`` a date and time without a zone
(``2023-11-16 18:15:46.6805900``), ``ContextTokens`` and ``GeneratedTokens`` whole
numbers in [0, 10,000,000].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from deepboot.core.errors import ConfigError
from deepboot.core.service import (
    MAX_CONCURRENCY,
    MAX_GPUS_PER_REPLICA,
    MAX_MODEL_GB,
    ServiceSpec,
    valid_name,
)
from deepboot.sim.traces.common import AZURE_SOURCE, InferenceStream, Request, demand, read_rows

COLUMNS: tuple[str, ...] = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
"""The header of an Azure LLM inference trace."""

MAX_TOKENS = 10_000_000
"""Most tokens of one request accepted."""
MIN_DURATION_S = 0.001
"""Duration given to a request whose cost model gives 0 (all costs 0)."""
MAX_HOURS = 24.0 * 366
"""Longest stream one call builds."""


@dataclass(frozen=True, slots=True)
class AzureRequest:
    """One row of the trace.

    Attributes:
        line: 1-based line in the file.
        arrival: ``TIMESTAMP`` as seconds since 1970-01-01 (same clock, no zone).
        context_tokens: Prompt tokens.
        generated_tokens: Output tokens.
    """

    line: int
    arrival: float
    context_tokens: int
    generated_tokens: int


def read_requests(path: str | Path) -> list[AzureRequest]:
    """Read the trace row by row (see the module doc for valid rows).

    Raises:
        InputError: naming the file, the line and the column.
    """
    return [
        AzureRequest(
            row.line,
            row.timestamp("TIMESTAMP"),
            row.count("ContextTokens", MAX_TOKENS),
            row.count("GeneratedTokens", MAX_TOKENS),
        )
        for row in read_rows(path, "an Azure LLM inference trace", COLUMNS)
    ]


@dataclass(frozen=True, slots=True)
class CostModel:
    """Seconds a request runs, from its tokens (defaults and sources: module doc).

    Attributes:
        prefill_s_per_token: Seconds per context (prompt) token, in [0, 10].
        decode_s_per_token: Seconds per generated token, in [0, 10].
        overhead_s: Fixed seconds per request, in [0, 3600].
    """

    prefill_s_per_token: float = 0.0001
    decode_s_per_token: float = 0.012
    overhead_s: float = 0.05

    def __post_init__(self) -> None:
        for name, top in (("prefill_s_per_token", 10), ("decode_s_per_token", 10)):
            if not 0 <= getattr(self, name) <= top:
                raise ConfigError(f"{name} must be in [0, {top}] s, got {getattr(self, name)}")
        if not 0 <= self.overhead_s <= 3600:
            raise ConfigError(f"overhead_s must be in [0, 3600] s, got {self.overhead_s}")

    def duration(self, context_tokens: int, generated_tokens: int) -> float:
        """Seconds one request runs (0 only when every cost is 0)."""
        return (
            self.overhead_s
            + self.prefill_s_per_token * context_tokens
            + self.decode_s_per_token * generated_tokens
        )


@dataclass(frozen=True, slots=True)
class AzureConfig:
    """Knobs of :func:`azure_stream` (defaults: module doc).

    Attributes:
        service: The one service's name.
        model: Its model label.
        concurrency: Requests one replica serves at once, in [1, 1024].
        cold_start_s: The service's cold start, in [0, 86400] s.
        hours: Tile the trace to this many hours; None: the trace as it is.
        max_requests: Stop after this many requests (>= 1).
        cost: The cost model.
        gpus_per_replica: GPUs one replica spans, all on one node, in [1, 64].
        model_gb: The model's weights in GB, written into the services file (the
            host cache's size of it); None: not written.
    """

    service: str = "llm-conv"
    model: str = "azure-llm-conv"
    concurrency: int = 8
    cold_start_s: float = 20.0
    hours: float | None = None
    max_requests: int = 200_000
    cost: CostModel = field(default_factory=CostModel)
    gpus_per_replica: int = 1
    model_gb: float | None = None

    def __post_init__(self) -> None:
        if not valid_name(self.service):
            raise ConfigError(
                f"service name {self.service!r}: use letters, digits and _.-, starting with "
                "a letter or digit (at most 63 characters)"
            )
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise ConfigError(f"concurrency must be in [1, {MAX_CONCURRENCY}]")
        if not 0 <= self.cold_start_s <= 86_400:
            raise ConfigError(f"cold start must be in [0, 86400] s, got {self.cold_start_s}")
        if self.hours is not None and not 0 < self.hours <= MAX_HOURS:
            raise ConfigError(f"hours must be in (0, {MAX_HOURS:g}], got {self.hours}")
        if self.max_requests < 1:
            raise ConfigError(f"max_requests must be >= 1, got {self.max_requests}")
        if not 1 <= self.gpus_per_replica <= MAX_GPUS_PER_REPLICA:
            raise ConfigError(f"gpus_per_replica must be in [1, {MAX_GPUS_PER_REPLICA}]")
        if self.model_gb is not None and not 0 < self.model_gb <= MAX_MODEL_GB:
            raise ConfigError(f"model_gb must be in (0, {MAX_MODEL_GB:g}], got {self.model_gb}")


def tile_period(arrivals: Sequence[float]) -> float:
    """``P`` of the tiling (module doc): the span times ``n / (n - 1)``, or 3600 s."""
    n = len(arrivals)
    span = max(arrivals) - min(arrivals) if n else 0.0
    return span * n / (n - 1) if n > 1 and span > 0 else 3600.0


def azure_stream(
    trace: Sequence[AzureRequest], config: AzureConfig, rng: np.random.Generator
) -> InferenceStream:
    """The inference stream of an Azure LLM trace (see the module doc).

    Args:
        trace: The rows (:func:`read_requests`); never mutated.
        config: Service, cost model, tiling and cap.
        rng: Draws the tiles' shifts (one per tile after the first, in order).

    Returns:
        Requests sorted by arrival, one service, notes and the summary line.

    Raises:
        ConfigError: the trace is empty.
    """
    if not trace:
        raise ConfigError("the trace has no requests")
    rows = sorted(trace, key=lambda r: r.arrival)
    t0 = rows[0].arrival
    offsets = np.array([r.arrival - t0 for r in rows], dtype=np.float64)
    zero = 0
    durations: list[float] = []
    for r in rows:
        d = config.cost.duration(r.context_tokens, r.generated_tokens)
        if d <= 0:
            zero += 1
        durations.append(d if d > 0 else MIN_DURATION_S)
    period = tile_period(offsets.tolist())
    end = None if config.hours is None else config.hours * 3600
    tiles = 1 if end is None else max(1, int(np.ceil(end / period)))
    requests: list[Request] = []
    capped = False
    for k in range(tiles):
        if k == 0:
            times = offsets
        else:
            times = k * period + np.mod(offsets + rng.uniform(0.0, period), period)
        order = np.argsort(times, kind="stable")
        for i in order.tolist():
            t = float(times[i])
            if end is not None and t >= end:
                continue
            if len(requests) == config.max_requests:
                capped = True
                break
            requests.append(Request(t, config.service, durations[i]))
        if capped:
            break
    requests.sort(key=lambda r: r.time)
    spec = ServiceSpec(
        name=config.service,
        model=config.model,
        concurrency=config.concurrency,
        cold_start_s=config.cold_start_s,
        model_gb=config.model_gb,
        gpus_per_replica=config.gpus_per_replica,
    )
    busy = demand(requests, {spec.name: spec.concurrency}, gpus={spec.name: spec.gpus_per_replica})
    cost = config.cost
    span_h = requests[-1].time / 3600
    cover = (
        f"the trace's {len(rows):,} requests over {period / 3600:.3f} h"
        if config.hours is None
        else f"{tiles} tile(s) of the trace's {len(rows):,} requests ({period:.1f} s each, "
        f"seeded rotations) cut at {config.hours:g} h"
    )
    cap_text = (
        f"; CAPPED at --max-requests {config.max_requests:,}: the requests end at "
        f"{span_h:.2f} h of the {config.hours or period / 3600:g} h asked"
        if capped
        else ""
    )
    model_text = (
        f"duration = {cost.overhead_s:g} s + {cost.prefill_s_per_token:g} s x context tokens "
        f"+ {cost.decode_s_per_token:g} s x generated tokens ({zero} zero durations set to "
        f"{MIN_DURATION_S:g} s); concurrency {config.concurrency}; cold start "
        f"{config.cold_start_s:g} s"
    )
    if config.gpus_per_replica > 1 or config.model_gb is not None:
        gb = "" if config.model_gb is None else f", a model of {config.model_gb:g} GB"
        model_text += f"; {config.gpus_per_replica} GPU(s) of one node a replica{gb}"
    notes = (AZURE_SOURCE, f"{len(requests):,} requests: {cover}{cap_text}.", model_text + ".")
    mean_d = sum(r.duration for r in requests) / len(requests)
    summary = (
        f"from-azure-llm: 1 service ({spec.name}), {len(requests):,} requests over "
        f"{span_h:.2f} h ({cover}{cap_text}); mean duration {mean_d:.2f} s; {model_text}; "
        f"demand: mean {busy.mean:.2f} GPUs, peak 10-min {busy.peak:.2f} GPUs; {AZURE_SOURCE}"
    )
    return InferenceStream(tuple(requests), (spec,), notes, summary)
