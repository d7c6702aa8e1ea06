"""Command services on a real local cluster, with the stand-in server
(examples/runtime/standin_server.py): the proxy streams an answer as the server
writes it, refuses a request without the token, and passes an OpenAI-style request
through; a replica whose GPU is lent sleeps (its process kept), and a request that
needs the GPU back is answered after a wake, not a second full load; a sleep that
never answers is evicted within its timeout and its GPU lent anyway."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.cluster_helpers import REPO, cli, events, job, local_cluster, wait_for
from tests.runtime.serving_helpers import gated_job, open_gate

pytestmark = pytest.mark.runtime

STANDIN = REPO / "examples" / "runtime" / "standin_server.py"
FLAGS = ("--training-nodes", "1", "--inference-nodes", "1", "--gpus-per-node", "1",
         "--protect-factor", "0.05")  # fmt: skip
"""One training GPU and one inference GPU to lend; replicas protected ~1.5 s."""
TOKENS = 5
TOKEN_DELAY_S = 0.3


def _service(directory: Path, name: str, *flags: str, sleep_timeout_s: float = 10.0) -> Path:
    """The stand-in as command service ``name``: 0.05 GB of weights at 0.05 GB/s (a ~1 s
    cold load), each full load logged to ``<name>-loads.log`` beside the file."""
    argv = [
        "python", str(STANDIN), "--port", "{port}", "--model", "{model}",
        "--weights-gb", "0.05", "--load-gbps", "0.05", "--wake-gbps", "1",
        "--token-delay-s", str(TOKEN_DELAY_S), "--load-log", str(directory / f"{name}-loads.log"),
        *flags,
    ]  # fmt: skip
    path = directory / f"{name}.toml"
    path.write_text(
        "\n".join(
            [
                f'name = "{name}"',
                'model = "standin-8b"',
                "command = [" + ", ".join(json.dumps(w) for w in argv) + "]",
                'ready_path = "/health"',
                'health_path = "/health"',
                'sleep = { method = "POST", path = "/sleep?level=1", '
                f"timeout_s = {sleep_timeout_s} }}",
                'wake = { method = "POST", path = "/wake_up", timeout_s = 30 }',
                "concurrency = 4",
                "stop_grace_s = 3",
                "request_timeout_s = 120",
            ]
        )
        + "\n"
    )
    return path


def _request(
    state: Path,
    path: str,
    body: Any = None,
    token: bool = True,
    headers: dict[str, str] | None = None,
) -> urllib.request.Request:
    url = json.loads((state / "http.json").read_text())["url"]
    h = dict(headers or {})
    if token:
        h["Authorization"] = f"Bearer {(state / 'http-token').read_text().strip()}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    return urllib.request.Request(
        url + path, data=data, headers=h, method="POST" if data else "GET"
    )


def _call(req: urllib.request.Request) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _loads(directory: Path, name: str) -> int:
    path = directory / f"{name}-loads.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _replica_ops(state: Path, service: str) -> list[dict[str, Any]]:
    return [
        e.detail for e in events(state)
        if e.kind.value == "replica" and e.detail.get("service") == service
    ]  # fmt: skip


def test_proxy_streams_sleeps_when_lent_and_wakes_on_reclaim(tmp_path: Path) -> None:
    with local_cluster(tmp_path / "state", *FLAGS) as state:
        cli(state, "serve", str(_service(tmp_path, "chat")))
        completion = {"model": "standin-8b", "prompt": "hi", "max_tokens": TOKENS}

        # The front door: no token, no answer, whatever the method; a page of
        # another site neither.
        for req in (
            _request(state, "/v1/chat/v1/completions", completion, token=False),
            _request(state, "/v1/chat/stats", token=False),
        ):
            assert _call(req)[0] == 401, req.full_url
        cross = _request(state, "/v1/chat/stats", headers={"Origin": "http://evil.example"})
        assert _call(cross)[0] == 403

        # A streamed answer arrives in pieces: the client holds the first token
        # before the server has produced the last (the chunks carry the server's
        # CLOCK_MONOTONIC time of production; this process reads the same clock).
        req = _request(state, "/v1/chat/v1/completions", {**completion, "stream": True})
        with urllib.request.urlopen(req, timeout=120) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            assert float(r.headers["X-Wait-Ms"]) >= 0
            first_seen_ns, chunks = 0, []
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                if not first_seen_ns:
                    first_seen_ns = time.monotonic_ns()
                if line == "data: [DONE]":
                    break
                chunks.append(json.loads(line[len("data: ") :]))
        assert [c["token_index"] for c in chunks] == list(range(TOKENS))
        assert first_seen_ns < chunks[-1]["created_ns"], "the answer was buffered whole"
        # A plain request, its query and JSON answer passed through.
        code, body = _call(_request(state, "/v1/chat/v1/completions", completion))
        assert code == 200 and body["object"] == "text_completion", body
        code, stats = _call(_request(state, "/v1/chat/stats?x=1"))
        assert code == 200 and stats["full_loads"] == 1, stats
        assert _loads(tmp_path, "chat") == 1

        # Idle, the replica sleeps and its GPU is lent: the job grows onto it.
        gate = tmp_path / "gate"
        cli(state, "submit", str(gated_job(tmp_path, "g", gate, max_workers=2)))
        wait_for(
            "the replica asleep",
            lambda: any(
                d["op"] == "evict" and d.get("asleep") for d in _replica_ops(state, "chat")
            ),
            120,
        )
        wait_for("g on the lent GPU", lambda: len(job(state, "g")["lent_gpus"]) == 1, 300)

        # A request that needs the GPU back: reclaimed, the server woken, not loaded.
        asked = time.time()
        code, body = _call(_request(state, "/v1/chat/v1/completions", completion))
        assert code == 200, body
        ready = [d for d in _replica_ops(state, "chat") if d["op"] == "ready"]
        assert ready[-1]["start"] == "wake", ready
        assert _loads(tmp_path, "chat") == 1, "the wake loaded the model again"
        reclaims = [
            e for e in events(state, "g")
            if e.kind.value == "gpu" and e.detail["op"] == "reclaim" and e.time >= asked - 1
        ]  # fmt: skip
        assert reclaims, "no GPU was reclaimed for the request"
        code, stats = _call(_request(state, "/v1/chat/stats"))
        assert (stats["full_loads"], stats["wakes"], stats["sleeps"]) == (1, 1, 1), stats
        open_gate(state, "g", gate)
        wait_for("g to finish", lambda: job(state, "g")["state"] == "finished", 300)


def test_a_sleep_that_never_answers_is_evicted_and_its_gpu_lent(tmp_path: Path) -> None:
    with local_cluster(tmp_path / "state", *FLAGS) as state:
        cli(state, "serve", str(_service(tmp_path, "stuck", "--hang-sleep", sleep_timeout_s=2)))
        code, _ = _call(_request(state, "/v1/stuck/v1/completions", {"prompt": "hi"}))
        assert code == 200
        gate = tmp_path / "gate"
        cli(state, "submit", str(gated_job(tmp_path, "g", gate, max_workers=2)))
        failed = wait_for(
            "the sleep to fail",
            lambda: [d for d in _replica_ops(state, "stuck") if d["op"] == "sleep-failed"],
            120,
        )
        assert "no answer within 2 s" in failed[0]["error"], failed
        wait_for("g on the lent GPU", lambda: len(job(state, "g")["lent_gpus"]) == 1, 300)
        ops = [d["op"] for d in _replica_ops(state, "stuck")]
        assert ops[ops.index("sleep-failed") + 1] == "evict", ops
        open_gate(state, "g", gate)
        wait_for("g to finish", lambda: job(state, "g")["state"] == "finished", 300)
