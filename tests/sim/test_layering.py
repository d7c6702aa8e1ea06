"""The simulator holds no scheduling decision: it calls no policy function itself.

Rule (DESIGN.md, "sim/"): ``deepboot.sim`` turns trace rows into events, applies the
control loop's operations to its simulated cluster, advances virtual time and records
metrics. From ``deepboot.policies`` it may import types and configs (and look a policy
up in a registry); from ``deepboot.scheduler`` the control loop, its events,
snapshots and operations. It never calls ``allocate``, ``place`` or ``decide``, nor a
decision helper (lendable capacity, the lending reserve, protect times, validation).
"""

from __future__ import annotations

import ast
from pathlib import Path

SIM = Path(__file__).resolve().parents[2] / "deepboot" / "sim"

ALLOWED_FROM_POLICIES = {
    "InferencePolicy",
    "TrainingPolicy",
    "ServiceLoad",
    "LendReserveConfig",
    "LifecycleConfig",
    "SloConfig",
    "ArrivalHistory",
    # Builds the warm-pool and oracle references' settings from the whole workload,
    # once before the run: configuration, not a decision at run time.
    "slo_references",
    "inference",  # the inference registry, for ``inference.create(name)`` only
}
ALLOWED_FROM_SCHEDULER = {
    "ControlLoop",
    "LoopSettings",
    "Snapshot",
    "Step",
    "PendingTask",
    "ReplicaLoad",
    "run_event",
    "Event",
    "EventKind",
    "Scheduler",
    "InferenceScheduler",
    "new_placement",
    "Start",
    "Resize",
    "Preempt",
    "Bind",
    "Lend",
    "Release",
    "Reclaim",
    "StartReplica",
    "ProtectReplica",
    "SleepReplica",
    "EvictReplica",
    "Unplaced",
    "WaitReason",
    "operations",  # the module of the operation types above
}
DECISION_METHODS = {"allocate", "place", "decide", "step"}


def violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    registry_imported = any(
        isinstance(n, ast.ImportFrom)
        and (n.module or "").startswith("deepboot.policies")
        and any(a.name == "inference" for a in n.names)
        for n in ast.walk(tree)
    )
    found = []
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and node.module:
            names = {a.name for a in node.names}
            if node.module.startswith("deepboot.policies"):
                found += [f"{where}: imports {n}" for n in names - ALLOWED_FROM_POLICIES]
            if node.module.startswith("deepboot.scheduler"):
                found += [f"{where}: imports {n}" for n in names - ALLOWED_FROM_SCHEDULER]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr, owner = node.func.attr, node.func.value
            if attr in DECISION_METHODS:
                found.append(f"{where}: calls .{attr}()")
            registry_call = isinstance(owner, ast.Name) and owner.id == "inference"
            if registry_imported and registry_call and attr != "create":
                found.append(f"{where}: calls inference.{attr}()")
    return found


def test_sim_calls_no_policy_function() -> None:
    files = sorted(SIM.glob("*.py"))
    assert files
    assert [v for f in files for v in violations(f)] == []


def test_the_rule_catches_a_policy_call(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from deepboot.policies.lending import reserved_gpus\n"
        "from deepboot.scheduler.inference import lendable_capacity\n"
        "x = policy.allocate(state, rng)\n"
    )
    assert sorted(violations(probe)) == sorted(
        [
            "probe.py:1: imports reserved_gpus",
            "probe.py:2: imports lendable_capacity",
            "probe.py:3: calls .allocate()",
        ]
    )
