"""Named configurations: a training policy with the shared-cluster flags it runs best with.

A preset is what a user says instead of several flags: ``--policy guarded`` (``simulate``,
``up``, ``compare --run guarded``) means Pollux's allocator, the SLO guard, a host-memory
model cache and 30 s rounds. ``deepboot up`` runs :data:`DEFAULT_PRESET` when it is
given no ``--policy``; ``deepboot policies`` lists every preset with its parts and the
figures measured for exactly those parts. The paper's DeepBoot stays ``--policy
deepboot``, unchanged, for reproductions.

A preset fills only the flags a user left out: ``--policy guarded --interval 20``
runs 20 s rounds. The commands leave those flags unset (None) until the preset has
had its say, and only then put in their own defaults.

Presets live here, below both worlds' command lines (the simulator's and the
runtime's), so that a preset means the same run in both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from deepboot.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Preset:
    """One named configuration.

    Attributes:
        name: What the user says (``--policy NAME``); no registered policy has it.
        policy: The training policy it runs (a registered name).
        flags: The command-line settings it fills, by ``argparse`` destination
            (``slo``, ``host_cache_gb``, ``interval``...), with their values.
        summary: One line: what it is and why it is the one to use.
        figures: What was measured for exactly this preset, each with where.
        yields_to: For a flag it sets, the user's choices that leave that flag
            alone: ``{"slo": (("reserve", True), ("lending", False))}``: the guard
            is not added to a run the user gave ``--reserve`` or ``--no-lending``
            (which it would contradict).
    """

    name: str
    policy: str
    flags: Mapping[str, object]
    summary: str
    figures: tuple[str, ...]
    yields_to: Mapping[str, tuple[tuple[str, object], ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    def run_flag(self, dest: str) -> str:
        """Flag ``dest`` as the run syntax of ``compare --run`` writes it: ``slo``,
        ``host-cache-gb=1``, ``interval=30``."""
        value, key = self.flags[dest], dest.replace("_", "-")
        return key if value is True else f"{key}={value:g}"

    def parts(self) -> str:
        """The policy and the flags it stands for: ``pollux, --slo, --host-cache-gb 1,
        --interval 30``."""
        words = [self.policy]
        for dest, value in self.flags.items():
            flag = "--" + dest.replace("_", "-")
            words.append(flag if value is True else f"{flag} {value:g}")
        return ", ".join(words)


GUARDED = Preset(
    name="guarded",
    policy="pollux",
    flags=MappingProxyType({"slo": True, "host_cache_gb": 1.0, "interval": 30.0}),
    summary="the best configuration measured in both worlds: Pollux's allocator, "
    "the SLO guard (forecast each service's demand, pre-warm, reclaim ahead of it, "
    "lend the rest), a 1 GB host-memory model cache per inference node (filled by "
    "evicted replicas; raise it to your models' sizes) and 30 s rounds",
    figures=(
        "small.csv: average JCT 1,999 +- 35 s, 0.980x the all-GPU limit, 99.76% of "
        "requests within a 1 s wait (paper's deepboot: 45%)",
        "middle.csv: 2,202 +- 19 s, 1.079x the limit, 99.83% within 1 s",
        "simulator, 16x4 GPUs with 8 inference nodes, measured profiles, five jittered "
        "replications, 95% intervals (docs/benchmarks.md, 'pollux-slo-0.99+lazy' "
        "at 30 s rounds)",
    ),
    # Another way of deciding what is lent, or none at all, replaces the guard.
    yields_to=MappingProxyType(
        {"slo": (("reserve", True), ("warm_pool", True), ("oracle", True), ("lending", False))}
    ),
)
"""Pollux + ``--slo`` + ``--host-cache-gb 1`` + ``--interval 30``: every figure in
:attr:`Preset.figures` is of exactly these flags (``bench/frontier.py --host-cache
--interval 30``, its ``pollux-slo-0.99+lazy`` row: the catalog's six models total
1.0 GB, so 1 GB holds them all and any larger cache gives the same runs)."""

PRESETS: Mapping[str, Preset] = MappingProxyType({GUARDED.name: GUARDED})
"""Every preset, by name."""

DEFAULT_PRESET = GUARDED.name
"""What ``deepboot up`` runs without ``--policy``."""


def preset(name: str) -> Preset | None:
    """The preset called ``name``, or None when it names none (a policy, say)."""
    return PRESETS.get(name)


def apply_preset(name: str, values: Mapping[str, object]) -> tuple[str, dict[str, object]]:
    """The training policy and the flag values ``--policy name`` stands for.

    Args:
        name: A preset's name or a training policy's.
        values: The flags as parsed, by destination (at least the preset's): None (or
            False, for an on/off flag) where the user left one out.

    Returns:
        ``(policy, filled)``: the training policy to run and the flags the preset
        fills, those the user left out (empty, with ``name`` itself, when ``name`` is
        no preset).

    Raises:
        ConfigError: the command lacks a flag the preset sets (a caller's bug).
    """
    found = preset(name)
    if found is None:
        return name, {}
    filled: dict[str, object] = {}
    for dest, value in found.flags.items():
        if dest not in values:
            raise ConfigError(f"preset {found.name!r} sets --{dest}, which this command lacks")
        left_out = values[dest] is None or values[dest] is False
        yields = found.yields_to.get(dest, ())
        overruled = any(values.get(other) == chosen for other, chosen in yields)
        if left_out and not overruled:
            filled[dest] = value
    return found.policy, filled
