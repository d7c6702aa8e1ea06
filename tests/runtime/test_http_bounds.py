"""Bounded logs and connections at the endpoint (issue 42, findings 3, 4 and 8).

A real aiohttp server on a real socket, in its own thread, as in the controller (the
router alone, without Ray, as tests/runtime/test_front_door_http.py builds it); raw
sockets for what no HTTP client sends: malformed requests, half-sent heads,
connections that send nothing.
"""

from __future__ import annotations

import asyncio
import errno
import http.client
import inspect
import json
import logging
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from aiohttp import web  # noqa: E402

from deepboot.runtime.http import connbounds as httpbounds  # noqa: E402
from deepboot.runtime.http import router as rt  # noqa: E402
from deepboot.runtime.logbounds import configure  # noqa: E402
from deepboot.runtime.messages import Inbox  # noqa: E402
from deepboot.runtime.prometheus_metrics import Metrics  # noqa: E402

pytestmark = pytest.mark.runtime

TOKEN = "f00d" * 16

# What aiohttp's parser refuses before any handler runs. The long request line is what
# a web page can make a browser send (a long URL).
MALFORMED = {
    "duplicate-host": b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "content-length--1": b"POST /v1/jobs HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
    "content-length-2^64": (
        b"POST /v1/jobs HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551616\r\n\r\n"
    ),
    "long-request-line": b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: a\r\n\r\n",
    "long-header": b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n",
}


def exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` on a new connection; everything the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            out += chunk
        return out


def healthz(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/healthz")
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def controller_logging(path: Path) -> logging.Handler:
    """The controller's log on ``path``, set up as the controller sets it up (without
    taking this process's descriptors 1 and 2)."""
    return configure(path, std_fds=False)


@pytest.fixture
def router() -> Iterator[rt.Router]:
    r = rt.Router(Inbox(), Metrics(), token=TOKEN)
    r.start()
    try:
        yield r
    finally:
        r.stop()


def test_a_thousand_malformed_requests_add_at_most_ten_lines(tmp_path: Path) -> None:
    path = tmp_path / "controller.log"
    root = logging.getLogger()
    level = root.level
    handler = controller_logging(path)
    r = rt.Router(Inbox(), Metrics(), token=TOKEN)
    try:
        r.start()
        handler.flush()
        before = path.stat().st_size
        kinds = list(MALFORMED.values())
        for i in range(1000):
            answer = exchange(r.port, kinds[i % len(kinds)])
            assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n")[0]
        handler.flush()
        added = path.read_bytes()[before:]
    finally:
        r.stop()
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()
    lines = added.count(b"\n")
    assert lines <= 10 and len(added) <= 8192, (
        f"1,000 malformed requests added {lines} lines, {len(added)} bytes to the log; "
        f"it begins: {added[:600]!r}"
    )
    # What it says: one line, at WARNING, naming the peer; no traceback.
    assert b"WARNING" in added and b"127.0.0.1" in added and b"Traceback" not in added, added


def test_half_open_connections_are_closed_while_healthz_answers() -> None:
    header_timeout = 1.0
    r = rt.Router(
        Inbox(), Metrics(), token=TOKEN, header_timeout_s=header_timeout, idle_timeout_s=2.0
    )
    r.start()
    opened: dict[int, tuple[socket.socket, float]] = {}
    try:
        for i in range(500):
            s = socket.create_connection(("127.0.0.1", r.port), timeout=10)
            if i < 300:  # a head cut short
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            # the other 200 send nothing at all
            s.setblocking(False)
            opened[s.fileno()] = (s, time.monotonic())
        poller = select.poll()
        for fd in opened:
            poller.register(fd, select.POLLIN)
        limit = header_timeout + 5.0  # the stated timeout plus 5 s, each from its own start
        answers = 0
        while opened:
            assert healthz(r.port) == 200
            answers += 1
            for fd, _ in poller.poll(200):
                s, _ = opened[fd]
                try:
                    closed = s.recv(65536) == b""
                except BlockingIOError:
                    closed = False
                except OSError as exc:
                    closed = exc.errno in (errno.ECONNRESET, errno.EPIPE)
                if closed:
                    poller.unregister(fd)
                    del opened[fd]
                    s.close()
            now = time.monotonic()
            late = [t for _, t in opened.values() if now - t > limit]
            assert not late, (
                f"{len(late)} of 500 half-open connections still open {limit:g} s after "
                f"they opened ({len(opened)} open in all; /healthz answered {answers} times)"
            )
        assert answers > 0
    finally:
        for s, _ in opened.values():
            s.close()
        r.stop()


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_parser_errors_answer_one_line_json(router: rt.Router, kind: str) -> None:
    answer = exchange(router.port, MALFORMED[kind])
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    assert status_line.split()[1] == "400", answer[:300]
    assert headers.get("content-type", "").startswith("application/json"), answer[:300]
    assert body.count(b"\n") == 0, body  # one line
    doc = json.loads(body)
    assert isinstance(doc["error"], str) and doc["error"], doc
    assert "id" in doc, doc
    # None of the input comes back.
    for echoed in (b"aaaaaaaa", b"bbbbbbbb", b"18446744073709551616", b"-1"):
        assert echoed not in body, body


def read_until_closed(s: socket.socket, within: float) -> tuple[bytes, bool]:
    """What the server sends on ``s`` until it closes it (True) or ``within`` s pass."""
    s.setblocking(False)
    out, deadline = b"", time.monotonic() + within
    while time.monotonic() < deadline:
        ready, _, _ = select.select([s], [], [], 0.1)
        if not ready:
            continue
        try:
            chunk = s.recv(65536)
        except BlockingIOError:
            continue
        except ConnectionResetError:
            return out, True
        if not chunk:
            return out, True
        out += chunk
    return out, False


def json_line(answer: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), answer
    assert b"\n" not in body, body
    return int(head.split()[1]), json.loads(body)


def test_a_head_cut_short_is_answered_408_and_closed() -> None:
    r = rt.Router(Inbox(), Metrics(), token=TOKEN, header_timeout_s=0.5, idle_timeout_s=30)
    r.start()
    try:
        with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            answer, closed = read_until_closed(s, 0.5 + 5)
        assert closed, answer
        status, doc = json_line(answer)
        assert status == 408 and "0.5 s" in str(doc["error"]), doc
    finally:
        r.stop()


def test_the_header_timeout_spares_slow_bodies_and_idle_gaps() -> None:
    """The header-read timeout stops once a head is complete (a body may take longer:
    its route's own bound applies) and starts again only with a later request's first
    byte (a kept-alive connection may wait for its idle timeout)."""
    registered: list[dict[str, object]] = []

    def register(raw: dict[str, object]) -> str:
        registered.append(raw)
        return "x"

    r = rt.Router(
        Inbox(), Metrics(), token=TOKEN, register=register, header_timeout_s=0.5,
        idle_timeout_s=30,
    )  # fmt: skip
    r.start()
    try:
        body = json.dumps({"name": "x"}).encode()
        head = (
            "POST /v1/services HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
            s.sendall(head + body[:3])
            time.sleep(1.5)  # 3x the header timeout, in the body
            s.sendall(body[3:])
            f = s.makefile("rb")
            assert f.readline().split()[1] == b"201"
            length = 0
            while (line := f.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            f.read(length)
            time.sleep(1.5)  # kept alive, idle: 3x the header timeout
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert f.readline().split()[1] == b"200"
        assert registered == [{"name": "x"}]
    finally:
        r.stop()


def test_an_idle_kept_alive_connection_is_closed() -> None:
    idle = 1.0
    r = rt.Router(Inbox(), Metrics(), token=TOKEN, header_timeout_s=30, idle_timeout_s=idle)
    r.start()
    try:
        with socket.create_connection(("127.0.0.1", r.port), timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer, closed = read_until_closed(s, idle + 5)
        assert closed and answer.startswith(b"HTTP/1.1 200"), answer[:200]
    finally:
        r.stop()


def test_connections_beyond_the_bound_are_answered_503_and_closed() -> None:
    r = rt.Router(Inbox(), Metrics(), token=TOKEN, max_connections=5)
    r.start()
    held = [socket.create_connection(("127.0.0.1", r.port), timeout=10) for _ in range(5)]
    try:
        with socket.create_connection(("127.0.0.1", r.port), timeout=10) as extra:
            answer, closed = read_until_closed(extra, 5)
        assert closed, answer
        status, doc = json_line(answer)
        assert status == 503 and "too many connections" in str(doc["error"]), doc
        held.pop().close()
        deadline = time.monotonic() + 5  # the server sees the close (polled)
        while True:
            try:
                if healthz(r.port) == 200:
                    break
            except (http.client.HTTPException, OSError):
                pass
            assert time.monotonic() < deadline, "a freed place was not given to a new connection"
            time.sleep(0.05)
    finally:
        for s in held:
            s.close()
        r.stop()


def test_aiohttp_still_has_what_the_bounds_hang_on() -> None:
    """deepboot.runtime.http.connbounds subclasses aiohttp's request handler: its constructor
    must take the arguments given, and aiohttp must still call ``handle_error`` (the
    JSON answers above) and ``log_exception`` as they are overridden."""
    params = list(inspect.signature(web.RequestHandler.handle_error).parameters)
    assert params == ["self", "request", "status", "exc", "message"], params
    assert list(inspect.signature(web.RequestHandler.log_exception).parameters) == [
        "self", "args", "kw",
    ]  # fmt: skip
    accepted = inspect.signature(web.RequestHandler.__init__).parameters
    kwargs = httpbounds.handler_kwargs(httpbounds.ConnectionBounds())
    assert set(kwargs) <= set(accepted), set(kwargs) - set(accepted)

    async def build() -> None:
        async def answer(request: web.BaseRequest) -> web.StreamResponse:
            return web.Response()

        bounds = httpbounds.ConnectionBounds()
        handler = httpbounds.BoundedHandler(
            web.Server(answer),
            httpbounds.new_state(bounds),
            loop=asyncio.get_running_loop(),
            **httpbounds.handler_kwargs(bounds),
        )
        assert handler.keepalive_timeout == httpbounds.IDLE_TIMEOUT_S

    asyncio.run(build())
