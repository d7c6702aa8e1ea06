"""What a control loop saw and decided, recorded, and read back for a replay.

Each step of the loop (``ControlLoop.step``) is one record: the event, the retry
cursor, the snapshot (what the loop reads: jobs, GPUs, queue, loads, services; the
cluster is in the run's start record), the random generator's state before the
step, and the step returned. A run's start (a controller's, after a crash too) is a
record of its own, with the settings the loop was built from. Replaying feeds the
same inputs to a loop built from the same settings, and compares the steps.

Records are JSON lines in numbered chunk files of a directory; the recorder starts a
new chunk past ``chunk_bytes`` and deletes the oldest chunks beyond ``keep_bytes``,
so a recording never outgrows its bound (a replay then starts at the oldest chunk
kept). The codec (:func:`encode`, :func:`decode`) writes the loop's frozen
dataclasses, enums, tuples, sets and mappings so that they decode equal; it decodes
only ``deepboot`` classes.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from deepboot.core.cluster import ClusterSpec
from deepboot.scheduler.control import ControlLoop, Retry, Snapshot, Step
from deepboot.scheduler.events import Event

FORMAT = 1
"""The recording's format version (each start record carries it)."""

_PACKAGE = "deepboot."


# -- the codec -------------------------------------------------------------------------


def encode(value: Any) -> Any:
    """A JSON-able form of ``value`` that :func:`decode` turns back into an equal one."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value  # JSON round-trips a float exactly (repr); nan/inf as Python writes them
    if isinstance(value, enum.Enum):
        return {"$e": _name(type(value)), "v": value.value}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # A field left out of __init__ is derived from the others: not written.
        fields = {
            f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init
        }
        return {"$d": _name(type(value)), "f": fields}
    if isinstance(value, tuple):
        return {"$t": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, frozenset | set):
        items = sorted((encode(v) for v in value), key=lambda e: json.dumps(e, sort_keys=True))
        return {"$s": items}
    if isinstance(value, Mapping):
        return {"$m": [[encode(k), encode(v)] for k, v in value.items()]}
    raise TypeError(f"cannot record a {type(value).__name__}: {value!r}")


def decode(value: Any) -> Any:
    """The value :func:`encode` wrote.

    Raises:
        ValueError: a class outside ``deepboot``, or not a dataclass or enum.
    """
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "$t" in value:
        return tuple(decode(v) for v in value["$t"])
    if "$s" in value:
        return frozenset(decode(v) for v in value["$s"])
    if "$m" in value:
        return {decode(k): decode(v) for k, v in value["$m"]}
    if "$e" in value:
        return _class(value["$e"])(value["v"])
    if "$d" in value:
        cls = _class(value["$d"])
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise ValueError(f"{value['$d']} is not a dataclass")
        fields = {k: decode(v) for k, v in value["f"].items()}
        make: Any = cls
        # A field the recording lacks (recorded before it existed) takes its default.
        return make(
            **{
                f.name: fields[f.name]
                for f in dataclasses.fields(cls)
                if f.init and f.name in fields
            }
        )
    raise ValueError(f"not a recorded value: {sorted(value)}")


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _class(name: str) -> Any:
    module, _, qual = name.partition(":")
    if not module.startswith(_PACKAGE):
        raise ValueError(f"refusing to decode {name}: not a deepboot class")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


# -- records ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One step of the loop, as recorded."""

    index: int
    event: Event
    cursor: Retry | None
    snapshot: Snapshot
    rng_state: dict[str, Any]
    step: Step


@dataclasses.dataclass(frozen=True)
class StartRecord:
    """A run's start: the loop's settings (the world's own form) and the cluster.
    ``continued``: the same run's start, repeated at the top of a new chunk (so a
    recording whose oldest chunks were dropped still says how to build the loop)."""

    settings: dict[str, Any]
    cluster: ClusterSpec
    continued: bool = False


class Recorder:
    """Appends records to numbered chunk files of ``directory``, within a size bound.

    Args:
        directory: Where the chunks go (created).
        keep_bytes: Most bytes kept over all chunks (the oldest chunks go first).
        chunk_bytes: A chunk's size before the next one starts.
    """

    def __init__(
        self, directory: Path, keep_bytes: int = 256 << 20, chunk_bytes: int = 16 << 20
    ) -> None:
        self.directory = directory
        self.keep_bytes, self.chunk_bytes = keep_bytes, chunk_bytes
        directory.mkdir(parents=True, exist_ok=True)
        chunks = _chunks(directory)
        self._number = int(chunks[-1].stem.split("-")[1]) if chunks else 0
        self._file: Any = None
        self._index = 0
        self._start: dict[str, Any] | None = None
        self._new_chunk()

    def start(self, settings: Mapping[str, Any], cluster: ClusterSpec) -> None:
        """A run starts (a controller, after a crash too): its loop's settings."""
        self._start = {"start": {"format": FORMAT, "settings": dict(settings)},
                       "cluster": encode(cluster)}  # fmt: skip
        self._write(self._start)

    def observe(
        self,
        event: Event,
        cursor: Retry | None,
        snap: Snapshot,
        rng_state: dict[str, Any],
        step: Step,
    ) -> None:
        """Record one step (the loop's ``observe`` hook: see ``run_event``)."""
        # The cluster is the start record's: leave it out of every snapshot.
        snap = dataclasses.replace(snap, cluster=_NO_CLUSTER)
        self._write(
            {
                "i": self._index,
                "event": encode(event),
                "cursor": encode(cursor),
                "snap": encode(snap),
                "rng": rng_state,
                "step": encode(step),
            }
        )
        self._index += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        if self._file.tell() + len(line) > self.chunk_bytes and self._file.tell() > 0:
            self._new_chunk()
            if self._start is not None and record is not self._start:
                again = {**self._start, "continued": True}
                self._file.write(json.dumps(again, separators=(",", ":")) + "\n")
        self._file.write(line)
        self._file.flush()

    def _new_chunk(self) -> None:
        self.close()
        self._number += 1
        path = self.directory / f"loop-{self._number:06d}.jsonl"
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (kept open)
        # The bound: the oldest chunks go while the rest exceed it.
        chunks = _chunks(self.directory)
        sizes = {c: c.stat().st_size for c in chunks}
        total = sum(sizes.values())
        for old in chunks[:-1]:
            if total <= self.keep_bytes:
                break
            total -= sizes[old]
            old.unlink(missing_ok=True)


_NO_CLUSTER = ClusterSpec(())


def _chunks(directory: Path) -> list[Path]:
    return sorted(directory.glob("loop-*.jsonl"))


def read_recording(directory: Path) -> Iterator[StartRecord | StepRecord]:
    """The records of ``directory``, oldest first (a chunk cut short by a crash ends
    at its last whole line).

    Raises:
        ValueError: no recording there, or a record of another format.
    """
    chunks = _chunks(directory)
    if not chunks:
        raise ValueError(f"{directory}: no recording (loop-*.jsonl)")
    cluster = _NO_CLUSTER
    for chunk in chunks:
        with open(chunk, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.endswith("\n"):
                    break  # the last line of a chunk a crash cut short
                raw = json.loads(line)
                if "start" in raw:
                    fmt = raw["start"].get("format")
                    if fmt != FORMAT:
                        raise ValueError(f"{chunk}:{n}: recording format {fmt}, not {FORMAT}")
                    cluster = decode(raw["cluster"])
                    yield StartRecord(
                        raw["start"]["settings"], cluster, raw.get("continued", False)
                    )
                    continue
                snap = dataclasses.replace(decode(raw["snap"]), cluster=cluster)
                yield StepRecord(
                    raw["i"],
                    decode(raw["event"]),
                    decode(raw["cursor"]),
                    snap,
                    raw["rng"],
                    decode(raw["step"]),
                )


def generator(state: Mapping[str, Any]) -> np.random.Generator:
    """A generator in the recorded ``state`` (numpy's PCG64 state dict)."""
    rng = np.random.default_rng()
    rng.bit_generator.state = dict(state)
    return rng


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first step a replay decided otherwise."""

    index: int
    event: Event
    now: float
    recorded: Step
    replayed: Step


@dataclasses.dataclass(frozen=True)
class AfterDivergence:
    """What the replayed loop decided from the first divergence on, fed the recorded
    world's steps (which followed the recorded decisions, not the replayed ones: a
    what-if's effect on job completion times is the simulator's to tell).

    Attributes:
        steps: Steps compared from the first divergence on (it included).
        differing: Those whose operations or waits differ.
        recorded: Operations the runtime applied, by kind (``Resize``, ``Reclaim``...).
        replayed: Operations the replayed loop returned, by kind.
        by_job: Per job (or service), replayed minus recorded operations.
        stopped: Why the replay stopped early (the replayed loop raised on a recorded
            snapshot it could not follow); None when it ran to the end.
    """

    steps: int
    differing: int
    recorded: Mapping[str, int]
    replayed: Mapping[str, int]
    by_job: Mapping[str, int]
    stopped: str | None = None


@dataclasses.dataclass(frozen=True)
class ReplayResult:
    """What a replay found: the steps replayed, the runs (starts) met, the clock of
    the first step replayed (what a report's times are relative to), and the first
    divergence with a summary of what followed, if any."""

    steps: int
    starts: int
    divergence: Divergence | None
    first_now: float | None = None
    after: AfterDivergence | None = None


class _Tally:
    """Counts of operations after a divergence (see :class:`AfterDivergence`)."""

    def __init__(self) -> None:
        self.steps = self.differing = 0
        self.recorded: dict[str, int] = {}
        self.replayed: dict[str, int] = {}
        self.by_job: dict[str, int] = {}

    def add(self, recorded: Step, replayed: Step) -> None:
        self.steps += 1
        self.differing += recorded != replayed
        for ops, kinds, sign in (
            (recorded.ops, self.recorded, -1),
            (replayed.ops, self.replayed, 1),
        ):
            for op in ops:
                kind = type(op).__name__
                kinds[kind] = kinds.get(kind, 0) + 1
                who = getattr(op, "job", None) or getattr(op, "service", None) or "?"
                self.by_job[who] = self.by_job.get(who, 0) + sign

    def result(self, stopped: str | None) -> AfterDivergence:
        return AfterDivergence(
            self.steps,
            self.differing,
            dict(sorted(self.recorded.items())),
            dict(sorted(self.replayed.items())),
            {k: v for k, v in sorted(self.by_job.items()) if v},
            stopped,
        )


def replay(
    records: Iterator[StartRecord | StepRecord],
    loop_for: Callable[[Mapping[str, Any]], ControlLoop],
    on_step: Callable[[], None] | None = None,
) -> ReplayResult:
    """Feed every recorded step to a loop built from its run's settings (a fresh
    one at each start: a restarted controller built one too) and compare.

    After the first divergence the replay goes on to the end, counting what the
    replayed loop decides otherwise (:class:`AfterDivergence`).

    Args:
        records: :func:`read_recording`'s.
        loop_for: The loop a start record's settings build (the world's own rule).
        on_step: Called after each step compared (a progress bar).
    """
    loop: ControlLoop | None = None
    steps = starts = 0
    first_now: float | None = None
    divergence: Divergence | None = None
    tally = _Tally()
    for rec in records:
        if isinstance(rec, StartRecord):
            if rec.continued and loop is not None:
                continue  # the same run, in its next chunk
            loop = loop_for(rec.settings)
            starts += 0 if rec.continued else 1
            continue
        if loop is None:  # the oldest chunks were dropped: the settings are unknown
            raise ValueError("the recording starts mid-run (its start record was dropped)")
        if first_now is None:
            first_now = rec.snapshot.now
        try:
            got = loop.step(rec.event, rec.snapshot, generator(rec.rng_state), rec.cursor)
        except Exception as exc:  # noqa: BLE001 - only past a divergence, reported
            if divergence is None:
                raise
            # A loop that decided otherwise may find the recorded world impossible
            # (a job it never started): what it decided so far is the summary.
            stopped = f"step {rec.index}: {type(exc).__name__}: {exc}"
            return ReplayResult(steps, starts, divergence, first_now, tally.result(stopped))
        steps += 1
        if on_step is not None:
            on_step()
        if divergence is None and got != rec.step:
            divergence = Divergence(rec.index, rec.event, rec.snapshot.now, rec.step, got)
        if divergence is not None:
            tally.add(rec.step, got)
    after = tally.result(None) if divergence is not None else None
    return ReplayResult(steps, starts, divergence, first_now, after)
