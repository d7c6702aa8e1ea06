"""``examples/azure-70b.csv`` and its services file ``examples/azure-70b.toml`` (issue 47
item 4): a 70B-class model whose replica spans 4 GPUs of one node.

The shipped pair must load with its services file, simulate under ``deepboot simulate
--services`` (its replicas taking 4 GPUs of one node), credit its source, state its
cost model, stay small, and be exactly what the commands recorded in the services
file's header write (checked when ``../shared/traces`` is present).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli
from test_genai_day_example import GENERATED_FROM as GENAI_FROM
from test_genai_day_example import recorded_commands as genai_commands

import deepboot

REPO = Path(__file__).resolve().parents[1]
CSV = REPO / "examples" / "azure-70b.csv"
TOML = REPO / "examples" / "azure-70b.toml"
SHARED = REPO.parent / "shared"
GENERATED_FROM = "\n# Services of azure-70b.csv, written by 'deepboot workload compose'."


def recorded_commands(text: str) -> list[list[str]]:
    """The ``deepboot`` commands of the header, read as genai-day's are."""
    return genai_commands(split(text)[0] + GENAI_FROM)


def split(text: str) -> tuple[str, str]:
    """(the hand-written header, what ``compose`` wrote) of the services file."""
    at = text.index(GENERATED_FROM) + 1
    return text[:at], text[at:]


def test_example_is_small_and_states_its_source_and_cost_model() -> None:
    assert CSV.stat().st_size < 1_000_000
    header, _ = split(TOML.read_text(encoding="utf-8"))
    for words in ("CC-BY-4.0", "Azure LLM inference trace 2023", "gpus_per_replica = 4",
                  "140 GB", "0.030 s x generated tokens", "Cold start 90 s",
                  "deepboot workload from-azure-llm", "deepboot workload compose"):  # fmt: skip
        assert words in header, words
    commands = recorded_commands(TOML.read_text(encoding="utf-8"))
    assert [c[:2] for c in commands] == [["workload", "from-azure-llm"], ["workload", "compose"]]


def test_example_loads_with_its_services() -> None:
    workload = deepboot.load_workload(CSV, services=TOML)
    assert len(workload.training) == 160
    assert len(workload.inference) == 15_030
    (spec,) = workload.services
    assert (spec.name, spec.gpus_per_replica, spec.model_gb, spec.concurrency) == (
        "llama-70b", 4, 140.0, 8,
    )  # fmt: skip
    assert spec.cold_start_s == 90.0


def test_example_simulates_guarded_with_a_host_cache_of_its_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The first hour, each replica on 4 GPUs of one node (the ledger's invariants
    # checked by the tests under tests/sim); the 140 GB model fits a 160 GB cache.
    summary = tmp_path / "s.json"
    argv = ["simulate", "--workload", str(CSV), "--services", str(TOML), "--policy",
            "guarded", "--host-cache-gb", "160", "--cluster", "16x4", "--inference-nodes",
            "8", "--max-time", "3600", "-q", "--summary-json", str(summary)]  # fmt: skip
    code, _, err = run_cli(capsys, *argv)
    assert code == 0, err
    data = json.loads(summary.read_text(encoding="utf-8"))
    assert data["inference"]["completed"] > 1000
    assert data["cluster"]["lent_gpu_s"] > 0
    assert data["inference"]["cold_starts"] > 0


@pytest.mark.skipif(not (SHARED / "traces").is_dir(), reason="needs ../shared/traces")
def test_recorded_commands_regenerate_the_same_bytes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "checkout"
    (root / "examples").mkdir(parents=True)
    (tmp_path / "shared").symlink_to(SHARED, target_is_directory=True)
    monkeypatch.chdir(root)
    text = TOML.read_text(encoding="utf-8")
    for argv in recorded_commands(text):
        code, _, err = run_cli(capsys, *argv)
        assert code == 0, (argv, err)
    assert (root / "examples" / "azure-70b.csv").read_bytes() == CSV.read_bytes()
    generated = (root / "examples" / "azure-70b.toml").read_text(encoding="utf-8")
    assert generated == split(text)[1]
