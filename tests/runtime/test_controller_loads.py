"""The runtime's snapshot carries the services' load, counted from every request the
router accepted (warm-served ones too), for the lending reserve: in-process, no Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

pytest.importorskip("prometheus_client")

from deepboot.core.cluster import ClusterSpec  # noqa: E402
from deepboot.policies.lending import ServiceLoad  # noqa: E402
from deepboot.runtime import messages as msg  # noqa: E402
from deepboot.runtime.controller.controller_settings import ControllerSettings  # noqa: E402
from deepboot.runtime.controller.wiring import Controller  # noqa: E402
from deepboot.runtime.store.statedir import StateDir  # noqa: E402
from deepboot.scheduler.events import Event, EventKind  # noqa: E402
from deepboot.world.settings import SharedCluster  # noqa: E402

pytestmark = pytest.mark.runtime


class NoActors:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the controller touched the actors ({name})")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def controller(tmp_path: Path, shared: SharedCluster, clock: Clock) -> Controller:
    state = StateDir.at(tmp_path / "state").ensure()
    settings = ControllerSettings(interval=5.0, shared=shared)
    cluster = ClusterSpec.parse("2x2", 1)
    return Controller(state, settings, cluster, cast(Any, NoActors()), clock=clock)


def test_the_tick_snapshot_counts_every_request_the_router_reported(tmp_path: Path) -> None:
    clock = Clock()
    ctl = controller(tmp_path, SharedCluster(reserve=True, reserve_window=10.0), clock)
    for t in range(6):  # six requests, a second apart; five answered after 0.5 s
        clock.now = 1000.0 + t
        ctl.inbox.put(msg.Received("svc"))
        if t:
            ctl.inbox.put(msg.Served("svc", 0.5))
        ctl.intake.handle_messages()
    snap = ctl.backend.snapshot(Event(EventKind.TICK))
    assert dict(snap.loads) == {"svc": ServiceLoad(rate=0.6, duration_s=0.5)}
    # Between ticks the loop reads no load (as in the simulator).
    assert not ctl.backend.snapshot(Event(EventKind.INFERENCE_ARRIVAL, "r", "svc")).loads
    clock.now += 10.0  # the window slid past every request
    assert not ctl.backend.snapshot(Event(EventKind.TICK)).loads


def test_without_the_reserve_the_snapshot_carries_no_load(tmp_path: Path) -> None:
    clock = Clock()
    ctl = controller(tmp_path, SharedCluster(), clock)
    ctl.inbox.put(msg.Received("svc"))
    ctl.intake.handle_messages()
    assert not ctl.backend.snapshot(Event(EventKind.TICK)).loads
    assert ctl.loop.settings.reserve.enabled is False


@pytest.mark.parametrize("flag", ["warm_pool", "oracle"])  # --slo runs: test_prewarm.py
def test_what_the_runtime_cannot_run_is_refused_with_the_reason(tmp_path: Path, flag: str) -> None:
    from deepboot.core.errors import ConfigError

    with pytest.raises(ConfigError, match="simulate"):
        controller(tmp_path, SharedCluster(**{flag: True}), Clock())  # type: ignore[arg-type]


def test_settings_saved_by_an_older_deepboot_still_load(tmp_path: Path) -> None:
    path = tmp_path / "controller.json"
    old = ('{"policy": "pollux", "afe": false, "lending": true, "protect_factor": 0.5, '
           '"inference_policy": "random", "interval": 5.0}')  # fmt: skip
    path.write_text(old)
    got = ControllerSettings.load(path)
    assert got.policy == "pollux" and not got.afe
    assert got.shared == SharedCluster(afe=False, protect_factor=0.5, ats_i="random")
    got.save(path)
    assert ControllerSettings.load(path) == got
