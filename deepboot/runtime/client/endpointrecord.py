"""What a state directory says about its controller's endpoint, read without the
network: the URL and instance id that ``STATE_DIR/http.json`` records
(:func:`read_record`), the bearer token of a token file (:func:`read_token`), and a
URL given on the command line (:func:`check_url`).

Nothing here is checked against the endpoint itself: that is
:mod:`deepboot.runtime.client.endpoint`'s work, before the token is sent anywhere.
Every malformed file is an :class:`~deepboot.core.errors.InputError` naming it (and
http.json's key); a missing http.json is an
:class:`~deepboot.runtime.client.endpointproof.EndpointError` (no controller serves).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from deepboot.core.errors import InputError
from deepboot.runtime.client.endpointproof import EndpointError


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
