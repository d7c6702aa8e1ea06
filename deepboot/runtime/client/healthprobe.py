"""Asking an endpoint's ``GET /healthz`` without the token, within a deadline.

* :func:`answer_within` runs one exchange on a daemon thread and gives up after
  ``timeout`` seconds in all: a socket's timeout bounds each read, not the exchange,
  so an endpoint that answers a byte at a time could otherwise hold the caller
  past any deadline.
* :func:`timed_out` tells "no answer in time" (a bare or urllib-wrapped
  ``TimeoutError``) from every other failure.
* :func:`health` is the whole probe over urllib: the instance id and the proof a URL
  answers, with no proxy (a proxy would see the traffic) and no redirect followed.
  It proves nothing by itself: comparing the proof is the caller's
  (:func:`~deepboot.runtime.client.endpointproof.proof_failure`).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from deepboot.runtime.client.endpointproof import MAX_ANSWER_BYTES, refused_error

HEALTH_TIMEOUT_S = 5.0
"""Most seconds a client waits for ``GET /healthz`` (connection included)."""


def answer_within(ask: Callable[[], object], timeout: float) -> list[object]:
    """``[what ask() returned, or the Exception it raised]``, or ``[]`` when it did
    not end within ``timeout`` seconds (it runs on, on a daemon thread named
    ``deepboot-healthz``: the caller should close what it reads from)."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(ask())
        except Exception as exc:
            result.append(exc)

    asker = threading.Thread(target=run, name="deepboot-healthz", daemon=True)
    asker.start()
    asker.join(timeout)
    return result[:1]


def timed_out(answer: object) -> bool:
    """``answer`` is urllib's read or connect timeout (bare, or wrapped in a URLError)."""
    if isinstance(answer, urllib.error.URLError) and not isinstance(answer, urllib.error.HTTPError):
        answer = answer.reason
    return isinstance(answer, TimeoutError)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: never follow one (with or without the token)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def health(url: str, timeout: float = HEALTH_TIMEOUT_S, challenge: str = "") -> tuple[str, str]:
    """The instance id and the proof
    (:func:`~deepboot.runtime.client.endpointproof.healthz_proof`; "" without a
    challenge) that ``GET {url}/healthz?challenge=...`` answers (sent without the
    token); the whole exchange takes at most ``timeout`` seconds.

    Raises:
        EndpointError: no answer within ``timeout``, or not a deepboot controller's.
    """

    def ask() -> object:
        # Any other error (no answer, not HTTP: http.client's errors, not JSON) is
        # raised, and answer_within hands it back.
        query = f"?challenge={challenge}" if challenge else ""
        try:
            with _OPENER.open(url + "/healthz" + query, timeout=timeout) as r:
                return json.loads(r.read(MAX_ANSWER_BYTES))
        except urllib.error.HTTPError as exc:
            exc.close()
            return exc

    result = answer_within(ask, timeout)
    # urllib's own timeout (the same length) can fire just before the wait ends:
    # that is the same "no answer in time", not an endpoint that does not speak HTTP.
    if not result or timed_out(result[0]):
        raise refused_error(url, f"did not answer GET /healthz within {timeout:g} s")
    return _instance_and_proof(url, result[0])


def _instance_and_proof(url: str, answer: object) -> tuple[str, str]:
    """What :func:`health` returns for ``answer`` (the decoded JSON, or the error)."""
    if isinstance(answer, urllib.error.HTTPError):
        raise refused_error(url, f"answered GET /healthz with HTTP {answer.code}")
    if isinstance(answer, urllib.error.URLError):
        raise refused_error(url, f"does not answer ({one_line(answer.reason)})")
    if isinstance(answer, ValueError):
        raise refused_error(url, "answered GET /healthz with something other than JSON")
    if isinstance(answer, Exception):
        raise refused_error(
            url, f"does not answer HTTP ({one_line(answer) or type(answer).__name__})"
        )
    instance = answer.get("instance") if isinstance(answer, dict) else None
    if not isinstance(instance, str):
        raise refused_error(url, "answered GET /healthz without an instance id")
    proof = answer.get("proof", "") if isinstance(answer, dict) else ""
    return instance, proof if isinstance(proof, str) else ""


def one_line(reason: object) -> str:
    """``str(reason)`` with every run of whitespace one space (for a one-line message)."""
    return " ".join(str(reason).split())
