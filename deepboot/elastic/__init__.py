"""deepboot.elastic: write a training function once; deepboot resizes it while it runs.

See :mod:`deepboot.elastic.context` for the API (``ElasticContext``) and
examples/runtime/regression.py for a whole job. Needs torch (the ``runtime`` extra).
"""

from deepboot.elastic.context import Departed, ElasticContext, state_digest
from deepboot.elastic.protocol import Generation, Restore, WorkerReport, WorkerStatus

__all__ = [
    "Departed",
    "ElasticContext",
    "Generation",
    "Restore",
    "WorkerReport",
    "WorkerStatus",
    "state_digest",
]
