"""Write ``examples/demo-deepboot.csv``, the workload of ``make demo``.

A small DeepBoot-format workload (``name,time,application,num_replicas,batch_size,
duration,num_task``) generated from a fixed seed by this script alone, so that it is
reproducible and needs no reference trace:

* training jobs of the built-in catalog's models, submitted at random over the first
  hours, each with one of the user configurations (``num_replicas``, ``batch_size``)
  that deepboot's Philly generator uses (:mod:`deepboot.sim.philly`);
* inference tasks (``application`` = ``infer-<model>-1``) of a few services whose
  arrival rate follows one day of traffic, compressed: a quiet night in which the
  inference pool's GPUs idle and can be lent to training, a morning and an evening
  burst that need most of the pool back, and a calmer afternoon in between.

Usage, from the repository root::

    .venv/bin/python examples/make_demo_workload.py   # rewrites examples/demo-deepboot.csv
    .venv/bin/python examples/make_demo_workload.py --out w.csv

``tests/test_demo_workload.py`` checks that the shipped file is exactly this script's
output. Only ``Generator.random``, ``Generator.integers`` and basic arithmetic are
used (no maths library functions, whose rounding may differ between platforms), so the
output is the same on every machine as long as NumPy keeps its PCG64 streams.
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from deepboot.sim.philly import BERT, CIFAR10, DEEPSPEECH2, NCF, JobConfig
from deepboot.sim.workload import DEEPBOOT_COLUMNS

SEED = 1
"""Seed of the one random generator; change it only together with the shipped file."""

DEFAULT_OUT = Path(__file__).resolve().parent / "demo-deepboot.csv"

# -- training ------------------------------------------------------------------------

TRAINING_JOBS = 32
TRAINING_WINDOW_S = 3 * 3600
"""Training jobs are submitted uniformly at random in [0, TRAINING_WINDOW_S)."""

TRAINING_MIX: tuple[tuple[str, int, tuple[JobConfig, ...]], ...] = (
    # (model, weight, configurations). A few minutes (ncf) to an hour (bert,
    # deepspeech2) on 8 GPUs of the built-in catalog. yolov3 and imagenet are left
    # out: one such job runs for hours (yolov3) or a day (imagenet) and would be the
    # whole demo.
    ("ncf", 30, NCF),
    ("cifar10", 40, CIFAR10),
    ("deepspeech2", 10, DEEPSPEECH2),
    ("bert", 10, BERT),
)

# -- inference -----------------------------------------------------------------------

DAY_S = 3 * 3600
"""Simulated seconds of one compressed day of inference traffic."""
INFERENCE_DAYS = 2
"""Days of inference traffic: 6 hours, longer than the demo's makespan (``make demo``:
4.4 h under deepboot, 5.7 h under the training-pool-only baseline)."""

HOURLY_LOAD: tuple[int, ...] = (
    # Load of each hour of the day, in percent of the peak: a silent night (the
    # whole inference pool can be lent), a morning burst, a calmer afternoon, an
    # evening burst.
    0, 0, 0, 0, 0, 0, 5, 30, 80, 100, 60, 20,
    15, 20, 15, 10, 15, 40, 90, 100, 50, 10, 0, 0,
)  # fmt: skip

SERVICES: tuple[tuple[str, int], ...] = (
    # (model, peak arrivals per 1,000 seconds): service 1 of each model. At the peak
    # about 5 of the inference pool's 8 GPUs serve tasks, more hold warm replicas.
    ("bert", 200),
    ("ncf", 300),
    ("yolov3", 200),
    ("cifar10", 250),
)
TASK_DURATION_S = (1, 9)
"""A task holds one GPU for a whole number of seconds in this range (as DeepBoot's)."""
TASK_REQUESTS = (100, 5000)
"""Request count of a task (informational), uniform in this range."""


Row = tuple[str, int, str, int, int, str, int]


def _weighted(rng: np.random.Generator, weights: Sequence[int]) -> int:
    """Index drawn with the given integer weights."""
    x = int(rng.integers(sum(weights)))
    for i, w in enumerate(weights):
        if x < w:
            return i
        x -= w
    raise AssertionError("unreachable")


def training_rows(rng: np.random.Generator) -> list[Row]:
    """The training jobs, sorted by submit time, named ``<model>-<index>``."""
    times = sorted(int(t) for t in rng.integers(TRAINING_WINDOW_S, size=TRAINING_JOBS))
    rows: list[Row] = []
    for i, t in enumerate(times):
        model, _, configs = TRAINING_MIX[_weighted(rng, [w for _, w, _ in TRAINING_MIX])]
        conf = configs[int(rng.integers(len(configs)))]
        rows.append((f"{model}-{i}", t, model, conf.num_replicas, conf.batch_size, "-1", -1))
    return rows


def load_percent(t: int) -> int:
    """Inference load at second ``t``, in percent of the peak.

    :data:`HOURLY_LOAD` interpolated linearly within each hour (integer arithmetic).
    """
    hour_s = DAY_S // 24
    s = t % DAY_S
    h, into = divmod(s, hour_s)
    a, b = HOURLY_LOAD[h], HOURLY_LOAD[(h + 1) % 24]
    return (a * (hour_s - into) + b * into) // hour_s


def inference_rows(rng: np.random.Generator) -> list[Row]:
    """The inference tasks, sorted by submit time, named ``inference-<model>-<index>``.

    Each second, each service gets a task with probability
    ``peak / 1000 * load_percent(t) / 100``.
    """
    rows: list[Row] = []
    horizon = DAY_S * INFERENCE_DAYS
    draws = rng.random((horizon, len(SERVICES)))
    index = 0
    for t in range(horizon):
        level = load_percent(t)
        for j, (model, peak) in enumerate(SERVICES):
            if draws[t, j] * 100_000 < peak * level:
                duration = int(rng.integers(TASK_DURATION_S[0], TASK_DURATION_S[1] + 1))
                requests = int(rng.integers(TASK_REQUESTS[0], TASK_REQUESTS[1] + 1))
                rows.append(
                    (
                        f"inference-{model}-{index}",
                        t,
                        f"infer-{model}-1",
                        1,
                        1,
                        f"{duration}.0",
                        requests,
                    )
                )
                index += 1
    return rows


def demo_rows(seed: int | None = None) -> list[Row]:
    """Every row of the demo workload, sorted by submit time (training first on ties).

    Args:
        seed: Seed of the random generator; None means :data:`SEED`.
    """
    rng = np.random.default_rng(SEED if seed is None else seed)
    training = training_rows(rng)
    inference = inference_rows(rng)
    return sorted(training + inference, key=lambda r: r[1])


def write_demo_workload(path: str | Path, seed: int | None = None) -> Path:
    """Write the demo workload to ``path`` (DeepBoot CSV, ``\\n`` line ends)."""
    out = Path(path)
    with out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(DEEPBOOT_COLUMNS)
        writer.writerows(demo_rows(seed))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output CSV file")
    args = parser.parse_args(argv)
    path = write_demo_workload(args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
