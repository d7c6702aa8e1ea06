"""The host-memory model cache's ledger: least recently used out first, never above
its bound, a model larger than the cache never kept."""

from __future__ import annotations

import pytest

from deepboot.core.errors import ConfigError
from deepboot.world.hostcache import MODEL_GB, HostCache, HostCacheConfig


def test_a_host_start_costs_the_copy_and_the_fixed_init() -> None:
    cfg = HostCacheConfig(capacity_gb=64, gbps=16.0, init_s=0.5)
    assert cfg.enabled and cfg.start_s(32.0) == pytest.approx(2.5)
    assert not HostCacheConfig().enabled  # off unless a run turns it on


def test_filled_past_its_bound_it_drops_the_least_recently_used() -> None:
    cache = HostCache(HostCacheConfig(capacity_gb=10.0), nodes=(1, 2))
    for i in range(40):  # 4 GB each, ten times the bound in all
        cache.keep(1, f"m{i}", 4.0)
        assert cache.used_gb(1) <= 10.0
    assert cache.contents(1) == ("m38", "m39")
    cache.use(1, "m38")  # a host start: m38 is the most recently used now
    cache.keep(1, "big", 5.0)  # 4 + 4 + 5 > 10: m39 goes, not m38
    assert cache.contents(1) == ("m38", "big") and cache.used_gb(1) == 9.0
    assert cache.host_starts == 1
    assert cache.contents(2) == () and not cache.holds(2, "m38")  # per node


def test_a_model_larger_than_the_cache_or_a_node_without_one_keeps_nothing() -> None:
    cache = HostCache(HostCacheConfig(capacity_gb=10.0), nodes=(1,))
    cache.keep(1, "small", 1.0)
    cache.keep(1, "huge", 11.0)
    assert cache.contents(1) == ("small",)
    cache.keep(0, "small", 1.0)  # node 0 has no cache (a training node)
    assert cache.contents(0) == ()


def test_keeping_a_cached_model_again_refreshes_it_and_counts_it_once() -> None:
    cache = HostCache(HostCacheConfig(capacity_gb=10.0), nodes=(1,))
    cache.keep(1, "a", 3.0)
    cache.keep(1, "b", 3.0)
    cache.keep(1, "a", 3.0)
    assert cache.contents(1) == ("b", "a") and cache.used_gb(1) == 6.0


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"capacity_gb": -1.0}, "--host-cache-gb"),
        ({"gbps": 0.0}, "--host-gbps"),
        ({"init_s": float("nan")}, "--host-init-s"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs: dict[str, float], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        HostCacheConfig(**kwargs)


def test_a_preload_fills_every_node_and_spreads_what_does_not_fit_in_one() -> None:
    """Four 4 GB models, 10 GB per node: two per node, the next two on the next node,
    so each model is on half of the nodes; one that fits nowhere is skipped."""
    cache = HostCache(HostCacheConfig(capacity_gb=10.0, preload=True), nodes=(7, 5, 6, 8))
    models = [("a", 4.0), ("b", 4.0), ("c", 4.0), ("d", 4.0), ("huge", 11.0)]
    cache.preload(models)
    assert [cache.contents(n) for n in (5, 6, 7, 8)] == [
        ("a", "b"), ("c", "d"), ("a", "b"), ("c", "d"),
    ]  # fmt: skip
    assert all(cache.used_gb(n) <= 10.0 for n in (5, 6, 7, 8))
    assert cache.host_starts == 0 and cache.view()[5] == frozenset({"a", "b"})
    roomy = HostCache(HostCacheConfig(capacity_gb=100.0), nodes=(1, 2))
    roomy.preload(models)  # all fit: every node holds each once
    assert roomy.contents(1) == roomy.contents(2) == ("a", "b", "c", "d", "huge")


def test_the_catalog_sizes_every_deepboot_model() -> None:
    from deepboot.sim.config import DEEPBOOT_COLD_START

    assert set(MODEL_GB) == set(DEEPBOOT_COLD_START)
    assert all(0 < gb < 1 for gb in MODEL_GB.values())
