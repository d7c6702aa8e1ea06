"""``deepboot dashboard``: a one-time login link to the controller's live dashboard.

The page itself is the controller's (:mod:`deepboot.runtime.http.livedashboard`); this command
only asks the running controller, with the state directory's bearer token, for a
login code, prints the link and, where a browser exists, opens it.

The link never goes into a process's argv (``/proc/PID/cmdline`` is world-readable,
and whoever spends a code first gets the session): the browser is opened on a page
written in the state directory, mode 0600, that goes on to the link
(:func:`write_login_page`), as notebook servers do.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import ipaddress
import json
import os
import secrets
import sys
import time
import urllib.error
import urllib.parse
import webbrowser
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console

from deepboot.core.errors import ConfigError
from deepboot.runtime.http.sessions import LOGIN_TTL_S

LOGIN_PAGE_PREFIX = "dashboard-login-"
"""The login pages' names in the state directory: ``dashboard-login-<random>.html``."""

_EPILOG = """\
examples:
  # print the link and open it in this machine's browser (where a display is:
  # macOS, Windows, or DISPLAY / WAYLAND_DISPLAY set)
  deepboot dashboard

  # only print it (a remote machine: forward the port first, e.g. ssh -L 8470:127.0.0.1:8470)
  deepboot dashboard --no-open --state-dir /var/lib/deepboot

The link holds a one-time code, good for {life}: opening it sets a session
cookie (HTTP-only, same-site strict, 12 hours) and leaves the code out of the
address bar. The browser is opened on a page in the state directory (mode 0600)
that goes on to the link, so the code is never on a command line other users can
read. The page refreshes itself every 3 seconds: each node's GPUs by state and
holder, the jobs, the services with their SLO attainment and p99 wait over the last
5 minutes, and the last hour's timeline with the reclaims (proactive or reactive).
Its data routes need the cookie or the bearer token; a controller restart forgets
the sessions: run this command again.
""".format(life=f"{LOGIN_TTL_S:g} seconds")


def add_parser(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """Add ``deepboot dashboard`` to the ``deepboot`` parser."""
    from deepboot.cli.runtime import _state_flag

    p = sub.add_parser(
        "dashboard",
        formatter_class=formatter,
        help="a one-time login link to the runtime's live dashboard (and open it)",
        description="Ask the running controller for a one-time login link to its live "
        "dashboard, print it, and open it in a browser where one exists.",
        epilog=_EPILOG,
    )
    _state_flag(p)
    p.add_argument(
        "--no-open", action="store_true", help="only print the link; never start a browser"
    )
    p.set_defaults(func=cmd_dashboard)


def login_url(state_dir: str, timeout: float = 10.0) -> str:
    """A fresh one-time login URL of the controller of ``state_dir``.

    Raises:
        ConfigError: no controller serves there, or it refused or did not answer
            within ``timeout``.
    """
    from deepboot.runtime.client.endpoint import EndpointError, connect
    from deepboot.runtime.store.statedir import StateDir

    state = StateDir.at(state_dir)
    try:
        endpoint = connect(state, timeout=timeout)
    except EndpointError as exc:
        raise ConfigError(f"no dashboard: {exc}") from None
    try:
        answer = endpoint.post_json("/v1/dashboard/login", {}, timeout=timeout)
        path = answer["login"]
    except urllib.error.HTTPError as exc:
        raise ConfigError(
            f"the controller at {endpoint.url} refused a dashboard login ({exc.code}); an "
            "older deepboot controller serves no dashboard: restart it with 'deepboot up'"
        ) from None
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"the controller at {endpoint.url} gave no dashboard login within {timeout:g} s ({exc})"
        ) from None
    if not (isinstance(path, str) and path.startswith("/dashboard/login?code=")):
        raise ConfigError(f"the controller at {endpoint.url} answered an odd login: {path!r}")
    return browser_base(endpoint.url) + path


def browser_base(url: str) -> str:
    """``url`` as a browser should open it: an endpoint bound to every interface
    (0.0.0.0, ::) by its loopback address, which browsers let a page reach."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    try:
        unspecified = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return url
    if not unspecified:
        return url
    loopback = "[::1]" if ":" in host else "127.0.0.1"
    return f"{parts.scheme}://{loopback}:{parts.port}"


def cmd_dashboard(
    args: argparse.Namespace,
    out: Console,
    err: Console,
    *,
    opener: Callable[[str], object] | None = None,
) -> int:
    """Print a fresh login link and, unless ``--no-open`` or without a display, open
    the browser on a login page that goes on to it.

    Args:
        opener: Opens a URL in a browser (injected for tests; default: a new tab of
            :func:`webbrowser.open`). It is given the page's ``file:`` URL only.
    """
    from deepboot.runtime.store.statedir import StateDir

    url = login_url(args.state_dir)
    out.print(url, markup=False, highlight=False, soft_wrap=True)
    out.print(
        f"(a one-time link, good for {LOGIN_TTL_S:g} seconds; run 'deepboot dashboard' "
        "again for another)",
        markup=False,
        highlight=False,
    )
    if not args.no_open and has_display():
        # A graphical browser only: a console one (lynx, w3m) would take over this
        # terminal. None found: the link is printed.
        try:
            open_login_page(StateDir.at(args.state_dir).root, url, opener)
        except OSError as exc:
            err.print(
                f"no browser opened (the login page: {exc.strerror or exc}); open the link above",
                markup=False,
                highlight=False,
            )
    return 0


def open_login_page(root: Path, url: str, opener: Callable[[str], object] | None = None) -> Path:
    """Write the login page for ``url`` under ``root`` (:func:`write_login_page`) and
    open the browser on it: ``opener`` gets the page's ``file:`` URL, never ``url``.

    Returns:
        The page's path.

    Raises:
        OSError: the page cannot be written.
    """
    page = write_login_page(root, url)
    if opener is None:
        webbrowser.open(page.as_uri(), new=2)
    else:
        opener(page.as_uri())
    return page


def write_login_page(root: Path, url: str, now: float | None = None) -> Path:
    """A new page under ``root`` (the state directory), readable by its owner only,
    that goes on to ``url`` (a script's ``location.replace``; a meta refresh without
    scripts); the pages of earlier runs, older than a code's life, are removed.

    Created with ``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600, under a random name:
    never an existing file or a link someone planted.

    Args:
        now: Unix seconds (injected for tests; default: now).

    Raises:
        OSError: the page cannot be written.
    """
    now = time.time() if now is None else now
    for old in root.glob(f"{LOGIN_PAGE_PREFIX}*.html"):  # their codes are spent or dead
        with contextlib.suppress(OSError):
            if now - old.lstat().st_mtime > LOGIN_TTL_S:
                old.unlink()
    path = root / f"{LOGIN_PAGE_PREFIX}{secrets.token_hex(8)}.html"
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(login_page(url))
    return path


def login_page(url: str) -> str:
    """The HTML of a page that goes on to ``url`` at once."""
    attr = html.escape(url, quote=True)
    # In a script, "</" or "<!--" must not end it: JSON with <, >, & escaped.
    script = json.dumps(url).replace("<", "\\u003c").replace(">", "\\u003e")
    script = script.replace("&", "\\u0026")
    return f"""<!doctype html>
<html><head><meta charset="utf-8">
<meta name="referrer" content="no-referrer">
<title>deepboot dashboard</title>
<script>window.location.replace({script});</script>
<noscript><meta http-equiv="refresh" content="0; url={attr}"></noscript>
</head><body>
<p>Opening the deepboot dashboard: <a href="{attr}">go on</a> if nothing happens
(a one-time link, good for {LOGIN_TTL_S:g} seconds).</p>
</body></html>
"""


def has_display(platform: str = sys.platform, env: Mapping[str, str] = os.environ) -> bool:
    """Whether a graphical browser could show the page here: macOS and Windows, or a
    display (X11 or Wayland) elsewhere; never over SSH without one."""
    if platform == "darwin" or platform.startswith("win"):
        return True
    return bool(env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"))
