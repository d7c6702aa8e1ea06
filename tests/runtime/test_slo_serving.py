"""SLO attainment measured at the router, end to end: a real local Ray cluster (1
training and 1 inference node x 1 logical GPU), a real replica, the real controller
process. Every answer carries ``X-Wait-Ms``; the scraped Prometheus SLO counters equal
``deepboot status --json``'s counts, and, after ``deepboot down``, the event log's last
``slo`` record. No assertion reads a wall-clock figure: which requests were within the
SLO depends on the machine, their sum and the agreement between the three do not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
from tests.runtime.serving_helpers import ECHO, post_with_headers, scrape  # noqa: E402

pytestmark = pytest.mark.runtime

REQUESTS = 4


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Path]:
    with local_cluster(tmp_path / "state", *ONE_AND_ONE, "--protect-factor", "0.05") as state:
        yield state


def _service(directory: Path) -> Path:
    path = directory / "timed.toml"
    lines = [
        'name = "timed"',
        'model = "tiny-mlp"',
        f'handler = "{ECHO}:load"',
        "request_timeout_s = 120",
        "slo_wait_s = 0.5",
        "[args]",
        "delay_s = 0.05",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _scraped(state: Path) -> tuple[int, int]:
    """``timed``'s within/over counters as ``/metrics`` shows them."""
    names = {
        "deepboot_requests_within_slo_total": "within",
        "deepboot_requests_over_slo_total": "over",
    }
    counts = scrape(state, "timed", names)
    return counts["within"], counts["over"]


def _status_counts(state: Path) -> dict[str, Any]:
    slo: dict[str, Any] = next(s for s in status(state)["services"] if s["name"] == "timed")["slo"]
    return slo


def test_wait_header_and_slo_counts_agree(cluster: Path, tmp_path: Path) -> None:
    cli(cluster, "serve", str(_service(tmp_path)))
    for i in range(REQUESTS):  # the first waits for a cold start, the rest mostly not
        code, _, headers = post_with_headers(cluster, "timed", f"r{i}", {"x": [1.0]})
        assert code == 200
        assert float(headers["X-Wait-Ms"]) >= 0.0
    within, over = _scraped(cluster)
    assert within + over == REQUESTS

    def agreed() -> dict[str, Any] | None:
        slo = _status_counts(cluster)
        total = slo["total"]
        return slo if (total["within"], total["over"]) == (within, over) else None

    slo = wait_for("status --json to count every answer", agreed, 120)
    assert (slo["recent"]["within"], slo["recent"]["over"]) == (within, over)
    assert slo["total"]["attainment"] == pytest.approx(within / REQUESTS)
    assert slo["slo_wait_s"] == 0.5

    cli(cluster, "down")  # the controller writes its last counts as it stops
    records = [e.detail for e in events(cluster) if e.kind is LogKind.SLO]
    last = [d for d in records if d["service"] == "timed"][-1]
    assert (last["within"], last["over"]) == (within, over)
