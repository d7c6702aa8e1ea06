"""The valid ranges of the ``deepboot`` command's numeric flags, checked at the boundary.

Each check raises :class:`~deepboot.core.errors.ConfigError` (one stderr line, exit 2)
with the flag, the range and the value; the same ranges are stated in ``--help``.
"""

from __future__ import annotations

import math
import re

from deepboot.core.errors import ConfigError

SEED_LIMIT = 2**63
"""``0 <= --seed < SEED_LIMIT``."""
MAX_INTERVAL_S = 86_400.0
"""``0 < --interval <= MAX_INTERVAL_S`` (one day)."""
MAX_TIME_S = 1e9
"""``0 < --max-time <= MAX_TIME_S`` (about 31.7 years of simulated time)."""
MAX_PROCS = 64
"""``1 <= --procs <= MAX_PROCS``."""
MAX_NODES = 4096
MAX_GPUS_PER_NODE = 64
MAX_GPUS = 65_536
"""``--cluster NODESxGPUS``: at most MAX_NODES nodes, MAX_GPUS_PER_NODE GPUs per node
and MAX_GPUS GPUs in all."""
MAX_PHILLY_JOBS = 100_000
"""``1 <= from-philly --jobs <= MAX_PHILLY_JOBS``."""
MAX_PROTECT_FACTOR = 100.0
"""``0 <= --protect-factor <= MAX_PROTECT_FACTOR``."""

SEED_HELP = "0 <= SEED < 2**63"
INTERVAL_HELP = f"0 < SECONDS <= {MAX_INTERVAL_S:g} (one day)"
DEFAULT_INTERVAL_S = 60.0
"""The scheduling interval when neither --interval nor a preset names one (Pollux's and
DeepBoot's, the fidelity figures' and the goldens')."""
MAX_TIME_HELP = "0 < SECONDS <= 1e9 (about 31 years)"
PROCS_HELP = f"1 <= N <= {MAX_PROCS}"
CLUSTER_HELP = (
    f"at most {MAX_NODES} nodes, {MAX_GPUS_PER_NODE} GPUs per node and {MAX_GPUS:,} GPUs in all"
)
INFERENCE_NODES_HELP = "0 <= N < NODES"
PHILLY_JOBS_HELP = f"1 <= JOBS <= {MAX_PHILLY_JOBS:,}"
PROTECT_FACTOR_HELP = f"0 <= P <= {MAX_PROTECT_FACTOR:g}"

_SHAPE = re.compile(r"\s*(?:[^:,]*:)?\s*(\d+)\s*[xX]\s*(\d+)\s*")


def check_seed(seed: int) -> int:
    """``seed`` if ``0 <= seed < 2**63``."""
    if not 0 <= seed < SEED_LIMIT:
        raise ConfigError(f"--seed must be in [0, 2**63), got {seed}")
    return seed


def check_interval(seconds: float) -> float:
    """``seconds`` if finite and in ``(0, 86400]``."""
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_INTERVAL_S):
        raise ConfigError(
            f"--interval must be a number of seconds in (0, {MAX_INTERVAL_S:g}], got {seconds}"
        )
    return seconds


def check_max_time(seconds: float | None) -> float | None:
    """``seconds`` (or None) if finite and in ``(0, 1e9]``."""
    if seconds is not None and not (math.isfinite(seconds) and 0 < seconds <= MAX_TIME_S):
        raise ConfigError(f"--max-time must be a number of seconds in (0, 1e9], got {seconds}")
    return seconds


def check_procs(procs: int | None) -> int | None:
    """``procs`` (or None) if in ``[1, 64]``."""
    if procs is not None and not 1 <= procs <= MAX_PROCS:
        raise ConfigError(f"--procs must be >= 1 and <= {MAX_PROCS}, got {procs}")
    return procs


def check_cluster(shape: str, inference_nodes: int) -> None:
    """Check ``--cluster`` against the size bounds and ``--inference-nodes`` against it.

    A malformed shape is left to :meth:`~deepboot.core.cluster.ClusterSpec.parse`,
    which says what the format is; this check only runs before it so that a huge
    cluster is refused before it is built.
    """
    nodes = gpus_in_all = widest = 0
    for group in shape.split(","):
        m = _SHAPE.fullmatch(group)
        if m is None:
            return
        # Compare digit counts first: int() refuses strings of over 4300 digits.
        nodes_text, gpus_text = m.group(1).lstrip("0") or "0", m.group(2).lstrip("0") or "0"
        count = int(nodes_text) if len(nodes_text) <= 9 else MAX_NODES + 1
        gpus = int(gpus_text) if len(gpus_text) <= 9 else MAX_GPUS_PER_NODE + 1
        nodes += count
        widest = max(widest, gpus)
        gpus_in_all += count * gpus
    if nodes > MAX_NODES or widest > MAX_GPUS_PER_NODE or gpus_in_all > MAX_GPUS:
        raise ConfigError(f"cluster shape {shape!r} is too large: {CLUSTER_HELP}")
    if nodes >= 1 and not 0 <= inference_nodes < nodes:
        raise ConfigError(
            f"--inference-nodes {inference_nodes} must be in [0, {nodes - 1}] for {nodes} nodes"
        )


def check_philly_jobs(jobs: int) -> int:
    """``jobs`` if in ``[1, 100000]``."""
    if not 1 <= jobs <= MAX_PHILLY_JOBS:
        raise ConfigError(f"--jobs must be in [1, {MAX_PHILLY_JOBS}], got {jobs}")
    return jobs


def check_philly_hours(hours: float) -> float:
    """``hours`` if finite and in ``(0, 24]``."""
    if not (math.isfinite(hours) and 0 < hours <= 24):
        raise ConfigError(f"--hours must be in (0, 24] (days are folded onto one), got {hours}")
    return hours


def check_start_hour(hour: int | None) -> int | None:
    """``hour`` (or None) if in ``[0, 23]``."""
    if hour is not None and not 0 <= hour <= 23:
        raise ConfigError(f"--start-hour must be in [0, 23], got {hour}")
    return hour


def check_protect_factor(factor: float) -> float:
    """``factor`` if finite and in ``[0, 100]``."""
    if not (math.isfinite(factor) and 0 <= factor <= MAX_PROTECT_FACTOR):
        raise ConfigError(
            f"--protect-factor must be a number in [0, {MAX_PROTECT_FACTOR:g}], got {factor}"
        )
    return factor


def check_reserve_target(target: float) -> float:
    """``target`` if in ``[0, 1)``."""
    if not 0.0 <= target < 1.0:  # also False for NaN
        raise ConfigError(f"--reserve-target must be in [0, 1), got {target}")
    return target
