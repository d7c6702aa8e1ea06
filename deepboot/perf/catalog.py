"""The built-in application catalog: compact fitted models of the reference profiles.

The package must run without the measured traces, so it ships ``catalog.json``: per
model, parameters fitted from the profiles by this project's own code
(:func:`fit_catalog`), never copies of the CSVs. Per model it holds:

* ``limits`` and ``max_epochs``;
* ``perf``: the 7 throughput parameters fitted on every measurement (a prior);
* ``throughput``: the 7 parameters fitted separately on groups of measurements, because
  one global fit cannot follow the measured step times of every placement (e.g. the
  2-node placements are measured much slower than the 7-parameter model predicts, and
  the compute time of one GPU grows when its node is shared). The groups are: one
  replica (``single``), then one fit per node count at knots ``nodes`` (1 = one node,
  several replicas; then 2, 3, 4, 6, 8, 12, 16). The step time of N nodes is predicted
  by the fit of the knot N, linearly interpolated between the two knots around N (above
  the last knot, the last knot's fit, like the reference's cap at 16 nodes). Only
  placements with at most ``node_gpus`` GPUs per node (4, the reference cluster's node
  size) are used for the group fits;
* ``progress``: cumulative progress at epoch knots (piecewise linear, 0 at epoch 0);
* ``grad``: for each validated batch size, log10 of grad_sqr and grad_var at epoch
  knots, fitted by least squares as piecewise-linear functions of the epoch.

:class:`CatalogApplication` answers the
:class:`~deepboot.perf.application.Application` queries from that data; between
validated batch sizes gradient statistics are interpolated linearly, as the profiles
are.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from deepboot.core.errors import InputError
from deepboot.core.params import BatchLimits, PerfParams
from deepboot.perf import detmath
from deepboot.perf.fit import fit_perf_params
from deepboot.perf.goodput import compute_time, step_time
from deepboot.perf.profiles import ProfiledApplication, canonical_shape, load_profiles

logger = logging.getLogger(__name__)

FloatArray: TypeAlias = npt.NDArray[np.float64]

CATALOG_VERSION = 1
NODE_KNOTS: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16)
"""Node counts fitted separately (those the reference profiles measure)."""
GRAD_KNOTS = 10
"""Epoch knots of the gradient statistics (fewer when the model has fewer epochs)."""
PROGRESS_KNOTS = 6
"""Epoch knots of the progress curve."""
_PERF_FIELDS = ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r", "gamma")


# -- fitting ------------------------------------------------------------------------


def _points(app: ProfiledApplication, node_gpus: int | None) -> tuple[FloatArray, ...]:
    """(nodes, replicas, local_bsz, compute, step) arrays of the measurements (P,).

    With ``node_gpus``, placements using more GPUs on some node are left out
    (``scalability.csv`` rows carry no per-node counts and are always kept).
    """
    d = app.data
    rows = [p for p in d.placements if node_gpus is None or max(map(int, p[0])) <= node_gpus]
    n = [float(len(p[0])) for p in rows] + list(d.scalability[:, 0])
    k = [float(sum(int(c) for c in p[0])) for p in rows] + list(d.scalability[:, 1])
    m = [float(p[1]) for p in rows] + list(d.scalability[:, 2])
    st = [p[2] for p in rows] + list(d.scalability[:, 3])
    sy = [p[3] for p in rows] + list(d.scalability[:, 4])
    step = np.asarray(st, dtype=np.float64)
    comp = step - np.asarray(sy, dtype=np.float64)
    # A sync time equal to the step time leaves no compute time to take the log of.
    ok = comp > 0
    arrays = (np.asarray(n), np.asarray(k), np.asarray(m), comp, step)
    return tuple(np.asarray(a, dtype=np.float64)[ok] for a in arrays)


def _perf_list(p: PerfParams) -> list[float]:
    return [float(getattr(p, f)) for f in _PERF_FIELDS]


def _epoch_knots(epochs: int, count: int) -> list[int]:
    """0, 1 and then ``count - 2`` knots evenly up to ``epochs - 1`` (unique, sorted)."""
    last = max(epochs - 1, 0)
    knots = {0, min(1, last), last}
    knots.update(int(round(x)) for x in np.linspace(1, last, max(count - 2, 2)))
    return sorted(knots)


def _hat_basis(x: FloatArray, knots: Sequence[float]) -> FloatArray:
    """(len(x), len(knots)) piecewise-linear interpolation basis, constant outside."""
    eye = np.eye(len(knots))
    return np.stack([np.interp(x, knots, eye[j]) for j in range(len(knots))], axis=1)


def _fit_piecewise(x: FloatArray, y: FloatArray, knots: Sequence[float]) -> list[float]:
    """Least-squares knot values of a piecewise-linear function through (x, y)."""
    if len(knots) == 1:
        return [float(np.mean(y))]
    basis = _hat_basis(x, knots)
    # Normal equations by elementwise sums and a Cholesky solve in detmath, not
    # np.linalg.lstsq: LAPACK's kernels (and last bits) depend on the CPU. A tiny
    # ridge keeps knots without data (columns of zeros) at 0 instead of singular.
    gram = np.sum(basis[:, :, None] * basis[:, None, :], axis=0)
    rhs = np.sum(basis * y[:, None], axis=0)
    q = len(knots)
    ridge = 1e-12 * max(float(np.max(np.diagonal(gram))), 1.0)
    a = [[float(gram[i, j]) + (ridge if i == j else 0.0) for j in range(q)] for i in range(q)]
    sol = detmath.solve_spd(a, [float(v) for v in rhs])
    if sol is None:
        raise ValueError("piecewise-linear fit: singular normal equations")
    return sol


def fit_model(app: ProfiledApplication, node_gpus: int = 4) -> dict[str, Any]:
    """Fit one model's catalog entry (see the module docstring for the fields).

    Args:
        app: The measured profiles of the model.
        node_gpus: GPUs per node of the cluster the group fits are meant for.
    """
    n, k, m, comp, step = _points(app, None)
    entry: dict[str, Any] = {
        "limits": {
            "init_batch_size": app.limits.init_batch_size,
            "max_batch_size": app.limits.max_batch_size,
            "min_local_bsz": app.limits.min_local_bsz,
            "max_local_bsz": app.limits.max_local_bsz,
        },
        "max_epochs": app.max_epochs,
        "perf": _perf_list(fit_perf_params(n, k, m, comp, step)),
    }
    n, k, m, comp, step = _points(app, node_gpus)

    def fit(sel: npt.NDArray[np.bool_]) -> list[float]:
        return _perf_list(fit_perf_params(n[sel], k[sel], m[sel], comp[sel], step[sel]))

    single = k == 1
    knots: list[int] = []
    params: list[list[float]] = []
    for node_count in NODE_KNOTS:
        sel = (n == node_count) & ~single
        if np.any(sel):
            knots.append(node_count)
            params.append(fit(sel))
    if not np.any(single) or not knots:
        raise InputError(app.name, 0, "", "profiles need single-GPU and multi-GPU measurements")
    entry["throughput"] = {"single": fit(single), "nodes": knots, "params": params}

    epochs = np.arange(app.max_epochs + 1, dtype=np.float64)
    progress = np.asarray([app.progress_at(int(e)) for e in epochs])
    p_knots = [int(round(x)) for x in np.linspace(0, app.max_epochs, PROGRESS_KNOTS)]
    p_knots = sorted(set(p_knots))
    p_vals = _fit_piecewise(epochs, progress, p_knots)
    p_vals[0] = 0.0
    entry["progress"] = {"epochs": p_knots, "values": p_vals}

    traces = app.data.validation
    g_knots = _epoch_knots(app.max_epochs, GRAD_KNOTS)
    log_sqr: list[list[float]] = []
    log_var: list[list[float]] = []
    for t in traces:
        rows = min(t.grad_sqr.size, app.max_epochs)
        x = np.arange(rows, dtype=np.float64)
        # log10 of non-positive statistics is undefined; clamp to a tiny positive value.
        sqr = detmath.log(np.maximum(t.grad_sqr[:rows], 1e-300)) / detmath.LN10
        var = detmath.log(np.maximum(t.grad_var[:rows], 1e-300)) / detmath.LN10
        log_sqr.append(_fit_piecewise(x, sqr, g_knots))
        log_var.append(_fit_piecewise(x, var, g_knots))
    entry["grad"] = {
        "batch_sizes": [t.batch_size for t in traces],
        "epochs": g_knots,
        "log10_sqr": log_sqr,
        "log10_var": log_var,
    }
    return entry


def fit_catalog(root: str | Path, node_gpus: int = 4) -> dict[str, Any]:
    """Fit every model of a profiles folder into a catalog document (JSON-ready).

    Raises:
        InputError: see :func:`~deepboot.perf.profiles.load_profiles`, or a model
            lacks single-GPU or multi-GPU measurements.
    """
    apps = load_profiles(root)
    return {
        "version": CATALOG_VERSION,
        "source": "fitted by deepboot.perf.catalog.fit_catalog from reference profiles",
        "node_gpus": node_gpus,
        "models": {name: fit_model(app, node_gpus) for name, app in sorted(apps.items())},
    }


def _round(obj: Any, digits: int = 6) -> Any:
    """Round floats to ``digits`` significant digits to keep the JSON small."""
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, list):
        return [_round(v, digits) for v in obj]
    if isinstance(obj, dict):
        return {key: _round(v, digits) for key, v in obj.items()}
    return obj


def catalog_json(root: str | Path, node_gpus: int = 4) -> str:
    """Fit the profiles under ``root`` and return the catalog file's text.

    The document of :func:`fit_catalog`, floats rounded to 6 significant digits,
    keys sorted: exactly what :func:`write_catalog` writes.

    Raises:
        InputError: the profiles are invalid (see :func:`fit_catalog`).
    """
    doc = _round(fit_catalog(root, node_gpus))
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def write_catalog(root: str | Path, out_path: str | Path, node_gpus: int = 4) -> Path:
    """Fit the profiles under ``root`` and write the catalog JSON to ``out_path``.

    The write is atomic: a temporary file in the same directory, synced, then renamed
    over ``out_path``; on failure the previous file is left intact and the temporary
    file removed.

    Returns:
        The path written.

    Raises:
        InputError: the profiles are invalid (see :func:`fit_catalog`).
        OSError: ``out_path`` cannot be written.
    """
    out = Path(out_path)
    _replace_file(out, catalog_json(root, node_gpus))
    return out


def _replace_file(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file next to ``path``, sync it, rename it over
    ``path``; on any failure remove the temporary file and re-raise."""
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# -- the application ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _GradTable:
    batch_sizes: FloatArray  # (B,)
    epochs: tuple[float, ...]  # (E_k,)
    log10_sqr: FloatArray  # (B, E_k)
    log10_var: FloatArray  # (B, E_k)


class CatalogApplication:
    """An :class:`~deepboot.perf.application.Application` from one catalog entry.

    Attributes:
        name: Model name.
        limits: Batch limits.
        max_epochs: Epochs to completion.
        perf: The global 7-parameter fit (a prior for schedulers; not used for step time).
    """

    def __init__(self, name: str, entry: Mapping[str, Any], source: str = "catalog") -> None:
        """Build from a catalog entry.

        Raises:
            InputError: the entry is missing a field or has values of the wrong shape
                (``source`` names the file in the error).
        """
        self.name: str = name
        try:
            lim = entry["limits"]
            self.limits: BatchLimits = BatchLimits(
                int(lim["init_batch_size"]),
                int(lim["max_batch_size"]),
                int(lim["min_local_bsz"]),
                int(lim["max_local_bsz"]),
            )
            self.max_epochs: int = int(entry["max_epochs"])
            self.perf: PerfParams = PerfParams(*(float(v) for v in entry["perf"]))
            tp = entry["throughput"]
            self._single = PerfParams(*(float(v) for v in tp["single"]))
            self._node_knots = np.asarray(tp["nodes"], dtype=np.float64)
            self._knot_params = tuple(PerfParams(*(float(v) for v in p)) for p in tp["params"])
            prog = entry["progress"]
            self._prog_epochs = np.asarray(prog["epochs"], dtype=np.float64)
            self._prog_values = np.asarray(prog["values"], dtype=np.float64)
            g = entry["grad"]
            self._grad = _GradTable(
                np.asarray(g["batch_sizes"], dtype=np.float64),
                tuple(float(e) for e in g["epochs"]),
                np.asarray(g["log10_sqr"], dtype=np.float64),
                np.asarray(g["log10_var"], dtype=np.float64),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(source, 0, name, f"malformed catalog entry: {e!r}") from e
        gt = self._grad
        shape = (gt.batch_sizes.size, len(gt.epochs))
        if (
            self._node_knots.size == 0
            or self._node_knots.size != len(self._knot_params)
            or self._prog_epochs.shape != self._prog_values.shape
            or self._prog_epochs.size < 2
            or gt.batch_sizes.size == 0
            or gt.log10_sqr.shape != shape
            or gt.log10_var.shape != shape
        ):
            raise InputError(source, 0, name, "catalog entry arrays have inconsistent lengths")
        self._step_memo: dict[tuple[int, int, int], tuple[float, float]] = {}
        self._grad_memo: dict[tuple[int, int], tuple[float, float]] = {}

    def _predict(
        self, p: PerfParams, nodes: int, replicas: int, local_bsz: int
    ) -> tuple[float, float]:
        step = float(step_time(p, nodes, replicas, local_bsz))
        if replicas == 1:
            return step, 0.0
        comp = float(compute_time(p, local_bsz))
        return step, max(step - comp, 0.0)

    def step_time(self, shape: tuple[int, ...], local_bsz: int) -> tuple[float, float]:
        """(step_time, sync_time) of one step without accumulation.

        Only the node count and replica count of ``shape`` matter.

        Raises:
            ValueError: the shape has no GPU or ``local_bsz`` < 1.
        """
        if local_bsz < 1:
            raise ValueError(f"local_bsz must be >= 1; got {local_bsz}")
        nodes_shape = canonical_shape(shape)
        key = (len(nodes_shape), sum(nodes_shape), int(local_bsz))
        hit = self._step_memo.get(key)
        if hit is None:
            hit = self._compute(*key)
            self._step_memo[key] = hit
        return hit

    def _compute(self, nodes: int, replicas: int, local_bsz: int) -> tuple[float, float]:
        if replicas == 1:
            return self._predict(self._single, nodes, replicas, local_bsz)
        knots = self._node_knots
        x = min(max(float(nodes), float(knots[0])), float(knots[-1]))
        hi = int(np.searchsorted(knots, x, side="left"))
        if knots[hi] == x:
            return self._predict(self._knot_params[hi], nodes, replicas, local_bsz)
        lo = hi - 1
        w = (x - knots[lo]) / (knots[hi] - knots[lo])
        s_lo, y_lo = self._predict(self._knot_params[lo], nodes, replicas, local_bsz)
        s_hi, y_hi = self._predict(self._knot_params[hi], nodes, replicas, local_bsz)
        return (1 - w) * s_lo + w * s_hi, (1 - w) * y_lo + w * y_hi

    def grad_stats(self, batch_size: int, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) during ``epoch`` at total ``batch_size``."""
        key = (int(batch_size), max(int(epoch), 0))
        hit = self._grad_memo.get(key)
        if hit is None:
            hit = self._compute_grad(*key)
            self._grad_memo[key] = hit
        return hit

    def _compute_grad(self, batch_size: int, epoch: int) -> tuple[float, float]:
        g = self._grad
        e = float(epoch)
        b = g.batch_sizes
        x = min(max(float(batch_size), float(b[0])), float(b[-1]))
        hi = int(np.searchsorted(b, x, side="left"))
        lo = hi if b[hi] == x else hi - 1
        w = 0.0 if lo == hi else (x - b[lo]) / (b[hi] - b[lo])

        def at(row: int) -> tuple[float, float]:
            sqr = detmath.exp10_scalar(float(np.interp(e, g.epochs, g.log10_sqr[row])))
            var = detmath.exp10_scalar(float(np.interp(e, g.epochs, g.log10_var[row])))
            return sqr, var

        sqr_lo, var_lo = at(lo)
        sqr_hi, var_hi = at(hi)
        return (1 - w) * sqr_lo + w * sqr_hi, (1 - w) * var_lo + w * var_hi

    def progress_at(self, epoch: int) -> float:
        """Cumulative progress at the end of ``epoch`` epochs (0 -> 0.0).

        Past the last knot the last segment is extended linearly.
        """
        if epoch <= 0:
            return 0.0
        ep, val = self._prog_epochs, self._prog_values
        if epoch <= ep[-1]:
            return float(np.interp(float(epoch), ep, val))
        slope = (val[-1] - val[-2]) / (ep[-1] - ep[-2])
        return float(val[-1] + slope * (epoch - ep[-1]))


def parse_catalog(doc: Mapping[str, Any], source: str = "catalog") -> dict[str, CatalogApplication]:
    """Build the applications of a catalog document.

    Raises:
        InputError: wrong version or malformed entries.
    """
    if not isinstance(doc, Mapping) or doc.get("version") != CATALOG_VERSION:
        raise InputError(source, 0, "version", f"expected a catalog of version {CATALOG_VERSION}")
    models = doc.get("models")
    if not isinstance(models, Mapping) or not models:
        raise InputError(source, 0, "models", "the catalog has no models")
    return {name: CatalogApplication(name, entry, source) for name, entry in sorted(models.items())}


def load_catalog(path: str | Path | None = None) -> dict[str, CatalogApplication]:
    """Load a catalog file; by default the one shipped in the package.

    Raises:
        InputError: the file is missing, not JSON, or malformed.
    """
    if path is None:
        ref = resources.files("deepboot.perf").joinpath("catalog.json")
        source = "deepboot/perf/catalog.json"
        try:
            text = ref.read_text(encoding="utf-8")
        except OSError as e:
            raise InputError(source, 0, "", f"the shipped catalog is missing: {e}") from e
    else:
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise InputError(source, 0, "", f"cannot read the catalog: {e}") from e
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(source, e.lineno, "", f"not valid JSON: {e.msg}") from e
    return parse_catalog(doc, source)
