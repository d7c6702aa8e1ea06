"""The node-local model cache on a real local cluster (1 training + 1 inference node x 1
logical GPU, torch on the CPU): a replica evicted when its GPU was lent to training
exports its model into its node's cache, and the replica that takes the GPU back
starts from there (a host start), not by the full load, and answers the same; a
controller SIGKILLed and started again finds the cache by name, with its model.

The service is ``examples/runtime/big_service.py`` with a small (4 MB) weights file
read at disk speed; each full load appends a line to a file of the test's, which is
the handler's own count of full loads.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from deepboot.runtime.store.jobstore import LogKind  # noqa: E402
from tests.runtime.cluster_helpers import (  # noqa: E402
    REPO,
    alive,
    cli,
    controller_pid,
    events,
    local_cluster,
    status,
    wait_for,
    write_job,
)
from tests.runtime.serving_helpers import post  # noqa: E402

pytestmark = pytest.mark.runtime

BIG = REPO / "examples" / "runtime" / "big_service.py"


def _service(directory: Path, weights: Path, loads: Path) -> Path:
    path = directory / "big.toml"
    path.write_text(
        "\n".join(
            [
                'name = "big"',
                'model = "big-matrix"',
                f'handler = "{BIG}:load"',
                "max_replicas = 1",
                "request_timeout_s = 120",
                "[args]",
                f'weights = "{weights}"',
                "fetch_gbps = 0",
                f'loads_file = "{loads}"',
            ]
        )
        + "\n"
    )
    return path


def _replica_ops(state: Path) -> list[dict[str, object]]:
    return [e.detail for e in events(state) if e.kind is LogKind.REPLICA]


FLAGS = (
    "--training-nodes", "1", "--inference-nodes", "1", "--gpus-per-node", "1",
    "--protect-factor", "0.05", "--host-cache-gb", "0.05",
)  # fmt: skip
"""The local cluster's: 1 training + 1 inference node x 1 GPU, a 50 MB cache."""


def _weights(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """A 4 MB weights file for the big service, and its matrix."""
    import sys

    sys.path.insert(0, str(BIG.parent))
    from big_service import make_weights  # type: ignore[import-not-found]

    weights = make_weights(tmp_path / "w.npy", mb=4)
    return weights, np.load(weights)


def _lend_after_export(tmp_path: Path, state: Path) -> None:
    """Submit a job that never ends, and wait until the sleeping replica on GPU 1.0 was
    evicted for lending (its model exported into node 1's cache) and the GPU lent."""
    job = write_job(
        tmp_path, "train", threshold=1e-12, delay=0.0, sample_delay=0.005, max_workers=2
    )
    cli(state, "submit", str(job))

    def lent_after_export() -> bool:
        ops = _replica_ops(state)
        evicted = any(d["op"] == "evict" and d.get("cache") == "exported" for d in ops)
        gpus = [e.detail for e in events(state) if e.kind is LogKind.GPU]
        return evicted and any(d["gpu"] == "1.0" and d["op"] == "lend" for d in gpus)

    wait_for("the replica's eviction (exported) and its GPU lent", lent_after_export, 300)


def test_a_replica_evicted_for_lending_starts_again_from_its_nodes_cache(
    tmp_path: Path,
) -> None:
    weights, matrix = _weights(tmp_path)
    loads = tmp_path / "loads.txt"
    state = tmp_path / "state"
    with local_cluster(state, *FLAGS):
        cli(state, "serve", str(_service(tmp_path, weights, loads)))
        x = [1.0, -2.0, 0.5]
        want = (matrix[:8, :3] @ np.array(x, np.float32)).tolist()

        # 1. A cold start: the full load, once.
        code, body = post(state, "big", "first", {"x": x})
        assert code == 200, body
        assert np.allclose(body["result"]["y"], want, rtol=1e-5)
        assert loads.read_text().count("\n") == 1

        # 2. A job that never ends takes the GPU once the replica sleeps: the
        #    replica is evicted for lending, after exporting into node 1's cache.
        #    Its steps are simulated GPU time per sample (5 ms), so a second worker
        #    pays whatever the online fit has seen: with a fixed delay per step, 2
        #    workers are slower than 1, and whether the fit has seen that depends on
        #    timing (whether a grow formed before a reclaim), and with it whether
        #    the policy lends it the GPU again after the restart.
        _lend_after_export(tmp_path, state)
        [cache] = status(state)["caches"]
        assert cache["node"] == 1 and cache["models"] == ["big-matrix"]
        assert 0 < cache["used_bytes"] <= cache["bound_bytes"] == 50_000_000

        # 3. A request takes the lent GPU back: the new replica restores from the
        #    cache (a host start), without a full load, and answers the same.
        code, body = post(state, "big", "second", {"x": x})
        assert code == 200, body
        assert np.allclose(body["result"]["y"], want, rtol=1e-5)
        gpus = [e.detail for e in events(state) if e.kind is LogKind.GPU]
        assert any(d["gpu"] == "1.0" and d["op"] == "reclaim" for d in gpus)

        # The answer can come before the controller's flush of the replica's "ready".
        def ready() -> list[object]:
            return [d["start"] for d in _replica_ops(state) if d["op"] == "ready"]

        assert wait_for("the second replica's ready", lambda: len(ready()) == 2, 60)
        assert ready() == ["cold", "host"]
        assert loads.read_text().count("\n") == 1, "the handler loaded in full again"

        url = json.loads((state / "http.json").read_text())["url"]
        with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
            scraped = r.read().decode()
        assert 'deepboot_replica_host_starts_total{service="big"} 1.0' in scraped
        assert 'deepboot_replica_cold_starts_total{service="big"} 1.0' in scraped
        text = cli(state, "status").stdout  # the table of what each node caches
        assert "model caches" in text and "big-matrix" in text

        # 4. The controller is SIGKILLed and started again: it finds node 1's cache
        #    by name with what it holds, so the next reclaim starts from the cache
        #    and the next eviction for lending has nothing to copy ("held").
        old = controller_pid(state)
        assert old is not None
        os.kill(old, signal.SIGKILL)
        wait_for("the controller to die", lambda: not alive(old))
        cli(state, "up")
        starts = [e for e in events(state) if e.kind is LogKind.CONTROLLER_STARTED]
        assert len(starts) == 2
        restarted = starts[-1].seq

        # The second replica may have slept and been evicted before the kill (its
        # protect time is 1.5 s here) or after the restart: either way, wait until its
        # GPU is lent again.
        def lent() -> bool:
            ops = [e.detail["op"] for e in events(state)
                   if e.kind is LogKind.GPU and e.detail["gpu"] == "1.0"]  # fmt: skip
            return ops[-1] == "lend"

        wait_for("GPU 1.0 lent again", lent, 300)
        code, body = post(state, "big", "third", {"x": x})
        assert code == 200 and np.allclose(body["result"]["y"], want, rtol=1e-5), body
        assert wait_for("the third replica's ready", lambda: len(ready()) == 3, 60)
        assert ready() == ["cold", "host", "host"]
        assert loads.read_text().count("\n") == 1, "the handler loaded in full again"
        third = max(
            e.seq for e in events(state) if e.kind is LogKind.REPLICA and e.detail["op"] == "ready"
        )

        def evictions_since_restart() -> list[dict[str, Any]]:
            return [
                e.detail
                for e in events(state)
                if e.seq > restarted and e.kind is LogKind.REPLICA and e.detail["op"] == "evict"
            ]

        # The third replica, asleep, is evicted for lending: its model is held already.
        wait_for(
            "the third replica's eviction",
            lambda: any(
                e.seq > third and e.kind is LogKind.REPLICA and e.detail["op"] == "evict"
                for e in events(state)
            ),
            300,
        )
        assert [d["cache"] for d in evictions_since_restart()] in (["held"], ["held", "held"])
        cli(state, "cancel", "train")
    # The loop's recording (with what each node cached, the snapshots' ``cached``)
    # replays exactly, across the restart.
    same = cli(state, "replay", check=False)
    assert same.returncode == 0 and "no divergence" in same.stdout, same.stdout


def test_a_promoted_standby_restores_from_the_cache_and_gives_its_gpu_back(
    tmp_path: Path,
) -> None:
    """``--standby-replicas``: the replica that takes a lent GPU back is node 1's
    standby (its process started and imported ahead of need), promoted: it restores
    from the cache and answers the same; evicted, its placement group goes with it,
    so the job's worker gets GPU 1.0 back and forms."""
    weights, matrix = _weights(tmp_path)
    loads = tmp_path / "loads.txt"
    state = tmp_path / "state"
    with local_cluster(state, *FLAGS, "--standby-replicas"):
        cli(state, "serve", str(_service(tmp_path, weights, loads)))
        x = [1.0, -2.0, 0.5]
        want = (matrix[:8, :3] @ np.array(x, np.float32)).tolist()
        code, body = post(state, "big", "first", {"x": x})
        assert code == 200, body
        _lend_after_export(tmp_path, state)
        code, body = post(state, "big", "second", {"x": x})
        assert code == 200, body
        assert np.allclose(body["result"]["y"], want, rtol=1e-5)

        def readies() -> list[dict[str, object]]:
            return [d for d in _replica_ops(state) if d["op"] == "ready"]

        assert wait_for("the second replica's ready", lambda: len(readies()) == 2, 60)
        assert readies()[-1]["start"] == "host"
        assert loads.read_text().count("\n") == 1, "the handler loaded in full again"
        second_start = [d for d in _replica_ops(state) if d["op"] == "start"][-1]
        assert second_start.get("standby") is True, "the node's standby was not used"
        log_text = (state / "logs" / "service-big.log").read_text()
        assert "promoted standby: had the GPU after" in log_text
        evicted_at = len(_replica_ops(state))

        # Evicted again for lending: Ray removes its placement group with it, and the
        # job's worker on GPU 1.0 (which asks Ray for the GPU's own resource) forms.
        def grown_onto_1_0() -> bool:
            ops = _replica_ops(state)
            if not any(d["op"] == "evict" for d in ops[evicted_at - 1 :]):
                return False
            last_evict = max(
                e.seq for e in events(state)
                if e.kind is LogKind.REPLICA and e.detail["op"] == "evict"
            )  # fmt: skip
            return any(
                e.seq > last_evict and e.kind is LogKind.RESIZED and "1.0" in e.detail["digests"]
                for e in events(state)
            )

        wait_for("the job to form on GPU 1.0 after the promoted standby's eviction",
                 grown_onto_1_0, 300)  # fmt: skip
        cli(state, "cancel", "train")
