"""The CLI's side of the controller's HTTP endpoint: the bearer token goes only to the
controller that STATE_DIR/http.json records, once its ``GET /healthz`` has echoed
http.json's ``instance``.

A stale http.json (the controller is gone) may point at a port someone else took: a
*squatter*, here a small stdlib HTTP server in a thread that records every request.
It must never see an ``Authorization`` header. No Ray, no aiohttp: these run in the
default suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from deepboot.runtime.client.endpoint import healthz_proof
from tests.cli_helpers import assert_one_line_error, run_cli, write_state_dir

TOKEN = "s3cret-token"
INSTANCE = "0123456789abcdef"
EXAMPLE_SERVICE = Path(__file__).resolve().parents[2] / "examples" / "runtime" / "echo.toml"


class _Server:
    """An HTTP server on loopback that records (method, path, headers) of every request.

    ``health``: what ``GET /healthz`` answers: "ok" (``{"ok": true, "instance":
    INSTANCE, "proof": ...}``, the proof computed with TOKEN), "replay" (INSTANCE, as a
    squatter that learnt it from the live controller's /healthz, but no proof: it
    has no token), "forged" (INSTANCE and a proof made with another token), "other"
    (another instance id), "none" (no instance), "404", "slow" (nothing until the
    server stops). Recorded paths leave out the query string. ``GET /redirect``
    answers 302 to ``redirect_to``. Every other request gets 200 with a JSON body that
    pleases the CLI.
    """

    def __init__(self, health: str) -> None:
        self.health = health
        self.redirect_to = ""
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            # Keep-alive, as the controller's: the token travels only on a connection
            # that proved itself, so an endpoint that closes each one cannot get it.
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _answer(self, status: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _record(self) -> None:
                path = urlsplit(self.path).path
                server.requests.append((self.command, path, dict(self.headers.items())))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)

            def do_GET(self) -> None:
                self._record()
                url = urlsplit(self.path)
                challenge = parse_qs(url.query).get("challenge", [""])[0]
                if url.path == "/healthz":
                    if server.health == "slow":
                        server.stopping.wait(60)
                        self._answer(200, {"ok": True, "instance": INSTANCE})
                    elif server.health == "404":
                        self._answer(404, {"error": "not found"})
                    elif server.health == "none":
                        self._answer(200, {"ok": True})
                    elif server.health == "replay":
                        self._answer(200, {"ok": True, "instance": INSTANCE})
                    elif server.health == "forged":
                        proof = healthz_proof("not-" + TOKEN, challenge)
                        self._answer(200, {"ok": True, "instance": INSTANCE, "proof": proof})
                    elif server.health == "other":
                        self._answer(200, {"ok": True, "instance": "f" * 16})
                    else:
                        proof = healthz_proof(TOKEN, challenge)
                        self._answer(200, {"ok": True, "instance": INSTANCE, "proof": proof})
                elif url.path == "/v1/services":
                    self._answer(200, [{"service": "echo"}])
                elif url.path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", server.redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self._answer(404, {"error": "not found"})

            def do_POST(self) -> None:
                self._record()
                self._answer(200, {"ok": True})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def authorized(self) -> list[str]:
        """Paths of the requests that carried an Authorization header."""
        return [p for _, p, h in self.requests if any(k.lower() == "authorization" for k in h)]

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


@pytest.fixture
def squatter(request: pytest.FixtureRequest) -> Iterator[_Server]:
    s = _Server(getattr(request, "param", "other"))
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def controller() -> Iterator[_Server]:
    """An endpoint that answers as this state directory's controller would."""
    s = _Server("ok")
    try:
        yield s
    finally:
        s.stop()


def _state(tmp_path: Path, url: str, auth: bool = True, instance: str | None = INSTANCE) -> Path:
    """A state directory whose http.json records ``url`` (and ``instance``)."""
    host, port = url.rsplit(":", 1)
    info: dict[str, object] = {"url": url, "host": host[7:], "port": int(port), "auth": auth}
    if instance is not None:
        info["instance"] = instance
    return write_state_dir(tmp_path / "state", info, TOKEN)


def _profile(tmp_path: Path) -> Path:
    path = tmp_path / "profile.csv"
    path.write_text("time_s,rps\n0,10\n0.2,0\n")
    return path


def _load(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, state: Path, out: Path
) -> tuple[int, str, str]:
    """``deepboot load echo`` (2 requests) with the endpoint of ``state``'s http.json."""
    argv = ["load", "echo", "--rate-profile", str(_profile(tmp_path)), "--out", str(out)]
    return run_cli(capsys, *argv, "--state-dir", str(state))


def _dead_url() -> str:
    """The URL of a loopback port nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("squatter", ["other", "replay", "forged", "none", "404"], indirect=True)
def test_load_never_sends_the_token_to_a_squatter(
    squatter: _Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _state(tmp_path, squatter.url)
    out = tmp_path / "out.csv"
    code, _, err = _load(capsys, tmp_path, state, out)
    assert squatter.authorized() == []
    assert code == 2
    assert_one_line_error(err, squatter.url, "not sent")
    assert not out.exists()
    assert [p for _, p, _ in squatter.requests] == ["/healthz"]


def test_load_refuses_an_endpoint_that_does_not_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _dead_url()
    state = _state(tmp_path, url)
    out = tmp_path / "out.csv"
    code, _, err = _load(capsys, tmp_path, state, out)
    assert code == 2
    assert_one_line_error(err, url, "not sent")
    assert not out.exists()


@pytest.fixture
def fake_controller(tmp_path: Path) -> Iterator[int]:
    """A process whose command line names deepboot's controller (what
    ``controller_alive`` looks for), so that the CLI believes one runs."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(120)",
            "deepboot.runtime.controller_process",
        ],
        stdin=subprocess.DEVNULL,
    )
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_serve_never_sends_the_token_to_a_squatter(
    squatter: _Server, fake_controller: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from deepboot.runtime.store.jobstore import JobStore

    state = _state(tmp_path, squatter.url)
    (state / "controller.pid").write_text(str(fake_controller))
    JobStore(state / "deepboot.db").close()
    code, _, err = run_cli(capsys, "serve", str(EXAMPLE_SERVICE), "--state-dir", str(state))
    assert squatter.authorized() == []
    assert code == 2
    assert_one_line_error(err, squatter.url, "not sent")


# -- the helper itself ------------------------------------------------------------------


def test_connect_checks_the_instance_then_requests_carry_the_token(
    controller: _Server, tmp_path: Path
) -> None:
    from deepboot.runtime.client.endpoint import connect
    from deepboot.runtime.store.statedir import StateDir

    endpoint = connect(StateDir.at(_state(tmp_path, controller.url, auth=False)))
    assert (endpoint.url, endpoint.token, endpoint.instance) == (controller.url, TOKEN, INSTANCE)
    assert endpoint.get_json("/v1/services") == [{"service": "echo"}]
    assert [(p, h.get("Authorization")) for _, p, h in controller.requests] == [
        ("/healthz", None),
        ("/v1/services", f"Bearer {TOKEN}"),
    ]


@pytest.mark.parametrize("squatter", ["other", "replay", "forged", "none", "404"], indirect=True)
def test_connect_refuses_a_squatter_without_sending_the_token(
    squatter: _Server, tmp_path: Path
) -> None:
    from deepboot.runtime.client.endpoint import EndpointError, connect
    from deepboot.runtime.store.statedir import StateDir

    with pytest.raises(EndpointError, match="the bearer token was not sent") as info:
        connect(StateDir.at(_state(tmp_path, squatter.url)))
    assert squatter.url in str(info.value)
    assert squatter.authorized() == []


@pytest.mark.parametrize("squatter", ["slow"], indirect=True)
def test_connect_gives_up_on_an_endpoint_that_does_not_answer_in_time(
    squatter: _Server, tmp_path: Path
) -> None:
    from deepboot.runtime.client.endpoint import EndpointError, connect
    from deepboot.runtime.store.statedir import StateDir

    with pytest.raises(EndpointError, match=r"did not answer GET /healthz within 0\.3 s"):
        connect(StateDir.at(_state(tmp_path, squatter.url)), timeout=0.3)
    assert squatter.authorized() == []


def test_http_json_errors_name_the_file_and_the_key(tmp_path: Path) -> None:
    from deepboot.core.errors import InputError
    from deepboot.runtime.client.endpoint import EndpointError, connect
    from deepboot.runtime.store.statedir import StateDir

    state = StateDir.at(tmp_path / "s")
    state.ensure()
    with pytest.raises(EndpointError, match="no HTTP endpoint recorded in .*http.json"):
        connect(state)
    cases = [
        ("{not json", "", "not JSON"),
        ("[1]", "", "not the endpoint record"),
        ('{"instance": "ab"}', "url", "missing"),
        ('{"url": "localhost:80", "instance": "ab"}', "url", "must look like"),
        ('{"url": "http://127.0.0.1:1"}', "instance", "deepboot up"),
        ('{"url": "http://127.0.0.1:1", "instance": "a b"}', "instance", "malformed"),
    ]
    for text, key, words in cases:
        state.http_file.write_text(text)
        with pytest.raises(InputError) as info:
            connect(state)
        assert (info.value.path, info.value.field) == (str(state.http_file), key), text
        assert words in str(info.value), text


def test_requests_follow_no_proxy_and_no_redirect(
    controller: _Server, squatter: _Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy would see the token, and urllib carries it along a redirect."""
    import urllib.error

    from deepboot.runtime.client.endpoint import connect
    from deepboot.runtime.store.statedir import StateDir

    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(var, squatter.url)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    endpoint = connect(StateDir.at(_state(tmp_path, controller.url)))
    controller.redirect_to = squatter.url + "/v1/services"
    with pytest.raises(urllib.error.HTTPError) as info:
        endpoint.get_json("/redirect")
    assert info.value.code == 302
    info.value.close()
    assert endpoint.get_json("/v1/services") == [{"service": "echo"}]
    assert squatter.requests == []


def test_serve_asks_a_checked_endpoint_with_the_token(
    controller: _Server, fake_controller: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from deepboot.runtime.store.jobstore import JobStore

    state = _state(tmp_path, controller.url, auth=False)
    (state / "controller.pid").write_text(str(fake_controller))
    JobStore(state / "deepboot.db").close()
    code, out, err = run_cli(capsys, "serve", str(EXAMPLE_SERVICE), "--state-dir", str(state))
    assert code == 0, err
    assert f"{controller.url}/v1/echo/infer" in " ".join(out.split())
    assert controller.authorized() == ["/v1/services"]


def test_urllibs_own_timeout_is_no_answer_in_time() -> None:
    """urllib's timeout has the deadline's length and can fire just before the join
    ends (CI, 2cd965b): that is "no answer in time", not "does not speak HTTP"."""
    import urllib.error

    from deepboot.runtime.client.healthprobe import timed_out as _timed_out

    assert _timed_out(TimeoutError("timed out"))
    assert _timed_out(urllib.error.URLError(TimeoutError("timed out")))
    assert not _timed_out(urllib.error.URLError(ConnectionRefusedError(111, "refused")))
    assert not _timed_out(ValueError("not JSON"))
