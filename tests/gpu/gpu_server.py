"""A model server that holds real GPU memory, with vLLM's sleep mode: the GPU tests'
command service (a worker lent the GPU of a sleeping server must leave it room).

``--gpu-gb`` GB on its CUDA device while awake (``cuda:0`` of what
``CUDA_VISIBLE_DEVICES`` shows it); ``POST /sleep`` frees all of it but
``--keep-gb`` (vLLM's level 1 keeps its CUDA context and some buffers);
``POST /wake_up`` allocates it again, so a wake while another process fills the
GPU is an out-of-memory error (answered 500, and printed). ``GET /health``,
``GET /stats`` (``wakes``, ``sleeps``, ``oom``, ``held_gb``, ``cuda_visible_devices``),
``POST /v1/completions`` (503 asleep).
"""

from __future__ import annotations

import argparse
import os

import torch
from aiohttp import web


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--gpu-gb", type=float, required=True)
    ap.add_argument("--keep-gb", type=float, required=True)
    args = ap.parse_args()
    # cuda:0 of the devices CUDA_VISIBLE_DEVICES shows it; the CPU in a dry run.
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    stats = {"wakes": 0, "sleeps": 0, "oom": 0, "sleeping": False,
             "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}  # fmt: skip
    held: dict[str, torch.Tensor] = {}

    def take(gb: float) -> None:
        held["w"] = torch.ones(int(gb * 1e9), dtype=torch.uint8, device=device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def held_gb() -> float:
        return sum(t.numel() for t in held.values()) / 1e9

    take(args.gpu_gb)
    print(f"loaded: {held_gb():.2f} GB on {device}", flush=True)

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def get_stats(_: web.Request) -> web.Response:
        return web.json_response({**stats, "held_gb": held_gb()})

    async def sleep(_: web.Request) -> web.Response:
        held.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()  # back to the driver: free for another process
        held["kept"] = torch.ones(int(args.keep_gb * 1e9), dtype=torch.uint8, device=device)
        stats["sleeps"] += 1
        stats["sleeping"] = True
        print(f"asleep: {held_gb():.2f} GB kept", flush=True)
        return web.json_response({"sleeping": True})

    async def wake(_: web.Request) -> web.Response:
        try:
            take(args.gpu_gb)
        except torch.cuda.OutOfMemoryError as exc:
            stats["oom"] += 1
            print(f"wake: out of memory: {exc}", flush=True)
            return web.json_response({"error": "out of memory"}, status=500)
        held.pop("kept", None)
        stats["wakes"] += 1
        stats["sleeping"] = False
        print(f"awake: {held_gb():.2f} GB", flush=True)
        return web.json_response({"sleeping": False})

    async def complete(_: web.Request) -> web.Response:
        if stats["sleeping"]:
            return web.json_response({"error": "asleep"}, status=503)
        return web.json_response({"choices": [{"text": "ok"}], "device": str(device)})

    app = web.Application()
    app.add_routes([
        web.get("/health", health), web.get("/stats", get_stats),
        web.post("/sleep", sleep), web.post("/wake_up", wake),
        web.post("/v1/completions", complete),
    ])  # fmt: skip
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
