"""``bench/controller_scale.py`` at a tiny size (8 jobs, 16 GPUs, 3 services): its
builder gives a controller whose turns come in both kinds (with a training round and
without), whose jobs run and finish, whose arrivals start replicas, and none of whose
steps was refused; its router path answers every request. Correctness only: no
assertion reads a wall-clock figure."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import controller_scale as cs  # noqa: E402

from deepboot.runtime.controller.jobrecords import gpu_name  # noqa: E402
from deepboot.runtime.store.jobstore import JobState, LogKind  # noqa: E402


def test_the_controller_bench_turns_with_and_without_a_round() -> None:
    b = cs.build(jobs=8, gpus=16, services=3, interval=2.0)
    try:
        assert b.ctl.driver.rounds >= 1  # the first round placed them
        assert any(r.row.state is JobState.RUNNING for r in b.ctl.jobs.values())
        cs.run_turns(b, 48)  # 12 simulated seconds: 6 ticks, 12 polls
        kinds = {k: len(v) for k, v in b.times.items()}
        assert kinds.get(cs.ROUND, 0) >= 5, kinds
        assert kinds.get(cs.POLLED, 0) > 0 and kinds.get(cs.MESSAGES, 0) > 0, kinds
        assert sum(kinds.values()) == 48 and all(len(b.cpu[k]) == n for k, n in kinds.items())
        b.ctl.flush()
        logged = b.ctl.store.events()
        assert not [e for e in logged if e.kind is LogKind.DECISION_REJECTED]
        assert b.arrivals > 0 and b.router.starts > 0  # arrivals started replicas
        assert [e for e in logged if e.kind is LogKind.REPLICA]
        if b.finished_asked:  # a job asked to finish did, and another took its place
            assert [e for e in logged if e.kind is LogKind.FINISHED]
            assert len(b.ctl.store.jobs()) == 8 + b.finished_asked
        # The flushes write only what changed: the store holds what a full write would.
        ctl = b.ctl
        stored = {r.name: r for r in ctl.store.jobs()}
        assert all(stored[n] == rec.row for n, rec in ctl.jobs.items())
        written = [tuple(g) for g in ctl.store.gpus()]
        assert written == [tuple(g) for g in ctl._gpu_rows()]
        full = [
            (gpu_name(g.gpu_id), g.state.value, g.job or "", g.replica or "")
            for g in ctl.board.gpus
        ]
        assert [(g[0], g[4], g[5], g[7]) for g in written] == full
        # A job's view, kept while nothing it is built from changed, is the one built now.
        mode = ctl.loop.training.job_mode
        for rec in ctl.jobs.values():
            assert rec.view(ctl.board, mode) == rec._build_view(ctl.board.held(rec.name), mode)
    finally:
        b.close()


def test_the_router_bench_answers_every_request() -> None:
    pytest.importorskip("aiohttp")
    r = cs.router_bench(services=3, requests=90, clients=12)
    assert r.statuses == {200: 90} and len(r.latencies) == 90
    assert r.per_second > 0 and r.messages["Received"] == 90
