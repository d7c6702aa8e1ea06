"""The discrete-event simulator: engine, job state, metrics and the run entry point.

``simulate``, ``SimConfig``, ``SimResult``, ``JobRecord``, ``InferenceRecord`` and
``TimelinePoint`` are re-exported lazily, so that importing the workload loaders
(``deepboot.sim.workload``) does not pull in the performance and policy stack.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import Any

_EXPORTS = MappingProxyType(
    {
        "simulate": "deepboot.sim.run",
        "SimConfig": "deepboot.sim.config",
        "SimResult": "deepboot.sim.metrics",
        "JobRecord": "deepboot.sim.metrics",
        "InferenceRecord": "deepboot.sim.metrics",
        "TimelinePoint": "deepboot.sim.metrics",
    }
)

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'deepboot.sim' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
