"""The dashboard's login codes and sessions (deepboot.runtime.http.sessions): one-time,
short-lived, bounded in number; the clock is injected. And what ``deepboot dashboard``
does with the link (deepboot.cli.dashboard) that needs no endpoint."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from deepboot.runtime.http.sessions import Sessions


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


def test_a_login_code_lives_30_seconds() -> None:
    from deepboot.runtime.http.sessions import LOGIN_TTL_S

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


URL = "http://127.0.0.1:8470/dashboard/login?code=" + "c0de" * 16


def test_the_browser_is_given_a_private_page_never_the_code(tmp_path: Path) -> None:
    """Issue 42, finding 6: the opener (a browser launcher) gets the page's file: URL;
    the page, mode 0600 in the state directory, goes on to the login URL. The whole
    command against a real endpoint and a real launcher: test_dashboard_open.py."""
    from deepboot.cli.dashboard import open_login_page

    opened: list[str] = []
    page = open_login_page(tmp_path, URL, opened.append)
    assert opened == [page.as_uri()] and "c0de" not in opened[0]
    assert page.parent == tmp_path and stat.S_IMODE(page.stat().st_mode) == 0o600
    text = page.read_text()
    assert f'<meta http-equiv="refresh" content="0; url={URL}">' in text
    assert f'location.replace("{URL}")' in text


def test_earlier_login_pages_go_once_their_codes_are_dead(tmp_path: Path) -> None:
    from deepboot.cli.dashboard import write_login_page
    from deepboot.runtime.http.sessions import LOGIN_TTL_S

    first = write_login_page(tmp_path, URL)
    born = first.stat().st_mtime
    second = write_login_page(tmp_path, URL, now=born + LOGIN_TTL_S)  # first still live
    assert first.exists() and second != first
    os.utime(second, (born + LOGIN_TTL_S, born + LOGIN_TTL_S))  # written that late
    third = write_login_page(tmp_path, URL, now=born + LOGIN_TTL_S + 1)
    assert not first.exists() and second.exists() and third.exists()
    (tmp_path / "other.html").write_text("kept")
    write_login_page(tmp_path, URL, now=born + 10 * LOGIN_TTL_S)
    assert (tmp_path / "other.html").exists()
    assert len(list(tmp_path.glob("dashboard-login-*.html"))) == 1
