"""``deepboot up --slo`` end to end: a real local Ray cluster (1 training and 1
inference node x 1 logical GPU), the real controller process, a real replica. A
service with ``guaranteed_replicas = 1`` gets its replica pre-warmed by the SLO guard
before any request of it arrives (the event log's replica ``start`` with ``prewarm``);
once loaded it is protected (REPLICA_WARM), and the first request is served by it
with no other replica started. No assertion reads a wall-clock figure."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from deepboot.runtime.store.jobstore import LogKind  # noqa: E402
from tests.runtime.cluster_helpers import (  # noqa: E402
    ONE_AND_ONE,
    cli,
    events,
    local_cluster,
    status,
    wait_for,
)
from tests.runtime.serving_helpers import post, service_file  # noqa: E402

pytestmark = pytest.mark.runtime


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Path]:
    with local_cluster(tmp_path / "state", *ONE_AND_ONE, "--slo") as state:
        yield state


def _replica_log(state: Path) -> list[dict[str, object]]:
    return [e.detail for e in events(state) if e.kind is LogKind.REPLICA]


def test_a_guaranteed_replica_is_pre_warmed_before_any_request(
    cluster: Path, tmp_path: Path
) -> None:
    held = service_file(tmp_path, "held", 0.01, 0, extra=("guaranteed_replicas = 1",))
    cli(cluster, "serve", str(held))
    # No request yet: the guard of a tick starts the replica, with none.
    [start] = wait_for(
        "the pre-warm",
        lambda: [d for d in _replica_log(cluster) if d["op"] == "start"],
        timeout=180,
    )
    assert start["service"] == "held" and start["prewarm"] is True
    gpu = start["gpu"]
    # Loaded with no request: REPLICA_WARM protects it (held, never lent).
    wait_for(
        "the pre-warmed replica loaded and protected",
        lambda: any(
            g["gpu"] == gpu and g["state"] in ("protect", "sleep") for g in status(cluster)["gpus"]
        ),
        timeout=180,
    )
    code, body = post(cluster, "held", "r1", {"x": [1.0] * 8})
    assert code == 200 and body["replica"] == gpu
    log = _replica_log(cluster)
    assert [d["op"] for d in log if d["op"] in ("start", "ready")] == ["start", "ready"]
    assert not [e for e in events(cluster) if e.kind is LogKind.DECISION_REJECTED]
