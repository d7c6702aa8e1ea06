"""The inference replica lifecycle: RUNNING -> PROTECT -> SLEEP (DeepBoot §2.3).

When a replica's task ends it stays warm and unlendable (PROTECT) for

    t_protect = factor * min(t0 + hits * t_bonus, t_max)

seconds, then becomes lendable (SLEEP) with its hit count reset. Warm reuse from
PROTECT counts a hit; warm reuse from SLEEP resets the count. With the lifecycle
disabled (the ablation), an idle replica goes straight to SLEEP.

The reference artifact (``simulator.py``, ``calculate_protect_time``) truncates the
protect time to whole seconds; with the reference numbers every value is whole anyway,
so the time is kept exact here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from deepboot.core.gpu import GpuState
from deepboot.policies.registration import MAX_DELAY_S, require


@dataclass(frozen=True, slots=True)
class LifecycleConfig:
    """Protect-time rule of idle inference replicas.

    Attributes:
        t0: Protect time of a replica with no hits (s). Reference: 30. >= 0.
        t_bonus: Extra protect time per hit (s). Reference: 15. >= 0.
        t_max: Cap of the protect time before scaling (s). Reference: 120. >= 0.
        factor: Multiplies the protect time (the paper's P; 1 and 8 were studied). >= 0.
        enabled: False disables PROTECT: idle replicas go straight to SLEEP.

    Raises:
        ConfigError: a field is negative or not finite; the message names it.
    """

    t0: float = 30.0
    t_bonus: float = 15.0
    t_max: float = 120.0
    factor: float = 1.0
    enabled: bool = True

    def __post_init__(self) -> None:
        for name in ("t0", "t_bonus", "t_max", "factor"):
            value = getattr(self, name)
            require(
                isinstance(value, int | float)
                and math.isfinite(value)
                and 0 <= value <= MAX_DELAY_S,
                name,
                f"must be in [0, {MAX_DELAY_S:g}]; got {value!r}",
            )


def protect_time(hits: int, cfg: LifecycleConfig) -> float:
    """Seconds an idle replica with ``hits`` warm hits stays in PROTECT.

    Args:
        hits: Warm-reuse hits of the replica (>= 0).
        cfg: The lifecycle rule.

    Returns:
        ``cfg.factor * min(cfg.t0 + hits * cfg.t_bonus, cfg.t_max)``; 0.0 when the
        lifecycle is disabled.

    Raises:
        ValueError: ``hits`` is negative.
    """
    if hits < 0:
        raise ValueError(f"hits must be >= 0; got {hits}")
    if not cfg.enabled:
        return 0.0
    return cfg.factor * min(cfg.t0 + hits * cfg.t_bonus, cfg.t_max)


def idle_state(hits: int, cfg: LifecycleConfig) -> GpuState:
    """State a replica enters when its task ends: PROTECT, or SLEEP when the protect
    time is 0 (lifecycle disabled, or all times 0)."""
    return GpuState.PROTECT if protect_time(hits, cfg) > 0 else GpuState.SLEEP


def hits_after_reuse(state: GpuState, hits: int) -> int:
    """Hit count of a replica reused warm from ``state``.

    Reuse from PROTECT counts a hit; reuse from SLEEP starts the count again at 0.

    Raises:
        ValueError: ``state`` is neither PROTECT nor SLEEP (no warm replica there).
    """
    if state is GpuState.PROTECT:
        return hits + 1
    if state is GpuState.SLEEP:
        return 0
    raise ValueError(f"no warm replica to reuse in state {state.name}")
