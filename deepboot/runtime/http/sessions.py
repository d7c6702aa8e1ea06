"""The dashboard's one-time login codes and the sessions they open (in memory; no
aiohttp here, so the fast tests cover it). See :mod:`deepboot.runtime.http.livedashboard`.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable

LOGIN_TTL_S = 30.0
"""How long a login code may wait to be spent: long enough for a browser to start,
short enough that a code someone else saw is dead soon (issue 42)."""
SESSION_TTL_S = 12 * 3600.0
"""How long a session cookie is good for."""
MAX_SESSIONS = 32
"""Most sessions kept at once (the oldest goes first); as many login codes."""


def _digest(secret: str) -> str:
    # Kept and looked up by digest: the table holds no usable secret, and a lookup's
    # timing says nothing about the secret's characters.
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


class Sessions:
    """One-time login codes and the sessions they open (in memory).

    Args:
        clock: Monotonic seconds (injected).
        login_ttl_s: How long a code may wait to be spent.
        session_ttl_s: How long a session lasts.
        max_sessions: Most codes, and most sessions, kept at once (oldest dropped).
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        login_ttl_s: float = LOGIN_TTL_S,
        session_ttl_s: float = SESSION_TTL_S,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        self.clock = clock
        self.login_ttl_s, self.session_ttl_s = login_ttl_s, session_ttl_s
        self.max_sessions = max_sessions
        self._codes: dict[str, float] = {}  # digest -> expiry
        self._sessions: dict[str, float] = {}

    @staticmethod
    def _keep(table: dict[str, float], now: float, most: int) -> None:
        for key in [k for k, until in table.items() if until <= now]:
            del table[key]
        while len(table) >= most:  # dicts keep insertion order: the oldest first
            del table[next(iter(table))]

    def mint(self) -> str:
        """A new login code (hex, 256 bits)."""
        now = self.clock()
        self._keep(self._codes, now, self.max_sessions)
        code = secrets.token_hex(32)
        self._codes[_digest(code)] = now + self.login_ttl_s
        return code

    def redeem(self, code: str) -> str | None:
        """Spend ``code``: a new session id, or None for a spent, expired or unknown
        code."""
        now = self.clock()
        until = self._codes.pop(_digest(code), None)
        if until is None or until <= now:
            return None
        self._keep(self._sessions, now, self.max_sessions)
        session = secrets.token_hex(32)
        self._sessions[_digest(session)] = now + self.session_ttl_s
        return session

    def valid(self, session: str) -> bool:
        """``session`` is open and not expired."""
        until = self._sessions.get(_digest(session))
        return until is not None and until > self.clock()
