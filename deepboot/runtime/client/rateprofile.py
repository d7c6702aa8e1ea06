"""The rate profile behind ``deepboot load``: what it reads from ``--rate-profile``,
and when each request is sent.

Rate profile (``--rate-profile FILE``): a CSV with the header ``time_s,rps``, one row
per change of rate. It is piecewise constant: each row's rate holds from its time to
the next row's time, and the last row marks the end of the run (its ``rps`` must be
0). Times start at 0 and strictly increase; rates are finite and >= 0. So::

    time_s,rps
    0,2
    10,20
    20,0

sends 2 requests/s for 10 s, then 20 requests/s for 10 s, and ends at 20 s (220
requests). Blank lines are skipped; every bad line raises
:class:`~deepboot.core.errors.InputError` naming the file, the line and the column.

Arrivals (:func:`send_times`): evenly spaced within each piece (rate ``r``: one request
every ``1/r`` s; the fraction of a request left at the end of a piece carries over to
the next), or a Poisson process of the same rate when a random generator is given.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from deepboot.core.errors import InputError, csv_read_errors

if TYPE_CHECKING:
    from _csv import Reader

PROFILE_COLUMNS: tuple[str, ...] = ("time_s", "rps")
"""The header of a rate profile."""

MAX_PROFILE_TIME_S = 1e6
"""Largest ``time_s`` of a profile (about 11.6 days)."""

MAX_RPS = 100_000.0
"""Largest ``rps`` of a profile row."""

MAX_REQUESTS = 2_000_000
"""Most requests one run may send (a profile asking for more is refused)."""


# ------------------------------------------------------------------ rate profile


@dataclass(frozen=True, slots=True)
class RateProfile:
    """A piecewise-constant request rate.

    Attributes:
        times: Start of each piece, then the end: ``times[0] == 0``, strictly
            increasing; ``len(times) == len(rates) + 1``.
        rates: Requests per second of each piece (finite, >= 0).
        source: Where it was read from (for messages).
    """

    times: tuple[float, ...]
    rates: tuple[float, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if len(self.times) != len(self.rates) + 1 or not self.rates:
            raise ValueError("a profile needs n >= 1 rates and n + 1 times")
        if self.times[0] != 0 or any(b <= a for a, b in pairwise(self.times)):
            raise ValueError("profile times must start at 0 and strictly increase")
        if not all(math.isfinite(r) and r >= 0 for r in self.rates):
            raise ValueError("profile rates must be finite and >= 0")

    @property
    def duration(self) -> float:
        """Seconds from the start to the end of the profile."""
        return self.times[-1]

    def pieces(self) -> Iterator[tuple[float, float, float]]:
        """``(start, end, rps)`` of each piece."""
        for i, rate in enumerate(self.rates):
            yield self.times[i], self.times[i + 1], rate

    def expected_requests(self) -> float:
        """The integral of the rate: how many requests the profile asks for."""
        return sum((b - a) * r for a, b, r in self.pieces())

    @classmethod
    def load(cls, path: str | Path) -> RateProfile:
        """Read a rate profile CSV (see the module docstring).

        Raises:
            InputError: missing or unreadable file, wrong header, a malformed row, a
                time that does not start at 0 or does not increase, a rate that is not
                a finite non-negative number, a last row whose rate is not 0, fewer than
                two rows, or a profile that asks for more than :data:`MAX_REQUESTS`.
        """
        spath = str(path)
        with (
            csv_read_errors(spath, "a rate profile CSV file"),
            Path(path).open(newline="", encoding="utf-8-sig") as f,
        ):
            reader = csv.reader(f)
            _profile_header(reader, spath)
            times, rates, last_line = _profile_rows(reader, spath)
        _check_end(spath, times, rates, last_line)
        profile = cls(tuple(times), tuple(rates[:-1]), spath)
        expected = profile.expected_requests()
        if expected > MAX_REQUESTS:
            raise InputError(
                spath,
                0,
                "",
                f"the profile asks for {expected:,.0f} requests; at most {MAX_REQUESTS:,} per run",
            )
        return profile


def _profile_rows(reader: Reader, spath: str) -> tuple[list[float], list[float], int]:
    """(times, rates, the line of the last row) of the rows after the header (blank
    lines skipped), each checked: two numbers in range, times from 0, increasing."""
    times: list[float] = []
    rates: list[float] = []
    last_line = 1
    for values in reader:
        if not values or all(not v.strip() for v in values):
            continue
        line = last_line = reader.line_num
        if len(values) != len(PROFILE_COLUMNS):
            column = PROFILE_COLUMNS[len(values)] if len(values) < 2 else "rps"
            what = "missing" if len(values) < 2 else f"{len(values) - 2} extra value(s)"
            raise InputError(spath, line, column, f"expected 2 values (time_s,rps), {what}")
        t = _number(spath, line, "time_s", values[0], MAX_PROFILE_TIME_S)
        r = _number(spath, line, "rps", values[1], MAX_RPS)
        if not times and t != 0:
            raise InputError(spath, line, "time_s", f"the first row must be at time 0, got {t:g}")
        if times and t <= times[-1]:
            raise InputError(
                spath,
                line,
                "time_s",
                f"{t:g} does not come after the previous row's {times[-1]:g}; "
                "times must strictly increase",
            )
        times.append(t)
        rates.append(r)
    return times, rates, last_line


def _check_end(spath: str, times: list[float], rates: list[float], last_line: int) -> None:
    """Raise InputError unless there are two rows or more, the last with rate 0."""
    if len(times) < 2:
        raise InputError(
            spath,
            last_line,
            "time_s",
            "a profile needs at least two rows: the last one marks the end "
            "(for example 'T,0' to end at T seconds)",
        )
    if rates[-1] != 0:
        raise InputError(
            spath,
            last_line,
            "rps",
            f"the last row marks the end of the profile, so its rps must be 0, got "
            f"{rates[-1]:g} (add a row '{times[-1]:g}+D,0' to keep this rate for D s)",
        )


def _profile_header(reader: Iterator[list[str]], spath: str) -> None:
    for values in reader:
        if not values or all(not v.strip() for v in values):
            continue
        header = tuple(v.strip() for v in values)
        if header == PROFILE_COLUMNS:
            return
        line = getattr(reader, "line_num", 1)
        field = next(
            (c for i, c in enumerate(header) if i >= 2 or c != PROFILE_COLUMNS[i]),
            PROFILE_COLUMNS[len(header)] if len(header) < 2 else "header",
        )
        raise InputError(spath, line, field or "header", "unknown header; expected 'time_s,rps'")
    raise InputError(spath, 1, "header", "the file is empty; expected the header 'time_s,rps'")


def _number(spath: str, line: int, column: str, raw: str, top: float) -> float:
    text = raw.strip()
    if not text:
        raise InputError(spath, line, column, "is empty")
    try:
        value = float(text)
    except ValueError:
        raise InputError(spath, line, column, f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise InputError(spath, line, column, f"{text!r} is not a finite number")
    if value < 0:
        raise InputError(spath, line, column, f"{text} must be >= 0")
    if value > top:
        raise InputError(spath, line, column, f"{text} exceeds the limit {top:g}")
    return value


# ------------------------------------------------------------------ arrivals


def send_times(profile: RateProfile, rng: np.random.Generator | None = None) -> list[float]:
    """When each request is sent, in seconds from the start, sorted, all in
    ``[0, profile.duration)``.

    Args:
        profile: The rate profile.
        rng: None: deterministic, evenly spaced arrivals. Request ``k`` (0-based) goes
            at the time the integral of the rate reaches ``k``, counting only pieces
            with a positive rate; so a piece of rate ``r`` sends one request every
            ``1/r`` s and its leftover fraction carries into the next piece (2 rps for
            10 s then 20 rps for 10 s: 220 requests, at 0, 0.5, ..., 9.5, 10, 10.05,
            ..., 19.95). A generator: a Poisson process of the same rate (the same
            seed gives the same times).
    """
    out: list[float] = []
    if rng is not None:
        for a, b, r in profile.pieces():
            if r <= 0:
                continue
            n = int(rng.poisson(r * (b - a)))
            out.extend(np.sort(rng.uniform(a, b, size=n)).tolist())
        return out
    done = Fraction(0)  # requests due so far (exact: no request is lost to rounding)
    for a, b, r in profile.pieces():
        if r <= 0:
            continue
        fr, fa, fb = Fraction(r), Fraction(a), Fraction(b)
        end = done + fr * (fb - fa)
        first, stop = math.ceil(done), math.ceil(end)  # requests first .. stop-1
        for k in range(first, stop):
            t = float(fa + (k - done) / fr)
            out.append(min(t, math.nextafter(b, a)))
        done = end
    return out
