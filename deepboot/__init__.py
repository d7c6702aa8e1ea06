"""deepboot: schedule elastic training and inference together on one GPU cluster.

The Python API (:mod:`deepboot.api`) is importable from here::

    import deepboot
    result = deepboot.simulate(deepboot.load_workload("w.csv"), deepboot.cluster("4x4"), "pollux")

Its names are loaded on first use, so ``import deepboot`` (and ``deepboot --help``)
stay fast. (The list of policies is ``policy_names()``: ``deepboot.policies`` is the
subpackage.)
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = [
    "Cell",
    "Result",
    "cluster",
    "compare",
    "load_apps",
    "load_workload",
    "policy_names",
    "simulate",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from deepboot import api

        return getattr(api, name)
    raise AttributeError(f"module 'deepboot' has no attribute {name!r}")
