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


def test_the_catalog_sizes_every_deepboot_model() -> None:
    from deepboot.sim.config import DEEPBOOT_COLD_START

    assert set(MODEL_GB) == set(DEEPBOOT_COLD_START)
    assert all(0 < gb < 1 for gb in MODEL_GB.values())
