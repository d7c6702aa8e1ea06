"""The clients' side of the controller's HTTP endpoint (``deepboot load``, ``deepboot
serve``): find a state directory's endpoint, make sure that what answers there is that
directory's controller, and only then hand out the bearer token.

The contract with the controller (see :mod:`deepboot.runtime.http.router`):

* ``STATE_DIR/http.json`` records the running controller's endpoint: a JSON object
  with at least ``"url"`` (``http://HOST:PORT``) and ``"instance"``, a random hex id
  the controller draws when it starts serving.
* ``GET {url}/healthz`` needs no token and answers 200 ``{"ok": true, "instance": ID}`` (503
  and ``"ok": false`` once the controller's loop has stalled);
  ``GET {url}/healthz?challenge=C`` (C: 32-128 hex digits the client draws) adds
  ``"proof"``: :func:`healthz_proof` of the token and C, which only a process that
  holds the token can compute, and which reveals nothing of it.
* Every other route needs ``Authorization: Bearer <STATE_DIR/http-token>``, on
  loopback too; POST bodies are JSON (``Content-Type: application/json``).

Why check first: http.json outlives its controller (a SIGKILL, a crash, a reboot).
Its port is then free, and any process on the machine (or, off loopback, on the
network) may listen there: a client that sent the token to the recorded URL would
hand it over. :func:`connect` sends nothing secret until ``/healthz`` at that URL has
echoed http.json's ``instance`` and proved it holds the token by answering a fresh
random challenge (an instance id alone can be learnt from the live controller's
``/healthz`` by anyone, and replayed by a squatter once it dies).

Why on the same connection (issue 42): the controller may die *after* the check, and
a squatter bind the freed port at once. A check made once, or made again only after
an error, does not stop a later new TCP connection from reaching the squatter (with
every keep-alive connection idle at the controller's death, no error is ever seen).
So the token only ever travels on a TCP connection that has itself proved, on that
same connection, that its peer holds the token: a TCP connection belongs to the
process that accepted it, and a process that binds the port later can never own
one. :class:`Endpoint` holds such a proven connection (``http.client``, with
``auto_open`` off, so that it cannot silently reconnect); once it is closed, the next
request first proves a fresh connection, and a failed proof raises
:class:`EndpointError` (the token not sent). ``deepboot load`` does the same with a
pool of proven connections (:mod:`deepboot.runtime.client.provenhttp`).

Where the rest lives: the challenge and its proof, shared with the router and
``deepboot load``'s pool, in :mod:`deepboot.runtime.client.endpointproof`; reading
http.json and a token file in :mod:`deepboot.runtime.client.endpointrecord`; asking
``/healthz`` within a deadline in :mod:`deepboot.runtime.client.healthprobe`. Their
public names are importable from here too.

No aiohttp here (the base install's CLI imports this): urllib and ``http.client``,
with no proxy (a proxy would see the token) and no redirects (urllib would carry the
token along).
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import secrets
import select
import socket
import ssl
import threading
import urllib.error
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from deepboot.runtime.client.endpointproof import (
    CHALLENGE_RE,
    MAX_ANSWER_BYTES,
    EndpointError,
    healthz_proof,
    proof_failure,
    refused_error,
)
from deepboot.runtime.client.endpointrecord import check_url, read_record, read_token
from deepboot.runtime.client.healthprobe import (
    HEALTH_TIMEOUT_S,
    answer_within,
    health,
    one_line,
    timed_out,
)
from deepboot.runtime.store.ownership import read_secret
from deepboot.runtime.store.statedir import StateDir

__all__ = [
    "CHALLENGE_RE",
    "HEALTH_TIMEOUT_S",
    "Endpoint",
    "EndpointError",
    "Recorded",
    "check_url",
    "connect",
    "health",
    "healthz_proof",
    "proof_failure",
    "prove",
    "read_record",
    "read_token",
    "refused_error",
]


class _Held:
    """An :class:`Endpoint`'s proven connection (None: none yet, or it was closed),
    and the lock that serializes its requests."""

    __slots__ = ("conn", "lock", "source")

    def __init__(self) -> None:
        self.conn: http.client.HTTPConnection | None = None
        self.lock = threading.Lock()
        self.source = "http.json"  # where the URL came from, for error messages


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A controller's endpoint whose ``/healthz`` echoed the instance of http.json
    and proved it holds the token.

    Its requests go on a TCP connection that proved so itself (see the module doc):
    the one :meth:`Recorded.check` proved, while it stays open; then a fresh one,
    proved first (``GET /healthz?challenge=C`` on it, without the token). One request
    at a time (a lock); nothing is retried.

    Attributes:
        url: Its base URL, ``http://HOST:PORT`` (no trailing slash).
        token: The bearer token to send it.
        instance: The instance id it echoed.
    """

    url: str
    token: str
    instance: str
    _held: _Held = field(default_factory=_Held, init=False, repr=False, compare=False)

    @property
    def headers(self) -> dict[str, str]:
        """The headers of every request but ``/healthz``."""
        return {"Authorization": f"Bearer {self.token}"}

    def get_json(self, path: str, timeout: float = HEALTH_TIMEOUT_S) -> Any:
        """``GET {url}{path}`` with the token, on a proven connection; the decoded
        JSON answer.

        Raises:
            EndpointError: a fresh connection was needed, and what answered on it
                did not prove it holds the token (the token was not sent).
            urllib.error.URLError, OSError, ValueError: no answer (the connection
                refused, reset or closed; ``timeout`` seconds of silence), an HTTP
                error (``HTTPError``, a redirect included), or not JSON.
        """
        return self._request("GET", path, None, timeout)

    def post_json(self, path: str, body: Any, timeout: float = HEALTH_TIMEOUT_S) -> Any:
        """``POST {url}{path}`` of ``body`` as JSON, with the token, on a proven
        connection; the decoded answer.

        Raises:
            EndpointError, urllib.error.URLError, OSError, ValueError: as :meth:`get_json`.
        """
        return self._request("POST", path, json.dumps(body).encode(), timeout)

    def close(self) -> None:
        """Close the proven connection (a later request proves a fresh one)."""
        with self._held.lock:
            _drop(self._held)

    def _request(self, method: str, path: str, data: bytes | None, timeout: float) -> Any:
        held = self._held
        with held.lock:
            conn = held.conn
            if conn is None or not _idle_and_open(conn):
                _drop(held)
                try:
                    instance = self.instance or None  # "": none known (--url)
                    conn = _prove(self.url, self.token, instance, timeout, held.source)
                except _Unreachable as exc:
                    raise urllib.error.URLError(exc.reason) from None
                held.conn = conn
            headers = dict(self.headers)
            if data is not None:
                headers["Content-Type"] = "application/json"
            try:
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                prefix = urlsplit(self.url).path.rstrip("/")
                conn.request(method, prefix + path, body=data, headers=headers)
                r = conn.getresponse()
                raw = r.read(MAX_ANSWER_BYTES + 1)
            except http.client.HTTPException as exc:  # not OSErrors: wrapped as urllib does
                _drop(held)
                raise urllib.error.URLError(exc) from None
            except BaseException:
                _drop(held)
                raise
            if len(raw) > MAX_ANSWER_BYTES or not r.isclosed() or conn.sock is None:
                _drop(held)  # too long to read whole, or the endpoint closes it
            if len(raw) > MAX_ANSWER_BYTES:
                raise ValueError(f"the answer to {method} {path} is over {MAX_ANSWER_BYTES} bytes")
            if not 200 <= r.status < 300:
                raise urllib.error.HTTPError(
                    self.url + path, r.status, r.reason, r.headers, io.BytesIO(raw)
                )
            return json.loads(raw)


def _drop(held: _Held) -> None:
    if held.conn is not None:
        held.conn.close()
        held.conn = None


def _idle_and_open(conn: http.client.HTTPConnection) -> bool:
    """``conn`` is connected, and its peer has neither closed it nor sent anything
    unasked (either way it is dropped: a fresh connection is proved instead)."""
    sock = conn.sock
    if sock is None:
        return False
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN | select.POLLPRI)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False


class _Unreachable(Exception):
    """No answer to ``GET /healthz`` (refused, reset, closed, silent): no proof either
    way; ``reason`` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _prove(
    url: str, token: str, instance: str | None, timeout: float, source: str
) -> http.client.HTTPConnection:
    """A fresh connection to ``url`` whose peer proved, on it, that it holds ``token``
    (and echoed ``instance``, unless None); the whole exchange takes at most
    ``timeout`` seconds. The connection never reopens itself (``auto_open`` off).

    Raises:
        _Unreachable: no answer (refused, reset, closed before answering, silent).
        EndpointError: an answer, but no proof (the token was not sent).
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port
    prefix = parts.path.rstrip("/")
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(
            host, port, timeout=timeout, context=ssl.create_default_context()
        )
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    challenge = secrets.token_hex(16)

    def ask() -> tuple[int, bytes, bool]:
        # Raises when there is no answer, or not HTTP (http.client's errors).
        conn.connect()
        conn.auto_open = 0  # from now on, this connection or none
        conn.request("GET", f"{prefix}/healthz?challenge={challenge}")
        r = conn.getresponse()
        return r.status, r.read(MAX_ANSWER_BYTES + 1), conn.sock is not None

    result = answer_within(ask, timeout)  # a deadline on the whole exchange
    answer = result[0] if result else None
    if answer is None or isinstance(answer, Exception):
        _abandon(conn)
        if answer is None or timed_out(answer):
            raise _Unreachable(f"did not answer GET /healthz within {timeout:g} s")
        said = one_line(answer) or type(answer).__name__
        if isinstance(answer, OSError | http.client.IncompleteRead):  # refused, reset, closed
            raise _Unreachable(f"does not answer ({said})")
        raise refused_error(url, f"does not answer HTTP ({said})", source)
    assert isinstance(answer, tuple)
    status, body, still_open = answer
    why = proof_failure(status, body, token, challenge, instance, source)
    if why:
        conn.close()
        raise refused_error(url, why, source)
    if not still_open:
        conn.close()
        raise _Unreachable("closed the connection on which it proved itself")
    return conn


def _abandon(conn: http.client.HTTPConnection) -> None:
    """Close ``conn``, waking a thread blocked reading it."""
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    conn.close()


def prove(
    url: str,
    token: str,
    instance: str | None = None,
    timeout: float = HEALTH_TIMEOUT_S,
    source: str = "http.json",
) -> Endpoint:
    """The endpoint at ``url``, once a connection to it has proved it holds
    ``token`` (and echoed ``instance``, unless None: ``--url``, where none is known);
    its requests go on that connection while it stays open, then on fresh ones, each
    proved the same way first.

    Raises:
        EndpointError: no answer within ``timeout``, or no proof (the token was not
            sent).
    """
    try:
        conn = _prove(url, token, instance, timeout, source)
    except _Unreachable as exc:
        raise refused_error(url, exc.reason, source) from None
    endpoint = Endpoint(url, token, instance or "")
    endpoint._held.conn = conn
    endpoint._held.source = source
    return endpoint


@dataclass(frozen=True, slots=True)
class Recorded:
    """What http.json and the token file say, not checked yet: no request method
    (see :meth:`check`). ``token_file`` is where the token was read."""

    url: str
    instance: str
    token: str
    token_file: Path

    @classmethod
    def read(cls, state: StateDir, token_file: Path | None = None) -> Recorded:
        """Read ``state``'s http.json and token file (no network).

        Raises:
            EndpointError: no http.json (no controller serves).
            InputError: http.json or the token file is malformed (naming it, and
                http.json's key).
        """
        url, instance = read_record(state.http_file)
        if token_file is not None:  # the user's own file, named on the command line
            return cls(url, instance, read_token(token_file), token_file)
        # The state directory's token: only from a 0600 file of ours (finding 1 of
        # issue 42), never one another user could have planted or read.
        return cls(url, instance, read_token(state.http_token, read_secret), state.http_token)

    def check(self, timeout: float = HEALTH_TIMEOUT_S) -> Endpoint:
        """The endpoint, once a connection to it has, without the token, echoed the
        recorded instance id in ``GET /healthz`` and answered a fresh challenge with
        the token's proof; its requests go on that connection (see :class:`Endpoint`).

        Raises:
            EndpointError: it does not answer within ``timeout``, or is not the
                controller that wrote http.json (the token was not sent).
        """
        return prove(self.url, self.token, self.instance, timeout)


def connect(
    state: StateDir, token_file: Path | None = None, timeout: float = HEALTH_TIMEOUT_S
) -> Endpoint:
    """The endpoint of ``state``'s running controller, checked (see the module doc):
    ``Recorded.read(state, token_file).check(timeout)``.

    Raises:
        EndpointError: no http.json, or the endpoint it records does not answer or
            is not this state directory's controller (the token was not sent).
        InputError: http.json or the token file is malformed (naming it, and the key).
    """
    return Recorded.read(state, token_file).check(timeout)
