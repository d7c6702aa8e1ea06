"""The stand-in model server (examples/runtime/standin_server.py), as a process.

Each test starts it with a tiny weights file (a few tens of MB) on a free port
(``--port 0``: the port is read from its first line), waits with a bound, and kills
it at the end whatever happened. Nothing here is a speed claim: the streaming test
checks the order of events (the first chunk reached the client before the server
produced the last), not how fast.
"""

from __future__ import annotations

import http.client
import json
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiohttp")

SERVER = Path(__file__).resolve().parents[2] / "examples" / "runtime" / "standin_server.py"
WAIT_S = 60.0
"""Bound of every wait for the server (a start, a load, an exit)."""

_LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


@dataclass
class Standin:
    proc: subprocess.Popen[str]
    port: int
    lines: list[str] = field(default_factory=list)

    def call(
        self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = WAIT_S
    ) -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    def health(self) -> int:
        return self.call("GET", "/health")[0]

    def wait_ready(self) -> None:
        wait_until("a 200 from /health", lambda: self.health() == 200)

    def stats(self) -> dict[str, Any]:
        return self.call("GET", "/stats")[1]


def wait_until(what: str, ok: Callable[[], bool], timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Standin]]:
    """``start(*flags)``: a stand-in server on a free port, its weights 0.02 GB in
    ``tmp_path`` unless the flags say otherwise; every one started is killed after
    the test."""
    started: list[Standin] = []

    def _start(*flags: str, weights_gb: float = 0.02, load_gbps: float = 0.0) -> Standin:
        argv = [
            sys.executable, str(SERVER), "--port", "0", "--model", "m",
            "--weights-gb", str(weights_gb), "--load-gbps", str(load_gbps),
            "--weights-file", str(tmp_path / f"weights-{weights_gb}.bin"), *flags,
        ]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: queue.Queue[str] = queue.Queue()
        seen: list[str] = []

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                seen.append(line)
                lines.put(line)

        threading.Thread(target=pump, daemon=True).start()
        server = Standin(proc, 0, seen)
        started.append(server)
        deadline = time.monotonic() + WAIT_S
        while server.port == 0:
            try:
                line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no 'listening' line; output: {seen}") from None
            found = _LISTENING.search(line)
            if found:
                server.port = int(found.group(1))
        return server

    try:
        yield _start
    finally:
        for server in started:
            if server.proc.poll() is None:
                server.proc.kill()
            server.proc.wait(timeout=WAIT_S)


def test_help_names_every_flag() -> None:
    out = subprocess.run(
        [sys.executable, str(SERVER), "--help"], capture_output=True, text=True, timeout=WAIT_S
    )
    assert out.returncode == 0
    for flag in ("--port", "--host", "--model", "--weights-gb", "--load-gbps", "--wake-gbps",
                 "--weights-file", "--token-delay-s", "--load-log", "--hang-sleep",
                 "--fail-wake"):  # fmt: skip
        assert flag in out.stdout


def test_health_is_503_while_loading_then_200(start: Callable[..., Standin]) -> None:
    # 0.04 GB at 0.01 GB/s: a 4-s load, and the server listens before it starts.
    server = start(weights_gb=0.04, load_gbps=0.01)
    status, body = server.call("GET", "/health")
    assert (status, body["status"]) == (503, "loading")
    assert server.stats()["full_loads"] == 0
    status, _ = server.call("POST", "/v1/completions", {"model": "m", "prompt": "hi"})
    assert status == 503
    server.wait_ready()
    stats = server.stats()
    assert stats["full_loads"] == 1 and stats["device_bytes"] == 40_000_000


def test_a_completion_answers_openai_shaped(start: Callable[..., Standin]) -> None:
    server = start()
    server.wait_ready()
    status, body = server.call(
        "POST", "/v1/completions", {"model": "m", "prompt": "one two", "max_tokens": 3}
    )
    assert status == 200
    assert body["object"] == "text_completion" and body["model"] == "m"
    [choice] = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert choice["text"] == " The quick brown"
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    status, body = server.call(
        "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}
    )
    assert status == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert server.call("POST", "/v1/completions", {"model": "other", "prompt": "x"})[0] == 404
    assert server.call("POST", "/v1/completions", {"prompt": "x", "max_tokens": 0})[0] == 400
    assert server.call("POST", "/v1/completions", {"max_tokens": 2})[0] == 400
    assert server.stats()["requests"] == 5


def test_a_streamed_completion_arrives_before_its_last_token_is_made(
    start: Callable[..., Standin],
) -> None:
    server = start("--token-delay-s", "0.2")
    server.wait_ready()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT_S)
    try:
        body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 5, "stream": True})
        conn.request("POST", "/v1/completions", body=body.encode())
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("Content-Type", "").startswith("text/event-stream")
        events: list[tuple[int, str]] = []  # (the client's arrival, monotonic ns; data)
        while True:
            line = resp.readline()
            assert line, f"the stream ended without [DONE] after {events}"
            if line.startswith(b"data: "):
                events.append((time.monotonic_ns(), line[6:].strip().decode()))
                if events[-1][1] == "[DONE]":
                    break
            else:
                assert line == b"\n"  # the blank line that ends each event
    finally:
        conn.close()
    chunks = [(arrived, json.loads(data)) for arrived, data in events[:-1]]
    assert [c["token_index"] for _, c in chunks] == [0, 1, 2, 3, 4]
    assert "".join(c["choices"][0]["text"] for _, c in chunks) == " The quick brown fox jumps"
    assert [c["choices"][0]["finish_reason"] for _, c in chunks] == [None] * 4 + ["length"]
    # CLOCK_MONOTONIC is one clock for every process of the machine: the first chunk
    # reached this client before the server produced the last one (it was not
    # buffered until the end), and no chunk arrived before it was produced.
    first_arrived = chunks[0][0]
    last_made = chunks[-1][1]["created_ns"]
    assert first_arrived < last_made
    for arrived, chunk in chunks:
        assert chunk["created_ns"] <= arrived


def test_sleep_then_wake_keeps_one_full_load(start: Callable[..., Standin], tmp_path: Path) -> None:
    log = tmp_path / "loads.log"
    server = start("--load-log", str(log))
    server.wait_ready()
    assert server.call("GET", "/is_sleeping")[1] == {"is_sleeping": False}
    assert server.call("POST", "/sleep?level=2")[0] == 400  # level 1 only
    assert server.call("POST", "/sleep?level=1") == (200, {"sleeping": True})
    assert server.call("GET", "/is_sleeping")[1] == {"is_sleeping": True}
    asleep = server.stats()
    assert asleep["device_bytes"] == 0 and asleep["host_bytes"] == 20_000_000
    assert server.health() == 200  # as vLLM's: asleep is still healthy
    status, body = server.call("POST", "/v1/completions", {"prompt": "x"})
    assert status == 503 and "asleep" in body["error"]["message"]
    assert server.call("POST", "/wake_up")[0] == 200
    assert server.call("GET", "/is_sleeping")[1] == {"is_sleeping": False}
    assert server.call("POST", "/v1/completions", {"prompt": "x"})[0] == 200
    stats = server.stats()
    assert (stats["full_loads"], stats["sleeps"], stats["wakes"]) == (1, 1, 1)
    assert stats["device_bytes"] == 20_000_000 and stats["host_bytes"] == 0
    [line] = log.read_text().splitlines()
    word, pid, when = line.split()
    assert (word, int(pid)) == ("full_load", server.proc.pid) and float(when) > 0
    out = "".join(server.lines)
    assert "full_load" in out and "sleep:" in out and "wake:" in out


def test_the_load_log_has_one_line_per_full_load_across_processes(
    start: Callable[..., Standin], tmp_path: Path
) -> None:
    log = tmp_path / "loads.log"
    servers = [start("--load-log", str(log)) for _ in range(2)]
    for server in servers:
        server.wait_ready()
    pids = sorted(int(line.split()[1]) for line in log.read_text().splitlines())
    assert pids == sorted(s.proc.pid for s in servers)


def test_a_hung_sleep_never_answers(start: Callable[..., Standin]) -> None:
    server = start("--hang-sleep")
    server.wait_ready()
    with pytest.raises((TimeoutError, socket.timeout)):
        server.call("POST", "/sleep?level=1", timeout=0.5)
    assert server.health() == 200  # the rest of the server still answers
    assert server.stats()["sleeps"] == 0
    server.proc.send_signal(signal.SIGTERM)  # a hung call does not hold the exit
    assert server.proc.wait(timeout=WAIT_S) == 0


def test_a_failed_wake_is_500_and_stays_asleep(start: Callable[..., Standin]) -> None:
    server = start("--fail-wake")
    server.wait_ready()
    assert server.call("POST", "/sleep?level=1")[0] == 200
    status, body = server.call("POST", "/wake_up")
    assert status == 500 and "error" in body
    assert server.call("GET", "/is_sleeping")[1] == {"is_sleeping": True}
    assert server.stats()["wakes"] == 0


@pytest.mark.parametrize("when", ["loaded", "loading"])
def test_sigterm_exits_0(start: Callable[..., Standin], when: str) -> None:
    if when == "loaded":
        server = start()
        server.wait_ready()
    else:  # a 100-s load, cut short
        server = start(weights_gb=0.02, load_gbps=0.0002)
        assert server.health() == 503
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=WAIT_S) == 0
