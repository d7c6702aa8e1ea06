"""``examples/genai-day.csv`` and its services file ``examples/genai-day.toml`` (issue 19).

The shipped pair must load with its services file, simulate under ``deepboot simulate
--services``, credit its source, stay small, and be exactly what the commands recorded
in the services file's header write (checked when ``../shared/traces`` is present), so
that it can never drift from the loaders.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from cli_helpers import run_cli

import deepboot

REPO = Path(__file__).resolve().parents[1]
CSV = REPO / "examples" / "genai-day.csv"
TOML = REPO / "examples" / "genai-day.toml"
SHARED = REPO.parent / "shared"
GENERATED_FROM = "\n# Services of genai-day.csv, written by 'deepboot workload compose'."
"""The start of what ``deepboot workload compose`` writes (from its first line on);
the lines above it are the hand-written header that records the commands."""


def split(text: str) -> tuple[str, str]:
    """(the hand-written header, what ``compose`` wrote) of the services file."""
    at = text.index(GENERATED_FROM) + 1
    return text[:at], text[at:]


def recorded_commands(text: str) -> list[list[str]]:
    """The ``deepboot`` commands of the header (``#   deepboot ...`` lines, with their
    ``\\`` continuations), as argument lists without the program name."""
    header, _ = split(text)
    commands: list[str] = []
    continued = False
    for line in header.splitlines():
        body = line.removeprefix("#").strip()
        if continued:
            commands[-1] += " " + body.removesuffix("\\")
        elif line.startswith("#   deepboot "):
            commands.append(body.removesuffix("\\"))
        continued = line.startswith("#  ") and body.endswith("\\")
    return [shlex.split(c)[1:] for c in commands]


def test_example_is_small_and_credits_its_source() -> None:
    assert CSV.stat().st_size < 1_000_000
    text = TOML.read_text(encoding="utf-8")
    header, _ = split(text)
    for words in ("CC-BY-4.0", "cluster-trace-v2026-GenAI", "peak busy fraction of 0.5",
                  "deepboot workload from-genai", "deepboot workload compose"):  # fmt: skip
        assert words in header, words
    assert [c[:2] for c in recorded_commands(text)] == [
        ["workload", "from-genai"],
        ["workload", "compose"],
    ]


def test_example_loads_with_its_services() -> None:
    workload = deepboot.load_workload(CSV, services=TOML)
    assert len(workload.training) == 160
    assert len(workload.inference) == 3921
    names = {t.service for t in workload.inference}
    assert {"other", "M0002"} <= names
    assert all(t.duration > 0 for t in workload.inference)
    # The busiest day compressed to 8 hours, aligned with the first training job.
    first = min(j.submit_time for j in workload.training)
    span = max(t.submit_time for t in workload.inference) - first
    assert 7.5 * 3600 < span < 8.5 * 3600


def test_example_simulates_with_its_services(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    summary = tmp_path / "s.json"
    code, _, err = run_cli(
        capsys, "simulate", "--workload", str(CSV), "--services", str(TOML),
        "--policy", "deepboot", "--cluster", "16x4", "--inference-nodes", "8",
        "--max-time", "1800", "-q", "--summary-json", str(summary),
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(summary.read_text(encoding="utf-8"))
    assert data["inference"]["completed"] > 0
    assert data["inference"]["cold_starts"] > 0
    assert data["cluster"]["lent_gpu_s"] > 0


@pytest.mark.skipif(not (SHARED / "traces").is_dir(), reason="needs ../shared/traces")
def test_recorded_commands_regenerate_the_same_bytes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A checkout of our own beside ../shared, so that the commands' relative paths (and
    # the paths the services file records) are those of the repository root.
    root = tmp_path / "checkout"
    (root / "examples").mkdir(parents=True)
    (tmp_path / "shared").symlink_to(SHARED, target_is_directory=True)
    monkeypatch.chdir(root)
    text = TOML.read_text(encoding="utf-8")
    for argv in recorded_commands(text):
        code, _, err = run_cli(capsys, *argv)
        assert code == 0, (argv, err)
    assert (root / "examples" / "genai-day.csv").read_bytes() == CSV.read_bytes()
    generated = (root / "examples" / "genai-day.toml").read_text(encoding="utf-8")
    assert generated == split(text)[1]
