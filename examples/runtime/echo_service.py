"""A small inference service: a fixed random two-layer MLP behind a JSON handler.

``load`` is the service's factory (``handler = "echo_service.py:load"`` in echo.toml):
the runtime calls it once per replica, on the replica's device, with the ``[args]``
of the service file, and sends each request's JSON body to the handler it returns.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

WIDTH = 8
"""Input and output width of the model."""


def load(
    device: str, hidden: int = 64, delay_s: float = 0.0, **_: Any
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Build the model on ``device``; return the request handler.

    Args:
        device: Where the model runs ("cpu", "cuda:0", ...).
        hidden: Width of the hidden layer.
        delay_s: Seconds each request sleeps before the forward pass (simulated GPU
            time, to make a tiny model as slow as a real one).

    Returns:
        A handler: ``{"x": [floats]}`` (padded with zeros or trimmed to ``WIDTH``;
        missing: all zeros) -> ``{"y": [WIDTH floats], "pid": the replica's pid}``.
    """
    import torch  # only where a replica runs: the simulator never needs torch

    width = WIDTH
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, int(hidden)), torch.nn.ReLU(), torch.nn.Linear(int(hidden), width)
    ).to(device)
    model.eval()
    delay = float(delay_s)
    pid = os.getpid()

    def handle(request: dict[str, Any]) -> dict[str, Any]:
        raw = request.get("x") or []
        if not isinstance(raw, list):
            raise ValueError(f"'x' must be a list of numbers, got {type(raw).__name__}")
        values = [float(v) for v in raw[:width]]
        values += [0.0] * (width - len(values))
        if delay > 0:
            time.sleep(delay)
        with torch.no_grad():
            x = torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(0)
            y = model(x).squeeze(0).cpu().tolist()
        return {"y": y, "pid": pid}

    return handle
