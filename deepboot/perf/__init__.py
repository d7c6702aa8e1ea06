"""Performance models: goodput, fitting, batch-size optimizer, restart cost, catalog.

The light-weight models are re-exported here. Ground-truth applications live in
``deepboot.perf.profiles`` (measured traces) and ``deepboot.perf.catalog`` (the shipped
fitted catalog); import them from there.
"""

from deepboot.perf.application import Application
from deepboot.perf.fit import fit_perf_params
from deepboot.perf.goodput import (
    GoodputModel,
    fixed_batch_split,
    initial_batch_size,
    select_batch,
)
from deepboot.perf.restart import (
    DEEPBOOT_RESTART_TABLE,
    AfeRestartCost,
    FlatRestartCost,
    RestartCostModel,
    RestartDelays,
)
from deepboot.perf.speedup import (
    FixedBatchSpeedup,
    SpeedupFn,
    SpeedupModel,
    linear_speedup,
    speedup_fn,
)

__all__ = [
    "DEEPBOOT_RESTART_TABLE",
    "AfeRestartCost",
    "Application",
    "FixedBatchSpeedup",
    "FlatRestartCost",
    "GoodputModel",
    "RestartCostModel",
    "RestartDelays",
    "SpeedupFn",
    "SpeedupModel",
    "fit_perf_params",
    "fixed_batch_split",
    "initial_batch_size",
    "linear_speedup",
    "select_batch",
    "speedup_fn",
]
