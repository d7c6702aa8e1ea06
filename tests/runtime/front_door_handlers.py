"""Service factories that misbehave on purpose, for tests/runtime/test_front_door.py.

Each factory has the runtime's signature ``factory(device, **args) -> handler(body)``.
Those that record what they do append one JSON line per event to ``args["record"]``
(a file the test reads; appends of one short line are atomic between processes).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any


def _writer(path: str) -> Callable[..., None]:
    lock = threading.Lock()

    def write(**fields: Any) -> None:
        line = json.dumps({"pid": os.getpid(), "t": time.time(), **fields}) + "\n"
        with lock, open(path, "a") as f:
            f.write(line)

    return write


def hang(device: str, **_: Any) -> Callable[[Any], Any]:
    """Never finishes loading."""
    while True:
        time.sleep(3600)


def broken(device: str, **_: Any) -> Callable[[Any], Any]:
    """Fails to load, with an error that names an internal path."""
    raise RuntimeError(f"cannot open /srv/secret/weights-{os.getpid()}.bin")


def poison(device: str, record: str, **_: Any) -> Callable[[Any], Any]:
    """Answers every body but ``{"poison": true}``, on which it kills its own process."""
    write = _writer(record)
    write(event="load")

    def handle(body: Any) -> Any:
        if isinstance(body, dict) and body.get("poison"):
            write(event="poisoned")
            os._exit(17)
        return {"ok": True, "pid": os.getpid()}

    return handle


def recorded(device: str, record: str, sleep_s: float = 0.0, **_: Any) -> Callable[[Any], Any]:
    """Records the start and end of every call (with the body's ``tag``), sleeping
    ``sleep_s`` (or the body's ``sleep_s``) in between."""
    write = _writer(record)

    def handle(body: Any) -> Any:
        tag = body.get("tag", "") if isinstance(body, dict) else ""
        seconds = body.get("sleep_s", sleep_s) if isinstance(body, dict) else sleep_s
        write(event="start", tag=tag)
        time.sleep(float(seconds))
        write(event="end", tag=tag)
        return {"tag": tag, "pid": os.getpid()}

    return handle


def read_record(path: str) -> list[dict[str, Any]]:
    """The events a recording handler wrote (none when the file does not exist)."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
