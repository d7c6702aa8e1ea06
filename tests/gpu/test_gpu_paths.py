"""The GPU paths on real CUDA devices (``make test-gpu``), on local clusters whose
logical GPUs map to the machine's (``deepboot up``'s per-node CUDA_VISIBLE_DEVICES;
``--cuda-devices 0,0`` puts a training and an inference node of one GPU each on a
one-GPU machine's device):

- one GPU: a job's worker on ``cuda`` is lent an inference GPU, shrinks to 0 when a
  replica takes it back, and comes back; the replica's model (``DEEPBOOT_GPU_MODEL_GB``
  GB, default 2) loads on ``cuda``, is evicted for lending into the node's host cache,
  and restores from it: its copy rates against the simulator's ``--host-gbps``;
- two GPUs: an ElasticContext job's NCCL group re-formed at every resize (AFE), and a
  plain torchrun script (a command job) under NCCL across its restarts;
- one GPU: a worker lent the GPU of a sleeping server fills what is free beside the
  memory the server keeps, and the server wakes after the worker is gone: no
  out-of-memory on either side.

Each skips with its reason where the machine has fewer CUDA devices than it needs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.conftest import cuda_devices, dry_run, expected_device, need_gpus
from tests.runtime.cluster_helpers import (
    REPO,
    cli,
    events,
    job,
    local_cluster,
    open_gate_at,
    wait_for,
)
from tests.runtime.serving_helpers import gated_job, post

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
ONE_AND_ONE = ("--training-nodes", "1", "--inference-nodes", "1", "--gpus-per-node", "1",
               "--protect-factor", "0.05")  # fmt: skip
"""1 training + 1 inference node x 1 GPU; a replica protected ~1.5 s when idle."""
MODEL_GB = float(os.environ.get("DEEPBOOT_GPU_MODEL_GB", "2"))
"""The size of the GPU test service's model, GB."""


def _devices(logical: int) -> tuple[str, ...]:
    """``up`` flags that put ``logical`` one-GPU nodes on CUDA devices: the default
    (one device each) when the machine has enough, else all on device 0."""
    count, _ = cuda_devices()
    if count >= logical and not dry_run():
        return ()
    return ("--cuda-devices", ",".join(["0"] * logical))


def _job(directory: Path, name: str, gate: Path, max_workers: int, **args: Any) -> Path:
    """The tests' gated regression job (on the worker's device, ``ctx.device``)."""
    return gated_job(directory, name, gate, max_workers, **args)


def _log(state: Path, name: str) -> str:
    path = state / "logs" / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _holder(state: Path, gpu: str) -> str | None:
    """The job GPU ``gpu`` was last lent or bound to, None if it was taken back."""
    ops = [e for e in events(state) if e.kind.value == "gpu" and e.detail["gpu"] == gpu]
    last = ops[-1] if ops else None
    return last.job if last is not None and last.detail["op"] in ("lend", "bind") else None


def _finish(state: Path, tmp_path: Path, *names: str) -> None:
    for name in names:
        open_gate_at(state, name, tmp_path / f"{name}.gate")
    for name in names:
        wait_for(f"{name} to finish", lambda n=name: job(state, n)["state"] == "finished", 300)


def _model_service(directory: Path) -> Path:
    path = directory / "model.toml"
    path.write_text(
        "\n".join(
            [
                'name = "model"',
                'model = "gpu-test-model"',
                f'handler = "{HERE / "gpu_model_service.py"}:load"',
                "max_replicas = 1",
                "request_timeout_s = 300",
                "[args]",
                f"model_gb = {MODEL_GB}",
            ]
        )
        + "\n"
    )
    return path


def test_a_lent_gpu_on_cuda_shrinks_to_zero_and_its_replica_restores_from_host_memory(
    tmp_path: Path, record_property: Any
) -> None:
    need_gpus(1)
    from deepboot.world.hostcache import DEFAULT_HOST_GBPS, DEFAULT_HOST_INIT_S

    # The export of a model of GBs (device to host, into the object store) may take
    # over the default 5 s: 60, so that the eviction keeps it.
    flags = (*ONE_AND_ONE, *_devices(2), "--host-cache-gb", f"{MODEL_GB * 1.5:g}",
             "--export-timeout", "60")  # fmt: skip
    with local_cluster(tmp_path / "state", *flags, own=True) as state:
        cli(state, "serve", str(_model_service(tmp_path)))
        # 1. A cold start on the FREE inference GPU: the model on its CUDA device.
        code, body = post(state, "model", "cold", {})
        assert code == 200, body
        cold = body["result"]
        device, backend = expected_device()
        assert cold["device"] == device and cold["start"] == "cold", cold
        # 2. Two one-worker jobs: "b" holds the training GPU, so "g" is lent the
        #    inference one once the idle replica is evicted (its model exported into
        #    node 1's host cache). Each worker is one process on a CUDA device (on a
        #    one-GPU machine both on device 0: one worker each, never one group).
        for name in ("b", "g"):
            cli(state, "submit", str(_job(tmp_path, name, tmp_path / f"{name}.gate", 1)))
        borrower = wait_for("a job lent GPU 1.0", lambda: _holder(state, "1.0"), 300)
        wait_for(f"{borrower} stepping", lambda: job(state, borrower)["step"] > 5, 300)
        for name in ("b", "g"):
            assert f"on {device} ({backend}), rank 0 of 1" in _log(state, name), _log(state, name)
        evicted = [e.detail for e in events(state)
                   if e.kind.value == "replica" and e.detail["op"] == "evict"]  # fmt: skip
        assert evicted and evicted[-1].get("cache") == "exported", evicted
        # 3. A request takes 1.0 back: the borrower shrinks to 0 workers, and the
        #    replica restores from host memory.
        before = events(state)[-1].seq
        step_before = job(state, borrower)["step"]
        code, body = post(state, "model", "host", {})
        assert code == 200, body
        host = body["result"]
        assert host["device"] == device and host["start"] == "host", host
        assert host["head"] == cold["head"], (host, cold)  # the same weights
        kinds = [e.kind.value for e in events(state, borrower) if e.seq > before]
        assert "preempted" in kinds, kinds
        ready = wait_for("the host start's ready", lambda: [
            e.detail for e in events(state) if e.seq > before and e.kind.value == "replica"
            and e.detail["op"] == "ready"], 60)  # fmt: skip
        assert ready[0]["start"] == "host", ready
        # 4. The replica idles, 1.0 is lent again, and the borrower comes back on
        #    cuda from its checkpoint, and trains on.
        # (Its new generation is logged as a restart: from its checkpoint.)
        back = wait_for("the borrower back", lambda: [
            e.detail for e in events(state, borrower)
            if e.seq > before and e.kind.value in ("started", "resized")], 300)  # fmt: skip
        assert back[0]["workers"] == ["1.0"], back
        wait_for("the borrower training again",
                 lambda: job(state, borrower)["step"] > step_before + 5, 300)  # fmt: skip
        _finish(state, tmp_path, "b", "g")
    figures = {
        "model_gb": host["gb"],
        "cold_copy_s": cold["cold_copy_s"],
        "h2d_pageable_gbps": host["h2d_pageable_gbps"],
        "h2d_pinned_gbps": host["h2d_pinned_gbps"],
        "restore_copy_s": host["restore_copy_s"],
        "host_start_load_s": float(ready[0]["load_seconds"]),
        "sim_host_gbps": DEFAULT_HOST_GBPS,
        "sim_host_start_s": DEFAULT_HOST_INIT_S + host["gb"] / DEFAULT_HOST_GBPS,
    }
    for key, value in figures.items():
        record_property(key, value)


def _resizes(state: Path, name: str, after: int = 0) -> list[dict[str, Any]]:
    """Job ``name``'s resizes logged after event ``after``, oldest first."""
    return [e.detail for e in events(state, name) if e.kind.value == "resized" and e.seq > after]


def _grown_after(resizes: list[dict[str, Any]], shrink: dict[str, Any]) -> list[dict[str, Any]]:
    """The resizes onto more GPUs that follow ``shrink`` in ``resizes``."""
    later = resizes[resizes.index(shrink) + 1 :]
    return [r for r in later if len(r["to"]) > len(r["from"])]


def test_an_elastic_jobs_nccl_group_reforms_at_every_resize(
    tmp_path: Path, record_property: Any
) -> None:
    need_gpus(2)
    with local_cluster(tmp_path / "state", *ONE_AND_ONE, own=True) as state:
        cli(state, "serve", str(_model_service(tmp_path)))
        cli(state, "submit", str(_job(tmp_path, "g", tmp_path / "g.gate", 2)))
        wait_for("g on 2 GPUs", lambda: len(job(state, "g")["workers"]) == 2, 300)
        wait_for("g stepping on 2", lambda: any(len(r["to"]) == 2 for r in _resizes(state, "g"))
                 or job(state, "g")["step"] > 5, 300)  # fmt: skip
        # A request takes the lent GPU back: g shrinks to 1 by AFE, its NCCL group
        # re-formed on the survivor; the replica idles, and g grows back to 2.
        before = events(state)[-1].seq
        code, body = post(state, "model", "r1", {})
        assert code == 200 and body["result"]["device"] == expected_device()[0], body
        shrink = wait_for("g's shrink", lambda: [r for r in _resizes(state, "g", before)
                                                if len(r["to"]) < len(r["from"])], 300)  # fmt: skip
        assert shrink[0]["how"] == "afe" and len(shrink[0]["to"]) == 1, shrink
        grow = wait_for("g's growth back", lambda: _grown_after(
            _resizes(state, "g", before), shrink[0]), 300)  # fmt: skip
        assert grow[0]["how"] == "afe", grow
        log = _log(state, "g")
        backend = expected_device()[1]
        for rank in (0, 1):
            assert f"({backend}), rank {rank} of 2" in log, log[-3000:]
        # Every resize kept the model: the survivors' state after the re-formed
        # group's broadcast is the one before it (the digests of each member).
        for r in (shrink[0], grow[0]):
            afters = {after for _, after in r["digests"].values()}
            assert len(afters) == 1, r["digests"]
        step = job(state, "g")["step"]
        wait_for("g training after", lambda: job(state, "g")["step"] > step + 5, 300)
        _finish(state, tmp_path, "g")
    record_property("nccl_shrink_pause_s", float(shrink[0]["seconds"]))
    record_property("nccl_grow_pause_s", float(grow[0]["seconds"]))


def test_a_torchrun_script_runs_under_nccl_across_its_restarts(
    tmp_path: Path, record_property: Any
) -> None:
    need_gpus(2)
    script = REPO / "examples" / "runtime" / "ddp_train.py"
    spec = tmp_path / "ddp.toml"
    spec.write_text(
        f'name = "ddp"\ncommand = ["{sys.executable}", "{script}", "--checkpoint-dir", '
        '"{checkpoint_dir}", "--target-samples", "60000", "--sample-time", "0.0005", '
        '"--checkpoint-every", "20"]\nmin_workers = 1\nmax_workers = 2\nbatch_size = 24\n'
    )
    with local_cluster(tmp_path / "state", *ONE_AND_ONE, own=True) as state:
        cli(state, "serve", str(_model_service(tmp_path)))
        cli(state, "submit", str(spec))
        wait_for("ddp on 2 GPUs", lambda: len(job(state, "ddp")["workers"]) == 2, 300)
        before = events(state)[-1].seq
        code, body = post(state, "model", "r1", {})
        assert code == 200, body
        shrink = wait_for("ddp's restart on 1", lambda: [r for r in _resizes(state, "ddp", before)
                                                        if len(r["to"]) == 1], 300)  # fmt: skip
        assert shrink[0]["how"] == "restart" and len(shrink[0]["from"]) == 2, shrink
        wait_for("ddp back on 2", lambda: _grown_after(
            _resizes(state, "ddp", before), shrink[0]), 300)  # fmt: skip
        wait_for("ddp to finish", lambda: job(state, "ddp")["state"] == "finished", 600)
        log = _log(state, "ddp")
        assert "ranks 2" in log and "ranks 1" in log, log[-3000:]
    record_property("torchrun_restart_pause_s", float(shrink[0].get("seconds", "nan")))


def test_a_worker_beside_a_sleeping_server_and_its_wake_run_out_of_no_memory(
    tmp_path: Path, record_property: Any
) -> None:
    need_gpus(1)
    import torch

    total_gb = 1.0 if dry_run() else torch.cuda.get_device_properties(0).total_memory / 1e9
    awake_gb, keep_gb = round(0.3 * total_gb, 1), max(round(0.05 * total_gb, 1), 0.1)
    argv = [sys.executable, str(HERE / "gpu_server.py"), "--port", "{port}",
            "--gpu-gb", str(awake_gb), "--keep-gb", str(keep_gb)]  # fmt: skip
    service = tmp_path / "srv.toml"
    service.write_text(
        "\n".join(
            [
                'name = "srv"',
                'model = "gpu-test-server"',
                "command = [" + ", ".join(json.dumps(w) for w in argv) + "]",
                'ready_path = "/health"',
                'health_path = "/health"',
                'sleep = { method = "POST", path = "/sleep", timeout_s = 60 }',
                'wake = { method = "POST", path = "/wake_up", timeout_s = 60 }',
                f"sleep_gpu_gb = {keep_gb}",
                "stop_grace_s = 5",
                "request_timeout_s = 300",
            ]
        )
        + "\n"
    )
    with local_cluster(tmp_path / "state", *ONE_AND_ONE, *_devices(2), own=True) as state:
        cli(state, "serve", str(service))
        code, body = post_command(state, "srv", "/v1/completions", {"prompt": "hi"})
        assert code == 200, body
        # "b" holds the training GPU; "g" is lent the sleeping server's and fills 80%
        # of what is free there: a wake before g's worker is gone could not fit.
        cli(state, "submit", str(_job(tmp_path, "b", tmp_path / "b.gate", 1)))
        wait_for("b stepping", lambda: job(state, "b")["step"] > 2, 300)
        cli(state, "submit", str(_job(tmp_path, "g", tmp_path / "g.gate", 1, fill_fraction=0.8)))
        wait_for("g lent 1.0", lambda: _holder(state, "1.0") == "g", 300)
        told = f"{keep_gb:g} GB of GPU 1.0 held by a sleeping server"
        # (A dry run's worker is on the CPU: it fills nothing.)
        wait_for("g told and filling", lambda: told in _log(state, "g")
                 and ("holds" in _log(state, "g") or dry_run()), 300)  # fmt: skip
        code, body = post_command(state, "srv", "/v1/completions", {"prompt": "again"})
        assert code == 200, body
        code, stats = post_command(state, "srv", "/stats", None)
        # Woken, not restarted cold. An out-of-memory wake retried (the worker's memory
        # late back with the driver after Ray freed its GPU) is counted, and shown.
        assert stats["wakes"] == 1 and stats["oom"] <= 1, stats
        assert "out of memory" not in _log(state, "g").lower()
        _finish(state, tmp_path, "b", "g")
    record_property("wake_out_of_memory_first_try", stats["oom"])
    record_property("server_awake_gb", awake_gb)
    record_property("server_asleep_gb", keep_gb)


def post_command(state: Path, service: str, path: str, body: Any) -> tuple[int, Any]:
    """A request to command service ``service``'s ``path`` through the front door."""
    import urllib.error
    import urllib.request

    url = json.loads((state / "http.json").read_text())["url"]
    headers = {"Authorization": f"Bearer {(state / 'http-token').read_text().strip()}"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(f"{url}/v1/{service}{path}", data=data, headers=headers,
                                 method="POST" if data else "GET")  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
