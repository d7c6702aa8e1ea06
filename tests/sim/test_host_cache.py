"""The simulator's host-memory model cache: a replica evicted when its GPU is lent
leaves its model in the node's memory, and the request that reclaims the GPU starts
its replica from there (``model_gb / gbps + init``) instead of cold; off, nothing
changes."""

from __future__ import annotations

import pytest
from test_inference_builders import Greedy, job, run, task

from deepboot.core.errors import ConfigError
from deepboot.sim.metrics import SimResult
from deepboot.world.hostcache import HostCacheConfig

CACHE = HostCacheConfig(capacity_gb=1.0, gbps=10.0, init_s=0.5)


def _lend_then_reclaim(**config: object) -> SimResult:
    # t1 starts a replica cold (5 s) on the inference GPU; it idles (PROTECT, SLEEP);
    # the tick at 60 s lends the GPU to the job (evicting the replica); t2 reclaims it.
    return run(
        [job("a")],
        [task("t1", 1.0, 1.0), task("t2", 100.0, 1.0)],
        shape="2x1",
        policy=Greedy(want=2),
        **config,
    )


def test_a_reclaimed_gpu_starts_its_replica_from_host_memory() -> None:
    res = _lend_then_reclaim(host_cache=CACHE, model_gb={"tiny": 0.5})
    t1, t2 = res.inference
    assert (t1.cold, t1.host, t1.delay) == (True, False, 5.0)
    assert res.reclaim_times == (100.0,)
    assert (t2.cold, t2.host) == (True, True)
    assert t2.delay == pytest.approx(0.5 + 0.5 / 10.0)
    s = res.summary("g", "w")["inference"]
    assert (s["cold_starts"], s["host_starts"]) == (1, 1)


def test_off_the_same_run_pays_the_cold_start_and_its_summary_is_unchanged() -> None:
    res = _lend_then_reclaim()
    t1, t2 = res.inference
    assert (t2.cold, t2.host, t2.delay) == (True, False, 5.0)
    s = res.summary("g", "w")["inference"]
    assert s["cold_starts"] == 2 and "host_starts" not in s


def test_a_model_larger_than_the_cache_still_starts_cold() -> None:
    res = _lend_then_reclaim(host_cache=CACHE, model_gb={"tiny": 2.0})
    assert [(r.host, r.delay) for r in res.inference] == [(False, 5.0), (False, 5.0)]


def test_a_service_of_unknown_size_is_refused_when_the_cache_is_on() -> None:
    with pytest.raises(ConfigError, match="model_gb"):
        _lend_then_reclaim(host_cache=CACHE, model_gb={})


def test_ats_i_reclaims_the_lent_gpu_whose_node_holds_the_model() -> None:
    # Two inference nodes. t0 (model "small") starts on node 1, t1 ("tiny") on node
    # 2; both replicas idle, and the tick at 60 s lends both GPUs (the job wants 3).
    # t2 ("tiny") reclaims: the two lent GPUs lose the job the same, so DeepBoot's
    # ATS-I takes node 1's (GPU order) and starts cold; with the cache it takes node
    # 2's, whose memory holds "tiny", and starts from there.
    tasks = [task("t0", 0.5, 5.0, service="infer-small-1"), task("t1", 1.0, 1.0),
             task("t2", 100.0, 1.0)]  # fmt: skip
    kwargs: dict[str, object] = {"shape": "3x1", "inference_nodes": 2, "policy": Greedy(want=3)}
    off = run([job("a")], tasks, **kwargs)
    on = run([job("a")], tasks, host_cache=CACHE, model_gb={"tiny": 0.5, "small": 0.5}, **kwargs)
    assert [r.start for r in off.inference][:2] == [2.5, 6.0]
    assert off.inference[2].delay == 5.0 and not off.inference[2].host
    assert on.inference[2].host and on.inference[2].delay == pytest.approx(0.55)
