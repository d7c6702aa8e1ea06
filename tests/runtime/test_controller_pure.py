"""The runtime controller's pure parts, in-process (no Ray): which operations it
applies (job operations as the intent their GPU operations carry out), and where its
ticks fall."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pytest

from deepboot.core.cluster import ClusterSpec
from deepboot.core.errors import InvalidDecisionError
from deepboot.core.placement import Placement
from deepboot.runtime.controller.adapter import RayBackend, check_applicable, next_tick
from deepboot.scheduler.control import Step
from deepboot.scheduler.decision import Preempt, Resize, Start
from deepboot.scheduler.operations import Bind, Lend, Reclaim, Release, WarmReplica
from deepboot.world.gpus import GpuBoard


@dataclass(frozen=True)
class Teleport:
    """An operation no world knows."""

    gpu: tuple[int, int]


class Untouchable:
    def __init__(self, name: str = "") -> None:
        self.name = name

    def __getattr__(self, attr: str) -> Any:
        raise AssertionError(f"the backend touched its {self.name} ({attr})")


COLLABORATORS = (
    "loop", "cluster", "board", "jobs", "requests", "catalog", "replicas", "generations",
    "log", "crash", "post", "interval", "clock", "caches",
)  # fmt: skip


def backend_with(**given: Any) -> RayBackend:
    """A backend whose collaborators are ``given``, every other one untouchable."""
    return RayBackend(**{n: given[n] if n in given else Untouchable(n) for n in COLLABORATORS})


def test_every_known_operation_is_applicable() -> None:
    two, one = Placement.of((0, 0)), Placement.of((0,))
    check_applicable(
        (
            Bind((0, 0), "a"),
            Lend((1, 0), "a"),
            Reclaim((1, 0), "a"),
            Release((0, 0), "a"),
            WarmReplica((1, 0), "s", 10.0),  # --slo's pre-warm (tests/runtime/test_prewarm.py)
            Start("b", two),
            Resize("b", two, one),
            Preempt("b", one),
        )
    )


def test_an_operation_it_does_not_know_is_refused_before_anything_runs() -> None:
    backend = backend_with()
    with pytest.raises(InvalidDecisionError, match="does not know how to apply Teleport"):
        backend.apply(Step(ops=(Bind((0, 1), "a"), cast(Any, Teleport((0, 0))))))


def test_ticks_stay_on_their_grid() -> None:
    # Polls a little late every time: the next tick is still origin + k x 60.
    assert next_tick(100.0, 100.0, 60.0) == 160.0
    assert next_tick(160.7, 100.0, 60.0) == 220.0
    assert next_tick(219.99, 100.0, 60.0) == 220.0
    # An iteration 2.5 intervals late skips the ticks it missed.
    assert next_tick(370.0, 100.0, 60.0) == 400.0
    # Exactly on a tick: the next one.
    assert next_tick(220.0, 100.0, 60.0) == 280.0


class LedgerOnly:
    """A GPU ledger and nothing else: the backend's job operations are checked against
    it and handed to the generations' ``retarget`` (this object plays the event log,
    the crash points, the requests and the generations)."""

    def __init__(self) -> None:
        self.board = GpuBoard(ClusterSpec.parse("2x2", 1))
        self.jobs = {"a": "job a", "b": "job b"}
        self.retargeted: list[str] = []
        self.arrived: dict[str, str] = {}

    def gpu(self, *_: Any, **__: Any) -> None:
        pass

    def hit(self, point: str) -> None:
        pass

    def retarget(self, rec: str) -> None:
        self.retargeted.append(rec)

    def backend(self) -> RayBackend:
        return backend_with(
            board=self.board, jobs=self.jobs, requests=self, generations=self, log=self,
            crash=self,
        )  # fmt: skip


def test_job_operations_are_the_intent_their_gpu_operations_carry_out() -> None:
    ctl = LedgerOnly()
    backend = ctl.backend()
    two = Placement.of((0, 1))
    backend.apply(Step(ops=(Bind((0, 0), "a"), Lend((1, 0), "a"), Start("a", two))))
    assert ctl.retargeted == ["job a"]
    # A reclaim's shrink: the Resize names the job whose generation follows.
    backend.apply(Step(ops=(Reclaim((1, 0), "a"), Resize("a", two, Placement.of((0,))))))
    assert ctl.retargeted == ["job a", "job a"]


@pytest.mark.parametrize(
    ("ops", "words"),
    [
        ((Bind((0, 0), "b"),), "moved with no Start, Resize or Preempt"),
        ((Bind((0, 0), "b"), Start("b", Placement.of((0, 0)))), r"places it on nodes \{0: 2\}"),
    ],
)
def test_gpu_operations_that_do_not_carry_out_their_job_operation_are_refused(
    ops: tuple[Any, ...], words: str
) -> None:
    ctl = LedgerOnly()
    with pytest.raises(InvalidDecisionError, match=words):
        ctl.backend().apply(Step(ops=ops))
    assert ctl.retargeted == []
