"""The summary dict every simulation run reports, and a check that one conforms.

Schema (nested keys; values are numbers unless noted)::

    {"policy": str, "workload": str,
     "cluster": {"nodes", "gpus_per_node", "inference_nodes", "lent_gpu_s", "reclaims",
                 "util_training_pool", "util_inference_pool"},
     "training": {"jobs", "completed", "avg_jct_s", "median_jct_s", "p99_jct_s",
                  "makespan_s", "avg_queue_s", "restarts", "restart_s",
                  "max_job_restarts", "max_job_restart_s"},
     "inference": {"tasks", "completed", "cold_starts", "warm_hits", "avg_delay_s",
                   "p99_delay_s", "slo_attainment", "slo_worst_window" (or null),
                   "requests_late", "requests_unstarted", "requests_dropped",
                   "p50_delay_s", "max_delay_s", "reclaims_proactive",
                   "reclaims_reactive",
                   "per_service": {name: {"requests", "slo_wait_s", "slo_target",
                                          "slo_attainment", "slo_worst_window",
                                          "p99_delay_s", "requests_late"}}},
     "scheduler": {"rounds", "decision_ms_median", "decision_ms_max"},
     "wall_s": float}

Optional keys (:data:`OPTIONAL_KEYS`) appear only in runs that use what they count:
``inference.host_starts`` with the host-memory model cache on (so that a run without
it reports exactly what it always did), ``cluster.shape`` on a cluster of several GPU
types (its typed spec, ``t4:6x4,a100:2x8``), and ``preset`` (a string) in a run of a
preset.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from deepboot.core.errors import DeepbootError

SUMMARY_SCHEMA: Mapping[str, tuple[str, ...] | None] = MappingProxyType(
    {
        "policy": None,
        "workload": None,
        "cluster": (
            "nodes",
            "gpus_per_node",
            "inference_nodes",
            "lent_gpu_s",
            "reclaims",
            "util_training_pool",
            "util_inference_pool",
        ),
        "training": (
            "jobs",
            "completed",
            "avg_jct_s",
            "median_jct_s",
            "p99_jct_s",
            "makespan_s",
            "avg_queue_s",
            "restarts",
            "restart_s",
            "max_job_restarts",
            "max_job_restart_s",
        ),
        "inference": (
            "tasks",
            "completed",
            "cold_starts",
            "warm_hits",
            "avg_delay_s",
            "p99_delay_s",
            "slo_attainment",
            "slo_worst_window",
            "requests_late",
            "requests_unstarted",
            "requests_dropped",
            "p50_delay_s",
            "max_delay_s",
            "reclaims_proactive",
            "reclaims_reactive",
            "per_service",
        ),
        "scheduler": ("rounds", "decision_ms_median", "decision_ms_max"),
        "wall_s": None,
    }
)
"""Top-level key -> its sub-keys (None for a scalar)."""

OPTIONAL_KEYS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"inference": ("host_starts",), "cluster": ("shape",)}
)
"""Sub-keys kept, after the schema's, when a run reports them (see the module doc)."""

OPTIONAL_TOP_KEYS: tuple[str, ...] = ("preset",)
"""Top-level keys kept, at the end, when a run reports them: ``preset``, the name of
the preset the run's policy and flags came from (``deepboot simulate --policy
guarded``)."""


class SummaryError(DeepbootError):
    """A summary dict lacks a key of :data:`SUMMARY_SCHEMA` (a bug in its producer)."""


def conform_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict with exactly the keys of :data:`SUMMARY_SCHEMA`, in schema order.

    Extra keys are dropped; ``summary`` is never mutated.

    Raises:
        SummaryError: a schema key is missing, or a section is not a mapping.
    """
    out: dict[str, Any] = {}
    for key, sub in SUMMARY_SCHEMA.items():
        if key not in summary:
            raise SummaryError(f"run summary lacks the key {key!r}")
        value = summary[key]
        if sub is None:
            out[key] = value
            continue
        if not isinstance(value, Mapping):
            raise SummaryError(f"run summary key {key!r} is not a mapping")
        missing = [s for s in sub if s not in value]
        if missing:
            raise SummaryError(f"run summary section {key!r} lacks {', '.join(missing)}")
        out[key] = {s: value[s] for s in sub}
        out[key].update({s: value[s] for s in OPTIONAL_KEYS.get(key, ()) if s in value})
    out.update({k: summary[k] for k in OPTIONAL_TOP_KEYS if k in summary})
    return out
