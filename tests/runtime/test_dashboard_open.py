"""Issue 42, finding 6: ``deepboot dashboard`` never puts its one-time login URL in a
browser launcher's argv (``/proc/PID/cmdline`` is world-readable). It opens the
browser on a file in the state directory, mode 0600, that redirects to the URL, and
the login route takes that redirect (a ``file:`` page's navigation is cross-site).

The real command in a process of its own, against a real router (no Ray); its
browser is a recorder named by ``BROWSER`` (Python's webbrowser reads it), which
writes the argv it was started with. The code's life: test_dashboard_sessions.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from deepboot.runtime.http import router as rt  # noqa: E402
from deepboot.runtime.prometheus_metrics import Metrics  # noqa: E402
from deepboot.runtime.store.statedir import StateDir  # noqa: E402
from tests.runtime.test_front_door_http import send  # noqa: E402

pytestmark = pytest.mark.runtime

ROOT = Path(__file__).resolve().parents[2]
RECORDER = (
    "import json, os, sys\n"
    "with open(os.environ['DEEPBOOT_TEST_ARGV'], 'w') as f:\n"
    "    json.dump(sys.argv, f)\n"
)
# What a browser sends when a page (here a file: page, whose origin is opaque)
# navigates the tab: a cross-site top-level navigation.
NAVIGATION = {
    "Sec-Fetch-Site": "cross-site",
    "Sec-Fetch-Mode": "navigate",
    "Sec-Fetch-Dest": "document",
}


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[tuple[rt.Router, StateDir]]:
    """A router with the dashboard, recorded in its state directory as the controller
    records it (http.json, the token)."""
    state = StateDir.at(tmp_path / "state").ensure()
    token = state.ensure_http_token().read_text().strip()
    router = rt.Router(rt.Inbox(), Metrics(), token=token, state=state)
    router.start()
    router.write_address(state.http_file)
    try:
        yield router, state
    finally:
        router.stop()


def run_dashboard(state: StateDir, tmp_path: Path, *flags: str) -> tuple[str, list[str] | None]:
    """``deepboot dashboard`` with a display and the recorder for a browser: what it
    printed, and the argv the browser was started with (None: no browser)."""
    record = tmp_path / "browser-argv.json"
    recorder = tmp_path / "browser.py"
    recorder.write_text(RECORDER)
    env = dict(os.environ)
    env.pop("WAYLAND_DISPLAY", None)
    env.update(
        DISPLAY=":0",
        BROWSER=f"{shlex.quote(sys.executable)} {shlex.quote(str(recorder))} %s",
        DEEPBOOT_TEST_ARGV=str(record),
    )
    argv = [sys.executable, "-m", "deepboot.cli.main", "dashboard", "--state-dir", str(state.root)]
    done = subprocess.run(
        [*argv, *flags], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    opened = json.loads(record.read_text()) if record.exists() else None
    return done.stdout, opened


def test_the_browser_gets_a_private_file_never_the_code(
    controller: tuple[rt.Router, StateDir], tmp_path: Path
) -> None:
    router, state = controller
    out, argv = run_dashboard(state, tmp_path)
    url = out.splitlines()[0]  # printed to the user's terminal, as documented
    assert re.fullmatch(rf"{re.escape(router.url)}/dashboard/login\?code=[0-9a-f]{{64}}", url)
    code = url.rpartition("=")[2]
    assert argv is not None, "no browser was started"
    assert not any(code in arg for arg in argv), argv
    assert len(argv) == 2 and argv[1].startswith("file://"), argv
    page = Path(urllib.request.url2pathname(urlsplit(argv[1]).path))
    assert page.parent == state.root and page.suffix == ".html", page
    info = page.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid()
    text = page.read_text()
    assert f'<meta http-equiv="refresh" content="0; url={url}">' in text, text
    assert f"location.replace({json.dumps(url)})" in text, text
    assert "good for 30 seconds" in out, out
    # The page's navigation, as a browser makes it, logs in.
    status, headers, _ = send(router.url, url[len(router.url) :], "GET", headers=NAVIGATION)
    assert status == 200 and headers["Set-Cookie"].startswith(f"deepboot_dashboard_{router.port}=")


def test_a_cross_site_navigation_to_the_login_logs_in_through_a_same_origin_hop(
    controller: tuple[rt.Router, StateDir],
) -> None:
    router, state = controller
    token = state.http_token.read_text().strip()
    mint = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    status, _, answer = send(router.url, "/v1/dashboard/login", headers=mint)
    assert status == 200, answer
    login = answer["login"]
    # Not a navigation (an image, a fetch): refused, and the code is not spent.
    for dest in (
        {"Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"},
        {"Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"},
    ):
        status, _, _ = send(
            router.url, login, "GET", headers={"Sec-Fetch-Site": "cross-site", **dest}
        )
        assert status == 403, dest
    # The navigation: the cookie, and a page that goes on to /dashboard from the
    # endpoint's own origin (a redirect would keep the chain cross-site: refused,
    # and the strict cookie not sent).
    status, headers, page = send(router.url, login, "GET", headers=NAVIGATION)
    assert status == 200, page
    cookie = headers["Set-Cookie"]
    assert cookie.startswith(f"deepboot_dashboard_{router.port}=")
    assert '<meta http-equiv="refresh" content="0; url=/dashboard">' in page, page
    assert headers["Content-Security-Policy"].startswith("default-src 'none'")
    status, _, _ = send(
        router.url,
        "/dashboard",
        "GET",
        headers={"Cookie": cookie.split(";")[0], "Sec-Fetch-Site": "same-origin"},
    )
    assert status == 200
    # Spent: once only, whichever way it came.
    status, _, _ = send(router.url, login, "GET", headers=NAVIGATION)
    assert status == 401


def test_no_open_only_prints_the_link(
    controller: tuple[rt.Router, StateDir], tmp_path: Path
) -> None:
    router, state = controller
    out, argv = run_dashboard(state, tmp_path, "--no-open")
    assert argv is None
    assert out.splitlines()[0].startswith(f"{router.url}/dashboard/login?code=")
    assert not list(state.root.glob("*.html"))
