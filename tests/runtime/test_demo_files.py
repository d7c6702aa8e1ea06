"""The files of ``make demo-runtime`` and the README's runtime quick start: they parse,
and they are set up to show lending (fast; no cluster)."""

from __future__ import annotations

import re
from pathlib import Path

from deepboot.runtime.client.jobspec import load_job
from deepboot.runtime.client.rateprofile import RateProfile
from deepboot.runtime.client.servicespec import load_service

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "runtime"
README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_job_can_use_more_gpus_than_the_demo_training_pool() -> None:
    job = load_job(EXAMPLES / "finetune.toml")
    # The demo's training pool: 1 node x 2 GPUs (examples/runtime/demo.py, README).
    assert job.max_workers > 2


def test_the_service_needs_a_replica_loaded_before_its_requests() -> None:
    spec = load_service(EXAMPLES / "chat.toml")
    load_s = float(spec.args["load_s"])
    assert spec.slo_wait_s < load_s  # the pre-warm regime: no cold start meets the SLO


def test_the_profile_has_a_lull_a_ramp_and_a_spike() -> None:
    rates = list(RateProfile.load(EXAMPLES / "lull-ramp-spike.csv").rates)
    top = rates.index(max(rates))
    assert min(rates[:top]) < 0.1 and min(rates[top:]) < 0.1  # a lull before and after
    assert sorted(rates[1:top]) == rates[1:top]  # a ramp up to the spike


def test_the_readme_quick_start_uses_the_demo_files() -> None:
    text = README.read_text()
    for name in ("chat.toml", "finetune.toml", "lull-ramp-spike.csv"):
        assert f"examples/runtime/{name}" in text
    assert re.search(r"deepboot up --training-nodes 1 --inference-nodes 1 --gpus-per-node 2", text)
