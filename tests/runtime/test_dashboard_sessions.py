"""The dashboard's login codes and sessions (deepboot.runtime.sessions): one-time,
short-lived, bounded in number; the clock is injected."""

from __future__ import annotations

import pytest

from deepboot.runtime.sessions import Sessions


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_code_opens_one_session_once() -> None:
    clock = Clock()
    s = Sessions(clock, login_ttl_s=120, session_ttl_s=3600)
    code = s.mint()
    assert len(code) == 64 and int(code, 16) >= 0
    session = s.redeem(code)
    assert session is not None and session != code
    assert s.valid(session)
    assert s.redeem(code) is None  # spent
    assert not s.valid(code)  # a code is no session
    assert s.redeem("") is None and s.redeem("00" * 32) is None
    assert not s.valid("") and not s.valid(session + "0")


def test_codes_and_sessions_expire() -> None:
    clock = Clock()
    s = Sessions(clock, login_ttl_s=120, session_ttl_s=3600)
    late = s.mint()
    clock.now += 120.0
    assert s.redeem(late) is None
    session = s.redeem(s.mint())
    assert session is not None
    clock.now += 3599.0
    assert s.valid(session)
    clock.now += 1.0
    assert not s.valid(session)


@pytest.mark.xfail(
    strict=True,
    reason="issue 42 finding 6: a login code lives 120 s; the issue asks at most 30 s",
)
def test_a_login_code_lives_30_seconds() -> None:
    from deepboot.runtime.sessions import LOGIN_TTL_S

    assert LOGIN_TTL_S == 30.0
    clock = Clock()
    s = Sessions(clock)  # the controller's default
    code = s.mint()
    clock.now += 29.0
    assert s.redeem(code) is not None
    late = s.mint()
    clock.now += 30.0
    assert s.redeem(late) is None


def test_bounded_oldest_first() -> None:
    clock = Clock()
    s = Sessions(clock, max_sessions=3)
    codes = [s.mint() for _ in range(4)]  # the first is dropped to keep 3
    assert s.redeem(codes[0]) is None
    sessions = [s.redeem(c) for c in codes[1:]]
    assert all(sessions)
    newest = s.redeem(s.mint())  # a fourth session drops the oldest
    assert newest is not None and s.valid(newest)
    assert [s.valid(x or "") for x in sessions] == [False, True, True]


def test_the_link_of_an_endpoint_on_every_interface_is_loopback() -> None:
    from deepboot.cli.dashboard import browser_base

    assert browser_base("http://0.0.0.0:8470") == "http://127.0.0.1:8470"
    assert browser_base("http://[::]:8470") == "http://[::1]:8470"
    assert browser_base("http://127.0.0.1:8470") == "http://127.0.0.1:8470"
    assert browser_base("http://10.1.2.3:80") == "http://10.1.2.3:80"
    assert browser_base("http://head.example:8470") == "http://head.example:8470"


def test_a_browser_is_opened_only_where_a_display_is() -> None:
    from deepboot.cli.dashboard import has_display

    assert has_display("darwin", {}) and has_display("win32", {})
    assert not has_display("linux", {})
    assert not has_display("linux", {"DISPLAY": ""})
    assert has_display("linux", {"DISPLAY": ":0"})
    assert has_display("linux", {"WAYLAND_DISPLAY": "wayland-0"})
