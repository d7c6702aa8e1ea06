"""The live dashboard the controller serves (``deepboot dashboard``; docs/runtime.md,
"Dashboard").

One page, ``/dashboard``, and the routes it reads, all on the controller's endpoint:

- ``POST /v1/dashboard/login`` (the bearer token, as every POST) mints a one-time
  login code, good for :data:`~deepboot.runtime.http.sessions.LOGIN_TTL_S`; ``deepboot
  dashboard`` prints (and opens) ``/dashboard/login?code=CODE``.
- ``GET /dashboard/login?code=CODE`` spends the code: it sets a session cookie
  (``HttpOnly; SameSite=Strict; Path=/dashboard``, named after the port, since
  cookies do not tell ports apart) and redirects to ``/dashboard``, so the code
  leaves the address bar. A spent, expired or unknown code is a 401. ``deepboot
  dashboard`` opens the browser on a page in the state directory that goes on to this
  URL (the code never in a process's argv); a ``file:`` page's origin is opaque, so
  its navigation is cross-site: this route takes a top-level navigation from any site
  (the code is the credential) and then answers a page that goes on to
  ``/dashboard`` from the endpoint's own origin (a redirect would keep the chain
  cross-site: refused below, and the strict cookie not sent).
- Every other ``/dashboard`` route (the page, its script and style, ``api/status``,
  ``api/timeline.png``) needs that cookie or the bearer token; with neither, 401.
  They are refused to cross-site requests: a foreign ``Origin`` (the front door's
  rule) and a ``Sec-Fetch-Site`` other than ``same-origin`` or ``none`` (a page on
  another port of this host is *same-site*, and would carry a strict cookie).

The page is static HTML, CSS and a small script (``deepboot/runtime/http/dashboard_static``,
nothing loaded from elsewhere; a Content-Security-Policy of ``'self'`` says so to the
browser). The script polls ``api/status`` every :data:`REFRESH_S` seconds: the status
document (:func:`~deepboot.runtime.client.statusdoc.status_document`) plus the router's live
queues, and the last hour's reclaims from the event log; the timeline image is
``deepboot timeline --last 3600``'s (matplotlib, in a process of its own), redrawn at
most every :data:`TIMELINE_EVERY_S`.

Sessions live in the controller's memory: a restarted controller forgets them, and
``deepboot dashboard`` logs in again.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from deepboot.runtime.client.statusdoc import status_document
from deepboot.runtime.http.frontdoor import Refused
from deepboot.runtime.http.sessions import Sessions
from deepboot.runtime.store.jobstore import JobStore, LogKind
from deepboot.runtime.store.statedir import StateDir

log = logging.getLogger("deepboot.router")

REFRESH_S = 3.0
"""How often the page asks for the status."""
TIMELINE_EVERY_S = 30.0
"""The timeline image is redrawn at most this often (a drawing costs a process start
and matplotlib's import: 1.2 s wall, 1.05 s of CPU, measured on a 2-core machine)."""
DRAW_TIMEOUT_S = 60.0
"""The longest a drawing may take."""
TIMELINE_SPAN_S = 3600.0
"""The timeline shows the last hour."""
LOGIN_PATH = "/dashboard/login"
LOGIN_API = "/v1/dashboard/login"

_STATIC = {
    "/dashboard": ("index.html", "text/html"),
    "/dashboard/app.js": ("app.js", "text/javascript"),
    "/dashboard/style.css": ("style.css", "text/css"),
}
_HEADERS = {
    # Nothing from elsewhere, no inline script, never framed, the code in the login
    # URL never sent on as a Referer.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


_HOP_PAGE = """<!doctype html>
<html><head><meta charset="utf-8">
<meta http-equiv="refresh" content="0; url=/dashboard">
<title>deepboot dashboard</title></head>
<body><p>Logged in: <a href="/dashboard">open the dashboard</a>.</p></body></html>
"""


def _cross_site(request: web.Request) -> bool:
    return request.headers.get("Sec-Fetch-Site", "none") not in ("same-origin", "none")


def _top_level_navigation(request: web.Request) -> bool:
    """A browser's navigation of a whole tab (not a frame, an image or a fetch)."""
    headers = request.headers
    return (
        headers.get("Sec-Fetch-Mode") == "navigate" and headers.get("Sec-Fetch-Dest") == "document"
    )


@dataclass
class _Drawn:
    """The timeline image last drawn, and when (the dashboard's clock); ``png`` None:
    that drawing failed (it is not tried again before :data:`TIMELINE_EVERY_S`)."""

    at: float
    png: bytes | None


class Dashboard:
    """The dashboard's routes, on the router's aiohttp application.

    Args:
        state: The controller's state directory (the store and its event log).
        port: The endpoint's port (names the cookie).
        live: Called on the router's loop: each service's ``queued`` and
            ``in_flight`` requests now.
        clock: Monotonic seconds (injected; the sessions' and the image's).
        draw: Draws the timeline of a state directory as a PNG, raising
            RuntimeError when it cannot (:func:`draw_timeline`; injected for tests).
    """

    def __init__(
        self,
        state: StateDir,
        port: int,
        live: Callable[[], Mapping[str, Mapping[str, int]]],
        clock: Callable[[], float] = time.monotonic,
        draw: Callable[[Path], bytes] | None = None,
    ) -> None:
        self.state = state
        self.port = port
        self.live = live
        self.clock = clock
        self.draw = draw if draw is not None else draw_timeline
        self.sessions = Sessions(clock)
        self._drawn: _Drawn | None = None
        self._drawing: asyncio.Task[_Drawn] | None = None

    @property
    def cookie(self) -> str:
        """The session cookie's name (one per port: cookies ignore ports)."""
        return f"deepboot_dashboard_{self.port}"

    # -- access (the front door asks) --------------------------------------------------

    @staticmethod
    def covers(path: str) -> bool:
        """``path`` is one of the dashboard's pages (not its login API)."""
        return path == "/dashboard" or path.startswith("/dashboard/")

    def cross_site(self, request: web.Request) -> bool:
        """A request another site (another port of this host included) made, except a
        top-level navigation to the login route (its code is the credential; the page
        ``deepboot dashboard`` opens is a ``file:`` page, cross-site to every origin)."""
        if request.path == LOGIN_PATH and _top_level_navigation(request):
            return False
        return _cross_site(request)

    def allowed(self, request: web.Request) -> bool:
        """The login route (its code is the credential), or a live session cookie."""
        if request.path == LOGIN_PATH:
            return True
        session = request.cookies.get(self.cookie)
        return session is not None and self.sessions.valid(session)

    # -- routes ----------------------------------------------------------------------------

    def add_routes(self, app: web.Application) -> None:
        """Add the dashboard's routes to ``app``."""
        app.router.add_post(LOGIN_API, self._mint)
        # GET only: a link checker's HEAD must not spend the one-time code.
        app.router.add_get(LOGIN_PATH, self._login, allow_head=False)
        for path in _STATIC:
            app.router.add_get(path, self._static)
        app.router.add_get("/dashboard/api/status", self._status)
        app.router.add_get("/dashboard/api/timeline.png", self._timeline)

    async def _mint(self, request: web.Request) -> web.Response:
        code = self.sessions.mint()
        return web.json_response(
            {"login": f"{LOGIN_PATH}?code={code}", "expires_in_s": self.sessions.login_ttl_s},
            headers={"Cache-Control": "no-store"},
        )

    async def _login(self, request: web.Request) -> web.Response:
        session = self.sessions.redeem(request.query.get("code", ""))
        if session is None:
            return web.Response(
                status=401,
                text="This login link is spent or expired: run 'deepboot dashboard' for a "
                "new one.\n",
                headers=_HEADERS,
            )
        if _cross_site(request):
            # A navigation from another site (the file deepboot dashboard opened): a
            # redirect would leave the chain cross-site, so /dashboard would be refused
            # and the strict cookie not sent; this page's own navigation is same-origin.
            response = web.Response(
                status=200, text=_HOP_PAGE, content_type="text/html", headers=_HEADERS
            )
        else:
            response = web.Response(status=303, headers={**_HEADERS, "Location": "/dashboard"})
        response.set_cookie(
            self.cookie,
            session,
            path="/dashboard",
            httponly=True,
            samesite="Strict",
            max_age=int(self.sessions.session_ttl_s),
        )
        return response

    async def _static(self, request: web.Request) -> web.Response:
        name, kind = _STATIC[request.path]
        body = (
            resources.files("deepboot.runtime.http").joinpath("dashboard_static", name).read_bytes()
        )
        return web.Response(body=body, content_type=kind, headers=_HEADERS)

    async def _status(self, request: web.Request) -> web.Response:
        live = self.live()  # on the loop: the router's own state
        loop = asyncio.get_running_loop()
        doc = await loop.run_in_executor(None, self._document)
        for service in doc["services"]:
            service["live"] = dict(live.get(service["name"], {}))
        doc["refresh_s"] = REFRESH_S
        return web.json_response(doc, headers=_HEADERS)

    def _document(self) -> dict[str, Any]:
        doc = status_document(self.state)
        doc["reclaims_last_hour"] = recent_reclaims(self.state, time.time())
        return doc

    async def _timeline(self, request: web.Request) -> web.Response:
        png = await self.timeline_png()
        return web.Response(body=png, content_type="image/png", headers=_HEADERS)

    async def timeline_png(self) -> bytes:
        """The last hour's timeline: the image drawn less than :data:`TIMELINE_EVERY_S`
        ago, else a new one. At most one drawing runs at a time, and a request whose
        client goes away does not cancel it (the others wait for the same one).

        Raises:
            Refused: 503, the last drawing failed (less than TIMELINE_EVERY_S ago).
        """
        drawn = self._drawn
        if drawn is None or self.clock() - drawn.at >= TIMELINE_EVERY_S:
            if self._drawing is None:
                self._drawing = asyncio.get_running_loop().create_task(self._draw())
            drawn = await asyncio.shield(self._drawing)
        if drawn.png is None:
            raise Refused(503, "the timeline could not be drawn (see the log)")
        return drawn.png

    async def _draw(self) -> _Drawn:
        loop = asyncio.get_running_loop()
        png: bytes | None
        try:
            png = await loop.run_in_executor(None, self.draw, self.state.root)
        except RuntimeError as exc:
            log.warning("dashboard timeline: %s", exc)
            png = None
        finally:
            self._drawing = None
        self._drawn = _Drawn(self.clock(), png)
        return self._drawn


def draw_timeline(state_dir: Path, span_s: float = TIMELINE_SPAN_S) -> bytes:
    """The last ``span_s`` of the event log's timeline as a PNG, drawn by ``deepboot
    timeline --last`` in a process of its own: the figure is the report layer's,
    which the runtime does not import (DESIGN.md's layers), and a slow drawing never
    holds the controller's GIL.

    Raises:
        RuntimeError: the command failed or ran past :data:`DRAW_TIMEOUT_S` (its
            error's last line).
    """
    with tempfile.TemporaryDirectory(prefix="deepboot-dashboard-") as tmp:
        out = Path(tmp) / "timeline.png"
        argv = [sys.executable, "-m", "deepboot.cli.main", "timeline", str(state_dir)]
        argv += ["--last", f"{span_s:g}", "--title", "The last hour", "--out", str(out)]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=DRAW_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"deepboot timeline ran past {DRAW_TIMEOUT_S:g} s") from None
        if done.returncode != 0 or not out.is_file():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"deepboot timeline failed ({done.returncode}): {last}")
        return out.read_bytes()


def recent_reclaims(
    state: StateDir, now: float, span_s: float = TIMELINE_SPAN_S
) -> list[dict[str, Any]]:
    """The event log's reclaims of lent GPUs over the ``span_s`` before ``now`` (Unix
    seconds), newest first: ``{"ago_s", "job", "gpu", "proactive"}``."""
    store = JobStore(state.db)
    try:
        rows = store.events(since=now - span_s)
    finally:
        store.close()
    out = [
        {
            "ago_s": round(max(now - e.time, 0.0), 1),
            "job": e.job,
            "gpu": str(e.detail.get("gpu", "")),
            "proactive": bool(e.detail.get("proactive")),
        }
        for e in rows
        if e.kind is LogKind.GPU and e.detail.get("op") == "reclaim"
    ]
    out.reverse()
    return out
