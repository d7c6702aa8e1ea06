"""The runtime's SLO guard under bursts (issue 45): a lull, then one-second bursts
well above the mean rate. The guard measures the burstiness of the requests it
routes (the ledger both worlds feed), sizes the service by Hayward's approximation
(more replicas than Erlang B gives for the same mean rate), and holds that count
loaded, lending none of it to the job that wants every GPU: all polled in
``status``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from deepboot.policies.forecast import replicas_for  # noqa: E402
from tests.runtime.cluster_helpers import cli, job, local_cluster, status, wait_for  # noqa: E402
from tests.runtime.serving_helpers import (  # noqa: E402
    Load,
    gated_job,
    open_gate,
    rate_profile,
    service_file,
)

pytestmark = pytest.mark.runtime

CLUSTER = (
    "--training-nodes", "1", "--inference-nodes", "1", "--gpus-per-node", "4",
    "--protect-factor", "0.1", "--slo",
    # Rounds (and the forecast's bins) of 10 s, not the tests' 2 s: burstiness is
    # the spread of one-second counts within a bin, and a 2-s bin holds two seconds.
    "--interval", "10",
)  # fmt: skip
DELAY_S = 0.2
MAX_REPLICAS = 4
TARGET = 0.9
LULL_END = 20
BURSTS_END = 110


def _profile() -> list[tuple[float, float]]:
    """0.2/s for 20 s, then a second at 12/s every 5 s (a mean of ~2.6/s, bursts 4.6x
    it: a dispersion of one-second counts of ~4-6, as a burst falls in one second or
    two), then nothing."""
    rows: list[tuple[float, float]] = [(0, 0.2)]
    for t in range(LULL_END, BURSTS_END, 5):
        rows += [(t, 12.0), (t + 1, 0.2)]
    return [*rows, (BURSTS_END, 0)]


def _service(sv: list[dict[str, Any]]) -> dict[str, Any]:
    [found] = [s for s in sv if s["name"] == "bursty"]
    return found


def _loaded(doc: dict[str, Any]) -> int:
    """The service's replicas loaded (serving, protected or idle-held)."""
    return sum(
        1 for r in _service(doc["services"])["replicas"]
        if r["state"] in ("running", "protect", "sleep")
    )  # fmt: skip


def test_the_guard_holds_the_burst_sized_replica_count(tmp_path: Path) -> None:
    with local_cluster(tmp_path / "state", *CLUSTER) as state:
        # A declared cold start above the SLO's wait: the pre-warm regime, where the
        # guard holds replicas loaded (the echo handler itself loads in ~1-3 s, and
        # a load may take 3x the declared cold start before it counts as failed).
        extra = ("slo_wait_s = 1.0", f"slo_target = {TARGET}", "cold_start_s = 20.0")
        cli(state, "serve", str(service_file(tmp_path, "bursty", DELAY_S, MAX_REPLICAS, extra)))
        gate = tmp_path / "gate"
        gate.write_text("1000000000")  # open only once the bursts are over
        cli(state, "submit", str(gated_job(tmp_path, "train", gate, 8)))
        wait_for("the job running", lambda: job(state, "train")["state"] == "running", 300)
        load = Load(state, "bursty", rate_profile(tmp_path, "p", _profile()), tmp_path / "r.csv")

        def burst_sized() -> dict[str, Any] | None:
            d = _service(status(state)["services"])["demand"]
            return d if d and d["peakedness"] > 1.5 else None

        demand = wait_for("the bursts measured", burst_sized, 150)
        # Hayward asks for more than Erlang B at the same forecast, and it is held.
        poisson = replicas_for(demand["forecast_rps"] * DELAY_S, TARGET, 1)
        assert demand["sized"] > poisson, demand
        held = min(demand["sized"], MAX_REPLICAS)
        doc = wait_for("the burst-sized replicas loaded", lambda: (
            d if _loaded(d := status(state)) >= held else None), 120)  # fmt: skip
        assert _loaded(doc) >= held
        # The replicas held are kept from the job, which wants every GPU.
        train = next(j for j in doc["jobs"] if j["name"] == "train")
        assert len(train["lent_gpus"]) <= 4 - held, train
        text = cli(state, "status").stdout
        assert "demand (the SLO guard's reading): bursty: forecast" in text
        rows = load.rows()
        answered = sum(r["status"] == "200" for r in rows)
        assert rows and answered >= 0.9 * len(rows), (answered, len(rows))
        open_gate(state, "train", gate)
