"""Hand-made run data for the report tests: summaries and GPU timelines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deepboot.report.table import MatrixRow


@dataclass(frozen=True, slots=True)
class Point:
    """A timeline point shaped like ``deepboot.sim.metrics.TimelinePoint``."""

    t: float
    training: int = 0
    lent: int = 0
    running: int = 0
    protect: int = 0
    sleep: int = 0
    free: int = 0


def make_summary(
    policy: str = "deepboot",
    avg_jct: float = 2366.0,
    *,
    cold_starts: int | None = 12,
    reclaims: int | None = 40,
    attainment: float = 0.95,
    lent_gpu_s: float | None = 36000.0,
) -> dict[str, Any]:
    """A complete run summary; ``None`` leaves an inference/cluster key out."""
    cluster: dict[str, Any] = {"nodes": 16, "gpus_per_node": 4, "inference_nodes": 8}
    if lent_gpu_s is not None:
        cluster["lent_gpu_s"] = lent_gpu_s
    if reclaims is not None:
        cluster["reclaims"] = reclaims
    summary: dict[str, Any] = {
        "policy": policy,
        "workload": "small",
        "cluster": cluster,
        "training": {
            "jobs": 160,
            "completed": 160,
            "avg_jct_s": avg_jct,
            "median_jct_s": avg_jct / 2,
            "p99_jct_s": avg_jct * 8,
            "makespan_s": 36000.0,
            "avg_queue_s": 30.0,
            "restarts": 200,
            "restart_s": 6000.0,
            "max_job_restarts": 12,
            "max_job_restart_s": 400.0,
        },
        "scheduler": {"rounds": 600, "decision_ms_median": 3.0, "decision_ms_max": 40.0},
        "wall_s": 12.0,
    }
    if cold_starts is not None:
        summary["inference"] = {
            "tasks": 3200,
            "completed": 3200,
            "cold_starts": cold_starts,
            "warm_hits": 3200 - cold_starts,
            "avg_delay_s": 0.75,
            "p99_delay_s": 8.0,
            "slo_attainment": attainment,
        }
    return summary


def make_rows() -> list[MatrixRow]:
    """Two workloads x two runs; deepboot is better on JCT, pollux-only on reclaims."""
    return [
        MatrixRow("small", "deepboot", make_summary("deepboot", 2366.0)),
        MatrixRow("small", "pollux-only", make_summary("pollux", 4450.0, reclaims=0)),
        MatrixRow("middle", "deepboot", make_summary("deepboot", 3000.0)),
        MatrixRow("middle", "pollux-only", make_summary("pollux", 5000.0, reclaims=0)),
    ]
