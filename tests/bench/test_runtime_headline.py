"""The pure parts of ``bench/runtime_headline.py`` (and of ``bench/twin.py`` it
reuses): the thinned trace, the per-request accounting, the figures of a recorded run
and of its simulation, the table. No cluster, no wall clock."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import runtime_headline as h  # noqa: E402
import twin  # noqa: E402

from deepboot.runtime.store.jobstore import EventRow, LogKind  # noqa: E402


def _event(kind: LogKind, **detail: Any) -> EventRow:
    return EventRow(seq=0, time=0.0, kind=kind, job="", detail=detail)


def _request(
    send: float, status: str = "200", wait: str = "", latency: str = "0.2"
) -> dict[str, str]:
    return {
        "send_s": str(send),
        "status": status,
        "wait_s": wait,
        "latency_s": latency,
        "exec_s": "0.1",
    }


def test_thin_trace_keeps_every_kth_inference_row_of_the_day_in_time_order() -> None:
    rows = [
        {"name": "train", "time": "0", "application": "cifar10"},
        *(
            {"name": f"r{i}", "time": str(10 * (9 - i)), "application": "infer-M1"}
            for i in range(10)
        ),
        {"name": "late", "time": "500", "application": "infer-M1"},
    ]
    got = h.thin_trace(rows, 3, day_s=100)
    assert [r["time"] for r in got] == ["0", "30", "60", "90"]


def test_request_wait_prefers_the_routers_wait_then_estimates_then_misses() -> None:
    assert h.request_wait(_request(0, wait="1.5")) == 1.5
    assert h.request_wait(_request(0, latency="0.5")) == pytest.approx(0.4)  # 0.5 - exec 0.1
    assert h.request_wait(_request(0, status="503", latency="0.01")) is None
    assert h.request_wait(_request(0, status="0", latency="")) is None


def test_attainment_counts_misses_and_once_warm_starts_at_the_first_met_request() -> None:
    sends = [0.0, 1.0, 2.0, 3.0, 4.0]
    waits = [14.0, 13.0, 1.0, None, 0.5]  # two behind the cold start, one unanswered
    attained, warm = h.attainments(sends, waits)
    assert attained == pytest.approx(2 / 5)
    assert warm == pytest.approx(2 / 3)
    assert h.attainments([], []) == (None, None)
    assert h.attainments([0.0], [None]) == (0.0, None)


def test_measured_side_counts_reclaims_by_kind_and_replica_starts() -> None:
    rt = twin.WorldRun(submit={"j1": 0.0, "j2": 5.0}, finish={"j1": 30.0}, lent_gpu_s=12.5)
    log = [
        _event(LogKind.GPU, op="lend", gpu="g2"),
        _event(LogKind.GPU, op="reclaim", gpu="g2", proactive=True),
        _event(LogKind.GPU, op="reclaim", gpu="g3", proactive=False),
        _event(LogKind.GPU, op="reclaim", gpu="g3"),
        _event(LogKind.REPLICA, op="start", cold=True),
        _event(LogKind.REPLICA, op="start", cold=True, prewarm=True),
        _event(LogKind.REPLICA, op="ready", seconds=14.0),
    ]
    requests = [_request(0, wait="12"), _request(1, wait="0.1"), _request(2, status="0")]
    side = h.measured_side(rt, requests, log)
    assert side.jct == {"j1": 30.0}
    assert side.avg_jct == 30.0
    assert (side.reclaims_proactive, side.reclaims_reactive, side.reclaims) == (1, 2, "1/2")
    assert (side.cold_starts, side.prewarms) == (2, 1)
    assert (side.requests, side.unanswered) == (3, 1)
    assert side.attainment == pytest.approx(1 / 3)
    assert side.p99_wait_s is not None and 0.1 < side.p99_wait_s <= 12
    assert side.lent_gpu_s == 12.5


def test_each_configuration_runs_its_switch_on_the_runtime() -> None:
    assert "--no-lending" in h.setup_for("no-lending", 10).up_args()
    reactive = h.setup_for("reactive", 10).up_args()
    assert "--no-lending" not in reactive and "--slo" not in reactive
    assert "--slo" in h.setup_for("slo", 10).up_args()
    setup = h.setup_for("slo", 10)
    assert [(n, t) for n, t, _ in setup.jobs] == [("j1", 0), ("j2", 30), ("j3", 60), ("j4", 90)]
    assert h.time_scale(10) == 48
    assert h.work_scale(2) == pytest.approx(0.2)


def test_the_twins_own_setup_gives_the_flags_it_runs_with() -> None:
    assert twin.TWIN.up_args() == [
        "--training-nodes", "2", "--inference-nodes", "1", "--gpus-per-node", "2",
        "--interval", "2.0", "--poll", "0.3", "--protect-factor", "0.05", "--http-port", "0",
        "--collective-timeout", "15", "--policy", "deepboot", "--param=restart_delay=10",
    ]  # fmt: skip


def test_sent_at_puts_the_requests_on_the_run_clock() -> None:
    sent = [{"send_s": "1.0", "sent_at": "1001.5"}, {"send_s": "2.0", "sent_at": "1002.5"}]
    assert twin._sent_at_offset(sent, 1000.0, -7.0) == pytest.approx(0.5)
    assert twin._sent_at_offset([{"send_s": "1.0", "sent_at": ""}], 1000.0, -7.0) == -7.0


def _recorded() -> twin.WorldRun:
    """A run as the runtime records it (figures of a real 1-minute one, rounded)."""
    run = twin.WorldRun(
        submit={"j1": 2.0, "j2": 5.0, "j3": 8.0, "j4": 11.0},
        finish={"j1": 30.0, "j2": 40.0, "j3": 50.0, "j4": 60.0},
    )
    m = run.measured
    m.profile = {
        (1, 1, 48): [85.0, 81.7, 81.8],
        (1, 2, 24): [67.0, 32.3, 32.6],
        (2, 3, 16): [28.0, 9.0, 9.2],
    }
    m.grad = {"j1": (0.53, 18.7), "j3": (0.14, 13.0)}
    m.start_s = [4.5, 3.3]
    m.shrink_s = [0.7]
    m.grow_s = [3.2]
    m.cold_start_s = [13.5]
    # A lull, a burst (more than the 2 replicas can take at once), a lull.
    times = [1.0 + 2 * i for i in range(10)] + [25 + 0.1 * i for i in range(12)]
    run.requests = [(t, 0.3) for t in [*times, 50.0, 55.0]]
    return run


@pytest.mark.parametrize("config", list(h.CONFIGS))
def test_every_configuration_simulates_a_recorded_run(config: str) -> None:
    rt = _recorded()
    run, sim = twin.simulate(rt, h.setup_for(config, 1), h.work_scale(1))
    side = h.sim_side(run, sim)
    assert set(side.jct) == set(rt.submit)  # every job finished
    assert side.requests == len(rt.requests)  # the whole day, not only until the jobs end
    assert side.attainment is not None and 0 <= side.attainment <= 1
    if config == "no-lending":
        assert side.lent_gpu_s == 0 and side.reclaims == "0/0"


def test_a_guaranteed_replica_is_in_both_worlds(tmp_path: Path) -> None:
    """``--guaranteed N``: the runtime's service file holds it, and so does the
    simulated service: reactive lending lends less of the recorded run's lulls with
    one replica held, and nothing with both."""
    service, _, _ = h.write_inputs(tmp_path, h.setup_for("slo", 1, guaranteed=1), 1)
    assert "guaranteed_replicas = 1\n" in service.read_text()
    lent = []
    for held in (0, 1, 2):
        run, sim = twin.simulate(_recorded(), h.setup_for("reactive", 1, held), h.work_scale(1))
        lent.append(h.sim_side(run, sim).lent_gpu_s)
    assert lent[0] > lent[1] > lent[2] == 0


def _result(config: str, jct: float, attainment: float, sim_jct: float) -> h.Result:
    measured = h.Side(jct={"j1": jct}, attainment=attainment)
    predicted = h.Side(jct={"j1": sim_jct}, attainment=attainment)
    return h.Result(config, measured, predicted, 100.0, twin.WorldRun(), twin.WorldRun())


def test_gain_kept_verdict_and_table() -> None:
    results = {
        "no-lending": _result("no-lending", 100.0, 0.90, 110.0),
        "reactive": _result("reactive", 60.0, 0.80, 61.0),
        "slo": _result("slo", 70.0, 0.91, 90.0),
    }
    assert h.gain_kept(results) == pytest.approx(0.75)
    assert results["slo"].ratio == pytest.approx(90 / 70)
    lines = h.verdict(results)
    assert "at or above" in lines[0] and "75.0%" in lines[0]
    assert "(within 20%)" in lines[1] and "(within 20%)" in lines[2]
    assert "NOT within 20%" in lines[3]
    console = Console(record=True, width=200)
    console.print(h.table(results, 10))
    text = console.export_text()
    for label in h.LABELS.values():
        assert label in text
    assert "1.29" in text  # the --slo row's sim / measured
    assert h.gain_kept({"slo": results["slo"]}) is None
    no_gain = {**results, "reactive": _result("reactive", 120.0, 0.8, 120.0)}
    assert h.gain_kept(no_gain) is None


def test_warmup_requests_are_simulated_but_not_counted() -> None:
    rt = _recorded()
    day = rt.requests
    rt.requests = [(t + 20.0, d) for t, d in day]  # the day starts at 20 s
    rt.submit = {j: t + 20.0 for j, t in rt.submit.items()}
    rt.finish = {j: t + 20.0 for j, t in rt.finish.items()}
    warmup = [
        {
            "send_s": "0.0",
            "sent_at": "1005.0",
            "status": "200",
            "latency_s": "14.3",
            "wait_s": "14.0",
        },
        {
            "send_s": "1.0",
            "sent_at": "1006.0",
            "status": "200",
            "latency_s": "0.4",
            "wait_s": "0.1",
        },
    ]
    log = [EventRow(seq=0, time=1000.0, kind=LogKind.CONTROLLER_STARTED, job="", detail={})]
    before = h.warmup_requests(warmup, 1000.0, 0.2)
    assert [t for t, _ in before] == [5.0, 6.0]  # on the controller's clock
    assert [d for _, d in before] == pytest.approx([0.3, 0.3])  # latency less wait
    result = h.evaluate_run("no-lending", rt, [], log, 1, warmup)
    assert result.predicted.requests == len(day)  # the warm-up's two are left out
    assert len(result.runtime.requests) == len(day) + 2  # but simulated
    assert result.predicted.cold_starts == 0  # they loaded the replicas before the day


def test_as_json_holds_every_configuration() -> None:
    rt = _recorded()
    result = h.evaluate_run("slo", rt, [], [], 1)
    doc = h.as_json({"slo": result}, 1)
    assert doc["configs"]["slo"]["setup"]["slo"] is True
    assert doc["configs"]["slo"]["predicted"]["avg_jct_s"] == result.predicted.avg_jct


def test_jittered_pauses_stay_within_the_jitter_and_repeat_with_the_seed() -> None:
    base = twin.MeasuredRestart.of(_recorded().measured)
    draws = []
    for seed in (7, 7, 8):
        moved = twin.JitteredRestart(base, 1.0, seed)
        draws.append([moved.delay("j1", old, new, False) for old, new in ((0, 2), (2, 1), (1, 3))])
    expected = [base.delay("j1", o, n, False) for o, n in ((0, 2), (2, 1), (1, 3))]
    assert draws[0] == draws[1] != draws[2]  # seeded
    for got in draws:
        assert all(g >= 0 and abs(g - e) <= 1.0 for g, e in zip(got, expected, strict=True))
    assert twin.JitteredRestart(base, 10.0, 1).delay("j1", 2, 1, False) >= 0  # never negative


def test_sensitivity_compares_each_run_with_itself_moved() -> None:
    """``--sensitivity``: every job's moved simulations against the unmoved one, and
    the median-of-runs statistic over every combination (n ** runs of them)."""
    rt = _recorded()
    sim = twin.sim_run(rt, 1.0)
    runs = [(rt, sim, sim), (rt, sim, sim)]
    doc = twin.sensitivity(runs, 1.0, 3, 0.5, Console(file=None, width=200, quiet=True))
    assert set(doc["jobs"]) == {name for name, _, _ in twin.JOBS}
    for job in doc["jobs"].values():
        assert len(job["moved"]) == 6 and len(job["median_of_runs"]) == 9
        assert all(r > 0 for r in job["moved"])
    assert 0.0 <= doc["any_median_outside"] <= 1.0
    assert len(doc["agreement"]) == 6 and all(0 <= a <= 1 for a in doc["agreement"])
    # No jitter to speak of: the simulation is itself.
    still = twin.sensitivity(runs, 1.0, 2, 1e-9, Console(quiet=True))
    assert still["any_median_outside"] == 0.0 and set(still["agreement"]) == {1.0}
