"""Which CUDA device a deepboot GPU is (deepboot.elastic.devices): a local cluster's
nodes' slices of the machine's devices, a child process's CUDA_VISIBLE_DEVICES
translated through the inherited one, and the logical fallback."""

from __future__ import annotations

import pytest

from deepboot.core.errors import ConfigError
from deepboot.elastic.command import torchrun_env
from deepboot.elastic.devices import (
    gpu_index,
    machine_devices,
    plan_node_devices,
    torch_device,
    visible_devices,
)


def test_gpu_index_reads_the_index_of_node_dot_index() -> None:
    assert gpu_index("3.1") == 1
    assert gpu_index("12.10") == 10
    assert gpu_index("worker") is None
    assert gpu_index("3.x") is None


def test_a_child_sees_its_gpus_through_the_inherited_list() -> None:
    # Unset: the machine's devices by index.
    assert visible_devices([1, 0], None) == "1,0"
    # A local cluster's node 1 sees devices 6,7: its GPU 1 is device 7.
    assert visible_devices([1], "6,7") == "7"
    assert visible_devices([0, 1], "6, 7") == "6,7"
    assert visible_devices([0], "GPU-aa,GPU-bb") == "GPU-aa"
    # The node sees fewer devices than its GPUs (logical): the child sees none.
    assert visible_devices([0], "") == ""
    assert visible_devices([2], "6,7") == ""


def test_the_machine_devices_come_from_cuda_visible_devices_when_set() -> None:
    assert machine_devices({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert machine_devices({"CUDA_VISIBLE_DEVICES": ""}) == []
    # Unset: nvidia-smi's count, which torch's agrees with (none here in CI).
    torch = pytest.importorskip("torch")
    expected = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert machine_devices({}) == [str(i) for i in range(expected)]


def test_plan_gives_each_node_its_own_slice_when_the_machine_has_enough() -> None:
    per_node, line = plan_node_devices([2, 2], ["0", "1", "2", "3", "4"])
    assert per_node == ("0,1", "2,3")
    assert line == "GPUs on CUDA devices 0,1,2,3"


def test_plan_leaves_a_machine_without_cuda_alone() -> None:
    per_node, line = plan_node_devices([2, 2], [])
    assert per_node is None
    assert "no CUDA device" in line


def test_plan_makes_every_gpu_logical_when_the_machine_has_too_few() -> None:
    # A worker on a real GPU beside one on the CPU could not form one group: all CPU.
    per_node, line = plan_node_devices([1, 1], ["0"])
    assert per_node == ("", "")
    assert "the cluster has 2, this machine 1" in line


def test_cuda_devices_may_share_a_device_across_nodes_not_within_one() -> None:
    per_node, line = plan_node_devices([1, 1], ["0"], "0,0")
    assert per_node == ("0", "0")
    assert "--cuda-devices" in line
    with pytest.raises(ConfigError, match="node 0 the device"):
        plan_node_devices([2], ["0", "1"], "1,1")
    with pytest.raises(ConfigError, match="names 3 device"):
        plan_node_devices([2, 2], ["0"], "0,1,2")


def test_cuda_devices_are_positions_in_the_machines_devices() -> None:
    # Under CUDA_VISIBLE_DEVICES=3,5 (a shared machine), device 0 is the machine's 3.
    per_node, _ = plan_node_devices([1, 1], ["3", "5"], "0,0")
    assert per_node == ("3", "3")
    per_node, line = plan_node_devices([1, 1], ["3", "5"], "1,0")
    assert per_node == ("5", "3") and line.endswith("5,3 (--cuda-devices)")
    with pytest.raises(ConfigError, match="names 2: this machine's devices are 0..1"):
        plan_node_devices([1, 1], ["3", "5"], "0,2")
    # A machine without CUDA devices: taken as they are (the runtime tests' check
    # that each node's processes see their own slice).
    assert plan_node_devices([2], [], "4,5")[0] == ("4,5",)


def test_a_command_jobs_rank_gets_its_nodes_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    members = ["0.0", "1.0", "1.1"]
    kw = {"run_id": "r", "restart_count": 0, "max_restarts": 0}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert torchrun_env(members, "1.1", "127.0.0.1", 1, **kw)["CUDA_VISIBLE_DEVICES"] == "0,1"
    # On a local cluster's node 1, whose processes see devices 2,3.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    env = torchrun_env(members, "1.1", "127.0.0.1", 1, **kw)
    assert (env["CUDA_VISIBLE_DEVICES"], env["LOCAL_RANK"]) == ("2,3", "1")


def test_torch_device_is_the_cpu_where_the_gpu_is_logical() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: tests/gpu covers cuda:<index>")
    assert str(torch_device("0.1")) == "cpu"
    assert str(torch_device("worker")) == "cpu"
