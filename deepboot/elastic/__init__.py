"""deepboot.elastic: write a training function once; deepboot resizes it while it runs.

See :mod:`deepboot.elastic.context` for the API (``ElasticContext``) and
examples/runtime/regression.py for a whole job. Needs torch (the ``runtime`` extra).
A plain torchrun script runs as a command job instead (:mod:`deepboot.elastic.command`);
:func:`report` is its one optional line (:mod:`deepboot.elastic.scriptreport`).
"""

from deepboot.elastic.context import Departed, ElasticContext, state_digest
from deepboot.elastic.protocol import Generation, Restore, WorkerReport, WorkerStatus
from deepboot.elastic.scriptreport import report

__all__ = [
    "Departed",
    "ElasticContext",
    "Generation",
    "Restore",
    "WorkerReport",
    "WorkerStatus",
    "report",
    "state_digest",
]
