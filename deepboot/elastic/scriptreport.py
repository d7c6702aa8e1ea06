"""One optional line for a command job: ``deepboot.elastic.report(...)``.

A script started by torchrun runs under deepboot unchanged; the scheduler then sizes
it from its declared bounds and its ``application`` (or a linear speedup). A script
that adds one call per step, ::

    from deepboot.elastic import report
    report(samples=samples_seen, batch_size=global_batch, step=step, loss=loss)

tells its worker how fast it goes, which feeds the job's goodput fit as an AFE job's
measurements do. Outside deepboot (no ``DEEPBOOT_REPORT_FILE`` in the environment:
plain ``torchrun``, ``python train.py``) it does nothing, so the script keeps running
everywhere.

Why a call and not the script's log lines: a log line's format is each framework's
own and changes between versions, a line can be split or interleaved by buffering,
and reading numbers out of arbitrary output is a parser of untrusted text in the
worker; one call states what it means. The file holds only the newest report,
replaced atomically (a reader never sees half of one), and this module imports
nothing beyond the standard library.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass

REPORT_ENV = "DEEPBOOT_REPORT_FILE"
"""The variable naming the file a rank's reports go to (set by its worker)."""


@dataclass(frozen=True, slots=True)
class Progress:
    """The newest report of one rank.

    Attributes:
        samples: Training samples the whole job has processed so far.
        batch_size: The global batch per optimizer step (0: not given).
        step: Optimizer steps taken (-1: not given).
        loss: The latest loss (nan: not given).
        time: When it was reported (Unix seconds).
    """

    samples: int
    batch_size: int
    step: int
    loss: float
    time: float


def report(
    *,
    samples: int,
    batch_size: int | None = None,
    step: int | None = None,
    loss: float | None = None,
) -> None:
    """Tell deepboot this rank's progress (a no-op outside deepboot).

    Args:
        samples: Samples the whole job has processed so far (all ranks together).
        batch_size: The global batch of one optimizer step.
        step: Optimizer steps taken so far.
        loss: The latest loss.

    Raises:
        ValueError: ``samples`` or ``batch_size`` negative.
    """
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    if samples < 0 or (batch_size is not None and batch_size < 0):
        raise ValueError(
            f"report: samples and batch_size must be >= 0, got {samples}, {batch_size}"
        )
    doc = {
        "samples": int(samples),
        "batch_size": int(batch_size or 0),
        "step": -1 if step is None else int(step),
        "loss": None if loss is None or not math.isfinite(float(loss)) else float(loss),
        "time": time.time(),
    }
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def read_progress(path: str) -> Progress | None:
    """The newest report in ``path``; None when there is none or it cannot be read
    (a file the script replaced by something else is no report)."""
    try:
        with open(path) as f:
            doc = json.load(f)
        loss = doc.get("loss")
        return Progress(
            samples=int(doc["samples"]),
            batch_size=int(doc.get("batch_size") or 0),
            step=int(doc.get("step", -1)),
            loss=float("nan") if loss is None else float(loss),
            time=float(doc["time"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
