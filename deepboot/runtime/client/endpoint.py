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

No aiohttp here (the base install's CLI imports this): urllib and ``http.client``,
with no proxy (a proxy would see the token) and no redirects (urllib would carry the
token along).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import io
import json
import re
import secrets
import select
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from deepboot.core.errors import DeepbootError, InputError
from deepboot.runtime.store.ownership import read_secret
from deepboot.runtime.store.statedir import StateDir

HEALTH_TIMEOUT_S = 5.0
"""Most seconds :func:`connect` waits for ``GET /healthz`` (connection included)."""

_MAX_BODY = 1 << 20
"""Most bytes read from an answer of the endpoint."""


CHALLENGE_RE = re.compile(r"[0-9a-f]{32,128}")
"""A ``/healthz`` challenge: lowercase hex digits."""


def healthz_proof(token: str, challenge: str) -> str:
    """HMAC-SHA256 of ``challenge`` under the bearer token (hex): what ``/healthz``
    answers to a challenge, proving it holds the token without revealing it."""
    key = token.encode("utf-8", "surrogateescape")
    return hmac.new(key, b"deepboot-healthz|" + challenge.encode(), hashlib.sha256).hexdigest()


class EndpointError(DeepbootError):
    """The endpoint of http.json does not answer, or is not this state directory's
    controller; the token was not sent."""


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
                raw = r.read(_MAX_BODY + 1)
            except http.client.HTTPException as exc:  # not OSErrors: wrapped as urllib does
                _drop(held)
                raise urllib.error.URLError(exc) from None
            except BaseException:
                _drop(held)
                raise
            if len(raw) > _MAX_BODY or not r.isclosed() or conn.sock is None:
                _drop(held)  # too long to read whole, or the endpoint closes it
            if len(raw) > _MAX_BODY:
                raise ValueError(f"the answer to {method} {path} is over {_MAX_BODY} bytes")
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
    result: list[object] = []

    def ask() -> None:
        try:
            conn.connect()
            conn.auto_open = 0  # from now on, this connection or none
            conn.request("GET", f"{prefix}/healthz?challenge={challenge}")
            r = conn.getresponse()
            result.append((r.status, r.read(_MAX_BODY + 1), conn.sock is not None))
        except Exception as exc:  # no answer, or not HTTP (http.client's errors)
            result.append(exc)

    # A thread, so that an endpoint that answers a byte at a time cannot hold us
    # past the deadline (the socket's timeout bounds each read, not the exchange).
    asker = threading.Thread(target=ask, name="deepboot-healthz", daemon=True)
    asker.start()
    asker.join(timeout)
    answer = result[0] if result else None
    if answer is None or isinstance(answer, Exception):
        _abandon(conn)
        if answer is None or _timed_out(answer):
            raise _Unreachable(f"did not answer GET /healthz within {timeout:g} s")
        said = _one_line(answer) or type(answer).__name__
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


def proof_failure(
    status: int,
    body: bytes,
    token: str,
    challenge: str,
    instance: str | None,
    source: str = "http.json",
) -> str:
    """Why the answer (``status``, ``body``) to ``GET /healthz?challenge=<challenge>``
    does not prove that its sender holds ``token`` (and, unless ``instance`` is None,
    is that instance); "" when it does. ``source`` names where ``instance`` was read.
    """
    if status != 200:
        return f"answered GET /healthz with HTTP {status}"
    if len(body) > _MAX_BODY:
        return f"answered GET /healthz with over {_MAX_BODY} bytes"
    try:
        answer = json.loads(body)
    except ValueError:
        return "answered GET /healthz with something other than JSON"
    got = answer.get("instance") if isinstance(answer, dict) else None
    if not isinstance(got, str):
        return "answered GET /healthz without an instance id"
    if instance is not None and got != instance:
        return (
            f"answered GET /healthz with another instance id than {source}'s (the file "
            "is stale, and another process listens there)"
        )
    proof = answer.get("proof") if isinstance(answer, dict) else None
    if not isinstance(proof, str) or not hmac.compare_digest(
        proof.encode("utf-8", "surrogateescape"), healthz_proof(token, challenge).encode()
    ):
        return (
            "did not prove it holds the token (a wrong answer to GET /healthz's challenge: "
            "another process listens there)"
        )
    return ""


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


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: never follow one (with or without the token)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def read_token(path: str | Path, reader: Callable[[Path], str] | None = None) -> str:
    """The bearer token in ``path`` (surrounding whitespace removed), read by ``reader``
    (default: a plain read; a state directory's token goes through
    :func:`~deepboot.runtime.store.ownership.read_secret`, which refuses a file not ours and
    0600, raising :class:`~deepboot.runtime.store.ownership.UnsafePathError`).

    Raises:
        InputError: the file is missing, unreadable or empty.
    """
    spath = str(path)
    try:
        if reader is None:
            token = Path(path).read_text(encoding="utf-8").strip()
        else:
            token = reader(Path(path)).strip()
    except FileNotFoundError:
        raise InputError(spath, 0, "", "token file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(spath, 0, "", f"cannot read the token: {exc}") from None
    if not token or any(c.isspace() for c in token):
        raise InputError(spath, 0, "", "the token file is empty or holds more than one word")
    return token


def check_url(url: str) -> str:
    """``url`` if it looks like ``http(s)://HOST[:PORT]`` (trailing slashes removed).

    Raises:
        ValueError: it does not.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"must look like http://HOST:PORT, got {url!r}")
    return url.rstrip("/")


def read_record(path: Path) -> tuple[str, str]:
    """(url, instance) of the endpoint that http.json at ``path`` records.

    Raises:
        EndpointError: there is no such file (no controller serves).
        InputError: it is not the record the controller writes (naming the key).
    """
    spath = str(path)
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EndpointError(
            f"no HTTP endpoint recorded in {spath}: no controller serves (run 'deepboot up')"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        why = f"cannot read it: {exc}" if isinstance(exc, OSError) else "not JSON"
        raise InputError(
            spath, 0, "", f"not the endpoint record the controller writes ({why})"
        ) from None
    if not isinstance(info, dict):
        raise InputError(spath, 0, "", "not the endpoint record the controller writes")
    url = info.get("url")
    if not isinstance(url, str):
        raise InputError(spath, 0, "url", "missing, or not a string")
    try:
        url = check_url(url)
    except ValueError as exc:
        raise InputError(spath, 0, "url", str(exc)) from None
    instance = info.get("instance")
    if not isinstance(instance, str) or not re.fullmatch(r"[0-9A-Za-z_-]{1,256}", instance):
        raise InputError(
            spath,
            0,
            "instance",
            "missing or malformed: no client can check that the endpoint is this state "
            "directory's controller (a controller older than this deepboot wrote it? "
            "restart it: 'deepboot down', then 'deepboot up')",
        )
    return url, instance


def health(url: str, timeout: float = HEALTH_TIMEOUT_S, challenge: str = "") -> tuple[str, str]:
    """The instance id and the proof (:func:`healthz_proof`; "" without a challenge)
    that ``GET {url}/healthz?challenge=...`` answers (sent without the token); the
    whole exchange takes at most ``timeout`` seconds.

    Raises:
        EndpointError: no answer within ``timeout``, or not a deepboot controller's.
    """
    result: list[object] = []

    def ask() -> None:
        try:
            query = f"?challenge={challenge}" if challenge else ""
            with _OPENER.open(url + "/healthz" + query, timeout=timeout) as r:
                result.append(json.loads(r.read(_MAX_BODY)))
        except urllib.error.HTTPError as exc:
            exc.close()
            result.append(exc)
        except Exception as exc:  # no answer, not HTTP (http.client's errors), not JSON
            result.append(exc)

    # A thread, so that an endpoint that answers a byte at a time cannot hold us
    # past the deadline (urllib's timeout bounds each read, not the exchange).
    asker = threading.Thread(target=ask, name="deepboot-healthz", daemon=True)
    asker.start()
    asker.join(timeout)
    # urllib's own timeout (the same length) can fire just before the join ends:
    # that is the same "no answer in time", not an endpoint that does not speak HTTP.
    if not result or _timed_out(result[0]):
        raise refused_error(url, f"did not answer GET /healthz within {timeout:g} s")
    answer = result[0]
    if isinstance(answer, urllib.error.HTTPError):
        raise refused_error(url, f"answered GET /healthz with HTTP {answer.code}")
    if isinstance(answer, urllib.error.URLError):
        raise refused_error(url, f"does not answer ({_one_line(answer.reason)})")
    if isinstance(answer, ValueError):
        raise refused_error(url, "answered GET /healthz with something other than JSON")
    if isinstance(answer, Exception):
        raise refused_error(
            url, f"does not answer HTTP ({_one_line(answer) or type(answer).__name__})"
        )
    instance = answer.get("instance") if isinstance(answer, dict) else None
    if not isinstance(instance, str):
        raise refused_error(url, "answered GET /healthz without an instance id")
    proof = answer.get("proof", "") if isinstance(answer, dict) else ""
    return instance, proof if isinstance(proof, str) else ""


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


def refused_error(
    url: str, what: str, source: str = "http.json", outcome: str = "the bearer token was not sent"
) -> EndpointError:
    """The error of an endpoint that did not prove itself; ``source``: where its URL
    came from ("http.json", or a flag such as "--url")."""
    if source == "http.json":
        where, whose = "recorded in http.json", "this state directory's controller"
    else:
        where, whose = source, "the controller that holds the token"
    return EndpointError(
        f"the endpoint at {url} ({where}) {what}: it is down, or not {whose}; {outcome}"
    )


def _timed_out(answer: object) -> bool:
    """``answer`` is urllib's read or connect timeout (bare, or wrapped in a URLError)."""
    if isinstance(answer, urllib.error.URLError) and not isinstance(answer, urllib.error.HTTPError):
        answer = answer.reason
    return isinstance(answer, TimeoutError)


def _one_line(reason: object) -> str:
    return " ".join(str(reason).split())
