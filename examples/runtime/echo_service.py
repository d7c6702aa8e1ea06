"""A small inference service: a fixed random two-layer MLP behind a JSON handler.

``load`` is the service's factory (``handler = "echo_service.py:load"`` in echo.toml):
the runtime calls it once per replica, on the replica's device, with the ``[args]``
of the service file, and sends each request's JSON body to the handler it returns.

It implements the node-local model cache's optional pair (``deepboot up
--host-cache-gb``; docs/runtime.md): the handler's ``export_weights()`` returns its
parameters as numpy arrays, and ``load.from_weights(device, weights, **args)`` builds
the handler from them instead of seeding and initializing the model.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

WIDTH = 8
"""Input and output width of the model."""

MAX_EXEC_S = 3600.0
"""Largest per-request ``exec_s`` (a replica is busy that long; a bigger value is a
mistake, refused with an error rather than holding the replica)."""


def load(
    device: str, hidden: int = 64, delay_s: float = 0.0, load_s: float = 0.0, **_: Any
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Build the model on ``device``; return the request handler.

    Args:
        device: Where the model runs ("cpu", "cuda:0", ...).
        hidden: Width of the hidden layer.
        delay_s: Seconds each request sleeps before the forward pass (simulated GPU
            time, to make a tiny model as slow as a real one), unless the request
            names its own.
        load_s: Seconds the load sleeps before building the model: an artificial
            cold start, as long as a real model's weights take to fetch (the SLO
            test and ``make demo-runtime`` use 10-12 s: a 15-20 s cold start with
            the replica process's own start). A restore from the node's
            model cache (:func:`from_weights`) skips it, as a real one skips the
            fetch.

    Returns:
        A handler: ``{"x": [floats], "exec_s": seconds}`` -> ``{"y": [WIDTH floats],
        "pid": the replica's pid}``. ``x`` is padded with zeros or trimmed to
        ``WIDTH`` (missing: all zeros). ``exec_s`` (optional, a number in [0,
        MAX_EXEC_S]) is the seconds this request sleeps instead of ``delay_s``:
        ``deepboot load --trace`` sends each trace row's execution time so.
    """
    import torch  # only where a replica runs: the simulator never needs torch

    if load_s > 0:
        time.sleep(float(load_s))
    torch.manual_seed(0)
    return _handler(_model(int(hidden)).to(device), device, float(delay_s))


def from_weights(
    device: str, weights: dict[str, Any], hidden: int = 64, delay_s: float = 0.0, **_: Any
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The handler :func:`load` builds, from the weights its ``export_weights`` gave
    (read-only numpy arrays: copied onto ``device``)."""
    import torch

    model = _model(int(hidden))
    model.load_state_dict({k: torch.tensor(v) for k, v in weights.items()})
    return _handler(model.to(device), device, float(delay_s))


load.from_weights = from_weights  # type: ignore[attr-defined]


def _model(hidden: int) -> Any:
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, WIDTH)
    )


def _exec_s(request: dict[str, Any], default: float) -> float:
    """The request's ``exec_s``, checked, or ``default`` when it gives none."""
    value = request.get("exec_s")
    if value is None:
        return default
    # bool is an int: {"exec_s": true} is a mistake, not one second.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"'exec_s' must be a number of seconds, got {type(value).__name__}")
    if not 0 <= value <= MAX_EXEC_S:  # also refuses nan
        raise ValueError(f"'exec_s' must be in [0, {MAX_EXEC_S:g}] seconds, got {value!r}")
    return float(value)


def _handler(model: Any, device: str, delay: float) -> Callable[[dict[str, Any]], dict[str, Any]]:
    import torch

    width = WIDTH
    model.eval()
    pid = os.getpid()

    def handle(request: dict[str, Any]) -> dict[str, Any]:
        raw = request.get("x") or []
        if not isinstance(raw, list):
            raise ValueError(f"'x' must be a list of numbers, got {type(raw).__name__}")
        values = [float(v) for v in raw[:width]]
        values += [0.0] * (width - len(values))
        pause = _exec_s(request, delay)
        if pause > 0:
            time.sleep(pause)
        with torch.no_grad():
            x = torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(0)
            y = model(x).squeeze(0).cpu().tolist()
        return {"y": y, "pid": pid}

    def export_weights() -> dict[str, Any]:
        return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}

    handle.export_weights = export_weights  # type: ignore[attr-defined]
    return handle
