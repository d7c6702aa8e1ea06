"""``deepboot up --slo`` keeps the SLO on real processes where reactive lending does
not (issue 24), on a real local cluster: a training pool of 1 node x 2 logical GPUs,
an inference pool of 1 x 2, the real controller, real replicas and a real gated
training job that can use 4 GPUs.

The service's replicas take 15-20 s to start (the echo handler's ``load_s`` plus
the replica process's own start) and its SLO is a 3 s wait: no cold start meets it,
only a replica loaded before its requests come does. Time runs about 30x faster
than on a real cluster (2 s rounds, protect times at a tenth, the forecast paced to
the rounds). The load (:data:`PROFILE`, evenly spaced requests of 0.1 s each):

* a warm-up (the first replica's cold start: the requests that wait for it are not
  counted);
* a lull of one request per 20 s, longer than a replica is protected: reactive
  lending lends its GPU away and the next request waits for a cold start, while the
  SLO guard holds it (its forecast is above zero) and lends the other GPU;
* a ramp from 2 to 11 requests/s over 42 s, which the forecast sees: it takes the
  lent GPU back ahead of demand (a proactive reclaim) and pre-warms a replica on it
  while one replica still serves the ramp alone; at its top, 11/s, requests come
  faster than one replica serves them (evenly spaced, 0.09 s apart) and about
  half go to the pre-warmed one;
* a spike of 14 requests/s, 70% of what the two replicas serve (the issue asks for
  at most half: at half, 10/s, the spike would not rise above the ramp's top),
  then a second lull, in which the forecast decays and the job borrows the second
  GPU again.

Asserted, with ``--slo``: at least 99% of the counted requests within the SLO, some
of the ramp's served by a pre-warmed replica (the answers say so), the job holding a
lent GPU during both lulls, a reclaim logged as proactive; the same run's scraped
counters equal to the event log's last ``slo`` record and to the load CSV's counts.
Reactive ``deepboot`` on the same profile, up to the spike's end, attains less
than the guard over the same requests. No assertion reads a
wall-clock figure: the windows are the profile's, each request's time its own
(``sent_at``), and every wait for a condition has a generous deadline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from deepboot.runtime.store.jobstore import EventRow, LogKind  # noqa: E402
from tests.runtime.cluster_helpers import (  # noqa: E402
    cli,
    events,
    job,
    local_cluster,
    wait_for,
)
from tests.runtime.serving_helpers import (  # noqa: E402
    ECHO,
    Load,
    gated_job,
    open_gate,
    rate_profile,
    scrape,
)

pytestmark = pytest.mark.runtime

CLUSTER = (
    "--training-nodes", "1", "--inference-nodes", "1", "--gpus-per-node", "2",
    "--protect-factor", "0.1",
)  # fmt: skip
SLO_WAIT_S = 3.0
LOAD_S = 12.0
"""The handler's artificial load; the replica process's start adds 3-8 s."""
PROFILE = [
    (0, 1),  # warm-up
    (10, 0.05),  # lull 1
    (50, 2), (58, 4), (66, 6), (74, 8), (82, 11),  # ramp
    (92, 14),  # spike
    (98, 4),
    (102, 0.05),  # lull 2
    (155, 0),
]  # fmt: skip
WARM_UP_END = 10.0
LULLS = ((10.0, 50.0), (102.0, 155.0))
RAMP = (50.0, 92.0)
SPIKE_END = 102.0
REACTIVE_PROFILE = [*(row for row in PROFILE if row[0] < SPIKE_END), (SPIKE_END, 0)]
"""The profile up to the spike's end: reactive lending's misses are the first lull's
cold start and the ramp's; the second lull asks nothing of it (53 s saved)."""


@dataclass
class Run:
    """What one scenario left: the load CSV's rows, the event log, the counters
    scraped at its end, the Unix time of the load's start."""

    rows: list[dict[str, str]]
    log: list[EventRow]
    scraped: dict[str, int]
    load_start: float

    def counted(self, until: float = float("inf")) -> list[dict[str, str]]:
        """The requests after the warm-up (and sent before ``until``)."""
        return [r for r in self.rows if WARM_UP_END <= float(r["send_s"]) < until]

    def attainment(self, until: float = float("inf")) -> float:
        rows = self.counted(until)
        return sum(1 for r in rows if _within(r)) / len(rows)

    def summary(self, name: str) -> str:
        """One line of figures (``pytest -s`` prints them; the closing notes quote it)."""
        reclaims = [
            e.detail for e in self.log if e.kind is LogKind.GPU and e.detail["op"] == "reclaim"
        ]
        ahead = sum(1 for d in reclaims if d.get("proactive"))
        waits = sorted(float(r["wait_s"]) for r in self.counted() if r["wait_s"])
        p99 = waits[min(len(waits) - 1, int(0.99 * len(waits)))] if waits else float("nan")
        prewarmed = sum(1 for r in self.rows if r["prewarmed"] == "1")
        return (
            f"{name}: {sum(1 for r in self.counted() if _within(r))}/{len(self.counted())} "
            f"counted requests within {SLO_WAIT_S:g} s ({100 * self.attainment():.1f}%), "
            f"p99 wait {p99:.2f} s, {prewarmed} served by pre-warmed replicas, "
            f"reclaims {len(reclaims)} ({ahead} proactive)"
        )

    def lent_during(self, start: float, end: float) -> bool:
        """Whether the job held a lent GPU at some moment of the load's ``[start,
        end)`` (seconds from the load's start), from the event log's lends and
        reclaims."""
        lo, hi = self.load_start + start, self.load_start + end
        held: set[str] = set()
        for e in self.log:
            if e.time >= hi:
                break
            if e.time >= lo and held:
                return True  # held when the window opened, or since
            if e.kind is not LogKind.GPU:
                continue
            op, gpu = e.detail.get("op"), str(e.detail.get("gpu"))
            if op == "lend":
                held.add(gpu)
            elif op in ("reclaim", "release"):
                held.discard(gpu)
            if held and e.time >= lo:
                return True
        return bool(held)  # held at the window's end (nothing logged in it)


def _within(row: dict[str, str]) -> bool:
    return row["status"] == "200" and bool(row["wait_s"]) and float(row["wait_s"]) <= SLO_WAIT_S


def _service(directory: Path) -> Path:
    path = directory / "llm.toml"
    lines = [
        'name = "llm"',
        'model = "tiny-mlp"',
        f'handler = "{ECHO}:load"',
        "concurrency = 1",
        "max_replicas = 2",
        "queue_bound = 1000",
        "request_timeout_s = 120",
        f"slo_wait_s = {SLO_WAIT_S}",
        # The guard sizes replicas as for a loss system (a request finding them all
        # busy is lost); the router queues it (~0.1 s), so 90% held is >= 99% met.
        "slo_target = 0.9",
        "[args]",
        "delay_s = 0.1",
        f"load_s = {LOAD_S}",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _scrape(state: Path) -> dict[str, int]:
    return scrape(
        state,
        "llm",
        {
            "deepboot_requests_within_slo_total": "within",
            "deepboot_requests_over_slo_total": "over",
            "deepboot_requests_prewarmed_total": "prewarmed",
        },
    )


def _scenario(root: Path, *flags: str, profile_rows: list[tuple[float, float]] = PROFILE) -> Run:
    root.mkdir(parents=True)
    with local_cluster(root / "state", *CLUSTER, *flags) as state:
        cli(state, "serve", str(_service(root)))
        gate = root / "gate"
        gate.write_text("1000000000")  # open only once the load is over
        cli(state, "submit", str(gated_job(root, "train", gate, 4)))
        wait_for("the job running", lambda: job(state, "train")["state"] == "running", 300)
        profile = rate_profile(root, "profile", profile_rows)
        load = Load(state, "llm", profile, root / "requests.csv")
        rows = load.rows()
        # The controller writes its last ``slo`` record at shutdown: scrape first,
        # then stop it (the fixture's ``deepboot down``), then read the log.
        scraped = _scrape(state)
        open_gate(state, "train", gate)
    log = events(root / "state")
    sent = [float(r["sent_at"]) - float(r["send_s"]) for r in rows if r["sent_at"]]
    return Run(rows, log, scraped, min(sent))


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _scenario(tmp_path_factory.mktemp("slo") / "run", "--slo")


def test_slo_guarded_lending_keeps_the_slo_and_still_lends(guarded: Run) -> None:
    print(guarded.summary("--slo"))
    assert guarded.attainment() >= 0.99, _misses(guarded)
    ramp = [r for r in guarded.rows if RAMP[0] <= float(r["send_s"]) < RAMP[1]]
    assert sum(1 for r in ramp if r["prewarmed"] == "1") > 0, "no ramp request hit a pre-warm"
    for start, end in LULLS:
        assert guarded.lent_during(start, end), f"nothing lent in the lull {start}-{end} s"
    reclaims = [
        e.detail for e in guarded.log if e.kind is LogKind.GPU and e.detail["op"] == "reclaim"
    ]
    assert any(d["proactive"] for d in reclaims), reclaims
    starts = [
        e.detail for e in guarded.log if e.kind is LogKind.REPLICA and e.detail["op"] == "start"
    ]
    assert any(d.get("prewarm") for d in starts), starts
    assert not [e for e in guarded.log if e.kind is LogKind.DECISION_REJECTED]


def test_the_metrics_equal_the_event_log_and_the_load_csv(guarded: Run) -> None:
    within = sum(1 for r in guarded.rows if _within(r))
    over = len(guarded.rows) - within
    [last] = [e.detail for e in guarded.log if e.kind is LogKind.SLO][-1:]
    assert (last["within"], last["over"]) == (within, over)
    assert (guarded.scraped["within"], guarded.scraped["over"]) == (within, over)
    prewarmed = sum(1 for r in guarded.rows if r["prewarmed"] == "1")
    assert guarded.scraped["prewarmed"] == prewarmed


def test_reactive_lending_attains_less_on_the_same_load(guarded: Run, tmp_path: Path) -> None:
    # The same load up to the spike's end; both runs' requests counted over it.
    reactive = _scenario(tmp_path / "reactive", profile_rows=REACTIVE_PROFILE)
    print(reactive.summary("reactive"))
    assert reactive.attainment() < guarded.attainment(until=SPIKE_END), (
        reactive.attainment(),
        guarded.attainment(until=SPIKE_END),
    )
    assert not any(e.detail.get("proactive") for e in reactive.log if e.kind is LogKind.GPU)


def _misses(run: Run) -> list[Any]:
    return [(r["send_s"], r["status"], r["wait_s"]) for r in run.counted() if not _within(r)]
