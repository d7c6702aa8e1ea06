"""The clients' side of the controller's HTTP endpoint (``deepboot load``, ``deepboot
serve``): find a state directory's endpoint, make sure that what answers there is that
directory's controller, and only then hand out the bearer token.

The contract with the controller (see :mod:`deepboot.runtime.router`):

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

No aiohttp here (the base install's CLI imports this): urllib, with no proxy (a
proxy would see the token) and no redirects (urllib would carry the token along).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from deepboot.core.errors import DeepbootError, InputError
from deepboot.runtime.statedir import StateDir

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


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A controller's endpoint whose ``/healthz`` echoed the instance of http.json.

    Attributes:
        url: Its base URL, ``http://HOST:PORT`` (no trailing slash).
        token: The bearer token to send it.
        instance: The instance id it echoed.
    """

    url: str
    token: str
    instance: str

    @property
    def headers(self) -> dict[str, str]:
        """The headers of every request but ``/healthz``."""
        return {"Authorization": f"Bearer {self.token}"}

    def get_json(self, path: str, timeout: float = HEALTH_TIMEOUT_S) -> Any:
        """``GET {url}{path}`` with the token; the decoded JSON answer.

        Raises:
            urllib.error.URLError, OSError, ValueError: no answer, an HTTP error
                (``HTTPError``, a redirect included), or not JSON.
        """
        req = urllib.request.Request(self.url + path, headers=self.headers)
        with _OPENER.open(req, timeout=timeout) as r:
            return json.loads(r.read(_MAX_BODY))

    def post_json(self, path: str, body: Any, timeout: float = HEALTH_TIMEOUT_S) -> Any:
        """``POST {url}{path}`` of ``body`` as JSON, with the token; the decoded answer.

        Raises:
            urllib.error.URLError, OSError, ValueError: as :meth:`get_json`.
        """
        headers = {**self.headers, "Content-Type": "application/json"}
        data = json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method="POST")
        with _OPENER.open(req, timeout=timeout) as r:
            return json.loads(r.read(_MAX_BODY))


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: never follow one (with or without the token)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def read_token(path: str | Path) -> str:
    """The bearer token in ``path`` (surrounding whitespace removed).

    Raises:
        InputError: the file is missing, unreadable or empty.
    """
    spath = str(path)
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
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
        raise _refused(url, f"did not answer GET /healthz within {timeout:g} s")
    answer = result[0]
    if isinstance(answer, urllib.error.HTTPError):
        raise _refused(url, f"answered GET /healthz with HTTP {answer.code}")
    if isinstance(answer, urllib.error.URLError):
        raise _refused(url, f"does not answer ({_one_line(answer.reason)})")
    if isinstance(answer, ValueError):
        raise _refused(url, "answered GET /healthz with something other than JSON")
    if isinstance(answer, Exception):
        raise _refused(url, f"does not answer HTTP ({_one_line(answer) or type(answer).__name__})")
    instance = answer.get("instance") if isinstance(answer, dict) else None
    if not isinstance(instance, str):
        raise _refused(url, "answered GET /healthz without an instance id")
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
        path = token_file if token_file is not None else state.http_token
        return cls(url, instance, read_token(path), path)

    def check(self, timeout: float = HEALTH_TIMEOUT_S) -> Endpoint:
        """The endpoint, once its ``GET /healthz`` (without the token) has echoed the
        recorded instance id and answered a fresh challenge with the token's proof.

        Raises:
            EndpointError: it does not answer within ``timeout``, or is not the
                controller that wrote http.json (the token was not sent).
        """
        challenge = secrets.token_hex(16)
        instance, proof = health(self.url, timeout, challenge)
        if instance != self.instance:
            raise _refused(
                self.url,
                "answered GET /healthz with another instance id than http.json's (the "
                "file is stale, and another process listens there)",
            )
        if not hmac.compare_digest(proof, healthz_proof(self.token, challenge)):
            raise _refused(
                self.url,
                "did not prove it holds the token (a wrong answer to GET /healthz's "
                "challenge: the file is stale, and another process listens there)",
            )
        return Endpoint(self.url, self.token, self.instance)


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


def _refused(url: str, what: str) -> EndpointError:
    return EndpointError(
        f"the endpoint at {url} (recorded in http.json) {what}: it is down, or not this "
        "state directory's controller; the bearer token was not sent"
    )


def _timed_out(answer: object) -> bool:
    """``answer`` is urllib's read or connect timeout (bare, or wrapped in a URLError)."""
    if isinstance(answer, urllib.error.URLError) and not isinstance(answer, urllib.error.HTTPError):
        answer = answer.reason
    return isinstance(answer, TimeoutError)


def _one_line(reason: object) -> str:
    return " ".join(str(reason).split())
