"""The GPU paths (``make test-gpu``): real CUDA devices, NCCL, a replica's model on
``cuda`` and restored from host memory, a worker beside a sleeping server.

Every test needs CUDA devices and says how many (:func:`need_gpus`); without them it
skips with one line that says why. A test's figures (copy rates, restore times,
resize pauses) go into the JUnit report as properties (``record_property``), where
``bench/gpu_report.py`` reads them.

``DEEPBOOT_GPU_DRY_RUN=1`` runs them on a machine without CUDA, every device the CPU
and every group gloo: a check of the tests' own flow (their waits, the events and
fields they read) where no GPU is at hand, never a result about the GPU paths.
"""

from __future__ import annotations

import os

import pytest

DRY_RUN_ENV = "DEEPBOOT_GPU_DRY_RUN"


def dry_run() -> bool:
    """Whether the tests run on the CPU to check their own flow (``DEEPBOOT_GPU_DRY_RUN=1``)."""
    return os.environ.get(DRY_RUN_ENV) == "1"


def expected_device() -> tuple[str, str]:
    """The device a one-GPU node's worker or replica should report, and its group's
    backend: ``cuda:0`` and NCCL, or in a dry run the CPU and gloo."""
    return ("cpu", "gloo") if dry_run() else ("cuda:0", "nccl")


def cuda_devices() -> tuple[int, str]:
    """How many CUDA devices torch sees here, and why there are none when so."""
    try:
        import torch
    except ImportError:
        return 0, "torch is not installed (make runtime-install)"
    if not torch.cuda.is_available():
        build = "a CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        return 0, f"torch {torch.__version__} ({build}) sees no CUDA device"
    return torch.cuda.device_count(), ""


def need_gpus(n: int) -> None:
    """Skip the calling test unless torch sees at least ``n`` CUDA devices (or this
    is a dry run)."""
    if dry_run():
        return
    count, why = cuda_devices()
    if count == 0:
        pytest.skip(f"needs {n} CUDA device(s): {why}")
    if count < n:
        pytest.skip(f"needs {n} CUDA devices, this machine has {count}")
