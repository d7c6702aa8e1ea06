"""The diurnal rate shape of the Alibaba GenAI trace's QPS samples (``qps.csv``), as a
rate profile (``time_s,rps``, the layout ``deepboot load --rate-profile`` reads).

``qps.csv`` (``timestamp_anon,value,container_ip,request_type``) holds per-container
QPS samples (about one a minute per container while it serves; values anonymised by a
constant factor, which keeps the shape). The platform's rate in a window is taken as
proportional to the **sum of the samples that fall in it**: each container reports at
the same period, and a missing sample counts as 0. Windows of ``window_s`` seconds start
at the first sample; only whole windows are kept (the samples after the last whole
window are left out: a partial window's sum would understate its rate). The sums are
scaled so that the largest equals ``peak_rps``.

The profile's rows: window ``j`` at ``time_s = j x window_s / compress`` with its rate,
then a last row at the end of the last window with rate 0, which ends the profile (the
reader's rule). ``compress`` shortens the day (e.g. 22 h into 1 h for a demo); rates are
unchanged.

**Valid rows** (else an :class:`~deepboot.core.errors.InputError` naming the file, the
line and the column): ``timestamp_anon`` a number of seconds in [0, 1e11]; ``value`` a
number in [0, 1e9]; ``container_ip`` any text (empty allowed); ``request_type`` text.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deepboot.core.errors import ConfigError
from deepboot.sim.traces.common import GENAI_SOURCE, read_rows

COLUMNS: tuple[str, ...] = ("timestamp_anon", "value", "container_ip", "request_type")
"""The header of ``qps.csv``."""

MAX_TIMESTAMP = 1e11
MAX_VALUE = 1e9
MAX_WINDOWS = 1_000_000
"""Most windows of a profile ('deepboot load' reads at most 1e6 s of windows >= 1 s)."""


@dataclass(frozen=True, slots=True)
class QpsSamples:
    """The samples of one request type (or of all).

    Attributes:
        times: Sample times in seconds, file order.
        values: Sample values, file order.
        types: How many samples each request type has in the whole file.
    """

    times: tuple[float, ...]
    values: tuple[float, ...]
    types: Counter[str]


def read_qps(path: str | Path, request_type: str | None = None) -> QpsSamples:
    """Read ``qps.csv`` row by row, keeping the samples of ``request_type`` (None: all).

    Every row is validated, whatever its type.

    Raises:
        InputError: a bad row, naming the file, the line and the column.
        ConfigError: no sample has ``request_type`` (the types found are listed).
    """
    times: list[float] = []
    values: list[float] = []
    types: Counter[str] = Counter()
    for row in read_rows(path, "qps.csv", COLUMNS):
        t = row.number("timestamp_anon", MAX_TIMESTAMP)
        v = row.number("value", MAX_VALUE)
        kind = row.text("request_type")
        types[kind] += 1
        if request_type is None or kind == request_type:
            times.append(t)
            values.append(v)
    if not times:
        found = ", ".join(f"{k!r} ({n})" for k, n in sorted(types.items()))
        raise ConfigError(f"{path}: no sample of request type {request_type!r}; found {found}")
    return QpsSamples(tuple(times), tuple(values), types)


@dataclass(frozen=True, slots=True)
class RateShape:
    """A rate profile.

    Attributes:
        times: Start of each window, then the end (seconds, from 0).
        rates: Requests per second of each window; ``len(times) == len(rates) + 1``.
        window_s: Each window's length in the trace (before compression).
        samples: Samples that went into the windows.
        left_out_s: Seconds of samples after the last whole window (left out).
    """

    times: tuple[float, ...]
    rates: tuple[float, ...]
    window_s: float
    samples: int
    left_out_s: float

    def rows(self) -> list[tuple[str, str]]:
        """The profile's CSV rows (without the header), the last with rate 0."""
        rates = [*self.rates, 0.0]
        return [(_num(t), _num(r)) for t, r in zip(self.times, rates, strict=True)]

    def expected_requests(self) -> float:
        """How many requests the profile asks for."""
        return sum(
            (b - a) * r for a, b, r in zip(self.times, self.times[1:], self.rates, strict=False)
        )

    def summary(self) -> str:
        """One line: windows, span, peak and trough, requests, the credit."""
        rates = np.array(self.rates)
        peak, low = int(np.argmax(rates)), float(rates.min())
        ratio = f" (peak/trough {rates[peak] / low:.1f}x)" if low > 0 else ""
        step = self.times[1] - self.times[0]
        return (
            f"rate-shape: {len(self.rates)} windows of {self.window_s:g} s ({step:g} s in the "
            f"profile), {self.times[-1] / 3600:.2f} h from {self.samples:,} samples "
            f"({self.left_out_s:.0f} s after the last whole window left out); peak "
            f"{rates[peak]:g} rps at {self.times[peak] / 3600:.2f} h, trough {low:g} rps"
            f"{ratio}, mean {float(rates.mean()):.3g} rps: {self.expected_requests():,.0f} "
            f"requests in all; {GENAI_SOURCE}"
        )


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(round(x, 6))


def rate_shape(
    samples: QpsSamples, peak_rps: float, window_s: float, compress: float = 1.0
) -> RateShape:
    """The rate profile of ``samples`` (see the module doc).

    Args:
        samples: From :func:`read_qps`.
        peak_rps: The largest window's rate, in (0, 1e5].
        window_s: Window length in the trace's seconds, in [1, 86400].
        compress: Divide times by this, so that a window lasts ``window_s / compress``
            seconds in the profile (at least 1).

    Raises:
        ConfigError: an argument is out of range, the samples span less than one
            window or more than :data:`MAX_WINDOWS`, or every window sums to 0.
    """
    if not 0 < peak_rps <= 1e5:
        raise ConfigError(f"peak rate must be in (0, 100000] requests/s, got {peak_rps}")
    if not 1 <= window_s <= 86_400:
        raise ConfigError(f"window must be in [1, 86400] s, got {window_s}")
    if not (0 < compress <= 1e4 and window_s / compress >= 1):
        raise ConfigError(
            f"compress must be in (0, 10000] and leave windows of at least 1 s, got {compress}"
        )
    t = np.array(samples.times, dtype=np.float64)
    v = np.array(samples.values, dtype=np.float64)
    t0, span = float(t.min()), float(t.max() - t.min())
    windows = int(span // window_s)
    if windows > MAX_WINDOWS:
        raise ConfigError(
            f"the samples span {span:g} s: {windows:,} windows of {window_s:g} s, more than "
            f"{MAX_WINDOWS:,}; give a longer window"
        )
    if windows < 1:
        raise ConfigError(
            f"the samples span {span:g} s, less than one window of {window_s:g} s; "
            "give a shorter window"
        )
    index = np.floor((t - t0) / window_s).astype(np.int64)
    inside = index < windows
    sums = np.bincount(index[inside], v[inside], windows)
    top = float(sums.max())
    if top <= 0:
        raise ConfigError("every window's samples sum to 0: there is no shape to scale")
    rates = sums / top * peak_rps
    step = window_s / compress
    return RateShape(
        times=tuple(j * step for j in range(windows + 1)),
        rates=tuple(float(r) for r in rates),
        window_s=window_s,
        samples=int(inside.sum()),
        left_out_s=span - windows * window_s,
    )


def write_profile(path: str | Path, shape: RateShape) -> None:
    """Write ``shape`` as a rate profile CSV (``time_s,rps``).

    Raises:
        OSError: the file cannot be written.
    """
    lines = ["time_s,rps", *(f"{t},{r}" for t, r in shape.rows())]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
