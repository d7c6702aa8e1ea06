"""The node-local model cache without Ray: its byte bound (filled past it, LRU out, an
oversized model not kept), and the controller around it with fake actors (an eviction
exports first, bounded; the snapshot's ``cached``; the event log; status)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from deepboot.core.cluster import ClusterSpec, Node, Pool
from deepboot.core.errors import ConfigError
from deepboot.core.service import ServiceSpec
from deepboot.runtime import messages as rt
from deepboot.runtime.actors.modelcache import ModelCache, bound_bytes, weights_nbytes
from deepboot.runtime.controller.controller_settings import ControllerSettings, check_runnable
from deepboot.runtime.controller.wiring import Controller
from deepboot.runtime.store.jobstore import LogKind
from deepboot.runtime.store.statedir import StateDir
from deepboot.scheduler.control import Step
from deepboot.scheduler.events import Event, EventKind
from deepboot.scheduler.operations import (
    EvictReplica,
    ProtectReplica,
    SleepReplica,
    StartReplica,
)
from deepboot.world.settings import SharedCluster
from tests.runtime.fake_actors import FakeActors
from tests.runtime.test_controller_inprocess import Clock

MB = 10**6


def cache(capacity_gb: float) -> tuple[ModelCache, list[object]]:
    """A cache whose ``put`` records what it stored (the identity otherwise)."""
    stored: list[object] = []

    def put(value: object) -> object:
        stored.append(value)
        return value

    return ModelCache(3, capacity_gb, put=put), stored


def test_weights_are_counted_by_their_buffers() -> None:
    arrays = {"w": np.zeros((10, 10), np.float32), "b": [np.zeros(5, np.float64), b"abc"]}
    assert weights_nbytes(arrays) == 400 + 40 + 3
    assert weights_nbytes({"n": 7}) > 0  # anything else: its pickled size


def test_filling_the_cache_past_its_bound_never_exceeds_it() -> None:
    c, _ = cache(0.01)  # 10 MB
    bound = bound_bytes(0.01)
    sizes = [3, 4, 2, 5, 1, 6, 3, 3, 4, 2, 7, 1, 1, 1, 9, 2]  # MB, 54 in all
    for i, mb in enumerate(sizes):
        view = c.keep(f"m{i}", b"x" * (mb * MB))
        assert view["used_bytes"] <= bound == view["bound_bytes"]
        assert f"m{i}" in view["models"], "a model that fits is kept, as the newest"
        assert view["models"][-1] == f"m{i}"
        # What the cache holds is exactly what its ledger lists.
        assert sorted(c._refs) == sorted(view["models"])
        assert view["used_bytes"] == sum(len(c._refs[m]) for m in view["models"])


def test_the_least_recently_used_go_first_and_a_restore_counts_as_a_use() -> None:
    c, _ = cache(0.01)
    for name in ("a", "b", "c"):
        c.keep(name, b"x" * (3 * MB))
    assert c.take("a") == [b"x" * (3 * MB)]  # a is now the most recently used
    view = c.keep("d", b"x" * (3 * MB))  # 12 MB > 10: the least recently used (b) goes
    assert view["models"] == ["c", "a", "d"]
    assert c.take("b") is None
    assert view["used_bytes"] == 9 * MB


def test_a_model_larger_than_the_cache_is_not_kept() -> None:
    c, stored = cache(0.01)
    c.keep("small", b"x" * MB)
    view = c.keep("huge", b"x" * (10 * MB + 1))
    assert view["models"] == ["small"], "nothing evicted for a model that can never fit"
    assert len(stored) == 1, "the oversized model was never put in the object store"
    assert c.take("huge") is None
    assert c.keep("exact", b"x" * (9 * MB))["used_bytes"] == 10 * MB  # exactly the bound fits


def test_a_smaller_bound_keeps_the_most_recently_used_that_fit() -> None:
    c, _ = cache(0.01)
    for name in ("a", "b", "c"):
        c.keep(name, b"x" * (3 * MB))
    view = c.configure(0.007)
    assert view["models"] == ["b", "c"] and view["used_bytes"] <= bound_bytes(0.007)
    assert c.configure(0.0)["models"] == []


# -- the controller around the caches (fake actors) -------------------------------------------

CLUSTER = ClusterSpec((Node(0, 2, Pool.TRAINING), Node(1, 2, Pool.INFERENCE)))


def controller(
    tmp_path: Path, fake: FakeActors, gb: float = 1.0, clock: Clock | None = None
) -> Controller:
    settings = ControllerSettings(
        policy="fifo", interval=2.0, shared=SharedCluster(host_cache_gb=gb), export_timeout=0.5
    )
    state = StateDir.at(tmp_path / "state").ensure()
    ctl = Controller(state, settings, CLUSTER, fake, clock=clock or Clock())
    ctl.start()
    ctl.store.register_service(ServiceSpec("svc", "tiny", handler="m:load", cold_start_s=1.0))
    ctl.catalog.take_services()
    return ctl


def idle(ctl: Controller, gpu: tuple[int, int]) -> None:
    """The replica on ``gpu`` empties: PROTECT, then SLEEP (its GPU evictable)."""
    ctl.backend.apply(Step(ops=(ProtectReplica(gpu, ctl.clock() + 1.0),)))
    ctl.backend.apply(Step(ops=(SleepReplica(gpu),)))


def start(ctl: Controller, gpu: tuple[int, int], task: str = "t") -> str:
    """A new replica of svc on ``gpu`` for request ``task``; its actor's name."""
    ctl.backend.apply(Step(ops=(StartReplica(gpu, "svc", task, cold=True, hits=0),)))
    name = ctl.board.get(gpu).replica
    assert name is not None
    return name


def evict(ctl: Controller, gpu: tuple[int, int]) -> None:
    """The replica on ``gpu`` idles (PROTECT, SLEEP) and is evicted."""
    idle(ctl, gpu)
    ctl.backend.apply(Step(ops=(EvictReplica(gpu),)))
    ctl.flush()


def evict_after_start(ctl: Controller, gpu: tuple[int, int] = (1, 1)) -> str:
    """A replica of svc starts on ``gpu``, sleeps and is evicted; its actor's name."""
    name = start(ctl, gpu)
    evict(ctl, gpu)
    return name


def evicts(ctl: Controller) -> list[dict[str, object]]:
    log = ctl.store.events()
    return [e.detail for e in log if e.kind is LogKind.REPLICA and e.detail["op"] == "evict"]


def test_an_evicted_replica_exports_into_its_nodes_cache_before_it_is_killed(
    tmp_path: Path,
) -> None:
    fake = FakeActors(export_bytes=1000)
    ctl = controller(tmp_path, fake)
    assert set(fake.caches) == {1}, "one cache per inference node"
    assert ctl.caches.cached_models() == {}
    name = evict_after_start(ctl)
    assert fake.exported == [name] and name in fake.killed
    assert fake.exported.index(name) <= fake.killed.index(name)
    assert evicts(ctl)[-1]["cache"] == "exported"
    snap = ctl.backend.snapshot(Event(EventKind.TICK))
    assert snap.cached == {1: frozenset({"tiny"})}, "ATS-I sees what the node caches"
    # A second eviction of the same model: the cache holds it already, nothing copied.
    second = evict_after_start(ctl, (1, 0))
    assert second not in fake.exported and evicts(ctl)[-1]["cache"] == "held"
    # status reads what the caches hold from the store.
    [view] = json.loads(ctl.store.meta("host_cache"))
    assert view == {"node": 1, "models": ["tiny"], "used_bytes": 1000, "bound_bytes": 10**9}


def test_an_export_that_fails_or_times_out_still_evicts(tmp_path: Path) -> None:
    fake = FakeActors(export_bytes=1000)
    ctl = controller(tmp_path, fake)
    name = start(ctl, (1, 1))
    fake.export_fails.add(name)
    evict(ctl, (1, 1))
    assert name in fake.killed
    assert evicts(ctl)[-1]["cache"] == "failed"
    assert ctl.caches.cached_models() == {}


def test_without_export_weights_or_without_the_cache_nothing_changes(tmp_path: Path) -> None:
    fake = FakeActors(export_bytes=0)  # the handler has no export_weights
    ctl = controller(tmp_path / "a", fake)
    evict_after_start(ctl)
    assert evicts(ctl)[-1]["cache"] == "none"
    off = FakeActors(export_bytes=1000)
    ctl = controller(tmp_path / "b", off, gb=0.0)
    evict_after_start(ctl)
    assert off.caches == {} and off.exported == []
    assert "cache" not in evicts(ctl)[-1]


def test_host_and_cold_starts_are_logged_and_counted_per_service(tmp_path: Path) -> None:
    fake = FakeActors(export_bytes=1000)
    ctl = controller(tmp_path, fake)
    first = start(ctl, (1, 1))
    ctl.inbox.put(rt.Ready("1.1", first, 2.0, 1.5, "cold"))
    ctl.intake.handle_messages()
    evict(ctl, (1, 1))
    second = start(ctl, (1, 1), "t2")
    ctl.inbox.put(rt.Ready("1.1", second, 0.3, 0.1, "host"))
    ctl.intake.handle_messages()
    ctl.flush()
    ready = [
        e.detail["start"]
        for e in ctl.store.events()
        if e.kind is LogKind.REPLICA and e.detail["op"] == "ready"
    ]
    assert ready == ["cold", "host"]
    assert ctl.metrics.counts() == {"cold:svc": 1, "host:svc": 1}
    # The service's cold start is the full load's, never a host start's.
    [row] = ctl.store.services()
    assert row.cold_start == 1.5


def test_the_runtime_runs_the_cache_but_refuses_the_simulators_model_of_it() -> None:
    check_runnable(SharedCluster(host_cache_gb=4.0))
    with pytest.raises(ConfigError, match="--host-gbps: the runtime's host starts are measured"):
        check_runnable(SharedCluster(host_cache_gb=4.0, host_gbps=10.0))
    with pytest.raises(ConfigError, match="--host-init-s"):
        check_runnable(SharedCluster(host_cache_gb=4.0, host_init_s=0.0))
    with pytest.raises(ConfigError, match="--host-cache-preload: the runtime's node caches"):
        check_runnable(SharedCluster(host_cache_gb=4.0, host_cache_preload=True))
    with pytest.raises(ConfigError, match="--export-timeout"):
        ControllerSettings(export_timeout=0.0)


def test_a_node_that_left_and_returned_gets_a_new_empty_cache(tmp_path: Path) -> None:
    clock = Clock()
    fake = FakeActors(export_bytes=1000, nodes={0, 1}, clock=clock)
    ctl = controller(tmp_path, fake, clock=clock)
    evict_after_start(ctl)
    assert ctl.caches.cached_models() == {1: frozenset({"tiny"})}
    fake.lose_node(1)
    clock.t += 10
    ctl.nodes.check_nodes()
    assert ctl.caches.cached_models() == {}, "a lost node's cache is not offered to ATS-I"
    fake.nodes = {0, 1}
    clock.t += 10
    ctl.nodes.check_nodes()
    assert 1 in fake.caches and fake.caches[1].view()["models"] == []
    evict_after_start(ctl)  # the new cache takes the next export
    assert evicts(ctl)[-1]["cache"] == "exported"
    assert ctl.caches.cached_models() == {1: frozenset({"tiny"})}


def test_a_restarted_controller_finds_the_caches_with_what_they_hold(tmp_path: Path) -> None:
    fake = FakeActors(export_bytes=1000)
    first = controller(tmp_path, fake)
    evict_after_start(first)
    first.store.close()
    second = Controller(first.state, first.settings, CLUSTER, fake, clock=Clock())
    second.start()
    assert second.caches.cached_models() == {1: frozenset({"tiny"})}
