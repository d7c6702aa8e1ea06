"""What the runtime benchmarks (``reclaim.py``, ``twin.py``) share: the ``deepboot`` CLI
of this checkout in a subprocess, and a bounded wait."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def cli_env() -> dict[str, str]:
    """The environment of a spawned ``deepboot``: this checkout's package first."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return env


def cli(state: Path, *args: str, timeout: float = 300) -> str:
    """Run ``deepboot ARGS --state-dir STATE`` with this interpreter and this checkout's
    package first on the path; its stdout.

    Raises:
        RuntimeError: it failed (its output in the message).
        subprocess.TimeoutExpired: it ran past ``timeout`` seconds.
    """
    proc = subprocess.run(
        [sys.executable, "-m", "deepboot.cli.main", *args, "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=cli_env(),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"deepboot {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def wait_for(what: str, ok: Callable[[], Any], timeout: float, every: float = 0.2) -> Any:
    """Poll ``ok()`` every ``every`` seconds until it is truthy; its value.

    Raises:
        TimeoutError: still false after ``timeout`` seconds (naming ``what``).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = ok()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(every)
