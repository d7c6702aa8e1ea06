"""An arrival the router withdrew before the loop handled it is moot (in-process, fake
actors): the router posts an arrival when every replica of the service is busy, and
withdraws it when one frees up and takes the request first. Placing it anyway started
a replica, or reclaimed a lent GPU, for a request already served."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

from deepboot.core.gpu import GpuState  # noqa: E402
from deepboot.runtime import messages as rt  # noqa: E402
from deepboot.world.settings import SharedCluster  # noqa: E402
from tests.runtime.test_prewarm import GPU, controller, replica_log  # noqa: E402


def test_a_withdrawn_arrival_places_nothing(tmp_path: Path) -> None:
    ctl, fake, router = controller(tmp_path, SharedCluster())
    ctl.driver.run_due()  # the first tick
    ctl.inbox.put(rt.Arrival("r1", "svc"))
    ctl.inbox.put(rt.Withdraw("r1"))
    ctl.intake.handle_messages()
    ctl.driver.run_due()
    assert router.started == [] and fake.replicas == {}
    assert ctl.board.get(GPU).state is GpuState.FREE
    ctl.flush()
    assert replica_log(ctl) == []
    # The same path with no withdrawal starts a replica for the request.
    ctl.inbox.put(rt.Arrival("r2", "svc"))
    ctl.intake.handle_messages()
    ctl.driver.run_due()
    assert [task for *_, task in router.started] == ["r2"]
    ctl.flush()
    assert [d["op"] for d in replica_log(ctl)] == ["start"]
