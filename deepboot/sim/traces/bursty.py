"""Inference streams of a chosen burstiness, generated (issue 45).

Requests come in *batches* (a compound Poisson process): batches arrive as a Poisson
process of rate ``rate(t) / E[B]``, and every request of a batch arrives at the
batch's instant. Batch sizes ``B`` are geometric on 1, 2, ... with ``P(B = k) = (1 -
p)^(k - 1) p``: ``E[B] = 1 / p`` and ``E[B^2] / E[B] = (2 - p) / p``. For a compound
Poisson process the index of dispersion of the counts in any window (their variance
over their mean) is ``E[B^2] / E[B]`` whatever the window's length (Cox and Lewis,
*The Statistical Analysis of Series of Events*, 1966, ch. 4), so a target dispersion
``D >= 1`` of one-second counts sets ``p = 2 / (D + 1)``: ``D = 1`` is the Poisson
process (every batch one request), ``D = 13`` (the held-out trace the issue measured)
batches of 7 requests on average. The rate follows any piecewise-constant shape
(``(start, end, rps)`` pieces: a rate profile's), so the mean over the shape is the
one asked for and the bursts ride on the shape's own changes.

Every request gets the same stated duration; the service gets the stated model
size, cold start and SLO. Pure: a function of the configuration and the injected
random generator.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from deepboot.core.errors import ConfigError
from deepboot.core.service import ServiceSpec
from deepboot.sim.traces.common import InferenceStream, Request

MAX_DISPERSION = 1000.0
"""Largest dispersion asked for (a mean batch of ~500 requests)."""


@dataclass(frozen=True, slots=True)
class BurstyConfig:
    """One generated service and its stream.

    Attributes:
        service: The service's name (its rows' application is ``infer-<service>``).
        model: Its model label.
        mean_rps: Requests per second over the whole shape (> 0).
        dispersion: Index of dispersion of one-second counts, >= 1 (1: Poisson).
        duration_s: Seconds every request runs once started (> 0).
        hours: Length of the stream when no shape is given (a constant rate).
        cold_start_s: The service's cold start, seconds.
        model_gb: Its model's size, GB (what a host-memory start copies), or None.
        slo_wait_s: Its SLO's wait, seconds.
        concurrency: Requests one replica serves at once.
        max_requests: Most requests written (a bound on the output).
    """

    service: str = "bursty"
    model: str = "bursty-model"
    mean_rps: float = 1.0
    dispersion: float = 1.0
    duration_s: float = 10.0
    hours: float = 1.0
    cold_start_s: float = 20.0
    model_gb: float | None = None
    slo_wait_s: float = 1.0
    concurrency: int = 1
    max_requests: int = 2_000_000

    def __post_init__(self) -> None:
        checks = (
            ("mean_rps", self.mean_rps > 0),
            ("dispersion", 1.0 <= self.dispersion <= MAX_DISPERSION),
            ("duration_s", self.duration_s > 0),
            ("hours", self.hours > 0),
            ("cold_start_s", self.cold_start_s >= 0),
            ("slo_wait_s", self.slo_wait_s > 0),
            ("concurrency", self.concurrency >= 1),
            ("max_requests", self.max_requests >= 1),
        )
        for name, ok in checks:
            value = getattr(self, name)
            if not ok or not math.isfinite(float(value)):
                raise ConfigError(f"--{name.replace('_', '-')}: {value} is out of range")
        if not 1.0 <= self.dispersion <= MAX_DISPERSION:
            raise ConfigError(f"--dispersion must be in [1, {MAX_DISPERSION:g}]")

    @property
    def batch_p(self) -> float:
        """The geometric batch size's ``p``: ``2 / (dispersion + 1)`` (1: single)."""
        return 2.0 / (self.dispersion + 1.0)


def bursty_stream(
    config: BurstyConfig,
    rng: np.random.Generator,
    shape: Sequence[tuple[float, float, float]] | None = None,
) -> InferenceStream:
    """A compound Poisson stream of ``config``'s service (see the module docstring).

    Args:
        config: The service and the stream's statistics.
        rng: The randomness (injected; the same seed gives the same stream).
        shape: ``(start, end, rps)`` pieces, contiguous from 0: the rate's shape,
            scaled so that its mean over the whole shape is ``config.mean_rps``
            (None: a constant rate for ``config.hours``).

    Raises:
        ConfigError: a shape with no positive rate, or pieces that are not contiguous.
    """
    pieces = _scaled(config, shape)
    p = config.batch_p
    requests: list[Request] = []
    capped = False
    for start, end, rps in pieces:
        if rps <= 0:
            continue
        batches = int(rng.poisson(rps * p * (end - start)))
        times = np.sort(rng.uniform(start, end, size=batches))
        sizes = rng.geometric(p, size=batches) if p < 1.0 else np.ones(batches, dtype=np.int64)
        for t, size in zip(times.tolist(), sizes.tolist(), strict=True):
            for _ in range(int(size)):
                if len(requests) == config.max_requests:
                    capped = True
                    break
                requests.append(Request(t, config.service, config.duration_s))
            if capped:
                break
        if capped:
            break
    spec = ServiceSpec(
        name=config.service,
        model=config.model,
        concurrency=config.concurrency,
        cold_start_s=config.cold_start_s,
        slo_wait_s=config.slo_wait_s,
        model_gb=config.model_gb,
    )
    span = pieces[-1][1]
    measured = dispersion_of(requests, span)
    what = (
        f"{len(requests):,} requests of {config.service} over {span / 3600:.2f} h: mean "
        f"{len(requests) / span:.3f}/s, batches of mean {1 / p:.2f} (geometric), one-second "
        f"counts' dispersion {measured:.2f} (asked {config.dispersion:g})"
    )
    if capped:
        what += f"; CAPPED at --max-requests {config.max_requests:,}"
    notes = (
        "Generated by deepboot workload bursty: a compound Poisson process, geometric "
        f"batches (p = {p:.4f}), dispersion {config.dispersion:g}, mean {config.mean_rps:g} "
        f"requests/s, {config.duration_s:g} s per request.",
    )
    return InferenceStream(tuple(requests), (spec,), notes, what)


def _scaled(
    config: BurstyConfig, shape: Sequence[tuple[float, float, float]] | None
) -> list[tuple[float, float, float]]:
    if shape is None:
        return [(0.0, config.hours * 3600.0, config.mean_rps)]
    pieces = list(shape)
    if not pieces or pieces[0][0] != 0 or any(a[1] != b[0] for a, b in itertools.pairwise(pieces)):
        raise ConfigError("the rate shape's pieces must run contiguously from time 0")
    span = pieces[-1][1]
    total = sum((end - start) * rps for start, end, rps in pieces)
    if total <= 0:
        raise ConfigError("the rate shape asks for no request (every rate is 0)")
    scale = config.mean_rps * span / total
    return [(start, end, rps * scale) for start, end, rps in pieces]


def dispersion_of(requests: Sequence[Request], span_s: float) -> float:
    """The index of dispersion (variance over mean) of the requests' counts in the
    one-second windows of ``[0, span_s)``; 0 with no request."""
    seconds = max(int(math.ceil(span_s)), 1)
    counts = np.bincount(
        np.minimum(np.floor([r.time for r in requests]).astype(np.int64), seconds - 1),
        minlength=seconds,
    ) if requests else np.zeros(seconds)  # fmt: skip
    mean = float(counts.mean())
    return float(counts.var()) / mean if mean > 0 else 0.0
