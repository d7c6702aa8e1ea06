"""The ``/healthz`` challenge by which a controller's endpoint proves that it holds
the bearer token, shared by the endpoint (:mod:`deepboot.runtime.http.router`) and
both clients (:mod:`deepboot.runtime.client.endpoint`, the sync one;
:mod:`deepboot.runtime.client.provenhttp`, ``deepboot load``'s pool).

The contract:

* A client draws a challenge C (:data:`CHALLENGE_RE`: 32-128 lowercase hex digits)
  and sends ``GET /healthz?challenge=C`` without the token.
* The endpoint answers 200 with a JSON object holding its ``"instance"`` id and
  ``"proof"``: :func:`healthz_proof` of the token and C, which only a process that
  holds the token can compute, and which reveals nothing of it.
* :func:`proof_failure` says, in words, why an answer is not that proof ("" when it
  is); a client that gets one raises :func:`refused_error`'s
  :class:`EndpointError` and sends nothing secret to that endpoint.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re

from deepboot.core.errors import DeepbootError

MAX_ANSWER_BYTES = 1 << 20
"""Most bytes the sync client reads from an answer of the endpoint; a ``/healthz``
answer over it proves nothing."""

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
    if len(body) > MAX_ANSWER_BYTES:
        return f"answered GET /healthz with over {MAX_ANSWER_BYTES} bytes"
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
