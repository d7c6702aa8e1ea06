"""Standby replicas (``deepboot up --standby-replicas``) around the controller, with
fake actors: one per inference node, promoted to the next replica there (logged, its
row naming it), replaced once that replica is ready, skipped while it imports or when
its promotion fails; a restarted controller keeps a promoted standby its row names and
kills the others. The real processes, the placement group and the GPU's exclusivity
are tested on Ray in ``test_host_cache.py``."""

from __future__ import annotations

from pathlib import Path

from deepboot.core.service import ServiceSpec
from deepboot.runtime import messages as rt
from deepboot.runtime.actors.replica_actor import is_standby_name, standby_name
from deepboot.runtime.controller.controller_settings import ControllerSettings
from deepboot.runtime.controller.wiring import Controller
from deepboot.runtime.store.jobstore import LogKind
from deepboot.runtime.store.statedir import StateDir
from deepboot.world.settings import SharedCluster
from tests.runtime.fake_actors import FakeActors
from tests.runtime.test_controller_inprocess import Clock
from tests.runtime.test_modelcache import CLUSTER, evict, start


def controller(tmp_path: Path, fake: FakeActors, standby: bool = True) -> Controller:
    settings = ControllerSettings(
        policy="fifo",
        interval=2.0,
        shared=SharedCluster(host_cache_gb=1.0),
        standby_replicas=standby,
    )
    state = StateDir.at(tmp_path / "state").ensure()
    ctl = Controller(state, settings, CLUSTER, fake, clock=Clock())
    ctl.start()
    ctl.store.register_service(ServiceSpec("svc", "tiny", handler="m:load", cold_start_s=1.0))
    ctl.catalog.take_services()
    return ctl


def starts(ctl: Controller) -> list[dict[str, object]]:
    ctl.flush()
    return [
        e.detail
        for e in ctl.store.events()
        if e.kind is LogKind.REPLICA and e.detail["op"] == "start"
    ]


def ready(ctl: Controller, gpu: str, name: str) -> None:
    ctl.inbox.put(rt.Ready(gpu, name, 0.3, 0.1, "host"))
    ctl.intake.handle_messages()


def test_each_inference_node_gets_a_standby_and_the_next_replica_there_is_it(
    tmp_path: Path,
) -> None:
    fake = FakeActors()
    ctl = controller(tmp_path, fake)
    # Node 1 is the one inference node of CLUSTER; training nodes get none.
    [(first, node)] = fake.standbys
    assert node == 1 and is_standby_name(first) and first == standby_name(1, 1)
    name = start(ctl, (1, 0))
    assert name == first and fake.promoted == [(first, "1.0")]
    assert not any(r for r in fake.replicas if not is_standby_name(r)), "no new actor"
    assert starts(ctl)[-1]["standby"] is True
    [row] = [r for r in ctl.store.gpus() if r.gpu == "1.0"]
    assert row.replica == first, "its GPU's row names the promoted standby"
    # Replaced once its replica is ready (not while it loads).
    assert len(fake.standbys) == 1
    ready(ctl, "1.0", name)
    assert [n for n, _ in fake.standbys] == [first, standby_name(1, 2)]
    # The next replica on the node is the new standby.
    assert start(ctl, (1, 1), "t2") == standby_name(1, 2)


def test_a_standby_still_importing_or_failing_its_promotion_gives_a_new_actor(
    tmp_path: Path,
) -> None:
    fake = FakeActors()
    ctl = controller(tmp_path, fake)
    [(first, _)] = fake.standbys
    fake.importing.add(first)
    name = start(ctl, (1, 0))
    assert name != first and not is_standby_name(name) and fake.promoted == []
    assert "standby" not in starts(ctl)[-1]
    assert ctl.replicas.standbys == {1: first}, "kept: it is used once it has imported"
    fake.importing.clear()
    fake.promote_fails.add(first)
    other = start(ctl, (1, 1), "t2")
    assert not is_standby_name(other) and first in fake.killed
    assert ctl.replicas.standbys == {}, "a failed standby is forgotten (replaced at the next Ready)"
    ready(ctl, "1.1", other)
    assert ctl.replicas.standbys == {1: standby_name(1, 2)}


def test_a_restarted_controller_keeps_the_promoted_standby_its_row_names(
    tmp_path: Path,
) -> None:
    fake = FakeActors()
    first = controller(tmp_path, fake)
    serving = start(first, (1, 0))
    ready(first, "1.0", serving)  # a new standby (2) starts
    first.flush()
    first.store.close()
    second = Controller(first.state, first.settings, CLUSTER, fake, clock=Clock())
    second.start()
    assert second.board.get((1, 0)).replica == serving, "the promoted standby is kept"
    assert standby_name(1, 2) in fake.killed, "an unpromoted standby no row names is killed"
    assert serving not in fake.killed
    assert second.replicas.standbys == {1: standby_name(1, 3)}, "and a fresh one started"


def test_without_the_flag_no_standby_runs(tmp_path: Path) -> None:
    fake = FakeActors()
    ctl = controller(tmp_path, fake, standby=False)
    name = start(ctl, (1, 0))
    ready(ctl, "1.0", name)
    evict(ctl, (1, 0))
    assert fake.standbys == [] and ctl.replicas.standbys == {}
    assert "standby" not in starts(ctl)[-1]
