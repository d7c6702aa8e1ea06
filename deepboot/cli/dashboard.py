"""``deepboot dashboard``: a one-time login link to the controller's live dashboard.

The page itself is the controller's (:mod:`deepboot.runtime.dashboard`); this command
only asks the running controller, with the state directory's bearer token, for a
login code, prints the link and, where a browser exists, opens it.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
import urllib.error
import urllib.parse
import webbrowser
from collections.abc import Mapping
from typing import Any

from rich.console import Console

from deepboot.core.errors import ConfigError

_EPILOG = """\
examples:
  # print the link and open it in this machine's browser (where a display is:
  # macOS, Windows, or DISPLAY / WAYLAND_DISPLAY set)
  deepboot dashboard

  # only print it (a remote machine: forward the port first, e.g. ssh -L 8470:127.0.0.1:8470)
  deepboot dashboard --no-open --state-dir /var/lib/deepboot

The link holds a one-time code, good for 2 minutes: opening it sets a session
cookie (HTTP-only, same-site strict, 12 hours) and leaves the code out of the
address bar. The page refreshes itself every 3 seconds: each node's GPUs by state
and holder, the jobs, the services with their SLO attainment and p99 wait over the
last 5 minutes, and the last hour's timeline with the reclaims (proactive or
reactive). Its data routes need the cookie or the bearer token; a controller
restart forgets the sessions: run this command again.
"""


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
    from deepboot.runtime.endpoint import EndpointError, connect
    from deepboot.runtime.statedir import StateDir

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


def cmd_dashboard(args: argparse.Namespace, out: Console, err: Console) -> int:
    url = login_url(args.state_dir)
    out.print(url, markup=False, highlight=False, soft_wrap=True)
    out.print(
        "(a one-time link, good for 2 minutes; run 'deepboot dashboard' again for another)",
        markup=False,
        highlight=False,
    )
    if not args.no_open and has_display():
        # A graphical browser only: a console one (lynx, w3m) would take over this
        # terminal. None found: the link is printed.
        webbrowser.open(url, new=2)
    return 0


def has_display(platform: str = sys.platform, env: Mapping[str, str] = os.environ) -> bool:
    """Whether a graphical browser could show the page here: macOS and Windows, or a
    display (X11 or Wayland) elsewhere; never over SSH without one."""
    if platform == "darwin" or platform.startswith("win"):
        return True
    return bool(env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"))
