"""A service whose model is large (hundreds of MB): its full load fetches the weights
from "remote storage", its restore copies them from the node's model cache.

``load`` (the factory, ``handler = "big_service.py:load"``) reads the weights file
``weights`` (a ``.npy`` float32 matrix, made by :func:`make_weights`) as a replica
would fetch a checkpoint from remote storage: the file's pages are first dropped from
the page cache (so the read is the disk's), and the read is paced at ``fetch_gbps``
GB/s, the bandwidth of one stream from remote object storage (an assumption, stated:
0.1 GB/s, about 1 Gbit/s; 0 = as fast as the disk). ``load.from_weights`` builds the
same handler from the weights the handler's ``export_weights`` gave (the node-local
model cache, ``deepboot up --host-cache-gb``): one copy from shared memory.

Each full load appends one line to ``loads_file`` (when given): the tests count the
full loads from it. A request ``{"x": [floats]}`` is answered ``{"y": [...]}``: the
first ``WIDTH`` outputs of the weight matrix times ``x`` (zero-padded), the same
whichever way the model was built.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

WIDTH = 8
"""Outputs in an answer."""

CHUNK = 8 << 20
"""Bytes read per paced chunk."""


def make_weights(path: Path, mb: float, seed: int = 0) -> Path:
    """Write a square float32 matrix of about ``mb`` MB to ``path`` (``.npy``)."""
    n = int((mb * 1e6 / 4) ** 0.5)
    weights = np.random.default_rng(seed).standard_normal((n, n), dtype=np.float32)
    np.save(path, weights)
    return path


def _fetch(path: str, gbps: float) -> np.ndarray:
    """The weights, read from disk (page cache dropped first) at ``gbps`` at most."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped: write them first
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        size = os.fstat(fd).st_size
        buf = bytearray(size)
        view = memoryview(buf)
        started, done = time.perf_counter(), 0
        while done < size:
            n = os.readv(fd, [view[done : done + CHUNK]])
            if n <= 0:
                raise OSError(f"{path}: short read at byte {done} of {size}")
            done += n
            if gbps > 0:  # pace to the remote store's bandwidth
                ahead = done / (gbps * 1e9) - (time.perf_counter() - started)
                if ahead > 0:
                    time.sleep(ahead)
    finally:
        os.close(fd)
    import io

    return np.load(io.BytesIO(buf), allow_pickle=False)  # type: ignore[no-any-return]


def load(
    device: str, weights: str, fetch_gbps: float = 0.1, loads_file: str = "", **_: Any
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The full load: fetch the weights (see the module doc), build the handler."""
    matrix = _fetch(weights, float(fetch_gbps))
    if loads_file:
        with open(loads_file, "a") as f:
            f.write(f"{os.getpid()}\n")
    return _handler(device, matrix)


def from_weights(
    device: str, exported: dict[str, Any], **_: Any
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The restore: the handler built from ``export_weights``'s arrays (read-only
    views on the node's shared memory: copied onto the device). The service's own
    ``weights`` (the file) arrives among the keyword arguments, unused."""
    return _handler(device, exported["w"])


load.from_weights = from_weights  # type: ignore[attr-defined]


def _handler(device: str, matrix: np.ndarray) -> Callable[[dict[str, Any]], dict[str, Any]]:
    import torch

    w = torch.tensor(matrix, device=device)  # the copy onto the device
    n = w.shape[1]

    def handle(request: dict[str, Any]) -> dict[str, Any]:
        raw = request.get("x") or []
        if not isinstance(raw, list):
            raise ValueError(f"'x' must be a list of numbers, got {type(raw).__name__}")
        x = torch.zeros(n, dtype=torch.float32, device=device)
        values = [float(v) for v in raw[:n]]
        if values:
            x[: len(values)] = torch.tensor(values, dtype=torch.float32, device=device)
        with torch.no_grad():
            y = (w[:WIDTH] @ x).cpu().tolist()
        return {"y": y}

    def export_weights() -> dict[str, Any]:
        return {"w": w.cpu().numpy()}

    handle.export_weights = export_weights  # type: ignore[attr-defined]
    return handle
