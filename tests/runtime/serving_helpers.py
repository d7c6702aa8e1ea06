"""Helpers of the runtime's serving tests: a service and a gated training job on
file, a request-rate profile, ``deepboot load`` in a thread, one POST."""

from __future__ import annotations

import csv
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.runtime.cluster_helpers import GATED_CODE, REPO, cli, open_gate_at

GATED = GATED_CODE
ECHO = REPO / "examples" / "runtime" / "echo_service.py"
THRESHOLD = 0.1
"""The gated job's loss threshold: a tenth of its first loss, which it reaches in
about 60 steps, long before any test opens its gate. The gate, not the loss, says
when it finishes (at 0.004 a job opened after a short scenario trained on for up to
two minutes, ~400 steps, with nothing left to check)."""


def service_file(
    directory: Path, name: str, delay: float, max_replicas: int, extra: tuple[str, ...] = ()
) -> Path:
    """The echo service ``name`` (``delay`` s per request) on file; ``extra``: more
    top-level ``key = value`` lines."""
    path = directory / f"{name}.toml"
    path.write_text(
        "\n".join(
            [
                f'name = "{name}"',
                'model = "tiny-mlp"',
                f'handler = "{ECHO}:load"',
                "concurrency = 1",
                f"max_replicas = {max_replicas}",
                "queue_bound = 1000",
                "request_timeout_s = 120",
                *extra,
                "[args]",
                f"delay_s = {delay}",
            ]
        )
        + "\n"
    )
    return path


def gated_job(
    directory: Path,
    name: str,
    gate: Path,
    max_workers: int,
    hang: Path | None = None,
    **args: Any,
) -> Path:
    """The gated job ``name`` on file; ``args``: more of its ``[args]`` (JSON values)."""
    path = directory / f"{name}.toml"
    path.write_text(
        "\n".join(
            [
                f'name = "{name}"',
                f'entry = "{GATED}:train"',
                "min_workers = 1",
                f"max_workers = {max_workers}",
                # An initial batch of 128 and >= 16 per GPU: steps long enough
                # (5 ms per sample) that more GPUs clearly pay, even on a loaded
                # 2-core machine, so the policy grows the job whenever it can. At
                # 2 ms, 6 gloo workers' all-reduce on a busy 2-core CI machine ate
                # most of the gain (64 -> 42 samples a step: 44 ms), the online fit
                # saw no speed-up, and the job never borrowed again after a spike.
                "batch_size = 128",
                "max_batch_size = 256",
                "min_local_batch_size = 16",
                "max_local_batch_size = 64",
                "checkpoint_every = 25",
                "[args]",
                f"loss_threshold = {THRESHOLD}",
                f'gate = "{gate}"',
                "sample_delay = 0.005",
                *([f'hang = "{hang}"'] if hang else []),
                *(f"{k} = {json.dumps(v)}" for k, v in args.items()),
            ]
        )
        + "\n"
    )
    return path


def open_gate(state: Path, name: str, gate: Path) -> None:
    """Let ``name`` finish once its loss is low enough, 40 steps from now."""
    open_gate_at(state, name, gate)


def rate_profile(directory: Path, name: str, rows: list[tuple[float, float]]) -> Path:
    path = directory / f"{name}.csv"
    path.write_text("time_s,rps\n" + "".join(f"{t},{r}\n" for t, r in rows))
    return path


class Load:
    """``deepboot load`` in a thread (the real CLI, in a subprocess).

    Each run numbers its request ids from 0, so ids are unique within a run.
    """

    def __init__(self, state: Path, service: str, profile: Path, out: Path, *flags: str) -> None:
        self.out = out
        args = (service, "--rate-profile", str(profile), "--out", str(out), "-q", *flags)
        self.thread = threading.Thread(
            target=lambda: cli(state, "load", *args, timeout=600), daemon=True
        )
        self.thread.start()

    def rows(self) -> list[dict[str, str]]:
        self.thread.join(600)
        assert not self.thread.is_alive()
        with self.out.open() as f:
            return list(csv.DictReader(f))


def post(state: Path, service: str, rid: str, body: Any) -> tuple[int, Any]:
    code, answer, _ = post_with_headers(state, service, rid, body)
    return code, answer


def post_with_headers(
    state: Path, service: str, rid: str, body: Any
) -> tuple[int, Any, dict[str, str]]:
    """POST one request: its status, JSON answer and headers."""
    url = json.loads((state / "http.json").read_text())["url"]
    token = (state / "http-token").read_text().strip()
    req = urllib.request.Request(
        f"{url}/v1/{service}/infer",
        data=json.dumps(body).encode(),
        headers={
            "X-Request-Id": rid,
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), dict(e.headers)


def scrape(state: Path, service: str, names: dict[str, str]) -> dict[str, int]:
    """The counters ``names`` (metric sample name -> key) of ``service`` as the
    controller's ``/metrics`` shows them now (0 for one not shown)."""
    from prometheus_client.parser import text_string_to_metric_families

    url = json.loads((state / "http.json").read_text())["url"]
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out = dict.fromkeys(names.values(), 0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names and sample.labels.get("service") == service:
                out[names[sample.name]] = int(sample.value)
    return out
