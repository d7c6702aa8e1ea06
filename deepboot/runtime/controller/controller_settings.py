"""The controller's settings: ``deepboot up``'s flags, saved in STATE_DIR/controller.json,
and the shared-cluster knobs this world refuses."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from deepboot.core.errors import ConfigError
from deepboot.policies import inference, registry
from deepboot.runtime.controller.faults import point_names
from deepboot.runtime.store.statedir import StateDir
from deepboot.scheduler.control import ControlLoop
from deepboot.scheduler.inference import InferenceScheduler
from deepboot.scheduler.loop import Scheduler
from deepboot.world.settings import SharedCluster, shared_loop_settings


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """The controller's knobs (``deepboot up`` flags; saved in controller.json).

    Attributes:
        policy: Training policy (one that needs no oracle; see ``deepboot up --help``).
        preset: The preset (:mod:`deepboot.world.presets`) the policy and the flags
            came from, for ``status`` to name; "" when the policy was named itself.
        interval: Seconds between scheduling rounds.
        poll: Seconds between polls of the workers.
        collective_timeout: Seconds before a hung collective or rendezvous fails.
        seed: Seed of the policies' randomness.
        params: The training policy's parameters (as ``deepboot policies`` lists).
        http_host: Address of the HTTP endpoint (requests, submissions, metrics);
            anything but loopback requires the bearer token.
        http_port: Its port (0: any free one; see STATE_DIR/http.json).
        shared: The shared-cluster knobs, as the simulator takes them: lending, the
            lifecycle and its protect factor, AFE (keep-alive resizes; off:
            checkpoint-restart resizes, the baseline), the lending reserve, the
            inference placement (:func:`check_runnable` says which run here).
        crash_at: A named crash point (``runtime.faults.point_names()``): the
            controller dies there (SIGKILL) the first time it gets there. For the
            crash-safety tests; empty: never.
        leave_timeout: Seconds a worker told to leave may take to depart before it
            is killed (it checkpoints first when its generation stopped).
        form_timeout: Seconds a generation may take to form, from its first offer
            (a joiner waits for its GPU's leaver, up to ``leave_timeout``); then its
            members that have not formed it count as dead and the loop re-plans.
        keep_events: The event log's retention: the newest this many entries are
            kept, older ones dropped (the metrics' counts are saved apart and go on).
        record_bytes: The loop's recording's bound (STATE_DIR/recording, for
            ``deepboot replay``): the oldest chunks go beyond it.
        node_check: Seconds between two looks at the Ray cluster's live nodes (a
            node that left takes its GPUs out of the ledger until it returns).
        export_timeout: With ``--host-cache-gb``: seconds a replica about to be
            evicted may take to export its weights into its node's cache (the
            controller waits for it); then it is evicted anyway.
        slow_turn_s: A turn of the controller's loop longer than this is logged
            with the loop's stack at that moment (where it is stuck).
        standby_replicas: Keep one replica process started ahead of need on each
            inference node (``--standby-replicas``; :mod:`deepboot.runtime.actors.replica_actor`):
            a new replica there skips its process start and imports.
    """

    policy: str = "deepboot"
    preset: str = ""
    interval: float = 60.0
    poll: float = 1.0
    collective_timeout: float = 60.0
    seed: int = 0
    params: dict[str, str] = field(default_factory=dict)
    http_host: str = "127.0.0.1"
    http_port: int = 8470
    shared: SharedCluster = field(default_factory=SharedCluster)
    crash_at: str = ""
    leave_timeout: float = 300.0
    form_timeout: float = 600.0
    keep_events: int = 1_000_000
    record_bytes: int = 256 << 20
    node_check: float = 5.0
    export_timeout: float = 5.0
    slow_turn_s: float = 5.0
    standby_replicas: bool = False

    def __post_init__(self) -> None:
        if not self.export_timeout > 0:
            raise ConfigError(f"--export-timeout must be > 0 seconds, got {self.export_timeout}")
        if not self.slow_turn_s > 0:
            raise ConfigError(f"slow_turn_s must be > 0 seconds, got {self.slow_turn_s}")
        if self.keep_events < 1:
            raise ConfigError(f"--keep-events must be >= 1, got {self.keep_events}")
        if self.crash_at and self.crash_at not in point_names():
            raise ConfigError(
                f"crash_at {self.crash_at!r} is no crash point; known: {', '.join(point_names())}"
            )

    @property
    def afe(self) -> bool:
        """Keep-alive resizes (AFE unless turned off: the runtime's default)."""
        return self.shared.afe is not False

    def describe(self) -> str:
        """The configuration in one line, as ``status`` names it: the preset when
        there is one, then the policy and the flags that shape the run
        (``guarded = deepboot, --param objective=power-mean, ..., --slo,
        --host-cache-gb 1, --interval 30``: :meth:`Preset.parts
        <deepboot.world.presets.Preset.parts>`' order)."""
        shared = self.shared
        parts = [self.policy, *(f"--param {k}={v}" for k, v in self.params.items())]
        if not shared.lending:
            parts.append("--no-lending")
        for flag, on in (("--slo", shared.slo), ("--reserve", shared.reserve)):
            if on:
                parts.append(flag)
        if shared.host_cache_gb:
            parts.append(f"--host-cache-gb {shared.host_cache_gb:g}")
        parts.append(f"--interval {self.interval:g}")
        if not self.afe:
            parts.append("--no-afe")
        what = ", ".join(parts)
        return f"{self.preset} = {what}" if self.preset else what

    def to_dict(self) -> dict[str, Any]:
        """The settings as controller.json holds them (:meth:`from_dict` reads them)."""
        raw = {f.name: getattr(self, f.name) for f in fields(self)}
        raw["shared"] = self.shared.to_dict()
        return raw

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> ControllerSettings:
        return cls.from_dict(json.loads(path.read_text()))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ControllerSettings:
        raw = dict(raw)
        shared = dict(raw.pop("shared", {}))
        # controller.json of a cluster an older deepboot started: its four
        # shared-cluster knobs sat at the top level.
        renamed = {"inference_policy": "ats_i"}
        for old in ("afe", "lending", "protect_factor", "inference_policy"):
            new = renamed.get(old, old)
            if old in raw:
                shared.setdefault(new, raw.pop(old))
        return cls(**raw, shared=SharedCluster.from_dict(shared))


RUNTIME_REFUSED = {
    "warm_pool": "the warm-pool reference is a simulator reference for --slo",
    "oracle": "the oracle reference reads the requests still to come",
    "host_gbps": "the runtime's host starts are measured (a real copy from its node's "
    "cache), not modelled by a bandwidth",
    "host_init_s": "the runtime's host starts are measured, not modelled by a fixed part",
    "host_cache_preload": "the runtime's node caches hold what evicted replicas exported; "
    "staging a model needs a replica to load and export it, not built yet",
}
"""Shared-cluster knobs the runtime refuses, and why (``--host-cache-gb`` runs: the
node-local model cache, :mod:`deepboot.runtime.actors.modelcache`; so does ``--slo``, with its
``--slo-target``, ``--slo-horizon`` and ``--slo-idle``: the router's arrivals feed the
guard's forecast, and a ``WarmReplica`` starts a replica with no request)."""


def build_loop(settings: ControllerSettings) -> ControlLoop:
    """The control loop ``settings`` describe: the controller's, and a replay's.

    Raises:
        ConfigError: an unknown policy or parameter, or a knob the runtime refuses.
    """
    policy = registry.create(settings.policy, **settings.params)
    shared = settings.shared
    check_runnable(shared)
    placement = inference.create(shared.inference_policy(settings.policy), **shared.ats_i_params)
    return ControlLoop(
        Scheduler(policy),
        InferenceScheduler(placement),
        shared_loop_settings(shared, settings.interval),
    )


def check_runnable(shared: SharedCluster) -> None:
    """Refuse, with the reason, the shared-cluster knobs this world cannot run.

    Raises:
        ConfigError: ``--warm-pool``, ``--oracle``, ``--host-gbps``,
            ``--host-init-s`` or ``--host-cache-preload``.
    """
    for name, why in RUNTIME_REFUSED.items():
        value = getattr(shared, name)
        if value is not None and value is not False:  # set at all (0 s included)
            raise ConfigError(
                f"--{name.replace('_', '-')}: {why} (the simulator runs it: "
                f"'deepboot simulate --{name.replace('_', '-')}')"
            )


LATENCIES_KEPT = 1000
"""The latest decision latencies the controller keeps for ``deepboot status``."""


def settings_file(state: StateDir) -> Path:
    return state.root / "controller.json"
