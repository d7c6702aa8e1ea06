"""Confidence intervals over replications, and paired differences against a baseline.

A handful of long jobs dominate the average JCT, so one run per configuration cannot
tell a real difference from placement noise. With K replications of every
configuration (the same K perturbed workloads for every run, so the comparison is
paired), each metric gets its mean with a 95% Student-t interval, and each run its
paired difference against the baseline:

    mean = sum(x) / K,  half = t(0.975, K - 1) * sd(x) / sqrt(K)
    d_i  = x_run,i - x_base,i   (the same replication i), then the same on d

A difference is called real only where its interval excludes zero. Student t on the
paired differences assumes they are roughly normal; with K = 5 it is the textbook
choice (a bootstrap needs more replications to be trusted).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

CONFIDENCE = 0.95


@dataclass(frozen=True, slots=True)
class Interval:
    """A mean and its two-sided confidence interval.

    Attributes:
        mean: The sample mean.
        half: Half the interval's width (``inf`` with one sample, 0 with no spread).
        n: Samples.
    """

    mean: float
    half: float
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half

    @property
    def high(self) -> float:
        return self.mean + self.half

    @property
    def excludes_zero(self) -> bool:
        """The interval lies wholly above or below zero: a real difference."""
        return self.low > 0.0 or self.high < 0.0


def mean_interval(xs: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The mean of ``xs`` with its Student-t interval (K - 1 degrees of freedom).

    Raises:
        ValueError: ``xs`` is empty, or a value is not finite.
    """
    n = len(xs)
    if n == 0:
        raise ValueError("an interval needs at least one sample")
    if not all(math.isfinite(x) for x in xs):
        raise ValueError("an interval needs finite samples")
    mean = math.fsum(xs) / n
    if n == 1:
        return Interval(mean, math.inf, 1)
    var = math.fsum((x - mean) ** 2 for x in xs) / (n - 1)
    t = float(stats.t.ppf(0.5 + confidence / 2, n - 1))
    return Interval(mean, t * math.sqrt(var / n), n)


def paired_difference(
    runs: Sequence[float], baseline: Sequence[float], confidence: float = CONFIDENCE
) -> Interval:
    """Interval of the mean paired difference ``run_i - baseline_i``.

    Raises:
        ValueError: the sequences differ in length or are empty.
    """
    if len(runs) != len(baseline):
        raise ValueError(f"paired samples differ in count: {len(runs)} vs {len(baseline)}")
    return mean_interval([a - b for a, b in zip(runs, baseline, strict=True)], confidence)
