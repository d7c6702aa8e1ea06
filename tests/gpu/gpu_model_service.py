"""A service whose model is ``model_gb`` GB of weights on the replica's CUDA device,
with the node cache's pair (``export_weights``, ``load.from_weights``), timing every
copy onto the device.

A full load (cold) fills the weights on the host and copies them to the device; an
export copies them back into a numpy array (the node's cache keeps it in Ray's object
store: shared memory, pageable); a restore (host start) copies that array onto the
device as a framework's plain load does (pageable), then once more through a pinned
host buffer, for comparison. Each answer says the replica's device and the figures.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch


class _Model:
    def __init__(self, weights: torch.Tensor, start: str, figures: dict[str, Any]) -> None:
        self.weights = weights
        self.start = start
        self.figures = figures

    def __call__(self, payload: Any) -> dict[str, Any]:
        # A little real work on the device: the answer depends on the weights.
        head = float(self.weights[:1024].float().sum().item())
        return {"device": str(self.weights.device), "start": self.start, "head": head,
                **self.figures}  # fmt: skip

    def export_weights(self) -> dict[str, np.ndarray]:
        return {"w": self.weights.cpu().numpy()}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _copy(host: torch.Tensor, device: str) -> tuple[torch.Tensor, float]:
    """``host`` onto ``device`` (a copy even on the CPU: a dry run's); the tensor and
    the seconds the copy took."""
    _sync(device)
    started = time.perf_counter()
    on_device = host.to(device, non_blocking=host.is_pinned(), copy=True)
    _sync(device)
    return on_device, time.perf_counter() - started


def load(device: str, model_gb: float = 1.0, **_: Any) -> Callable[[Any], Any]:
    """The full load: ``model_gb`` GB filled on the host, copied to ``device``."""
    n = int(model_gb * 1e9) // 4
    host = torch.from_numpy(np.full(n, 0.5, dtype=np.float32))
    weights, seconds = _copy(host, device)
    gb = n * 4 / 1e9
    return _Model(weights, "cold", {"gb": gb, "cold_copy_s": seconds,
                                    "h2d_pageable_gbps": gb / seconds})  # fmt: skip


def restore(device: str, exported: dict[str, Any], **_: Any) -> Callable[[Any], Any]:
    """The host start: the cached array (read-only shared memory) onto ``device``."""
    array = exported["w"]
    with warnings.catch_warnings():  # read-only: torch warns, and only reads it
        warnings.simplefilter("ignore", UserWarning)
        host = torch.from_numpy(array)
    started = time.perf_counter()
    weights, pageable_s = _copy(host, device)
    restore_s = time.perf_counter() - started
    pinned_gbps = None
    gb = array.nbytes / 1e9
    if device.startswith("cuda"):  # pinning needs CUDA (a dry run's CPU has none)
        pinned = torch.empty(host.shape, dtype=host.dtype, pin_memory=True)
        pinned.copy_(host)
        _, pinned_s = _copy(pinned, device)
        pinned_gbps = gb / pinned_s
    return _Model(weights, "host", {
        "gb": gb,
        "restore_copy_s": restore_s,
        "h2d_pageable_gbps": gb / pageable_s,
        "h2d_pinned_gbps": pinned_gbps,
    })  # fmt: skip


load.from_weights = restore  # type: ignore[attr-defined]
