"""The GPU check's report: what ``make test-gpu`` found (each test passed, failed or
skipped, with the reason) and the figures its tests recorded, from its JUnit XML,
with the reclaim benchmark's table when it ran, as Markdown and JSON.

    python bench/gpu_report.py --junit out/gpu-check/junit.xml --out out/gpu-check \\
        [--machine "..."] [--reclaim out/gpu-check/reclaim.txt]

``bench/gpu_check.sh`` runs it last; the Markdown goes into docs/runtime.md "GPU
paths" as it is.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

FIGURES = {
    "h2d_pageable_gbps": ("host-to-GPU copy, pageable (the cache's shared memory)", "GB/s"),
    "h2d_pinned_gbps": ("host-to-GPU copy, pinned", "GB/s"),
    "sim_host_gbps": ("the simulator's --host-gbps default", "GB/s"),
    "model_gb": ("the test model", "GB"),
    "cold_copy_s": ("cold start: the model's copy onto the GPU", "s"),
    "restore_copy_s": ("host start: the model's copy from the cache", "s"),
    "host_start_load_s": ("host start: the replica's whole load (ready's load_seconds)", "s"),
    "sim_host_start_s": ("the simulator's host start for that model (init + GB / GB/s)", "s"),
    "nccl_shrink_pause_s": ("AFE shrink under NCCL: offer to the group re-formed", "s"),
    "nccl_grow_pause_s": ("AFE growth under NCCL: offer to the group re-formed", "s"),
    "torchrun_restart_pause_s": ("torchrun script's restart resize under NCCL", "s"),
    "server_awake_gb": ("sleeping-server test: the server awake", "GB"),
    "server_asleep_gb": ("sleeping-server test: kept asleep (sleep_gpu_gb)", "GB"),
    "wake_out_of_memory_first_try": (
        "sleeping-server test: wakes out of memory at the first try (then retried)",
        "",
    ),
}
"""Every figure a GPU test records, in the report's order: what it is, its unit."""

STOPPED = "(the check)"
"""The one outcome of a check that stopped before its tests (``--failed-before``)."""


@dataclass
class Outcome:
    """One test: ``passed``, ``failed``, ``error`` or ``skipped``, why (a skip's
    reason, a failure's first line), its seconds and the figures it recorded."""

    test: str
    outcome: str
    why: str = ""
    seconds: float = 0.0
    figures: dict[str, float | None] = field(default_factory=dict)


def read_junit(path: Path) -> list[Outcome]:
    """The tests of a pytest JUnit XML file (``--junitxml``).

    Raises:
        ValueError: the file is not JUnit XML (names it).
    """
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as exc:
        raise ValueError(f"{path}: not a readable JUnit XML file ({exc})") from None
    outcomes = []
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        seconds = float(case.get("time", "0") or 0)
        figures: dict[str, float | None] = {}
        for prop in case.iter("property"):
            raw = prop.get("value", "")
            try:
                figures[prop.get("name", "?")] = float(raw)
            except ValueError:
                figures[prop.get("name", "?")] = None
        outcome, why = "passed", ""
        for tag in ("skipped", "failure", "error"):
            node = case.find(tag)
            if node is not None:
                outcome = {"skipped": "skipped", "failure": "failed", "error": "error"}[tag]
                why = (node.get("message") or node.text or "").strip().splitlines()[0:1]
                why = why[0] if why else ""
                break
        if outcome == "skipped" and why.startswith("Skipped: "):
            why = why[len("Skipped: ") :]
        outcomes.append(Outcome(name, outcome, why, seconds, figures))
    return outcomes


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def render(outcomes: list[Outcome], machine: str, commit: str, when: str, reclaim: str) -> str:
    """The report as Markdown."""
    counts = {k: sum(o.outcome == k for o in outcomes) for k in ("passed", "failed", "error",
                                                                  "skipped")}  # fmt: skip
    ran = counts["passed"] + counts["failed"] + counts["error"]
    lines = [f"GPU check of {commit}, {when}, on {machine}.", ""]
    if [o.test for o in outcomes] == [STOPPED]:
        lines.append(f"**The check stopped before the GPU tests**: {outcomes[0].why}.")
        return "\n".join(lines) + "\n"
    lines.append(
        f"{counts['passed']} passed, {counts['failed'] + counts['error']} failed, "
        f"{counts['skipped']} skipped of {len(outcomes)} GPU tests."
    )
    if ran == 0:
        lines += ["", "**No GPU test ran here**: the GPU paths are still unverified by this "
                  "check (each skip says why)."]  # fmt: skip
    elif counts["passed"] == 0:
        lines += ["", "**No GPU test passed here.**"]
    lines += ["", "| test | outcome | seconds | why |", "|---|---|---:|---|"]
    for o in outcomes:
        lines.append(f"| `{o.test}` | {o.outcome} | {o.seconds:.1f} | {o.why} |")
    recorded = {k: v for o in outcomes for k, v in o.figures.items()}
    if recorded:
        lines += ["", "| figure | value | unit |", "|---|---:|---|"]
        for key, (what, unit) in FIGURES.items():
            if key in recorded:
                value = recorded[key]
                lines.append(f"| {what} | {'n/a' if value is None else f'{value:.3g}'} | {unit} |")
        for key in sorted(set(recorded) - set(FIGURES)):
            lines.append(f"| {key} | {recorded[key]} | |")
    lines += ["", "Reclaim benchmark (`bench/reclaim.py`):", ""]
    lines += [reclaim.strip() or "not run"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--junit", type=Path, required=True, help="make test-gpu's JUnit XML")
    ap.add_argument("--out", type=Path, required=True, help="directory for report.md/.json")
    ap.add_argument("--machine", default="", help="the machine, in words (default: its GPUs)")
    ap.add_argument("--reclaim", type=Path, help="the reclaim benchmark's output, or why not")
    ap.add_argument(
        "--expect-gpus",
        action="store_true",
        help="the machine has GPUs (nvidia-smi lists them): a check where no GPU test ran "
        "failed (a CPU build of torch, a driver too old for it)",
    )
    ap.add_argument(
        "--failed-before",
        default="",
        metavar="WHY",
        help="the check stopped before the tests (an install that failed): report why",
    )
    args = ap.parse_args(argv)
    if args.failed_before:
        outcomes = [Outcome(STOPPED, "error", args.failed_before)]
    else:
        try:
            outcomes = read_junit(args.junit)
        except ValueError as exc:
            print(f"gpu_report: {exc}", file=sys.stderr)
            return 2
    machine = args.machine or "an unnamed machine"
    reclaim = args.reclaim.read_text() if args.reclaim and args.reclaim.exists() else ""
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    commit = _commit()
    text = render(outcomes, machine, commit, when, reclaim)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text(text)
    doc = {"machine": machine, "commit": commit, "when": when,
           "tests": [asdict(o) for o in outcomes], "reclaim": reclaim}  # fmt: skip
    (args.out / "report.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(text)
    failed = any(o.outcome in ("failed", "error") for o in outcomes)
    if args.expect_gpus and not any(o.outcome == "passed" for o in outcomes):
        print("gpu_report: this machine has GPUs, and no GPU test passed", file=sys.stderr)
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
