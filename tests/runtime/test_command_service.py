"""Command services on a real local cluster, with the stand-in server
(examples/runtime/standin_server.py): the proxy streams an answer as the server
writes it, refuses a request without the token, and passes an OpenAI-style request
through; a replica whose GPU is lent sleeps (its process kept), and a request that
needs the GPU back is answered after a wake, not a second full load, and the worker lent
that GPU meanwhile is told the memory the sleeping server keeps; a sleep that never
answers is evicted within its timeout and its GPU lent anyway, and a wake that fails
starts the server again cold (both recorded in the event log); a replica of two GPUs
takes both back from a job at once, which shrinks by two (AFE)."""

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
                "sleep_gpu_gb = 0.5",
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


def _formed(state: Path, name: str) -> list[str]:
    """The GPUs of job ``name``'s last generation formed (its start or last resize)."""
    formed = [e.detail.get("to", e.detail.get("workers", [])) for e in events(state, name)
              if e.kind.value in ("started", "resized")]  # fmt: skip
    return list(formed[-1]) if formed else []


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
        # A client that goes away mid-stream: the server's request is cancelled too
        # (its connection closed), not produced to its end for no one.
        long = {**completion, "max_tokens": 50, "stream": True}
        with urllib.request.urlopen(_request(state, "/v1/chat/v1/completions", long)) as r:
            assert r.readline().startswith(b"data: ")  # the first token, then hang up
        wait_for(
            "the server to abort the stream",
            lambda: _call(_request(state, "/v1/chat/stats"))[1]["aborted"] == 1,
            30,
        )
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
        # Its worker there was told what the sleeping server keeps of the GPU.
        told = "0.5 GB of GPU 1.0 held by a sleeping server"
        wait_for("g's worker on 1.0 told", lambda: told in (state / "logs" / "g.log").read_text())

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
        # The server's lines, and its replica's events, under the service's name.
        logs = cli(state, "logs", "chat").stdout
        assert "[chat 1.0] " in logs and "full_load" in logs and '"start": "wake"' in logs, logs
        open_gate(state, "g", gate)
        wait_for("g to finish", lambda: job(state, "g")["state"] == "finished", 300)


def test_a_failed_sleep_evicts_and_a_failed_wake_starts_cold(tmp_path: Path) -> None:
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

        # A wake that fails: the server starts again, cold, and the event log says why.
        cli(state, "serve", str(_service(tmp_path, "flaky", "--fail-wake")))
        assert _call(_request(state, "/v1/flaky/v1/completions", {"prompt": "hi"}))[0] == 200
        gate2 = tmp_path / "gate2"
        cli(state, "submit", str(gated_job(tmp_path, "g2", gate2, max_workers=2)))
        wait_for("g2 on the lent GPU", lambda: len(job(state, "g2")["lent_gpus"]) == 1, 300)
        assert any(d["op"] == "evict" and d.get("asleep") for d in _replica_ops(state, "flaky"))
        assert _call(_request(state, "/v1/flaky/v1/completions", {"prompt": "hi"}))[0] == 200
        ready = [d for d in _replica_ops(state, "flaky") if d["op"] == "ready"]
        assert ready[-1]["start"] == "cold" and "500" in ready[-1]["wake_failed"], ready
        assert _loads(tmp_path, "flaky") == 2
        # It was tried twice (the memory of a GPU's last holder may be late back).
        assert "trying again in 2 s" in cli(state, "logs", "flaky").stdout
        open_gate(state, "g2", gate2)
        wait_for("g2 to finish", lambda: job(state, "g2")["state"] == "finished", 300)


def test_a_two_gpu_replica_reclaims_two_gpus_of_one_node_and_the_job_shrinks_by_two(
    tmp_path: Path,
) -> None:
    flags = ("--training-nodes", "1", "--inference-nodes", "1", "--gpus-per-node", "2",
             "--protect-factor", "0.05")  # fmt: skip
    with local_cluster(tmp_path / "state", *flags) as state:
        path = _service(tmp_path, "wide")
        path.write_text(path.read_text().replace("sleep = ", "# sleep = ").replace(
            "wake = ", "# wake = ") + "gpus_per_replica = 2\n")  # fmt: skip
        cli(state, "serve", str(path))
        gate = tmp_path / "gate"
        cli(state, "submit", str(gated_job(tmp_path, "g", gate, max_workers=4)))
        wait_for("g formed on all 4 GPUs", lambda: len(_formed(state, "g")) == 4, 300)
        asked_seq = events(state)[-1].seq
        code, body = _call(_request(state, "/v1/wide/v1/completions", {"prompt": "hi"}))
        assert code == 200, body
        code, stats = _call(_request(state, "/v1/wide/stats"))
        assert stats["cuda_visible_devices"] == "0,1", stats  # both of the replica's GPUs
        later = [e for e in events(state) if e.seq > asked_seq]
        reclaimed = [e.detail["gpu"] for e in later if e.kind.value == "gpu"
                     and e.detail["op"] == "reclaim"]  # fmt: skip
        assert sorted(reclaimed) == ["1.0", "1.1"], reclaimed
        # The survivors' new generation is logged once it has formed (the replica may
        # answer first: it starts as soon as the departing workers are gone).
        shrinks = wait_for(
            "g's shrink",
            lambda: [
                e.detail
                for e in events(state)
                if e.seq > asked_seq and e.kind.value == "resized" and len(e.detail["to"]) < 4
            ],  # fmt: skip
            120,
        )
        assert (len(shrinks[0]["from"]), len(shrinks[0]["to"])) == (4, 2), shrinks
        assert shrinks[0]["how"] == "afe", shrinks
        started = [d for d in _replica_ops(state, "wide") if d["op"] == "start"]
        assert started[-1]["gpus"] == ["1.0", "1.1"], started
        open_gate(state, "g", gate)
        wait_for("g to finish", lambda: job(state, "g")["state"] == "finished", 300)
