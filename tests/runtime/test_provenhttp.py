"""The proven-connection clients (issue 42, finding 2): the token goes only on a TCP
connection that proved, on itself, that its peer holds the token.

:mod:`deepboot.runtime.client.provenhttp` (``deepboot load``'s pool and its HTTP/1.1 parser)
and :class:`deepboot.runtime.client.endpoint.Endpoint` (the sync client), in-process,
against :class:`Peer`: a raw-socket HTTP/1.1 server in a thread that records every
connection's requests in order. No aiohttp, no Ray: these run in the default suite.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import pytest

from deepboot.runtime.client.endpoint import Endpoint, EndpointError, healthz_proof, prove
from deepboot.runtime.client.http1wire import read_answer as _read_answer
from deepboot.runtime.client.provenhttp import (
    MAX_HEADERS,
    ProofFailed,
    ProtocolError,
    ProvenPool,
    Target,
)

TOKEN = "b0a7" * 16
INSTANCE = "abad1dea" * 2
WAIT_S = 10.0  # the most any step here waits (a bound, never a measurement)


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def authorized(self) -> bool:
        return any(k.lower() == "authorization" for k in self.headers)


@dataclass
class Conn:
    """One accepted connection: its requests in order, and its socket."""

    sock: socket.socket
    requests: list[Request] = field(default_factory=list)
    closed: threading.Event = field(default_factory=threading.Event)


Answer = Callable[[Request], bytes]


def answer(status: int = 200, body: object = None, extra: str = "") -> bytes:
    raw = json.dumps({"ok": True} if body is None else body).encode()
    head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(raw)}\r\n{extra}\r\n"
    return head.encode() + raw


class Peer:
    """An HTTP/1.1 server on loopback (raw sockets, keep-alive) recording each
    connection's requests. ``/healthz?challenge=C`` answers ``instance`` and the
    proof of ``token`` (a forger's token: a wrong proof); any other request,
    ``reply(request)`` (200 ``{"ok": true}`` by default). ``close_after``: close each
    connection once it has answered that many requests."""

    def __init__(
        self,
        token: str = TOKEN,
        instance: str = INSTANCE,
        reply: Answer | None = None,
        close_after: int = 0,
    ) -> None:
        self.token, self.instance = token, instance
        self.reply = reply or (lambda r: answer())
        self.close_after = close_after
        self.conns: list[Conn] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                sock, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn = Conn(sock)
            with self.lock:
                self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: Conn) -> None:
        sock = conn.sock
        sock.settimeout(0.05)
        buf = b""
        try:
            while not self.stopping.is_set():
                while b"\r\n\r\n" not in buf:
                    try:
                        chunk = sock.recv(65536)
                    except TimeoutError:
                        if self.stopping.is_set():
                            return
                        continue
                    if not chunk:
                        return
                    buf += chunk
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ")
                headers = dict(line.split(": ", 1) for line in lines[1:])
                n = int(headers.get("Content-Length", "0"))
                while len(buf) < n:
                    buf += sock.recv(65536)
                req = Request(method, path, headers, buf[:n])
                buf = buf[n:]
                with self.lock:
                    conn.requests.append(req)
                url = urlsplit(path)
                if url.path == "/healthz":
                    challenge = parse_qs(url.query).get("challenge", [""])[0]
                    proof = healthz_proof(self.token, challenge)
                    data = answer(body={"ok": True, "instance": self.instance, "proof": proof})
                else:
                    data = self.reply(req)
                sock.sendall(data)
                if self.close_after and len(conn.requests) >= self.close_after:
                    return
        except OSError:
            return
        finally:
            sock.close()
            conn.closed.set()

    def requests(self) -> list[list[Request]]:
        with self.lock:
            return [list(c.requests) for c in self.conns]

    def assert_token_only_after_proof(self) -> None:
        """Every connection that carried the token began with a /healthz without it."""
        for reqs in self.requests():
            if any(r.authorized for r in reqs):
                assert reqs[0].path.startswith("/healthz?challenge=")
                assert not reqs[0].authorized
                assert all(r.authorized for r in reqs[1:])

    def stop(self) -> None:
        self.stopping.set()
        self.sock.close()
        self.thread.join(WAIT_S)
        with self.lock:
            conns = list(self.conns)
        for c in conns:
            c.closed.wait(WAIT_S)


@pytest.fixture
def peer() -> Iterator[Peer]:
    p = Peer()
    try:
        yield p
    finally:
        p.stop()


def _pool(url: str, token: str | None = TOKEN, limit: int = 4) -> ProvenPool:
    target = Target(url, INSTANCE)
    return ProvenPool(lambda: target, token, limit)


async def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.01)


# -- the parser ------------------------------------------------------------------------


def _parse(raw: bytes, method: str = "POST", max_body: int = 1 << 20) -> tuple[object, bool]:
    async def go() -> tuple[object, bool]:
        reader = asyncio.StreamReader(limit=1 << 16)
        reader.feed_data(raw)
        reader.feed_eof()
        resp, keep = await _read_answer(reader, method, max_body)
        return (resp.status, dict(resp.headers), resp.body), keep

    return asyncio.run(go())


def test_answers_framed_by_length_chunks_or_the_close() -> None:
    assert _parse(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\r\nx-a: 2\r\n\r\nhi") == (
        (200, {"content-length": "2", "x-a": "1, 2"}, b"hi"),
        True,
    )
    chunked = (
        b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3;ext=1\r\nabc\r\nA\r\n0123456789\r\n0\r\nTrailer: t\r\n\r\n"
    )
    assert _parse(chunked) == ((503, {"transfer-encoding": "chunked"}, b"abc0123456789"), True)
    # No length: the body runs to the close, and the connection is not kept.
    assert _parse(b"HTTP/1.1 200 OK\r\n\r\nto the end") == ((200, {}, b"to the end"), False)
    # Connection: close, HTTP/1.0, 1xx skipped, 204 without a body.
    assert _parse(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")[1] is False
    assert _parse(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")[1] is False
    info = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No\r\n\r\n"
    assert _parse(info) == ((204, {}, b""), True)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n", "not an HTTP status line"),
        (b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n", "not an HTTP header line"),
        (b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n", "not an HTTP header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\nx", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "closed in the middle"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\n\r\n", "body over"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * (MAX_HEADERS + 1) + b"\r\n", "header lines"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 9000 + b"\r\n\r\n", "over"),
        (b"HTTP/1.1 200 OK\r\n\r\n" + b"z" * (1 << 20) + b"z", "body over"),
    ],
)
def test_malformed_or_oversized_answers_are_protocol_errors(raw: bytes, words: str) -> None:
    with pytest.raises(ProtocolError, match=words):
        _parse(raw)


def test_a_close_before_any_answer_is_a_reset_not_a_protocol_error() -> None:
    with pytest.raises(ConnectionResetError):
        _parse(b"")


# -- the pool --------------------------------------------------------------------------


def test_one_proven_connection_carries_the_token_and_is_reused(peer: Peer) -> None:
    async def go() -> list[int]:
        pool = _pool(peer.url)
        try:
            out = []
            for i in range(3):
                r = await pool.request("POST", "/v1/s/infer", {"X-N": str(i)}, b"{}", WAIT_S)
                out.append(r.status)
            return out
        finally:
            await pool.close()

    assert asyncio.run(go()) == [200, 200, 200]
    [reqs] = peer.requests()
    assert [r.path.split("?")[0] for r in reqs] == ["/healthz"] + ["/v1/s/infer"] * 3
    assert [r.headers.get("Authorization") for r in reqs] == [None] + [f"Bearer {TOKEN}"] * 3
    assert [r.headers.get("X-N") for r in reqs[1:]] == ["0", "1", "2"]


def test_a_connection_closed_while_idle_is_dropped_and_a_fresh_one_proven() -> None:
    peer = Peer(close_after=2)  # /healthz, then one request: then it closes
    try:

        async def go() -> None:
            pool = _pool(peer.url)
            try:
                assert (await pool.request("POST", "/a", {}, b"", WAIT_S)).status == 200
                # the peer closes the idle connection; the pool sees it and drops it
                await _until(lambda: not pool._idle or not pool._idle[0].open_and_idle())
                assert (await pool.request("POST", "/b", {}, b"", WAIT_S)).status == 200
            finally:
                await pool.close()

        asyncio.run(go())
    finally:
        peer.stop()
    paths = [[r.path.split("?")[0] for r in reqs] for reqs in peer.requests()]
    assert paths == [["/healthz", "/a"], ["/healthz", "/b"]]
    peer.assert_token_only_after_proof()


@pytest.mark.parametrize("forger", ["wrong-token", "other-instance"])
def test_a_failed_proof_raises_and_sends_nothing_more(forger: str) -> None:
    peer = Peer(token="not-" + TOKEN) if forger == "wrong-token" else Peer(instance="f" * 16)
    try:

        async def go() -> None:
            pool = _pool(peer.url)
            try:
                await pool.request("POST", "/v1/s/infer", {}, b"{}", WAIT_S)
            finally:
                await pool.close()

        with pytest.raises(ProofFailed, match="not sent") as info:
            asyncio.run(go())
        assert info.value.url == peer.url
        words = "did not prove" if forger == "wrong-token" else "another instance id"
        assert words in info.value.reason
    finally:
        peer.stop()
    [reqs] = peer.requests()
    assert [r.path.split("?")[0] for r in reqs] == ["/healthz"]
    assert not reqs[0].authorized


def test_without_a_token_nothing_is_proved_and_no_token_sent(peer: Peer) -> None:
    async def go() -> int:
        pool = _pool(peer.url, token=None)
        try:
            return (await pool.request("POST", "/a", {}, b"", WAIT_S)).status
        finally:
            await pool.close()

    assert asyncio.run(go()) == 200
    [reqs] = peer.requests()
    assert [(r.path, r.authorized) for r in reqs] == [("/a", False)]


def test_refused_is_an_oserror_and_the_token_is_the_pools_alone(peer: Peer) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"

    async def go(url: str, headers: dict[str, str]) -> None:
        pool = _pool(url)
        try:
            await pool.request("POST", "/a", headers, b"", WAIT_S)
        finally:
            await pool.close()

    with pytest.raises(OSError) as info:
        asyncio.run(go(dead, {}))
    assert not isinstance(info.value, ProofFailed)
    for bad in ({"Authorization": "Bearer x"}, {"X-A": "1\r\nAuthorization: x"}):
        with pytest.raises(ValueError):
            asyncio.run(go(peer.url, bad))
    assert peer.requests() == []


def test_at_most_limit_connections_and_a_wait_bounded_by_the_timeout() -> None:
    release = threading.Event()

    def slow(req: Request) -> bytes:
        release.wait(WAIT_S)
        return answer()

    peer = Peer(reply=slow)
    try:

        async def go() -> list[int]:
            pool = _pool(peer.url, limit=2)
            try:
                busy = [
                    asyncio.create_task(pool.request("POST", f"/{i}", {}, b"", WAIT_S))
                    for i in range(2)
                ]
                await _until(lambda: sum(len(r) for r in peer.requests()) == 4)
                # a third request waits for a connection: its timeout bounds the wait
                with pytest.raises(TimeoutError):
                    await pool.request("POST", "/late", {}, b"", 0.2)
                release.set()
                done = await asyncio.gather(*busy)
                after = await pool.request("POST", "/after", {}, b"", WAIT_S)  # reused
                return [r.status for r in done] + [after.status]
            finally:
                await pool.close()

        assert asyncio.run(go()) == [200, 200, 200]
    finally:
        release.set()
        peer.stop()
    reqs = peer.requests()
    assert len(reqs) == 2  # never a third connection
    assert sorted(r.path for c in reqs for r in c if not r.path.startswith("/healthz")) == [
        "/0",
        "/1",
        "/after",
    ]
    peer.assert_token_only_after_proof()


def test_a_new_connection_goes_where_locate_says_and_proves_that_instance() -> None:
    """A restarted controller (same token, another port and instance) is followed;
    a target whose peer echoes another instance than the one named is refused."""
    first, second = Peer(), Peer(instance="5ecd" * 4)
    target = [Target(first.url, INSTANCE)]
    try:

        async def go() -> None:
            pool = ProvenPool(lambda: target[0], TOKEN, 4)
            try:
                assert (await pool.request("POST", "/1", {}, b"", WAIT_S)).status == 200
                first.stop()  # the controller dies: its connections close
                await _until(lambda: not pool._idle[0].open_and_idle())
                target[0] = Target(second.url, "5ecd" * 4)  # http.json, rewritten
                assert (await pool.request("POST", "/2", {}, b"", WAIT_S)).status == 200
                await pool.close()
                target[0] = Target(second.url, INSTANCE)  # a stale record: refused
                with pytest.raises(ProofFailed, match="another instance id"):
                    await pool.request("POST", "/3", {}, b"", WAIT_S)
            finally:
                await pool.close()

        asyncio.run(go())
    finally:
        first.stop()
        second.stop()
    assert [[r.path.split("?")[0] for r in c] for c in first.requests()] == [["/healthz", "/1"]]
    assert [[r.path.split("?")[0] for r in c] for c in second.requests()] == [
        ["/healthz", "/2"],
        ["/healthz"],
    ]
    first.assert_token_only_after_proof()
    second.assert_token_only_after_proof()


# -- the sync client -------------------------------------------------------------------


def test_the_sync_client_holds_its_proven_connection_and_proves_a_fresh_one() -> None:
    peer = Peer(close_after=3)  # /healthz and two requests, then it closes
    try:
        endpoint = prove(peer.url, TOKEN, INSTANCE)
        conn = endpoint._held.conn
        assert conn is not None and conn.auto_open == 0  # never reopens by itself
        assert endpoint.get_json("/a") == {"ok": True}
        assert endpoint.post_json("/b", {"x": 1}) == {"ok": True}
        peer.conns[0].closed.wait(WAIT_S)
        assert endpoint.get_json("/c") == {"ok": True}  # on a fresh, proven connection
    finally:
        peer.stop()
    paths = [[r.path.split("?")[0] for r in reqs] for reqs in peer.requests()]
    assert paths == [["/healthz", "/a", "/b"], ["/healthz", "/c"]]
    assert json.loads(peer.requests()[0][2].body) == {"x": 1}
    peer.assert_token_only_after_proof()


def test_the_sync_clients_reproof_refused_is_a_urlerror_failed_is_an_endpointerror() -> None:
    peer = Peer()
    endpoint = prove(peer.url, TOKEN, INSTANCE)
    peer.stop()  # the controller dies: nothing listens on its port
    with pytest.raises(urllib.error.URLError):
        endpoint.get_json("/a")  # no proof either way: an error to retry
    # A squatter, here on another port (tests/runtime/test_token_squatter.py takes
    # the same one): an endpoint without a proven connection asks it for the proof.
    squatter = Peer(token="not-" + TOKEN)
    try:
        with pytest.raises(EndpointError, match="not sent"):
            Endpoint(squatter.url, TOKEN, INSTANCE).get_json("/a")
    finally:
        squatter.stop()
    assert [[r.path.split("?")[0] for r in c] for c in squatter.requests()] == [["/healthz"]]


def test_the_sync_client_reads_no_error_answer_as_json(peer: Peer) -> None:
    peer.reply = lambda r: answer(302, {"to": "elsewhere"}, "Location: http://x/\r\n")
    endpoint = prove(peer.url, TOKEN, INSTANCE)
    with pytest.raises(urllib.error.HTTPError) as info:
        endpoint.get_json("/redirect")
    assert info.value.code == 302
    info.value.close()
    peer.reply = lambda r: answer()
    assert endpoint.get_json("/after") == {"ok": True}  # the same connection, still proven
    assert len(peer.requests()) == 1


def test_the_sync_client_without_an_instance_reproves_the_token_alone(peer: Peer) -> None:
    """``--url``: no instance id is known; a fresh connection proves the token."""
    endpoint = prove(peer.url, TOKEN, None, source="--url")
    assert endpoint.instance == ""
    endpoint.close()
    assert endpoint.get_json("/a") == {"ok": True}
    assert [[r.path.split("?")[0] for r in c] for c in peer.requests()] == [
        ["/healthz"],
        ["/healthz", "/a"],
    ]
    peer.token = "not-" + TOKEN  # what answers now holds another token
    endpoint.close()
    with pytest.raises(EndpointError, match=r"\(--url\) did not prove it holds the token"):
        endpoint.get_json("/b")
    peer.assert_token_only_after_proof()
