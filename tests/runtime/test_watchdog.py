"""The controller's turn watchdog: a stuck turn is logged once, with where it waits."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from deepboot.runtime.controller.watchdog import TurnWatchdog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _stuck_here(entered: threading.Event, release: threading.Event) -> None:
    entered.set()
    release.wait(30)


def _run_turn(dog: TurnWatchdog, entered: threading.Event, release: threading.Event) -> None:
    with dog.turn():
        _stuck_here(entered, release)


def test_a_stuck_turn_is_logged_once_with_its_stack(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    dog = TurnWatchdog(5.0, clock=clock)
    entered, release = threading.Event(), threading.Event()
    loop = threading.Thread(target=_run_turn, args=(dog, entered, release))
    loop.start()
    try:
        assert entered.wait(30)
        clock.now = 4.0
        assert dog.check() is None  # within the limit
        clock.now = 6.0
        with caplog.at_level(logging.WARNING, logger="deepboot.controller"):
            stack = dog.check()
            assert stack is not None and "_stuck_here" in stack
            assert dog.check() is None  # once per turn
        assert dog.stalls == 1
        assert "in one turn for 6.0 s" in caplog.text and "_stuck_here" in caplog.text
        clock.now = 9.5
        with caplog.at_level(logging.WARNING, logger="deepboot.controller"):
            release.set()
            loop.join(30)
        assert "ended after 9.5 s" in caplog.text
    finally:
        release.set()
        loop.join(30)


def test_a_quick_turn_and_no_turn_are_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    dog = TurnWatchdog(1.0, clock=clock)
    clock.now = 100.0
    assert dog.check() is None  # between turns
    with caplog.at_level(logging.WARNING, logger="deepboot.controller"):
        with dog.turn():
            clock.now = 100.5
            assert dog.check() is None
        clock.now = 200.0
        assert dog.check() is None  # the turn ended
    assert dog.stalls == 0 and caplog.text == ""


def test_the_thread_reports_a_real_stall() -> None:
    dog = TurnWatchdog(0.05, every_s=0.01)
    dog.start()
    entered, release = threading.Event(), threading.Event()
    loop = threading.Thread(target=_run_turn, args=(dog, entered, release))
    loop.start()
    try:
        assert entered.wait(30)
        deadline = time.monotonic() + 30
        while dog.stalls == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert dog.stalls == 1
    finally:
        release.set()
        loop.join(30)
        dog.stop()


def test_the_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="limit_s"):
        TurnWatchdog(0.0)
