"""Builders shared by the perf tests: parameters, limits and synthetic profile folders."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from deepboot.core.params import BatchLimits, GradParams, PerfParams
from deepboot.perf.goodput import GoodputModel

REPO_ROOT = Path(__file__).resolve().parents[2]
TRACES = REPO_ROOT.parent / "shared" / "traces"
PROFILES = TRACES / "profiles"


def make_perf(**overrides: float) -> PerfParams:
    """Round-number throughput parameters (seconds) for hand-computed expectations."""
    base = dict(
        alpha_c=0.1, beta_c=0.01, alpha_n=0.5, beta_n=0.1, alpha_r=0.2, beta_r=0.05, gamma=1.0
    )
    base.update(overrides)
    return PerfParams(**base)


def make_limits(
    init: int = 10, max_batch: int = 200, min_local: int = 2, max_local: int = 16
) -> BatchLimits:
    return BatchLimits(init, max_batch, min_local, max_local)


def make_model(
    perf: PerfParams | None = None,
    grad: GradParams | None = None,
    limits: BatchLimits | None = None,
) -> GoodputModel:
    return GoodputModel(
        perf or make_perf(), grad or GradParams(sqr=1.0, var=4.0), limits or make_limits()
    )


PLACEMENTS_CSV = """placement,local_bsz,step_time,sync_time
1,4,0.5,0.0
1,8,0.9,0.0
2,4,0.7,0.2
2,8,1.1,0.2
11,4,1.5,1.0
11,8,1.9,1.0
"""

SCALABILITY_CSV = """num_nodes,num_replicas,local_bsz,step_time,sync_time
3,3,4,2.5,2.0
3,3,8,2.9,2.0
3,6,4,3.5,3.0
3,6,8,3.9,3.0
"""


def validation_csv(rows: Sequence[tuple[float, float, float, float, float]]) -> str:
    lines = ["progress,iteration,metric,grad_sqr,grad_var"]
    lines += [",".join(repr(v) for v in row) for row in rows]
    return "\n".join(lines) + "\n"


VALIDATION = {
    8: validation_csv([(10.0, 10, 0.5, 2.0, 4.0), (20.0, 20, 0.6, 1.0, 8.0)]),
    16: validation_csv([(11.0, 6, 0.5, 4.0, 6.0), (21.0, 11, 0.6, 3.0, 12.0)]),
}


def write_profile(
    root: Path,
    name: str = "toy",
    placements: str = PLACEMENTS_CSV,
    scalability: str = SCALABILITY_CSV,
    validation: dict[int, str] | None = None,
) -> Path:
    """Write a small, valid profile folder ``root/name`` and return it."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "placements.csv").write_text(placements)
    (folder / "scalability.csv").write_text(scalability)
    for bsz, text in (VALIDATION if validation is None else validation).items():
        (folder / f"validation-{bsz}.csv").write_text(text)
    return folder


def _reordered(text: str, order: list[str], speedup: float) -> str:
    """``text`` (a CSV) with its columns in ``order`` and its times divided by
    ``speedup``."""
    lines = text.strip().splitlines()
    header = lines[0].split(",")
    out = [",".join(order)]
    for line in lines[1:]:
        row = dict(zip(header, line.split(","), strict=True))
        for name in ("step_time", "sync_time"):
            row[name] = repr(float(row[name]) / speedup)
        out.append(",".join(row[c] for c in order))
    return "\n".join(out) + "\n"


def write_typed_profiles(
    tmp_path: Path, validation: dict[int, str] | None = None
) -> tuple[Path, Path]:
    """A base profile folder (``toy``, the t4 type's) and a typed one beside it: type
    ``fast`` 2x and type ``a100`` (Sia's ``dgx-ext`` files) 4x faster, their columns
    in Sia's order. Returns (base root, typed root)."""
    base = tmp_path / "base"
    write_profile(base, validation=validation)
    typed = tmp_path / "typed" / "toy"
    typed.mkdir(parents=True)
    placement_order = ["local_bsz", "step_time", "sync_time", "placement"]
    scalability_order = ["local_bsz", "step_time", "sync_time", "num_nodes", "num_replicas"]
    for suffix, speedup in (("fast", 2.0), ("dgx-ext", 4.0)):
        (typed / f"placements-{suffix}.csv").write_text(
            _reordered(PLACEMENTS_CSV, placement_order, speedup)
        )
        (typed / f"scalability-{suffix}.csv").write_text(
            _reordered(SCALABILITY_CSV, scalability_order, speedup)
        )
    return base, tmp_path / "typed"
