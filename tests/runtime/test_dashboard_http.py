"""The dashboard's routes on a real router (a real aiohttp server on a real socket,
a real SQLite store), without Ray: the one-time login and its cookie, every page
behind the cookie or the token, cross-site requests refused, the status document
with the router's live queues, the timeline image.

The whole page in a real browser, on a real cluster: tests/browser/.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from deepboot.core.service import ServiceSpec  # noqa: E402
from deepboot.runtime.http import router as rt  # noqa: E402
from deepboot.runtime.http.frontdoor import is_loopback  # noqa: E402
from deepboot.runtime.http.sessions import LOGIN_TTL_S  # noqa: E402
from deepboot.runtime.prometheus_metrics import Metrics  # noqa: E402
from deepboot.runtime.store.jobstore import GpuRow, JobStore  # noqa: E402
from deepboot.runtime.store.statedir import StateDir  # noqa: E402
from tests.runtime.test_front_door_http import TOKEN, send  # noqa: E402

pytestmark = pytest.mark.runtime

PAGES = (
    "/dashboard",
    "/dashboard/app.js",
    "/dashboard/style.css",
    "/dashboard/api/status",
    "/dashboard/api/timeline.png",
)


@pytest.fixture
def router(tmp_path: Path) -> Iterator[rt.Router]:
    state = StateDir.at(tmp_path / "state").ensure()
    store = JobStore(state.db)
    store.register_service(ServiceSpec("svc", "m", slo_wait_s=0.5, slo_target=0.9))
    with store.transaction() as db:
        store.save_gpus(
            db,
            [
                GpuRow("0.0", 0, 0, "training", "training", holder="job-a"),
                GpuRow("1.0", 1, 0, "inference", "lent", holder="job-a"),
                GpuRow("1.1", 1, 1, "inference", "sleep", service="svc", replica="r1"),
            ],
        )
    store.close()
    r = rt.Router(rt.Inbox(), Metrics(), token=TOKEN, state=state)
    r.start()
    r.set_services({"svc": ServiceSpec("svc", "m", queue_bound=4, request_timeout_s=30)})
    try:
        yield r
    finally:
        r.stop()


def login(router: rt.Router) -> str:
    """A one-time login path, minted with the token."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    code, _, answer = send(router.url, "/v1/dashboard/login", headers=headers)
    assert code == 200, answer
    assert answer["expires_in_s"] == LOGIN_TTL_S == 30
    path = answer["login"]
    assert re.fullmatch(r"/dashboard/login\?code=[0-9a-f]{64}", path), path
    return str(path)


def session_cookie(router: rt.Router) -> str:
    """Log in; the ``Cookie`` header value of the new session."""
    code, headers, _ = send(router.url, login(router), method="GET", headers={})
    assert code == 303 and headers["Location"] == "/dashboard"
    cookie = headers["Set-Cookie"]
    name = f"deepboot_dashboard_{router.port}"
    assert cookie.startswith(f"{name}=")
    flags = {f.strip().lower() for f in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/dashboard"} <= flags, cookie
    return cookie.split(";")[0]


def test_minting_a_login_needs_the_token(router: rt.Router) -> None:
    for headers in ({"Content-Type": "application/json"}, {"Authorization": "Bearer x"}):
        code, _, _ = send(router.url, "/v1/dashboard/login", headers=headers)
        assert code in (401, 415)
    # A page cannot mint one for itself: a foreign Origin is refused before the token.
    evil = {
        "Authorization": f"Bearer {TOKEN}",
        "Content-Type": "application/json",
        "Origin": "https://evil.example",
    }
    code, _, _ = send(router.url, "/v1/dashboard/login", headers=evil)
    assert code == 403


def test_every_page_needs_the_cookie_or_the_token_on_loopback(router: rt.Router) -> None:
    assert is_loopback(router.host)
    wrong = {"Cookie": f"deepboot_dashboard_{router.port}=" + "0" * 64}
    other_port = {"Cookie": session_cookie(router).replace(str(router.port), "1", 1)}
    for path in PAGES:
        for headers in ({}, wrong, other_port, {"Authorization": "Bearer nope"}):
            code, _, answer = send(router.url, path, method="GET", headers=headers)
            assert code == 401, (path, headers, code)
            assert "deepboot dashboard" in answer["error"]
    cookie = {"Cookie": session_cookie(router)}
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    for path in PAGES:
        for headers in (cookie, bearer):
            code, hdrs, _ = send(router.url, path, method="GET", headers=headers)
            assert code == 200, (path, headers, code)
            csp = hdrs["Content-Security-Policy"]
            assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
            assert hdrs["Cache-Control"] == "no-store"


def test_a_login_code_is_spent_once_and_expires(router: rt.Router) -> None:
    path = login(router)
    assert send(router.url, path, method="GET", headers={})[0] == 303
    code, _, text = send(router.url, path, method="GET", headers={})
    assert code == 401 and "spent or expired" in text
    assert send(router.url, "/dashboard/login?code=" + "ab" * 32, method="GET")[0] == 401
    assert send(router.url, "/dashboard/login", method="GET")[0] == 401
    late = login(router)
    assert router.dashboard is not None
    sessions = router.dashboard.sessions
    real = sessions.clock
    sessions.clock = lambda: real() + LOGIN_TTL_S + 1.0
    try:
        assert send(router.url, late, method="GET", headers={})[0] == 401
    finally:
        sessions.clock = real


@pytest.mark.parametrize("site", ["same-site", "cross-site"])
def test_cross_site_requests_are_refused_even_with_the_cookie(router: rt.Router, site: str) -> None:
    cookie = session_cookie(router)
    for path in PAGES:
        code, _, answer = send(
            router.url, path, method="GET", headers={"Cookie": cookie, "Sec-Fetch-Site": site}
        )
        assert code == 403, (path, code)
        code, _, _ = send(
            router.url,
            path,
            method="GET",
            headers={"Cookie": cookie, "Origin": "http://127.0.0.1:1"},
        )
        assert code == 403
    # The browser's own requests: a typed address, and the page's fetches.
    for site_ok in ("none", "same-origin"):
        code, _, _ = send(
            router.url,
            "/dashboard/api/status",
            method="GET",
            headers={"Cookie": cookie, "Sec-Fetch-Site": site_ok, "Origin": router.url},
        )
        assert code == 200


def test_status_is_the_status_document_with_live_queues(router: rt.Router) -> None:
    cookie = {"Cookie": session_cookie(router)}
    code, _, doc = send(router.url, "/dashboard/api/status", method="GET", headers=cookie)
    assert code == 200
    gpus = {g["gpu"]: (g["state"], g["holder"], g["service"]) for g in doc["gpus"]}
    assert gpus == {
        "0.0": ("training", "job-a", None),
        "1.0": ("lent", "job-a", None),
        "1.1": ("sleep", None, "svc"),
    }
    (svc,) = doc["services"]
    assert svc["name"] == "svc" and svc["live"] == {"queued": 0, "in_flight": 0}
    assert svc["slo"]["slo_wait_s"] == 0.5 and svc["slo"]["p99_wait_s"] is None
    assert doc["reclaims_last_hour"] == [] and doc["refresh_s"] > 0
    json.dumps(doc)  # plain JSON all through


def test_the_page_loads_nothing_from_elsewhere(router: rt.Router) -> None:
    cookie = {"Cookie": session_cookie(router)}
    code, _, page = send(router.url, "/dashboard", method="GET", headers=cookie)
    assert code == 200
    refs = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert refs and all(r.startswith("/dashboard") for r in refs), refs
    assert "<script>" not in page  # no inline script: the CSP allows only 'self'
    code, _, script = send(router.url, "/dashboard/app.js", method="GET", headers=cookie)
    assert code == 200 and "innerHTML" not in script and "://" not in script


def test_timeline_is_a_png(router: rt.Router) -> None:
    pytest.importorskip("matplotlib")
    cookie = {"Cookie": session_cookie(router)}
    code, headers, body = send(
        router.url, "/dashboard/api/timeline.png", method="GET", headers=cookie
    )
    assert code == 200 and headers["Content-Type"] == "image/png"
    assert isinstance(body, str) and body.startswith("\ufffdPNG")  # decoded loosely by send


def test_a_head_request_does_not_spend_the_login_code(router: rt.Router) -> None:
    path = login(router)
    code, _, _ = send(router.url, path, method="HEAD", headers={})
    assert code == 405
    code, headers, _ = send(router.url, path, method="GET", headers={})
    assert code == 303 and headers["Location"] == "/dashboard"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_drawing_at_a_time_and_a_failure_waits_its_turn(tmp_path: Path) -> None:
    from deepboot.runtime.http.frontdoor import Refused
    from deepboot.runtime.http.livedashboard import TIMELINE_EVERY_S, Dashboard

    clock, calls, fail = _Clock(), [], [False]

    def draw(root: Path) -> bytes:
        calls.append(root)
        if fail[0]:
            raise RuntimeError("no matplotlib")
        return b"png %d" % len(calls)

    state = StateDir.at(tmp_path / "state").ensure()
    board = Dashboard(state, 1234, dict, clock=clock, draw=draw)

    async def three_at_once() -> list[bytes]:
        return list(await asyncio.gather(*(board.timeline_png() for _ in range(3))))

    assert asyncio.run(three_at_once()) == [b"png 1"] * 3  # one drawing, shared
    clock.now += TIMELINE_EVERY_S - 1
    assert asyncio.run(board.timeline_png()) == b"png 1" and len(calls) == 1
    clock.now += 1
    fail[0] = True
    for _ in range(2):  # the failure is remembered: not drawn again at once
        with pytest.raises(Refused) as refused:
            asyncio.run(board.timeline_png())
        assert refused.value.status == 503
    assert len(calls) == 2
    fail[0] = False
    clock.now += TIMELINE_EVERY_S
    assert asyncio.run(board.timeline_png()) == b"png 3"


def test_a_client_that_leaves_does_not_cancel_the_drawing(tmp_path: Path) -> None:
    from deepboot.runtime.http.livedashboard import Dashboard

    started, release = threading.Event(), threading.Event()
    calls = []

    def draw(root: Path) -> bytes:
        calls.append(root)
        started.set()
        release.wait(30)
        return b"png"

    board = Dashboard(StateDir.at(tmp_path / "s").ensure(), 1234, dict, draw=draw)

    async def leave_then_ask() -> bytes:
        first = asyncio.ensure_future(board.timeline_png())
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)
        first.cancel()  # the client went away
        second = asyncio.ensure_future(board.timeline_png())
        release.set()
        return await second

    assert asyncio.run(leave_then_ask()) == b"png"
    assert len(calls) == 1
