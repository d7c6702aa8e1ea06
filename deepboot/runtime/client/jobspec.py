"""A training job's file (TOML), as ``deepboot submit`` reads it.

Example (examples/runtime/regression.toml)::

    name = "regression-a"
    entry = "regression.py:train"     # file (relative to this file) : function
    min_workers = 1
    max_workers = 4
    # workers = 2                      # what fifo and tiresias run it on (default: min)
    batch_size = 32                    # initial total batch
    max_batch_size = 512
    max_local_batch_size = 128         # per GPU (memory bound)

    [args]                             # passed to the function as ctx.args
    loss_threshold = 0.01

Every error names the file and the key (``InputError``; TOML syntax errors carry
the line).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from deepboot.core.errors import InputError
from deepboot.core.params import BatchLimits
from deepboot.runtime.client.specfile import check_keys, int_key, read_toml, resolve_callable

_KNOWN = {
    "name",
    "entry",
    "min_workers",
    "max_workers",
    "workers",
    "batch_size",
    "max_batch_size",
    "min_local_batch_size",
    "max_local_batch_size",
    "checkpoint_every",
    "args",
}
MAX_WORKERS = 4096


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One training job.

    Attributes:
        name: Unique job name (letters, digits, ``_.-``; at most 63).
        entry: "ABSOLUTE/path/file.py:function" or "package.module:function".
        min_workers: Fewest GPUs it runs on once started (>= 1).
        max_workers: Most GPUs it may get.
        workers: GPUs it asks for, within [min_workers, max_workers]: the size a
            fixed-size policy (``fifo``, ``tiresias``) runs it at; None: min_workers.
        batch_size: Initial total batch (the goodput model's M0); a fixed-batch or
            fixed-size policy keeps it whatever the job's size.
        max_batch_size: Largest total batch the goodput model may pick.
        min_local_batch_size: Smallest per-GPU batch.
        max_local_batch_size: Largest per-GPU batch (memory bound).
        checkpoint_every: Rank 0 checkpoints every this many steps (0 = only at
            restart resizes and preemptions).
        args: Passed to the training function as ``ctx.args``.
    """

    name: str
    entry: str
    min_workers: int = 1
    max_workers: int = 4
    workers: int | None = None
    batch_size: int = 32
    max_batch_size: int = 512
    min_local_batch_size: int = 1
    max_local_batch_size: int = 128
    checkpoint_every: int = 50
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def requested(self) -> int:
        """GPUs the job asks for (``workers``, else ``min_workers``)."""
        return self.min_workers if self.workers is None else self.workers

    @property
    def limits(self) -> BatchLimits:
        return BatchLimits(
            self.batch_size,
            self.max_batch_size,
            self.min_local_batch_size,
            self.max_local_batch_size,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        return cls(**json.loads(text))


def load_job(path: str | Path) -> JobSpec:
    """Read and validate a job file.

    Raises:
        InputError: unreadable file, bad TOML (with its line), unknown or missing
            key, or a value out of range; the message names the file and the key.
    """
    raw, where, base = read_toml(path, "job")
    return parse_job(raw, where, base, name_paths=True)


def parse_job(raw: dict[str, Any], where: str, base: Path, *, name_paths: bool = False) -> JobSpec:
    """Validate a job's keys (a job file's table, or a JSON body of POST /v1/jobs).

    Args:
        raw: The keys, as in a job file.
        where: What to name in errors (the file, or the endpoint).
        base: Directory a relative ``entry`` file is resolved against.
        name_paths: Whether an error may name the entry file looked for (a job file
            on the command line); never for a spec that came over HTTP (the default).

    Raises:
        InputError: unknown or missing key, a bad entry (a file that does not exist
            or cannot be read, a NUL byte, a path too long) or a value out of range
            (names ``where`` and the key).
    """
    check_keys(where, raw, _KNOWN, ("name", "entry"))
    name = raw["name"]
    entry = resolve_callable(where, base, "entry", raw["entry"], "function", name_paths=name_paths)
    lo = int_key(where, raw, "min_workers", 1, 1, MAX_WORKERS)
    hi = int_key(where, raw, "max_workers", max(lo, 4), 1, MAX_WORKERS)
    if hi < lo:
        raise InputError(where, 0, "max_workers", f"must be >= min_workers ({lo}), got {hi}")
    workers = int_key(where, raw, "workers", lo, lo, hi) if "workers" in raw else None
    bsz = int_key(where, raw, "batch_size", 32, 1, 1 << 24)
    max_bsz = int_key(where, raw, "max_batch_size", max(bsz, 512), 1, 1 << 24)
    if max_bsz < bsz:
        raise InputError(
            where, 0, "max_batch_size", f"must be >= batch_size ({bsz}), got {max_bsz}"
        )
    min_local = int_key(where, raw, "min_local_batch_size", 1, 1, 1 << 20)
    max_local = int_key(where, raw, "max_local_batch_size", max(min_local, 128), 1, 1 << 20)
    if max_local < min_local:
        raise InputError(
            where,
            0,
            "max_local_batch_size",
            f"must be >= min_local_batch_size ({min_local}), got {max_local}",
        )
    args = raw.get("args", {})
    if not isinstance(args, dict):
        raise InputError(where, 0, "args", "must be a table ([args])")
    return JobSpec(
        name=name,
        entry=entry,
        min_workers=lo,
        max_workers=hi,
        workers=workers,
        batch_size=bsz,
        max_batch_size=max_bsz,
        min_local_batch_size=min_local,
        max_local_batch_size=max_local,
        checkpoint_every=int_key(where, raw, "checkpoint_every", 50, 0, 1 << 30),
        args=args,
    )
