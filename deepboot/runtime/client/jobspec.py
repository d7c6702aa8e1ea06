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

Any job may give ``profile = "scalability.csv"`` (its measured step times: num_nodes,
num_replicas, local_bsz, step_time, sync_time per row): the throughput model fitted
to it is the job's prior until it measures its own (before ``application``'s).

A command job gives ``command`` instead of ``entry``: the user's own ``torchrun``
script, unmodified (examples/runtime/ddp_train.toml)::

    name = "ddp"
    command = ["python", "ddp_train.py", "--checkpoint-dir", "{checkpoint_dir}"]
    min_workers = 1
    max_workers = 3
    application = "cifar10"            # optional: the catalog's model as a prior
    max_restarts = 3                   # failures restarted (with back-off) before FAILED
    stop_grace_s = 10                  # SIGTERM, then SIGKILL after this many seconds

It runs with the job file's directory as its working directory (relative paths in
it resolve against the job file); ``{checkpoint_dir}`` and ``{job}`` are filled in;
``python`` is the worker's own interpreter.

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
    "command",
    "application",
    "max_restarts",
    "stop_grace_s",
    "profile",
}
MAX_WORKERS = 4096
MAX_ARGS = 1024
"""Most words a command may hold."""
MAX_ARG_BYTES = 4096
"""Longest word of a command."""
DEFAULT_MAX_RESTARTS = 3
DEFAULT_STOP_GRACE_S = 10.0
MAX_STOP_GRACE_S = 600.0
PLACEHOLDERS = ("{checkpoint_dir}", "{job}")
"""What a command's words may name, filled in when its workers start."""


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
        command: A command job's argv (its placeholders unfilled); empty for an
            ``entry`` job. A command job resizes by restart (``resize``).
        workdir: The command's working directory: the job file's directory.
        application: A catalog model whose throughput model is the job's prior
            until it measures its own ("": a linear speedup).
        max_restarts: Failures of a command job restarted (with back-off) before
            the job is FAILED.
        stop_grace_s: Seconds a command's processes may take to exit after SIGTERM
            before SIGKILL.
        profile_fit: The throughput model fitted to the job file's ``profile`` (a
            measured ``scalability.csv``: num_nodes, num_replicas, local_bsz,
            step_time, sync_time per row), the 7 parameters of
            :class:`~deepboot.core.params.PerfParams`; the job's prior until it
            measures its own, before its ``application``'s (empty: none). Fitted
            when the file is read, so the controller never reads the user's file.
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
    command: tuple[str, ...] = ()
    workdir: str = ""
    application: str = ""
    max_restarts: int = DEFAULT_MAX_RESTARTS
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    profile_fit: tuple[float, ...] = ()

    @property
    def resize(self) -> str:
        """How the job follows a change of its GPUs: "afe" (an ``entry`` job: the
        survivors keep running) or "restart" (a command job: every process
        restarts, and the script resumes from its own checkpoint)."""
        return "restart" if self.command else "afe"

    def argv(self, checkpoint_dir: str) -> tuple[str, ...]:
        """The command with its placeholders filled in."""
        return tuple(
            w.replace("{checkpoint_dir}", checkpoint_dir).replace("{job}", self.name)
            for w in self.command
        )

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
        raw = json.loads(text)
        raw["command"] = tuple(raw.get("command", ()))
        raw["profile_fit"] = tuple(raw.get("profile_fit", ()))
        return cls(**raw)


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
    has_entry, has_command = "entry" in raw, "command" in raw
    if has_entry and has_command:
        raise InputError(where, 0, "command", "give either entry or command, not both")
    check_keys(where, raw, _KNOWN, ("name",) if has_command else ("name", "entry"))
    name = raw["name"]
    command: tuple[str, ...] = ()
    entry = ""
    if has_command:
        command = _command(where, raw["command"])
    else:
        entry = resolve_callable(
            where, base, "entry", raw["entry"], "function", name_paths=name_paths
        )
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
        command=command,
        workdir=str(base.resolve()) if command else "",
        application=_application(where, raw),
        max_restarts=int_key(where, raw, "max_restarts", DEFAULT_MAX_RESTARTS, 0, 1000),
        stop_grace_s=_grace(where, raw),
        profile_fit=_profile_fit(where, base, raw, name_paths),
    )


def _profile_fit(
    where: str, base: Path, raw: dict[str, Any], name_paths: bool
) -> tuple[float, ...]:
    """The throughput model fitted to the ``profile`` file (relative to ``base``); ()
    without one. A spec that came over HTTP may not name a file: the controller's
    machine reads no path a remote client chose."""
    value = raw.get("profile")
    if value is None:
        return ()
    if not isinstance(value, str) or not value:
        raise InputError(where, 0, "profile", f"must be a file name, got {value!r}")
    if not name_paths:
        raise InputError(where, 0, "profile", "give it in a job file ('deepboot submit')")
    from deepboot.perf.fit import fit_perf_params
    from deepboot.perf.profiles import read_scalability

    rows = read_scalability(base / value)  # InputError names the file, line and column
    if len(rows) == 0:
        raise InputError(str(base / value), 0, "profile", "has no measurements")
    p = fit_perf_params(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3] - rows[:, 4], rows[:, 3])
    return (p.alpha_c, p.beta_c, p.alpha_n, p.beta_n, p.alpha_r, p.beta_r, p.gamma)


def _command(where: str, value: Any) -> tuple[str, ...]:
    """A command: a non-empty list of strings, bounded, without NUL bytes."""
    if not isinstance(value, list) or not value:
        raise InputError(
            where, 0, "command", 'must be a non-empty list, e.g. ["python", "train.py"]'
        )
    if len(value) > MAX_ARGS:
        raise InputError(where, 0, "command", f"at most {MAX_ARGS} words, got {len(value)}")
    for i, word in enumerate(value):
        if not isinstance(word, str):
            raise InputError(where, 0, f"command[{i}]", f"must be a string, got {word!r}")
        if "\x00" in word or len(word.encode("utf-8", "surrogatepass")) > MAX_ARG_BYTES:
            raise InputError(
                where, 0, f"command[{i}]", f"no NUL byte, at most {MAX_ARG_BYTES} bytes"
            )
    if not value[0].strip():
        raise InputError(where, 0, "command[0]", "the program must not be empty")
    return tuple(value)


def _application(where: str, raw: dict[str, Any]) -> str:
    """A catalog model's name ("" when not given)."""
    value = raw.get("application", "")
    if not isinstance(value, str):
        raise InputError(where, 0, "application", f"must be a string, got {value!r}")
    if value:
        from deepboot.perf.catalog import load_catalog

        known = load_catalog()
        if value not in known:
            raise InputError(
                where,
                0,
                "application",
                f"{value!r} is not in the catalog: {', '.join(sorted(known))}",
            )
    return value


def _grace(where: str, raw: dict[str, Any]) -> float:
    value = raw.get("stop_grace_s", DEFAULT_STOP_GRACE_S)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(where, 0, "stop_grace_s", f"must be a number of seconds, got {value!r}")
    if not 0 <= float(value) <= MAX_STOP_GRACE_S:
        raise InputError(
            where, 0, "stop_grace_s", f"must be in [0, {MAX_STOP_GRACE_S:g}], got {value}"
        )
    return float(value)
