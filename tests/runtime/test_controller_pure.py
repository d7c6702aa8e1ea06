"""The runtime controller's pure parts, in-process (no Ray): which operations it
applies, and where its ticks fall."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pytest

from deepboot.core.errors import InvalidDecisionError
from deepboot.core.placement import Placement
from deepboot.runtime.controller import RayBackend, check_applicable, next_tick
from deepboot.scheduler.control import Step
from deepboot.scheduler.decision import Preempt, Resize, Start
from deepboot.scheduler.operations import Bind, Lend, Reclaim, Release, WarmReplica


@dataclass(frozen=True)
class Teleport:
    """An operation no world knows."""

    gpu: tuple[int, int]


class Untouchable:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the backend touched the controller ({name})")


def test_every_known_operation_is_applicable() -> None:
    two, one = Placement.of((0, 0)), Placement.of((0,))
    check_applicable(
        (
            Bind((0, 0), "a"),
            Lend((1, 0), "a"),
            Reclaim((1, 0), "a"),
            Release((0, 0), "a"),
            Start("b", two),
            Resize("b", two, one),
            Preempt("b", one),
        )
    )


@pytest.mark.parametrize(
    ("op", "words"),
    [
        (Teleport((0, 0)), "does not know how to apply Teleport"),
        (WarmReplica((1, 0), "s", 10.0), "simulator-only"),
    ],  # fmt: skip
)
def test_an_operation_it_cannot_apply_is_refused_before_anything_runs(
    op: object, words: str
) -> None:
    backend = RayBackend(cast(Any, Untouchable()))
    with pytest.raises(InvalidDecisionError, match=words):
        backend.apply(Step(ops=(Bind((0, 1), "a"), cast(Any, op))))


def test_ticks_stay_on_their_grid() -> None:
    # Polls a little late every time: the next tick is still origin + k x 60.
    assert next_tick(100.0, 100.0, 60.0) == 160.0
    assert next_tick(160.7, 100.0, 60.0) == 220.0
    assert next_tick(219.99, 100.0, 60.0) == 220.0
    # An iteration 2.5 intervals late skips the ticks it missed.
    assert next_tick(370.0, 100.0, 60.0) == 400.0
    # Exactly on a tick: the next one.
    assert next_tick(220.0, 100.0, 60.0) == 280.0
