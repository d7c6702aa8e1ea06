"""Conditioning of the throughput fit: how far nearby data move the fitted model.

Builds measurement sets the way a job collects them (a few placements and per-GPU
batches of one model, step and sync times from the measured profiles), perturbs every
time by a relative amount eps (uniform in [-eps, eps]), refits, and reports how much
the fitted parameters and the predicted step times spread over the perturbations (and
in how many sets that exceeds 10%), and how well each fit matches its own data (the
fit error: the RMS log error of the fitted step times at the set's points):

* eps = 1e-12 stands for last-bit differences (another SIMD or BLAS kernel);
* eps = 1e-3 stands for measurement noise.

For each set: the parameter spread is max over the 7 parameters of (max / min - 1)
over the perturbed fits; the prediction spread is the 99th percentile, over a grid of
placements (1 to 64 GPUs, 1 to 16 nodes, three per-GPU batches), of
(max / min - 1) of the predicted step time. The table gives the median and the worst
set, for the current fit and, side by side in the same run, for the fit of an earlier
commit (``--reference-rev``, default: the commit before the well-conditioned fit).

    .venv/bin/python bench/fit_spread.py
    .venv/bin/python bench/fit_spread.py --sets 5 --draws 10      # quicker
"""

# ruff: noqa: E402  (BLAS threads must be limited before numpy is imported)
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
DEFAULT_REFERENCE = "bc69965"  # main before issue 7: L-BFGS-B fit (scipy)
SHAPES: tuple[tuple[int, ...], ...] = (
    (1,),
    (2,),
    (4,),
    (1, 1),
    (3,),
    (2, 2),
    (4, 2),
    (4, 4),
    (4, 4, 4, 4),
    (4, 4, 4, 4, 4, 4, 4, 4),
)
GRID_NK = ((1, 1), (1, 2), (1, 4), (2, 4), (2, 8), (4, 16), (8, 32), (16, 64))

FitFn = Callable[..., Any]


def load_reference_fit(rev: str) -> FitFn:
    """``fit_perf_params`` of ``deepboot/perf/fit.py`` at commit ``rev``."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{rev}:deepboot/perf/fit.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "reference_fit.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("reference_fit", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fit: FitFn = module.fit_perf_params
    return fit


def measurement_sets(
    profiles: str, sets: int, rng: np.random.Generator
) -> list[tuple[str, tuple[np.ndarray, ...], tuple[int, int]]]:
    """(model, (nodes, replicas, bsz, compute, step), (min, max local batch)) per set."""
    from deepboot.perf.profiles import load_profiles

    apps = load_profiles(profiles)
    out = []
    for name in sorted(apps):
        app = apps[name]
        lim = app.limits
        lo, hi = lim.min_local_bsz, lim.max_local_bsz
        batches = sorted({int(b) for b in np.linspace(lo, hi, 5).round()})
        for size in (3, 6, 12, 24):
            for _ in range(sets):
                configs = [(s, b) for s in SHAPES for b in batches]
                pick = rng.choice(len(configs), size=min(size, len(configs)), replace=False)
                rows = []
                for i in sorted(pick):
                    shape, bsz = configs[i]
                    step, sync = app.step_time(shape, bsz)
                    rows.append((len(shape), sum(shape), bsz, step - sync, step))
                arr = np.array(rows, dtype=np.float64)
                cols = (
                    arr[:, 0].astype(np.int64),
                    arr[:, 1].astype(np.int64),
                    arr[:, 2],
                    arr[:, 3],
                    arr[:, 4],
                )
                out.append((name, cols, (lo, hi)))
    return out


def spreads(
    fit: FitFn,
    cols: tuple[np.ndarray, ...],
    limits: tuple[int, int],
    eps: float,
    draws: int,
    rng: np.random.Generator,
) -> tuple[float, float, float, float]:
    """(parameter spread, p99 prediction spread, seconds per fit, RMS log error of the
    fitted step times at the set's own points) of one set."""
    from deepboot.perf.goodput import step_time

    n, k, m, comp, step = cols
    lo, hi = limits
    grid = [(gn, gk, b) for gn, gk in GRID_NK for b in (lo, (lo + hi) / 2, hi)]
    gn = np.array([g[0] for g in grid])
    gk = np.array([g[1] for g in grid])
    gm = np.array([g[2] for g in grid], dtype=np.float64)
    params, preds, errors = [], [], []
    started = time.perf_counter()
    for _ in range(draws):
        u = rng.uniform(-eps, eps, size=(2, comp.size))
        p = fit(n, k, m, comp * (1 + u[0]), step * (1 + u[1]))
        params.append([p.alpha_c, p.beta_c, p.alpha_n, p.beta_n, p.alpha_r, p.beta_r, p.gamma])
        preds.append(step_time(p, gn, gk, gm))
        errors.append(float(np.sqrt(np.mean(np.log(step_time(p, n, k, m) / step) ** 2))))
    per_fit = (time.perf_counter() - started) / draws
    par = np.array(params)
    pre = np.array(preds)
    par_spread = float(np.max(par.max(axis=0) / par.min(axis=0) - 1))
    pred_spread = float(np.percentile(pre.max(axis=0) / pre.min(axis=0) - 1, 99))
    return par_spread, pred_spread, per_fit, float(np.median(errors))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--profiles", default=str(TRACES / "profiles"))
    ap.add_argument("--sets", type=int, default=10, help="sets per model and size (default 10)")
    ap.add_argument("--draws", type=int, default=20, help="perturbations per set (default 20)")
    ap.add_argument("--reference-rev", default=DEFAULT_REFERENCE)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not Path(args.profiles).is_dir():
        print(f"fit_spread: no profiles at {args.profiles}", file=sys.stderr)
        return 2

    from deepboot.perf.fit import fit_perf_params

    fits: dict[str, FitFn] = {
        f"before ({args.reference_rev})": load_reference_fit(args.reference_rev),
        "after (this tree)": fit_perf_params,
    }
    sets = measurement_sets(args.profiles, args.sets, np.random.default_rng(args.seed))
    table = Table(title=f"Fit spread over {len(sets)} measurement sets, {args.draws} draws each")
    for col in ("eps", "fit", "param spread median", "param spread max"):
        table.add_column(col, justify="right")
    for col in ("pred p99 spread median", "pred p99 spread max", "sets > 10%"):
        table.add_column(col, justify="right")
    for col in ("fit error median", "ms / fit"):
        table.add_column(col, justify="right")
    for eps in (1e-12, 1e-3):
        for label, fit in fits.items():
            # The same perturbations for both fits: one generator per (eps, set).
            rows = [
                spreads(fit, cols, lim, eps, args.draws, np.random.default_rng([args.seed, i]))
                for i, (_, cols, lim) in enumerate(sets)
            ]
            arr = np.array(rows)
            table.add_row(
                f"{eps:g}",
                label,
                f"{np.median(arr[:, 0]):.2e}",
                f"{np.max(arr[:, 0]):.2e}",
                f"{np.median(arr[:, 1]):.2e}",
                f"{np.max(arr[:, 1]):.2e}",
                str(int(np.sum(arr[:, 1] > 0.1))),
                f"{np.median(arr[:, 3]):.2%}",
                f"{1e3 * np.median(arr[:, 2]):.2f}",
            )
    Console(width=200).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
