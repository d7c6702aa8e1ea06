"""Named configurations: a training policy with the shared-cluster flags it runs best with.

A preset is what a user says instead of several flags: ``--policy guarded`` (``simulate``,
``up``, ``compare --run guarded``) means ATS-T with Pollux's objective, the SLO guard, a
host-memory model cache and 30 s rounds. ``deepboot up`` runs :data:`DEFAULT_PRESET` when it is
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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from deepboot.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Preset:
    """One named configuration.

    Attributes:
        name: What the user says (``--policy NAME``); no registered policy has it.
        policy: The training policy it runs (a registered name).
        params: The policy parameters it sets (``--param KEY=VALUE``, as strings); a
            user's ``--param`` of the same key wins.
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
    params: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    yields_to: Mapping[str, tuple[tuple[str, object], ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    def run_flag(self, dest: str) -> str:
        """Flag ``dest`` as the run syntax of ``compare --run`` writes it: ``slo``,
        ``host-cache-gb=1``, ``interval=30``."""
        value, key = self.flags[dest], dest.replace("_", "-")
        return key if value is True else f"{key}={value:g}"

    def parts(self) -> str:
        """The policy, its parameters and the flags it stands for: ``deepboot, --param
        objective=power-mean, ..., --slo, --host-cache-gb 1, --interval 30``."""
        words = [self.policy, *(f"--param {k}={v}" for k, v in self.params.items())]
        for dest, value in self.flags.items():
            flag = "--" + dest.replace("_", "-")
            words.append(flag if value is True else f"{flag} {value:g}")
        return ", ".join(words)


GUARDED = Preset(
    name="guarded",
    policy="deepboot",
    params=MappingProxyType(
        {
            "objective": "power-mean",
            "restart_delay": "30",
            "hysteresis": "0.05",
            "solver": "core",
        }
    ),
    flags=MappingProxyType({"slo": True, "host_cache_gb": 1.0, "interval": 30.0}),
    summary="the best configuration measured in both worlds: ATS-T's exact knapsack "
    "with Pollux's objective (power mean, 30 s restart penalty, 5% hysteresis; "
    "Pollux's JCT on its eight workloads, ~50 ms a decision at 4,096 GPUs and 2,000 "
    "jobs), the SLO guard (forecast each service's demand, pre-warm, reclaim ahead of "
    "it, lend the rest), a 1 GB host-memory model cache per inference node (filled by "
    "evicted replicas; raise it to your models' sizes) and 30 s rounds",
    figures=(
        "small.csv: average JCT 2,026 +- 25 s, 0.993x the all-GPU limit, 99.76% of "
        "requests within a 1 s wait (Pollux's allocator so: 1,999 s; the paper's "
        "deepboot: 45%)",
        "middle.csv: 2,188 +- 20 s, 1.073x the limit, 99.82% within 1 s (Pollux's "
        "allocator so: 2,202 s)",
        "simulator, 16x4 GPUs with 8 inference nodes, measured profiles, five jittered "
        "replications, 95% intervals (docs/benchmarks.md, 'The recommended allocator')",
    ),
    # Another way of deciding what is lent, or none at all, replaces the guard.
    yields_to=MappingProxyType(
        {"slo": (("reserve", True), ("warm_pool", True), ("oracle", True), ("lending", False))}
    ),
)
"""ATS-T (``deepboot:objective=power-mean,restart_delay=30,hysteresis=0.05,solver=core``)
+ ``--slo`` + ``--host-cache-gb 1`` + ``--interval 30``: every figure in
:attr:`Preset.figures` is of exactly these settings (``bench/allocator_gap.py
--variants pollux,deepboot-hm-d30-h05-core --lending slo,slo-target=0.99,host-cache-gb=1
--interval 30``: the catalog's six models total 1.0 GB, so 1 GB holds them all and any
larger cache gives the same runs). Until issue 49 it ran Pollux's allocator, which
decides as well at 64 GPUs and takes over a second at 4,096."""

PRESETS: Mapping[str, Preset] = MappingProxyType({GUARDED.name: GUARDED})
"""Every preset, by name."""

DEFAULT_PRESET = GUARDED.name
"""What ``deepboot up`` runs without ``--policy``."""


def preset(name: str) -> Preset | None:
    """The preset called ``name``, or None when it names none (a policy, say)."""
    return PRESETS.get(name)


def preset_params(name: str, given: Iterable[str]) -> dict[str, str]:
    """The policy parameters preset ``name`` sets that ``given`` (the keys of the
    user's own ``--param``) leaves out; empty when ``name`` is no preset."""
    found = preset(name)
    if found is None:
        return {}
    chosen = set(given)
    return {k: v for k, v in found.params.items() if k not in chosen}


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
