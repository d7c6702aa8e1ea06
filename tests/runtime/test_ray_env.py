"""The environment deepboot's Ray clients run with: an attached cluster at a loopback
address is reached as a local one is (its nodes are at 127.0.0.1), any other as Ray
would by default. The runtime tests attach to such a cluster all the time
(``tests/runtime/cluster_helpers.py``: the shared clusters)."""

from __future__ import annotations

import pytest

from deepboot.runtime.cluster.raycluster import ClusterRecord, on_loopback, ray_env

_PINNED = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:6379", True),
        ("127.0.0.2:6379", True),
        ("[::1]:6379", True),
        ("localhost:6379", True),
        ("10.0.0.1:6379", False),
        ("192.0.2.2:6379", False),
        ("head:6379", False),
        ("[fd00::2]:6379", False),
    ],
)
def test_on_loopback(address: str, loopback: bool) -> None:
    assert on_loopback(address) is loopback


def _env(mode: str, address: str) -> dict[str, str]:
    return ray_env(ClusterRecord(mode, address, "", (), "/t/ray-token"))


def test_an_attached_loopback_cluster_is_reached_as_a_local_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in _PINNED:
        monkeypatch.delenv(var, raising=False)
    local = _env("local", "127.0.0.1:6379")
    attached = _env("attached", "127.0.0.1:6379")
    assert {k: attached.get(k) for k in _PINNED} == {k: local[k] for k in _PINNED}
    assert local["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert attached["RAY_AUTH_TOKEN_PATH"] == "/t/ray-token"
    remote = _env("attached", "10.0.0.1:6379")
    assert not any(k in remote for k in _PINNED), {k: remote.get(k) for k in _PINNED}
    assert remote["RAY_AUTH_MODE"] == "token"
