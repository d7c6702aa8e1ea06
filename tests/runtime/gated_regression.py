"""The example regression job, held open by a file: it trains until its loss is below
``loss_threshold`` *and* it has passed the step written in the file ``gate``.

The serving test needs the job alive through a lull, a spike and a second lull whose
lengths depend on the machine's speed; the gate lets the test decide when the job may
finish, while the loss threshold stays fixed (the job still has to reach it). The
test writes a step well ahead of the job's current one, so every rank has read the
file before that step and all of them stop at the same step.

With ``hang`` (a file path), a worker whose GPU name starts with what the file holds
stops stepping and sleeps until it is killed: a worker that ignores every offer and
stop (the deadlines' test).
"""

from __future__ import annotations

import os
import time

import torch

from deepboot.elastic import ElasticContext


def train(ctx: ElasticContext) -> None:
    args = ctx.args
    dim = 16
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    model.to(ctx.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ctx.register(model, opt)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4096, dim, generator=g)
    y = torch.tanh(x @ torch.randn(dim, 1, generator=g)) + 0.01 * torch.randn(4096, 1, generator=g)
    x, y = x.to(ctx.device), y.to(ctx.device)
    backend = "nccl" if ctx.device.type == "cuda" else "gloo"
    print(f"worker {ctx.worker} on {ctx.device} ({backend}), rank {ctx.rank} of {ctx.world_size}")
    held = _fill(ctx, float(args.get("fill_fraction", 0.0)))  # noqa: F841 (kept to the end)
    threshold = float(args["loss_threshold"])
    gate = str(args["gate"])
    # Simulated GPU time, proportional to the local batch as on a real GPU, so that
    # more workers (a smaller local batch each) make steps faster.
    per_sample = float(args.get("sample_delay", 0.001))
    step_delay = float(args.get("step_delay", 0.0))  # a fixed pace, as regression.py's
    until: int | None = None
    hang = str(args.get("hang", ""))
    while True:
        if hang and os.path.exists(hang):
            with open(hang) as f:
                prefix = f.read().strip()
            if prefix and ctx.worker.startswith(prefix):
                print(f"hanging: {ctx.worker} ignores everything from now on")
                while True:
                    time.sleep(3600)
        idx = ctx.next_batch(len(x))
        loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        time.sleep(step_delay + per_sample * len(idx))
        mean = ctx.step(loss.item())
        if until is None and os.path.exists(gate):
            with open(gate) as f:
                text = f.read().strip()
            until = int(text) if text else None
        if mean is not None and until is not None and ctx.steps >= until and mean < threshold:
            print(f"finished: loss {mean:.6f} < {threshold} at step {ctx.steps}")
            return


def _fill(ctx: ElasticContext, fraction: float) -> object:
    """On a CUDA device, take ``fraction`` of the memory free there now and keep it
    (the GPU tests: a worker that fills a GPU beside a sleeping server)."""
    if fraction <= 0 or ctx.device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(ctx.device)
    block = torch.empty(int(free * fraction), dtype=torch.uint8, device=ctx.device)
    print(f"worker {ctx.worker} holds {block.numel() / 1e9:.2f} GB of {ctx.device} "
          f"({free / 1e9:.2f} GB were free of {total / 1e9:.2f} GB)")  # fmt: skip
    return block
