"""A training job's file (TOML), as ``deepboot submit`` reads it.

Example (examples/runtime/regression.toml)::

    name = "regression-a"
    entry = "regression.py:train"     # file (relative to this file) : function
    min_workers = 1
    max_workers = 4
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
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from deepboot.core.errors import InputError
from deepboot.core.params import BatchLimits

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_KNOWN = {
    "name",
    "entry",
    "min_workers",
    "max_workers",
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
        batch_size: Initial total batch (the goodput model's M0).
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
    batch_size: int = 32
    max_batch_size: int = 512
    min_local_batch_size: int = 1
    max_local_batch_size: int = 128
    checkpoint_every: int = 50
    args: dict[str, Any] = field(default_factory=dict)

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


def _int(path: str, raw: dict[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(path, 0, key, f"must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise InputError(path, 0, key, f"must be in [{lo}, {hi}], got {value}")
    return value


def load_job(path: str | Path) -> JobSpec:
    """Read and validate a job file.

    Raises:
        InputError: unreadable file, bad TOML (with its line), unknown or missing
            key, or a value out of range; the message names the file and the key.
    """
    p = Path(path)
    where = str(p)
    try:
        text = p.read_text()
    except OSError as exc:
        raise InputError(where, 0, "", f"cannot read the job file: {exc.strerror}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = int(m.group(1)) if (m := re.search(r"line (\d+)", str(exc))) else 0
        raise InputError(where, line, "", f"not valid TOML: {exc}") from None
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise InputError(where, 0, unknown[0], f"unknown key (known: {', '.join(sorted(_KNOWN))})")
    for key in ("name", "entry"):
        if key not in raw:
            raise InputError(where, 0, key, "missing (required)")
        if not isinstance(raw[key], str):
            raise InputError(where, 0, key, f"must be a string, got {raw[key]!r}")
    name = raw["name"]
    if not _NAME.match(name):
        raise InputError(where, 0, "name", f"{name!r}: use letters, digits and _.- (<= 63)")
    entry = _resolve_entry(where, p, raw["entry"])
    lo = _int(where, raw, "min_workers", 1, 1, MAX_WORKERS)
    hi = _int(where, raw, "max_workers", max(lo, 4), 1, MAX_WORKERS)
    if hi < lo:
        raise InputError(where, 0, "max_workers", f"must be >= min_workers ({lo}), got {hi}")
    bsz = _int(where, raw, "batch_size", 32, 1, 1 << 24)
    max_bsz = _int(where, raw, "max_batch_size", max(bsz, 512), 1, 1 << 24)
    if max_bsz < bsz:
        raise InputError(
            where, 0, "max_batch_size", f"must be >= batch_size ({bsz}), got {max_bsz}"
        )
    min_local = _int(where, raw, "min_local_batch_size", 1, 1, 1 << 20)
    max_local = _int(where, raw, "max_local_batch_size", max(min_local, 128), 1, 1 << 20)
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
        batch_size=bsz,
        max_batch_size=max_bsz,
        min_local_batch_size=min_local,
        max_local_batch_size=max_local,
        checkpoint_every=_int(where, raw, "checkpoint_every", 50, 0, 1 << 30),
        args=args,
    )


def _resolve_entry(where: str, job_file: Path, entry: str) -> str:
    target, sep, func = entry.rpartition(":")
    if not sep or not target or not func.isidentifier():
        raise InputError(
            where, 0, "entry", f"{entry!r}: use 'file.py:function' or 'module:function'"
        )
    if target.endswith(".py"):
        file = (job_file.parent / target).resolve()
        if not file.is_file():
            raise InputError(where, 0, "entry", f"{file} does not exist")
        return f"{file}:{func}"
    return entry
