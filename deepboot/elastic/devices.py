"""Which CUDA device a deepboot GPU is, in the process that holds it.

A deepboot GPU is named ``"<node>.<index>"``. Ray's resources only say which process
may hold it; the CUDA device is this module's business, by one rule everywhere:

- A Ray node's processes inherit its raylet's ``CUDA_VISIBLE_DEVICES`` (the nodes
  carry no Ray GPUs, ``--num-gpus=0``, so Ray leaves the variable as the raylet had
  it). GPU ``index`` of a node is the ``index``-th device that node's processes see,
  ``cuda:<index>``: on a machine that is one Ray node (an attached cluster) that is
  the machine's GPU ``index``; on a local cluster, ``deepboot up`` gives each node's
  raylet its own slice of the machine's devices (:func:`plan_node_devices`), so that
  the logical GPUs of several nodes on one machine are distinct real ones.
- A process deepboot starts itself (a command job's rank, a command service's
  server) gets ``CUDA_VISIBLE_DEVICES`` naming only its GPUs
  (:func:`visible_devices`), translated through the inherited list.
- Without CUDA (no GPU, or a CPU build of torch), or where a node's processes see
  fewer devices than its GPUs, the GPU is logical: torch on the CPU, gloo.

Nothing here imports torch at module level: the simulator never needs it.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from deepboot.core.errors import ConfigError

CUDA_ENV = "CUDA_VISIBLE_DEVICES"


def gpu_index(gpu: str) -> int | None:
    """The index within its node of deepboot GPU ``"node.index"``; None if ``gpu`` is
    not such a name (a worker outside a deepboot cluster)."""
    _, dot, index = gpu.rpartition(".")
    return int(index) if dot and index.isdigit() else None


def torch_device(gpu: str) -> Any:
    """The torch device of deepboot GPU ``gpu`` in this process: ``cuda:<index>`` when
    torch sees that many CUDA devices, else the CPU (a logical GPU)."""
    import torch

    index = gpu_index(gpu)
    if index is not None and torch.cuda.is_available() and index < torch.cuda.device_count():
        return torch.device("cuda", index)
    return torch.device("cpu")


def visible_devices(indices: Sequence[int], inherited: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a child process that holds this node's GPUs
    ``indices`` (in that order), given the variable this process inherited.

    Unset: the node's devices are the machine's, named by index. Set: index ``i`` is
    its ``i``-th entry (a number or a ``GPU-<uuid>``). Set and too short (a node whose
    processes see fewer devices than its GPUs, such as ``""``: no device): the child
    sees none either, and its torch runs on the CPU.
    """
    if inherited is None:
        return ",".join(str(i) for i in indices)
    listed = _split(inherited)
    if any(i >= len(listed) for i in indices):
        return ""
    return ",".join(listed[i] for i in indices)


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def machine_devices(env: Mapping[str, str] | None = None) -> list[str]:
    """This machine's CUDA devices as a process started with ``env`` sees them: the
    entries of its ``CUDA_VISIBLE_DEVICES`` when set, else ``0 .. n-1`` for the ``n``
    GPUs ``nvidia-smi -L`` lists, or, without ``nvidia-smi`` but with NVIDIA device
    files, the devices torch counts. A machine with neither (no NVIDIA driver) has
    none, and torch is not imported (``deepboot up`` starts faster)."""
    env = os.environ if env is None else env
    if CUDA_ENV in env:
        return _split(env[CUDA_ENV])
    return [str(i) for i in range(_device_count())]


def _device_count() -> int:
    exe = shutil.which("nvidia-smi")
    if exe is not None:
        try:
            out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
            return sum(line.startswith("GPU ") for line in out.stdout.splitlines())
        except (OSError, subprocess.SubprocessError):
            pass
    if not glob.glob("/dev/nvidia[0-9]*"):
        return 0
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def plan_node_devices(
    gpus_per_node: Sequence[int], machine: Sequence[str], cuda_devices: str | None = None
) -> tuple[tuple[str, ...] | None, str]:
    """The devices each node of a local cluster (all on this machine) gets, as the
    entries of its raylet's ``CUDA_VISIBLE_DEVICES``, and a line that says so.

    Args:
        gpus_per_node: The GPUs of each node, in node order.
        machine: This machine's devices (:func:`machine_devices`).
        cuda_devices: ``deepboot up --cuda-devices``: one device per logical GPU of the
            cluster, node 0's first, comma-separated, each a position in ``machine``
            (``CUDA_VISIBLE_DEVICES``'s order, where it is set; taken as they are on a
            machine without CUDA devices). A device may repeat across nodes (two
            nodes' GPUs on one real one, for one-worker jobs and replicas: NCCL
            refuses two ranks of one group on a device), not within a node. None:
            this machine's devices in order, one each.

    Returns:
        ``(per_node, line)``: ``per_node[n]`` is node n's ``CUDA_VISIBLE_DEVICES``
        value, or ``per_node`` is None to leave the variable alone (a machine with no
        CUDA device). With fewer devices than logical GPUs and no ``cuda_devices``,
        every node gets ``""``: all GPUs logical (a worker on a real GPU beside one on
        the CPU could not form one group).

    Raises:
        ConfigError: ``cuda_devices`` does not name one device per logical GPU, names
            one this machine does not have, or repeats one within a node.
    """
    total = sum(gpus_per_node)
    if cuda_devices is not None:
        wanted = _split(cuda_devices)
        if len(wanted) != total:
            raise ConfigError(
                f"--cuda-devices names {len(wanted)} device(s) ({cuda_devices!r}); the "
                f"cluster has {total} GPUs: name one device per GPU, node 0's first"
            )
        if machine:
            bad = [w for w in wanted if not (w.isdigit() and int(w) < len(machine))]
            if bad:
                raise ConfigError(
                    f"--cuda-devices names {','.join(bad)}: this machine's devices are "
                    f"0..{len(machine) - 1} ({','.join(machine)})"
                )
            wanted = [machine[int(w)] for w in wanted]
        per_node, at = [], 0
        for node, gpus in enumerate(gpus_per_node):
            mine = wanted[at : at + gpus]
            at += gpus
            if len(set(mine)) != len(mine):
                raise ConfigError(
                    f"--cuda-devices gives node {node} the device(s) {','.join(mine)}: "
                    "a node's GPUs must be distinct devices (nodes may share one)"
                )
            per_node.append(",".join(mine))
        return tuple(per_node), f"GPUs on CUDA devices {','.join(wanted)} (--cuda-devices)"
    if not machine:
        return None, "GPUs logical (torch on the CPU, gloo): this machine has no CUDA device"
    if len(machine) < total:
        return tuple("" for _ in gpus_per_node), (
            f"GPUs logical (torch on the CPU, gloo): the cluster has {total}, this machine "
            f"{len(machine)} CUDA device(s) (--cuda-devices maps them, sharing devices)"
        )
    per_node, at = [], 0
    for gpus in gpus_per_node:
        per_node.append(",".join(machine[at : at + gpus]))
        at += gpus
    return tuple(per_node), f"GPUs on CUDA devices {','.join(machine[:total])}"
