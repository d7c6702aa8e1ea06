"""SLO attainment: the windowed tally (pure, times passed in), the router's count of
each answer (within or over, the ``X-Wait-Ms`` header, the Prometheus counters and
the controller's message), and the status view. No Ray, no HTTP server."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prometheus_client")

from rich.console import Console  # noqa: E402

from deepboot.cli.runtime import _attained, cmd_status, status_document  # noqa: E402
from deepboot.core.service import ServiceSpec  # noqa: E402
from deepboot.runtime.client.statusdoc import _slo_entry  # noqa: E402
from deepboot.runtime.http.dispatch import Dispatcher  # noqa: E402
from deepboot.runtime.http.routerstate import Answer, Pending, ServiceQueue  # noqa: E402
from deepboot.runtime.messages import Answered, Inbox  # noqa: E402
from deepboot.runtime.prometheus_metrics import Metrics  # noqa: E402
from deepboot.runtime.slotally import Attainment, SloTally, wait_header  # noqa: E402
from deepboot.runtime.store.jobstore import JobStore, LogKind  # noqa: E402
from deepboot.runtime.store.statedir import StateDir  # noqa: E402
from tests.runtime.test_controller_inprocess import Clock, controller  # noqa: E402


def test_counts_since_start_and_in_the_window() -> None:
    t = SloTally(window_s=60, bucket_s=10)
    t.record("a", True, 5.0)
    t.record("a", False, 15.0)
    t.record("b", True, 15.0)
    t.record("a", True, 59.0)
    assert t.since_start() == {"a": Attainment(2, 1), "b": Attainment(1, 0)}
    assert t.recent(59.0) == {"a": Attainment(2, 1), "b": Attainment(1, 0)}
    # At 60 the bucket [0, 10) leaves the window (6 buckets: [10, 70)).
    assert t.recent(60.0)["a"] == Attainment(1, 1)
    assert t.recent(1000.0) == {"a": Attainment(), "b": Attainment()}
    assert t.since_start()["a"] == Attainment(2, 1)  # the total never forgets


def test_memory_is_bounded_by_the_window() -> None:
    t = SloTally(window_s=300, bucket_s=10)
    for second in range(100_000):
        t.record("a", second % 3 != 0, float(second))
    assert len(t._recent["a"]) == 30
    assert t.recent(99_999.0)["a"] == Attainment(200, 100)  # [99_700, 100_000)
    assert t.since_start()["a"].total == 100_000


def test_a_clock_stepped_back_counts_in_the_newest_bucket() -> None:
    t = SloTally(window_s=60, bucket_s=10)
    t.record("a", True, 100.0)
    t.record("a", False, 42.0)
    assert t.recent(100.0)["a"] == Attainment(1, 1)
    assert len(t._recent["a"]) == 1


@pytest.mark.parametrize(
    ("window_s", "bucket_s"),
    [(0, 1), (10, 0), (10, 20), (float("inf"), 1), (10, float("nan"))],
    ids=["no-window", "no-bucket", "bucket-wider", "infinite", "nan"],
)
def test_bad_widths_are_refused(window_s: float, bucket_s: float) -> None:
    with pytest.raises(ValueError, match="bucket_s"):
        SloTally(window_s, bucket_s)


def test_attainment_and_view() -> None:
    assert Attainment().attainment is None
    assert Attainment(3, 1).attainment == 0.75
    t = SloTally(window_s=300, bucket_s=10)
    t.record("b", True, 1.0)
    t.record("a", False, 1.0)
    assert t.view(400.0) == {
        "a": {
            "window_s": 300,
            "recent": {"within": 0, "over": 0, "attainment": None},
            "total": {"within": 0, "over": 1, "attainment": 0.0},
            "p99_wait_s": None,
        },
        "b": {
            "window_s": 300,
            "recent": {"within": 0, "over": 0, "attainment": None},
            "total": {"within": 1, "over": 0, "attainment": 1.0},
            "p99_wait_s": None,
        },
    }


def test_recent_p99_wait_errs_high_by_at_most_a_bin() -> None:
    t = SloTally(window_s=60, bucket_s=10)
    waits = [0.01 * (i + 1) for i in range(200)]  # 10 ms .. 2 s; exact p99 = 1.98 s
    for i, w in enumerate(waits):
        t.record("s", w <= 1.0, 5.0 + i * 0.1, w)
    t.record("s", False, 30.0)  # unmeasured: counted, no wait
    p99 = t.recent_p99_wait(30.0)["s"]
    assert p99 is not None and 1.98 <= p99 <= 1.98 * 1.13
    assert t.view(30.0)["s"]["p99_wait_s"] == round(p99, 6)
    # Beyond the window: forgotten.
    assert t.recent_p99_wait(200.0)["s"] is None
    # Tiny and huge waits land in the end bins; an unbounded p99 reads null.
    t.record("s", False, 300.0, 1e6)
    assert t.view(300.0)["s"]["p99_wait_s"] is None
    t.record("z", True, 300.0, 0.0)
    assert t.recent_p99_wait(300.0)["z"] == 0.001


@pytest.mark.parametrize("wait", [900.0, 999.0, 1000.0])
def test_a_p99_up_to_1000_s_is_a_number(wait: float) -> None:
    # The last finite bin ends at 1000 s; only a longer wait reads null.
    t = SloTally(window_s=60, bucket_s=10)
    t.record("s", False, 5.0, wait)
    p99 = t.recent_p99_wait(5.0)["s"]
    assert p99 is not None and wait <= p99 <= max(wait * 1.13, 1000.0)
    t.record("s", False, 5.0, 1000.5)
    t.record("s", False, 5.0, 1000.5)
    assert t.recent_p99_wait(5.0)["s"] == float("inf")
    assert t.view(5.0)["s"]["p99_wait_s"] is None


@pytest.mark.parametrize(
    ("seconds", "header"),
    [(0.0, "0.000"), (0.0123456, "12.346"), (2.5, "2500.000"), (-1e-9, "0.000")],
    ids=["zero", "ms-decimals", "seconds", "never-negative"],
)
def test_wait_header(seconds: float, header: str) -> None:
    assert wait_header(seconds) == header
    assert float(header) >= 0


def test_status_entry_before_and_after_answers() -> None:
    empty = _slo_entry(1.0, 0.99, None)
    assert empty["total"] == {"within": 0, "over": 0, "attainment": None}
    assert empty["window_s"] == 300 and empty["slo_wait_s"] == 1.0
    assert _attained(empty["recent"]) == "-"
    assert _attained({"within": 3, "over": 1, "attainment": 0.75}) == "75.0% (3/4)"


def test_status_shows_what_the_controller_wrote(tmp_path: Path) -> None:
    """``deepboot status``: each service's SLO and attainment, from the store's ``slo``
    (a real SQLite file), as JSON and as the services table."""
    state = StateDir.at(tmp_path / "state").ensure()
    store = JobStore(state.db)
    store.register_service(ServiceSpec("svc", "m", slo_wait_s=0.5, slo_target=0.9))
    assert status_document(state)["services"][0]["slo"]["total"]["attainment"] is None
    tally = SloTally()
    for i in range(4):
        tally.record("svc", i != 0, 100.0 + i)
    with store.transaction() as db:
        store.set_meta(db, "slo", json.dumps(tally.view(103.0)))
    store.close()
    slo = status_document(state)["services"][0]["slo"]
    assert slo["recent"] == slo["total"] == {"within": 3, "over": 1, "attainment": 0.75}
    assert (slo["slo_wait_s"], slo["slo_target"]) == (0.5, 0.9)
    out = Console(width=250, record=True)
    args = argparse.Namespace(state_dir=str(state.root), json=False)
    assert cmd_status(args, out, Console(stderr=True)) == 0
    text = out.export_text()
    assert "0.5 s (90%)" in text and text.count("75.0% (3/4)") == 2


class _Router:
    """The router's dispatcher and nothing else (no HTTP, no loop of its own)."""

    def __init__(self, spec: ServiceSpec) -> None:
        self.dispatcher = Dispatcher(Inbox(), Metrics())
        self.dispatcher.services[spec.name] = ServiceQueue(spec)
        self.inbox, self.metrics = self.dispatcher.inbox, self.dispatcher.metrics


def _sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


# (seconds from arrival to hand-off, or None: never handed; the answer; within?)
ANSWERS = [
    (0.2, 200, True),
    (1.0, 200, True),  # exactly slo_wait_s: within
    (1.5, 200, False),
    (0.2, 500, True),  # the handler's own error: the wait met the SLO
    (None, 503, False),  # no replica in time
    (None, 499, False),  # the client went away while queued
]


@pytest.mark.parametrize(
    ("handed", "status", "within"),
    ANSWERS,
    ids=["fast", "at-slo", "late", "handler-error", "timed-out", "withdrawn"],
)
def test_the_router_counts_each_answer_once(
    handed: float | None, status: int, within: bool
) -> None:
    router = _Router(ServiceSpec("svc", "m", slo_wait_s=1.0))

    async def answer() -> tuple[Answer, float]:
        loop = asyncio.get_running_loop()
        arrived = loop.time() - 5.0  # hand-offs in the past; the answer is now
        p = Pending("r1", "svc", {}, loop.create_future(), arrived, arrived + 9, arrived + 9)
        p.handed = None if handed is None else arrived + handed
        router.dispatcher.ids.add("r1")
        router.dispatcher.answer(p, status, {"x": 1})
        return p.future.result(), loop.time() - arrived

    # Pending times are the router's monotonic clock, as asyncio's loop.time() is.
    result, spent = asyncio.run(answer())
    wait_ms = float(result.headers["X-Wait-Ms"])
    if handed is None:  # its wait is its whole time, to the answer
        assert 5000.0 <= wait_ms <= spent * 1000.0 + 1.0
    else:
        assert wait_ms == pytest.approx(handed * 1000.0, abs=0.01)
    assert result.headers["X-Request-Id"] == "r1" and result.status == status
    assert router.dispatcher.ids == set()
    m = router.metrics
    counted: dict[str, Any] = {
        "within": _sample(m, "deepboot_requests_within_slo_total", service="svc"),
        "over": _sample(m, "deepboot_requests_over_slo_total", service="svc"),
    }
    assert counted == ({"within": 1.0, "over": 0.0} if within else {"within": 0.0, "over": 1.0})
    waits = _sample(m, "deepboot_inference_request_wait_seconds_count", service="svc")
    assert waits == (0.0 if handed is None else 1.0)
    assert router.inbox.drain() == [Answered("svc", within)]


def test_a_second_answer_is_not_counted() -> None:
    router = _Router(ServiceSpec("svc", "m"))

    async def twice() -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        p = Pending("r1", "svc", {}, loop.create_future(), now, now + 9, now + 9)
        router.dispatcher.answer(p, 503, {})
        router.dispatcher.answer(p, 200, {})

    asyncio.run(twice())
    assert router.inbox.drain() == [Answered("svc", False)]


def test_a_retry_past_its_queue_deadline_waited_its_whole_time() -> None:
    """A request whose replica died is queued again: its earlier hand-off no longer
    ends its wait, so answered 503 now it never reached a replica (over)."""
    router = _Router(ServiceSpec("svc", "m", slo_wait_s=1.0))

    async def retried() -> Answer:
        loop = asyncio.get_running_loop()
        router.dispatcher.loop = loop
        arrived = loop.time() - 5.0
        p = Pending("r1", "svc", {}, loop.create_future(), arrived, arrived + 1, arrived + 9)
        p.handed = arrived + 0.1  # in time, on the replica that died
        router.dispatcher.enqueue(p, front=True)
        return p.future.result()

    result = asyncio.run(retried())
    assert result.status == 503 and float(result.headers["X-Wait-Ms"]) >= 5000.0
    assert router.inbox.drain() == [Answered("svc", False)]


def test_the_controller_tallies_answers_and_logs_them_boundedly(tmp_path: Path) -> None:
    """In-process (fake actors): the router's ``Answered`` messages become the store's
    ``slo`` view and ``slo`` event-log records, at most one a minute per service (the
    controller's injected clock), and one whenever ``log_slo(0)`` is asked (shutdown)."""
    ctl, _ = controller(tmp_path)
    clock = ctl.clock
    assert isinstance(clock, Clock)

    def answer(*within: bool) -> None:
        for w in within:
            ctl.inbox.put(Answered("svc", w))
        ctl.intake.handle_messages()
        ctl.intake.iteration()
        ctl.flush()

    def logged() -> list[tuple[int, int]]:
        return [
            (int(e.detail["within"]), int(e.detail["over"]))
            for e in ctl.store.events()
            if e.kind is LogKind.SLO and e.detail["service"] == "svc"
        ]

    answer(True, True, False)
    assert logged() == [(2, 1)]
    answer(True)  # within the minute: no record yet
    assert logged() == [(2, 1)]
    clock.t += 60.0
    answer()
    assert logged() == [(2, 1), (3, 1)]
    answer()  # unchanged: no record
    ctl.inbox.put(Answered("svc", False))
    ctl.intake.handle_messages()
    ctl.catalog.log_slo(every_s=0.0)
    ctl.flush()
    assert logged() == [(2, 1), (3, 1), (3, 2)]
    view = json.loads(ctl.store.meta("slo"))["svc"]
    assert view["total"] == {"within": 3, "over": 2, "attainment": 0.6}


def test_proactive_reclaims_are_counted_apart_and_rebuilt_from_the_log() -> None:
    m = Metrics()
    m.count(LogKind.GPU, {"op": "reclaim", "gpu": "1.0", "proactive": True})
    m.count(LogKind.GPU, {"op": "reclaim", "gpu": "1.1", "proactive": False})
    m.count(LogKind.GPU, {"op": "reclaim", "gpu": "1.1"})  # a log from before the flag
    assert (m.reclaimed._value.get(), m.reclaimed_ahead._value.get()) == (3, 1)
    again = Metrics()
    again.restore(m.counts())  # a restarted controller goes on from the saved counts
    assert again.counts() == m.counts() == {"reclaimed": 3, "ahead": 1}


@pytest.mark.parametrize("override", [None, 0.95])
def test_the_slo_a_service_is_held_to_is_flushed_scraped_and_shown(
    tmp_path: Path, override: float | None
) -> None:
    """In-process (fake actors, a real SQLite store): the SLO the controller applies,
    the service file's ``slo_target`` or ``--slo-target``'s override of it, is what
    ``/metrics`` exposes (``deepboot_service_slo_*``, a board's target line) and
    what ``deepboot status`` shows."""
    from deepboot.core.cluster import ClusterSpec
    from deepboot.runtime.controller.controller_settings import ControllerSettings
    from deepboot.runtime.controller.wiring import Controller
    from deepboot.world.settings import SharedCluster
    from tests.runtime.test_controller_inprocess import FakeActors

    shared = SharedCluster(slo=override is not None, slo_target=override)
    state = StateDir.at(tmp_path / "state").ensure()
    ctl = Controller(
        state, ControllerSettings(policy="deepboot", shared=shared),
        ClusterSpec.parse("2x2", inference_nodes=1), FakeActors(), clock=Clock(),
    )  # fmt: skip
    ctl.store.register_service(ServiceSpec("svc", "m", slo_wait_s=0.5, slo_target=0.9))
    ctl.intake.iteration()
    ctl.flush()
    want = 0.9 if override is None else override
    assert _sample(ctl.metrics, "deepboot_service_slo_target", service="svc") == want
    assert _sample(ctl.metrics, "deepboot_service_slo_wait_seconds", service="svc") == 0.5
    slo = status_document(state)["services"][0]["slo"]
    assert (slo["slo_wait_s"], slo["slo_target"]) == (0.5, want)
    out = Console(width=250, record=True)
    args = argparse.Namespace(state_dir=str(state.root), json=False)
    assert cmd_status(args, out, Console(stderr=True)) == 0
    assert f"0.5 s ({100 * want:g}%)" in out.export_text()
