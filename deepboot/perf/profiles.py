"""Ground truth from measured reference profiles (``--profiles DIR``).

A profile folder ``<root>/<model>/`` holds ``placements.csv``, ``scalability.csv`` and
``validation-<B>.csv`` files (format: ``shared/traces/README.md``).
:class:`ProfiledApplication` answers the :class:`~deepboot.perf.application.Application`
queries from them exactly as the reference simulator's ``applications.py`` does:

* **Step time.** The shape (GPUs per node, in node order, zeros dropped) is
  canonicalized to its lexicographically smallest rotation. If that placement was
  measured, step and sync time are interpolated linearly in the per-GPU batch. Outside
  the measured batch range (the reference raises there) the sync time is held at the
  nearest measured value and the compute time (step - sync) is extrapolated: linearly
  from the last two points above the range (slope floored at 0), proportionally to the
  batch below it. Any other placement is interpolated linearly over (num_nodes capped
  at 16, num_replicas, local_bsz) on the per-(nodes, replicas, batch) means of
  ``placements.csv`` plus ``scalability.csv``. Outside that data's convex hull (the
  reference returns NaN there) the batch is first clamped to the measured range, and
  failing that the nearest measured point in (nodes, replicas, log2 batch) is used.
* **Gradient statistics** during an epoch are interpolated linearly between the two
  validated batch sizes around the current batch (clamped to the validated range; an
  epoch past a file's last row uses that row).
* **Progress** at the end of epoch e is the minimum over batch sizes of the progress
  column at row e - 1 (past the last row, extended by the last per-epoch increment).

Results are memoized per instance (the simulator's hot path queries the same few
configurations over and over). Instances are otherwise immutable.

**Valid values.** Every value is checked when the folder is read; anything else stops
with one :class:`~deepboot.core.errors.InputError` naming the file, the 1-based line and
the column (line 0: the file or folder as a whole). Every number must be finite.

========================  ===============================================================
column                    valid values
========================  ===============================================================
``placement``             1 to 4096 digits, each 1-9 (GPUs on one node)
``num_nodes``             whole, in [1, 4096]
``num_replicas``          whole, in [num_nodes, 64 x num_nodes] (at most 64 GPUs a node)
``local_bsz``             whole, in [1, 1e6] (samples per GPU per step)
``step_time``             in [1e-6, 86400] s: at least a microsecond, at most a day
``sync_time``             in [0, step_time of the same row] (it is part of the step)
``<B>`` of validation-B   whole, in [1, 1e9] (total batch), no leading zeros
``progress``              in (0, 1e15], strictly increasing down the file: every epoch
                          makes progress, and the simulator's epoch targets rely on it
``iteration``             in [0, 1e15], non-decreasing (a cumulative step count)
``metric``                any finite number (its scale depends on the model)
``grad_sqr``              0, or in [1e-30, 1e30]
``grad_var``              in [0, 1e30]
========================  ===============================================================

The gradient statistics are squared norms, so negative values are impossible. A zero
``grad_sqr`` is kept: the reference DeepSpeech2 profile has it late in training (the
gradient's mean vanishes against its noise), and the goodput model reads a
non-positive ``grad_sqr`` as "noise dominates" (statistical efficiency 1). A non-zero
``grad_sqr`` below 1e-30, or either statistic above 1e30, would overflow the gradient
noise scale ``B0 * grad_var / grad_sqr`` to infinity. The bounds on sizes and times
match the CLI's cluster limits (``deepboot.cli.limits``: 4096 nodes, 64 GPUs a node)
and keep every product the simulator forms finite. The measured points of
``placements.csv`` and ``scalability.csv`` together must not all lie in one plane of
(nodes, replicas, per-GPU batch), or no placement outside them could be interpolated.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
from scipy.spatial import Delaunay, QhullError

from deepboot.core.errors import InputError
from deepboot.core.params import BatchLimits
from deepboot.perf import detmath
from deepboot.perf.csvtable import CsvTable, Range, read_numeric_csv, shorten

LN2 = detmath.LN2_HI + detmath.LN2_LO

logger = logging.getLogger(__name__)

FloatArray: TypeAlias = npt.NDArray[np.float64]

PLACEMENTS_FILE = "placements.csv"
SCALABILITY_FILE = "scalability.csv"
PLACEMENT_COLUMNS = ("placement", "local_bsz", "step_time", "sync_time")
SCALABILITY_COLUMNS = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
VALIDATION_COLUMNS = ("progress", "iteration", "metric", "grad_sqr", "grad_var")
_VALIDATION_RE = re.compile(r"validation-([1-9][0-9]*)\.csv")
_PLACEMENT_RE = re.compile(r"[1-9]+")

MAX_INTERP_NODES = 16
"""Node counts above this are interpolated as this many (the reference's cap)."""

MAX_NODES = 4096
"""Most nodes one measurement may span (the CLI's largest cluster)."""
MAX_GPUS_PER_NODE = 64
"""Most GPUs per node (``num_replicas <= MAX_GPUS_PER_NODE * num_nodes``)."""
MAX_LOCAL_BSZ = 1_000_000
"""Largest per-GPU batch."""
MAX_BATCH_SIZE = 1_000_000_000
"""Largest validated total batch size (the ``B`` of ``validation-<B>.csv``)."""
MIN_STEP_TIME_S = 1e-6
"""Shortest step time: no optimizer step takes less than a microsecond."""
MAX_STEP_TIME_S = 86_400.0
"""Longest step time: one day."""
MAX_PROGRESS = 1e15
"""Largest progress or iteration count."""
MIN_GRAD_SQR = 1e-30
"""Smallest non-zero ``grad_sqr`` (below it the noise scale overflows)."""
MAX_GRAD_STAT = 1e30
"""Largest ``grad_sqr`` or ``grad_var``."""

_STEP = Range(MIN_STEP_TIME_S, MAX_STEP_TIME_S)
_SYNC = Range(0.0, MAX_STEP_TIME_S)
_LOCAL_BSZ = Range(1, MAX_LOCAL_BSZ, integer=True)
PLACEMENT_RANGES: Mapping[str, Range] = MappingProxyType(
    {"local_bsz": _LOCAL_BSZ, "step_time": _STEP, "sync_time": _SYNC}
)
"""Per-value ranges of ``placements.csv`` (``placement`` is checked as text)."""
SCALABILITY_RANGES: Mapping[str, Range] = MappingProxyType(
    {
        "num_nodes": Range(1, MAX_NODES, integer=True),
        "num_replicas": Range(1, MAX_NODES * MAX_GPUS_PER_NODE, integer=True),
        "local_bsz": _LOCAL_BSZ,
        "step_time": _STEP,
        "sync_time": _SYNC,
    }
)
"""Per-value ranges of ``scalability.csv``."""
VALIDATION_RANGES: Mapping[str, Range] = MappingProxyType(
    {
        "progress": Range(0.0, MAX_PROGRESS, low_open=True),
        "iteration": Range(0.0, MAX_PROGRESS),
        "grad_sqr": Range(MIN_GRAD_SQR, MAX_GRAD_STAT, zero=True),
        "grad_var": Range(0.0, MAX_GRAD_STAT),
    }
)
"""Per-value ranges of ``validation-<B>.csv`` (``metric``: any finite number)."""


@dataclass(frozen=True, slots=True)
class AppSettings:
    """Per-model overrides of what a profile folder implies.

    Attributes:
        max_epochs: Epochs to completion (None: the shortest validation file's rows).
        init_batch_size: M0 (None: the smallest validated batch size).
        max_batch_size: None: the largest validated batch size.
        min_local_bsz: None: the smallest measured per-GPU batch.
        max_local_bsz: None: the largest measured per-GPU batch.
    """

    max_epochs: int | None = None
    init_batch_size: int | None = None
    max_batch_size: int | None = None
    min_local_bsz: int | None = None
    max_local_bsz: int | None = None


APP_SETTINGS: Mapping[str, AppSettings] = MappingProxyType(
    {
        "bert": AppSettings(max_epochs=2),
        "cifar10": AppSettings(max_epochs=100),
        "ncf": AppSettings(max_epochs=10),
        "imagenet": AppSettings(max_epochs=90),
        "deepspeech2": AppSettings(max_epochs=80),
        "yolov3": AppSettings(max_epochs=50, max_local_bsz=8),
    }
)
"""The reference simulators' settings for the six reference models."""


@dataclass(frozen=True, slots=True)
class ValidationTrace:
    """One ``validation-<B>.csv``: per-epoch columns, each of shape (E,)."""

    batch_size: int
    progress: FloatArray
    iteration: FloatArray
    metric: FloatArray
    grad_sqr: FloatArray
    grad_var: FloatArray


@dataclass(frozen=True, slots=True)
class ProfileData:
    """The parsed files of one profile folder (no interpretation yet).

    Attributes:
        name: Model name (the folder name).
        placements: (placement digits, local_bsz, step_time, sync_time) rows.
        scalability: (P, 5) array: num_nodes, num_replicas, local_bsz, step, sync.
        validation: One trace per validated batch size, ascending.
        folder: The folder read ("" when unknown), for error messages.
    """

    name: str
    placements: tuple[tuple[str, int, float, float], ...]
    scalability: FloatArray
    validation: tuple[ValidationTrace, ...]
    folder: str = ""


def canonical_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Drop empty nodes and rotate to the lexicographically smallest rotation.

    Raises:
        ValueError: the shape has no GPU or a negative count.
    """
    nodes = tuple(int(c) for c in shape if c != 0)
    if not nodes or min(nodes) < 0:
        raise ValueError(f"shape {shape} needs at least one GPU and no negative counts")
    return min(nodes[i:] + nodes[:i] for i in range(len(nodes)))


def _mean(values: list[float]) -> float:
    """``float(np.mean(values))`` of a non-empty list, without NumPy for one value."""
    return float(values[0]) if len(values) == 1 else float(np.mean(values))


def _read_placements(
    path: Path, any_order: bool = False
) -> tuple[tuple[str, int, float, float], ...]:
    table = read_numeric_csv(
        path, PLACEMENT_COLUMNS, PLACEMENT_RANGES, text=("placement",), any_order=any_order
    )
    out: list[tuple[str, int, float, float]] = []
    for i, (raw, row) in enumerate(zip(table.raw, table.rows, strict=True)):
        digits = raw[0]
        if _PLACEMENT_RE.fullmatch(digits) is None:
            raise table.error(i, "placement", f"'{shorten(digits)}' is not a string of digits 1-9")
        if len(digits) > MAX_NODES:
            raise table.error(
                i, "placement", f"{len(digits)} nodes exceed the limit of {MAX_NODES}"
            )
        _check_sync(table, i, row[3], row[2])
        out.append((digits, int(row[1]), row[2], row[3]))
    return tuple(out)


def _check_sync(table: CsvTable, i: int, sync: float, step: float) -> None:
    if sync > step:
        raise table.error(i, "sync_time", f"{sync:g} exceeds step_time {step:g}")


def read_scalability(path: str | Path) -> FloatArray:
    """A ``scalability.csv`` (num_nodes, num_replicas, local_bsz, step_time, sync_time
    per row), validated: an (N, 5) array.

    Raises:
        InputError: unreadable, a missing column, or a value out of range (naming the
            file, the line and the column).
    """
    return _read_scalability(Path(path))


def _read_scalability(path: Path, any_order: bool = False) -> FloatArray:
    table = read_numeric_csv(path, SCALABILITY_COLUMNS, SCALABILITY_RANGES, any_order=any_order)
    for i, row in enumerate(table.rows):
        nodes, replicas = int(row[0]), int(row[1])
        if nodes > replicas:
            raise table.error(i, "num_nodes", "num_nodes exceeds num_replicas")
        if replicas > MAX_GPUS_PER_NODE * nodes:
            raise table.error(
                i,
                "num_replicas",
                f"{replicas} replicas on {nodes} node(s) is more than "
                f"{MAX_GPUS_PER_NODE} GPUs per node",
            )
        _check_sync(table, i, row[4], row[3])
    return np.asarray(table.rows, dtype=np.float64).reshape(-1, len(SCALABILITY_COLUMNS))


def _read_validation(path: Path, batch_size: int) -> ValidationTrace:
    table = read_numeric_csv(path, VALIDATION_COLUMNS, VALIDATION_RANGES)
    for i in range(1, len(table.rows)):
        prev, row = table.rows[i - 1], table.rows[i]
        now, before = table.raw[i], table.raw[i - 1]
        if row[0] <= prev[0]:
            raise table.error(
                i,
                "progress",
                f"{shorten(now[0])} is not above the previous epoch's {shorten(before[0])}: "
                "progress is cumulative and must grow every epoch",
            )
        if row[1] < prev[1]:
            raise table.error(
                i,
                "iteration",
                f"{shorten(now[1])} is below the previous epoch's {shorten(before[1])}: "
                "the iteration count is cumulative",
            )
    data = np.asarray(table.rows, dtype=np.float64)
    return ValidationTrace(batch_size, *(data[:, i].copy() for i in range(5)))


def _measured_points(
    placements: Sequence[tuple[str, int, float, float]], scalability: FloatArray
) -> list[tuple[int, int, int]]:
    """The (num_nodes, num_replicas, local_bsz) of every measurement, as whole numbers."""
    pts = [(len(d), sum(int(c) for c in d), bsz) for d, bsz, _, _ in placements]
    pts += [(int(r[0]), int(r[1]), int(r[2])) for r in scalability]
    return pts


def _spans_a_volume(points: Sequence[tuple[int, int, int]]) -> bool:
    """Whether the integer points are not all in one plane (exact arithmetic)."""
    o = points[0]
    vecs = [(p[0] - o[0], p[1] - o[1], p[2] - o[2]) for p in points[1:]]
    a = next((v for v in vecs if v != (0, 0, 0)), None)
    if a is None:
        return False
    normal = (0, 0, 0)
    for v in vecs:
        normal = (a[1] * v[2] - a[2] * v[1], a[2] * v[0] - a[0] * v[2], a[0] * v[1] - a[1] * v[0])
        if normal != (0, 0, 0):
            break
    if normal == (0, 0, 0):
        return False
    return any(normal[0] * v[0] + normal[1] * v[1] + normal[2] * v[2] != 0 for v in vecs)


def read_measurements(
    placements_file: Path, scalability_file: Path, any_order: bool = False
) -> tuple[tuple[tuple[str, int, float, float], ...], FloatArray]:
    """A placements and a scalability file, validated (columns in any order with
    ``any_order``), whose points together span a volume.

    Raises:
        InputError: a file is missing or malformed, or the points lie in one plane.
    """
    placements = _read_placements(placements_file, any_order)
    scalability = _read_scalability(scalability_file, any_order)
    if not _spans_a_volume(_measured_points(placements, scalability)):
        raise InputError(
            str(scalability_file),
            0,
            "",
            f"with {placements_file.name}, the measurements lie in one plane of (num_nodes, "
            "num_replicas, local_bsz), so other placements cannot be interpolated; "
            "measure more node counts, replica counts or batch sizes",
        )
    return placements, scalability


def read_profile_dir(path: str | Path) -> ProfileData:
    """Parse one model's profile folder, checking every value (see the module doc).

    Raises:
        InputError: the folder or a required file is missing, no validation file is
            present, or a file is malformed or holds a value outside its valid range
            (the error names file, line and field).
    """
    folder = Path(path)
    if not folder.is_dir():
        raise InputError(str(folder), 0, "", "profile folder not found")
    placements, scalability = read_measurements(folder / PLACEMENTS_FILE, folder / SCALABILITY_FILE)
    traces: list[ValidationTrace] = []
    for file in sorted(folder.glob("validation-*.csv")):
        m = _VALIDATION_RE.fullmatch(file.name)
        if m is None or int(m.group(1)) > MAX_BATCH_SIZE:
            raise InputError(
                str(file),
                0,
                "",
                "name must be validation-<B>.csv, B a whole number in "
                f"[1, {MAX_BATCH_SIZE:g}] without leading zeros",
            )
        traces.append(_read_validation(file, int(m.group(1))))
    if not traces:
        raise InputError(str(folder), 0, "", "no validation-<B>.csv file in the profile folder")
    traces.sort(key=lambda t: t.batch_size)
    return ProfileData(folder.name, placements, scalability, tuple(traces), str(folder))


class ProfiledApplication:
    """The :class:`~deepboot.perf.application.Application` of measured reference profiles.

    Build with :meth:`from_dir` or :func:`load_profiles`. See the module docstring for
    the interpolation rules.

    Attributes:
        name: Model name.
        limits: Batch limits (defaults from the data, overridden by ``settings``).
        max_epochs: Epochs to completion.
        data: The parsed profile.
    """

    def __init__(self, data: ProfileData, settings: AppSettings | None = None) -> None:
        """Build from parsed data.

        Raises:
            InputError: the limits implied by data and settings are inconsistent.
        """
        s = settings or APP_SETTINGS.get(data.name, AppSettings())
        self.name: str = data.name
        self.data = data
        batch_sizes = [t.batch_size for t in data.validation]
        local = [p[1] for p in data.placements]
        self.limits: BatchLimits = BatchLimits(
            init_batch_size=s.init_batch_size or min(batch_sizes),
            max_batch_size=s.max_batch_size or max(batch_sizes),
            min_local_bsz=s.min_local_bsz or min(local),
            max_local_bsz=s.max_local_bsz or max(local),
        )
        lim = self.limits
        if not (
            lim.init_batch_size <= lim.max_batch_size and lim.min_local_bsz <= lim.max_local_bsz
        ):
            raise InputError(
                data.folder or data.name,
                0,
                "",
                f"the measured batch sizes and the settings of {data.name!r} give "
                f"inconsistent batch limits {lim}",
            )
        rows = min(t.progress.size for t in data.validation)
        epochs = s.max_epochs or rows
        if epochs > rows:
            logger.warning(
                "%s: max_epochs %d exceeds the %d validated epochs; extrapolating progress",
                data.name,
                epochs,
                rows,
            )
        self.max_epochs: int = epochs
        self._batch_sizes = np.asarray(batch_sizes, dtype=np.float64)
        # (B, E) progress table, truncated to the shortest file; min over batch sizes.
        prog = np.stack([t.progress[:rows] for t in data.validation])
        self._progress = np.concatenate([[0.0], prog.min(axis=0)])
        self._exact = self._index_placements(data)
        self._interp: _Linear3D | None = None
        self._step_memo: dict[tuple[tuple[int, ...], int], tuple[float, float]] = {}
        self._grad_memo: dict[tuple[int, int], tuple[float, float]] = {}

    @classmethod
    def from_dir(cls, path: str | Path, settings: AppSettings | None = None) -> ProfiledApplication:
        """Parse ``path`` (a model's profile folder) and build the application.

        Raises:
            InputError: see :func:`read_profile_dir`.
        """
        return cls(read_profile_dir(path), settings)

    @staticmethod
    def _index_placements(
        data: ProfileData,
    ) -> dict[str, tuple[FloatArray, FloatArray, FloatArray]]:
        """Placement digits -> (local_bsz, step, sync) arrays sorted by local_bsz."""
        grouped: dict[str, list[tuple[int, float, float]]] = {}
        for digits, bsz, step, sync in data.placements:
            grouped.setdefault(digits, []).append((bsz, step, sync))
        out: dict[str, tuple[FloatArray, FloatArray, FloatArray]] = {}
        for digits, pts in grouped.items():
            # Repeated measurements of one batch are averaged so x stays strictly increasing.
            by_bsz: dict[int, list[tuple[float, float]]] = {}
            for bsz, step, sync in pts:
                by_bsz.setdefault(bsz, []).append((step, sync))
            xs = sorted(by_bsz)
            # One measurement (the usual case) is its own mean, bit for bit.
            steps = [_mean([v[0] for v in by_bsz[x]]) for x in xs]
            syncs = [_mean([v[1] for v in by_bsz[x]]) for x in xs]
            out[digits] = (
                np.asarray(xs, dtype=np.float64),
                np.asarray(steps, dtype=np.float64),
                np.asarray(syncs, dtype=np.float64),
            )
        return out

    @property
    def validated_batch_sizes(self) -> tuple[int, ...]:
        """The validated total batch sizes, ascending."""
        return tuple(t.batch_size for t in self.data.validation)

    def measured_placements(self) -> tuple[str, ...]:
        """The placement digit strings of ``placements.csv``, sorted."""
        return tuple(sorted(self._exact))

    # -- step time -----------------------------------------------------------------

    def step_time(self, shape: tuple[int, ...], local_bsz: int) -> tuple[float, float]:
        """(step_time, sync_time) of one step without accumulation (see module doc).

        Args:
            shape: GPUs per used node, in node order; rotations are equivalent.
            local_bsz: Per-GPU batch of one micro-step, >= 1.

        Raises:
            ValueError: the shape has no GPU or ``local_bsz`` < 1.
        """
        if local_bsz < 1:
            raise ValueError(f"local_bsz must be >= 1; got {local_bsz}")
        key = (canonical_shape(shape), int(local_bsz))
        hit = self._step_memo.get(key)
        if hit is None:
            hit = self._compute_step_time(*key)
            self._step_memo[key] = hit
        return hit

    def _compute_step_time(self, shape: tuple[int, ...], local_bsz: int) -> tuple[float, float]:
        digits = "".join(map(str, shape)) if max(shape) <= 9 else ""
        exact = self._exact.get(digits)
        if exact is not None:
            return _interp_exact(*exact, float(local_bsz))
        return self._interp_3d(min(len(shape), MAX_INTERP_NODES), sum(shape), float(local_bsz))

    def _build_interp(self) -> _Linear3D:
        groups: dict[tuple[int, int, int], list[tuple[float, float]]] = {}
        for digits, bsz, step, sync in self.data.placements:
            key = (len(digits), sum(int(c) for c in digits), bsz)
            groups.setdefault(key, []).append((step, sync))
        keys = sorted(groups)
        means = np.asarray([np.mean(groups[k], axis=0) for k in keys], dtype=np.float64)
        pts = np.asarray(keys, dtype=np.float64).reshape(-1, 3)
        scal = self.data.scalability
        points = np.concatenate([pts, scal[:, :3]])
        values = np.concatenate([means.reshape(-1, 2), scal[:, 3:5]])
        try:
            return _Linear3D(points, values)
        except QhullError as e:  # a near-flat point set; read_profile_dir refuses flat ones
            where = str(Path(self.data.folder or self.name) / SCALABILITY_FILE)
            first = str(e).strip().splitlines()[0] if str(e).strip() else "qhull failed"
            raise InputError(
                where, 0, "", f"cannot triangulate the measurements ({first})"
            ) from None

    def _interp_3d(self, nodes: int, replicas: int, local_bsz: float) -> tuple[float, float]:
        if self._interp is None:
            self._interp = self._build_interp()
        interp = self._interp
        out = interp(np.array([nodes, replicas, local_bsz], dtype=np.float64))
        if out is None:
            lo, hi = float(interp.points[:, 2].min()), float(interp.points[:, 2].max())
            clamped = min(max(local_bsz, lo), hi)
            out = interp(np.array([nodes, replicas, clamped], dtype=np.float64))
        if out is None:
            logger.debug(
                "%s: (%d nodes, %d replicas, bsz %g) is outside the measured hull; "
                "using the nearest measurement",
                self.name,
                nodes,
                replicas,
                local_bsz,
            )
            pts = interp.points
            # detmath: np.log2's kernels depend on the CPU.
            scaled = np.column_stack([pts[:, 0], pts[:, 1], detmath.log(pts[:, 2]) / LN2])
            query = np.array([nodes, replicas, detmath.log_scalar(local_bsz) / LN2])
            gap = scaled - query
            out = interp.values[int(np.argmin(np.sum(gap * gap, axis=1)))]
        return float(out[0]), float(out[1])

    # -- statistical efficiency ----------------------------------------------------

    def _bracket(self, batch_size: float) -> tuple[int, int, float]:
        """Indices of the validated sizes around ``batch_size`` and the upper weight."""
        b = self._batch_sizes
        x = min(max(batch_size, float(b[0])), float(b[-1]))
        hi = int(np.searchsorted(b, x, side="left"))
        if b[hi] == x:
            return hi, hi, 0.0
        lo = hi - 1
        return lo, hi, (x - b[lo]) / (b[hi] - b[lo])

    def grad_stats(self, batch_size: int, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) during ``epoch`` (0-based) at total ``batch_size``."""
        key = (int(batch_size), max(int(epoch), 0))
        hit = self._grad_memo.get(key)
        if hit is None:
            lo, hi, w = self._bracket(float(key[0]))
            t_lo, t_hi = self.data.validation[lo], self.data.validation[hi]
            e_lo = min(key[1], t_lo.grad_sqr.size - 1)
            e_hi = min(key[1], t_hi.grad_sqr.size - 1)
            sqr = (1 - w) * t_lo.grad_sqr[e_lo] + w * t_hi.grad_sqr[e_hi]
            var = (1 - w) * t_lo.grad_var[e_lo] + w * t_hi.grad_var[e_hi]
            hit = (float(sqr), float(var))
            self._grad_memo[key] = hit
        return hit

    def progress_at(self, epoch: int) -> float:
        """Cumulative progress at the end of ``epoch`` epochs (0 -> 0.0)."""
        if epoch <= 0:
            return 0.0
        last = self._progress.size - 1
        if epoch <= last:
            return float(self._progress[epoch])
        step = self._progress[last] - self._progress[last - 1]
        return float(self._progress[last] + (epoch - last) * step)


_EPS = 100 * np.finfo(np.float64).eps
_EPS_BROAD = float(np.sqrt(np.finfo(np.float64).eps))
_RCOND_LIMIT = 1000 * np.finfo(np.float64).eps
_BRUTE_BLOCK = 512
"""Simplices the brute-force search tests per NumPy pass."""


class _Linear3D:
    """Piecewise-linear interpolation on the Delaunay triangulation of 3-D points.

    Reproduces scipy's ``LinearNDInterpolator`` (the reference's interpolator),
    including which simplex it picks: the measured (nodes, replicas, batch) grid is
    full of co-spherical points, so the triangulation has flat slivers and the
    interpolant jumps across some data planes; where the query lies on such a plane the
    answer depends on the simplex found, so scipy's walk (lifted-plane walk, directed
    walk, brute force) is followed step by step. The barycentric transforms are computed
    with elementwise NumPy (Cramer's rule) instead of scipy's per-simplex LAPACK calls,
    which can take minutes on a loaded machine when the BLAS library spins threads.

    Args:
        points: (P, 3) measurement coordinates.
        values: (P, 2) values at the points.
    """

    def __init__(self, points: FloatArray, values: FloatArray) -> None:
        self.points = points
        self.values = values
        tri = Delaunay(points)
        self._simplices = np.asarray(tri.simplices, dtype=np.int64)  # (S, 4)
        self._neighbors = np.asarray(tri.neighbors, dtype=np.int64)  # (S, 4)
        self._equations = np.asarray(tri.equations, dtype=np.float64)  # (S, 5)
        self._lift_scale = float(tri.paraboloid_scale)
        self._lift_shift = float(tri.paraboloid_shift)
        self._min = points.min(axis=0)
        self._max = points.max(axis=0)
        v = points[self._simplices]  # (S, 4, 3)
        # As scipy: the last vertex is the origin, columns are v_j - v_3 (j < 3).
        origin = v[:, 3]
        a, b, c = v[:, 0] - origin, v[:, 1] - origin, v[:, 2] - origin
        bc, ca, ab = np.cross(b, c), np.cross(c, a), np.cross(a, b)
        det = np.sum(a * bc, axis=1)  # (S,)
        safe = np.where(det != 0.0, det, 1.0)[:, None, None]
        inv = np.stack([bc, ca, ab], axis=1) / safe  # (S, 3, 3): rows of [a b c]^-1
        mat = np.stack([a, b, c], axis=2)  # (S, 3, 3), columns a, b, c
        # Reciprocal 1-norm condition number, as scipy's singularity test.
        norm = np.abs(mat).sum(axis=1).max(axis=1)
        norm_inv = np.abs(inv).sum(axis=1).max(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            rcond = 1.0 / (norm * norm_inv)
        ok = (det != 0.0) & np.isfinite(rcond) & (rcond >= _RCOND_LIMIT)
        self._valid = ok
        self._origin = origin
        self._inv = inv
        # What the brute-force search needs that does not depend on the query: a flat
        # simplex s may defer to its valid neighbours (_via_ok), with extra leeway on
        # the neighbour's coordinate towards s (_via_lower).
        nbs = self._neighbors
        idx = np.arange(nbs.shape[0])
        self._nb_safe = np.where(nbs >= 0, nbs, 0)  # (S, 4)
        towards = nbs[self._nb_safe] == idx[:, None, None]  # (S, 4, 4)
        self._via_lower = np.where(towards, -_EPS_BROAD, -_EPS)
        self._via_ok = (~ok)[:, None] & (nbs >= 0) & ok[self._nb_safe]  # (S, 4)
        self._deferring = np.flatnonzero(self._via_ok.any(axis=1))

    def _bary(self, simplex: int, x: FloatArray) -> FloatArray:
        c = (self._inv[simplex] * (x - self._origin[simplex])[None, :]).sum(axis=1)
        return np.array([c[0], c[1], c[2], 1.0 - c[0] - c[1] - c[2]])

    def _find(self, x: FloatArray) -> int:
        """Index of the simplex holding ``x``, or -1; scipy's ``_find_simplex``."""
        # x . x written out: np.dot is BLAS, whose kernels depend on the CPU.
        sq = float(x[0]) * float(x[0]) + float(x[1]) * float(x[1]) + float(x[2]) * float(x[2])
        z = np.append(x, (sq * self._lift_scale) + self._lift_shift)
        eq = self._equations
        s = 0
        best = float((eq[s, :4] * z).sum() + eq[s, 4])
        changed = True
        while changed and best <= 0:
            changed = False
            for k in range(4):
                nb = int(self._neighbors[s, k])
                if nb == -1:
                    continue
                dist = float((eq[nb, :4] * z).sum() + eq[nb, 4])
                if dist > best + _EPS * (1 + abs(best)):
                    s, best, changed = nb, dist, True
        return self._directed(x, s)

    def _directed(self, x: FloatArray, start: int) -> int:
        s = start
        for _ in range(1 + self._simplices.shape[0] // 4):
            if not self._valid[s]:
                return self._brute_force(x)
            c = self._bary(s, x)
            inside = 1
            for k in range(4):
                if c[k] < -_EPS:
                    nb = int(self._neighbors[s, k])
                    if nb == -1:
                        return -1
                    s, inside = nb, -1
                    break
                if c[k] > 1 + _EPS:
                    inside = 0
            if inside == 1:
                return s
            if inside == 0:
                return self._brute_force(x)
        return self._brute_force(x)

    def _coords(self, rows: npt.NDArray[np.int64] | slice, x: FloatArray) -> FloatArray:
        """(R, 4) barycentric coordinates of ``x`` in the simplices ``rows``.

        Row by row the same operations whatever the rows, so a simplex's coordinates do
        not depend on which others are computed with it.
        """
        d = x[None, :] - self._origin[rows]
        c3 = np.sum(self._inv[rows] * d[:, None, :], axis=2)  # (R, 3)
        return np.column_stack([c3, 1.0 - c3.sum(axis=1)])

    def _brute_force(self, x: FloatArray) -> int:
        """scipy's ``_find_simplex_bruteforce``: the first simplex, in index order, that
        holds ``x`` (within _EPS), or whose flat self defers to a valid neighbour that
        does; -1 if none.

        Vectorized over blocks of simplices in index order, stopping at the first block
        with a hit: the same answer as testing every simplex at once (each simplex's test
        is the same elementwise arithmetic), at a fraction of the cost when the hit is
        early.
        """
        if np.any(x < self._min - _EPS) or np.any(x > self._max + _EPS):
            return -1
        count = self._simplices.shape[0]
        deferring = self._deferring
        for start in range(0, count, _BRUTE_BLOCK):
            stop = min(start + _BRUTE_BLOCK, count)
            c = self._coords(slice(start, stop), x)
            hit = self._valid[start:stop] & np.all((c >= -_EPS) & (c <= 1 + _EPS), axis=1)
            direct = hit.copy()
            lo, hi = np.searchsorted(deferring, (start, stop))
            flat = deferring[lo:hi]
            if flat.size:
                nb_c = self._coords(self._nb_safe[flat].ravel(), x).reshape(flat.size, 4, 4)
                nb_in = np.all((nb_c >= self._via_lower[flat]) & (nb_c <= 1 + _EPS), axis=2)
                via = self._via_ok[flat] & nb_in  # (F, 4)
                hit[flat - start] |= via.any(axis=1)
            if not hit.any():
                continue
            s = int(np.argmax(hit))
            if direct[s]:
                return start + s
            row = int(np.searchsorted(flat, start + s))
            return int(self._neighbors[start + s, int(np.argmax(via[row]))])
        return -1

    def __call__(self, query: FloatArray) -> FloatArray | None:
        """Interpolated (2,) values at ``query`` (3,), or None outside the hull."""
        s = self._find(query)
        if s < 0:
            return None
        w = self._bary(s, query)
        return np.asarray((w[:, None] * self.values[self._simplices[s]]).sum(axis=0))


def _interp_exact(
    xs: FloatArray, steps: FloatArray, syncs: FloatArray, x: float
) -> tuple[float, float]:
    """Linear interpolation in the per-GPU batch at one measured placement (see module)."""
    if xs[0] <= x <= xs[-1]:
        return float(np.interp(x, xs, steps)), float(np.interp(x, xs, syncs))
    if x < xs[0]:
        sync = float(syncs[0])
        compute = float(steps[0] - syncs[0]) * x / float(xs[0])
        return sync + compute, sync
    sync = float(syncs[-1])
    comp = steps - syncs
    if xs.size >= 2:
        slope = max(float((comp[-1] - comp[-2]) / (xs[-1] - xs[-2])), 0.0)
    else:
        slope = float(comp[-1] / xs[-1])
    compute = float(comp[-1]) + slope * (x - float(xs[-1]))
    return sync + compute, sync


def load_profiles(root: str | Path) -> dict[str, ProfiledApplication]:
    """Load every model folder under ``root`` (hidden folders are skipped).

    Settings come from :data:`APP_SETTINGS` for known model names, else from the data.

    Returns:
        Model name -> application, sorted by name.

    Raises:
        InputError: ``root`` is missing or holds no model folder, or a model folder is
            invalid (see :func:`read_profile_dir`).
    """
    base = Path(root)
    if not base.is_dir():
        raise InputError(str(base), 0, "", "profiles folder not found")
    folders = sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise InputError(str(base), 0, "", "no model folder (e.g. cifar10/) in the profiles folder")
    return {f.name: ProfiledApplication.from_dir(f) for f in folders}
