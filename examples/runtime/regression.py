"""A small elastic training job: a two-layer network regresses a fixed random
function on synthetic data, until its loss falls below ``loss_threshold`` (and it has
trained ``min_steps`` steps, when given).

Runs on CPU (gloo) or GPU unchanged; deepboot resizes it while it trains.
"""

from __future__ import annotations

import time

import torch

from deepboot.elastic import ElasticContext


def _data(n: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    w = torch.randn(dim, 1, generator=g)
    y = torch.tanh(x @ w) + 0.01 * torch.randn(n, 1, generator=g)
    return x, y


def train(ctx: ElasticContext) -> None:
    args = ctx.args
    dim = int(args.get("dim", 16))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    model.to(ctx.device)  # this worker's GPU, or the CPU
    opt = torch.optim.SGD(model.parameters(), lr=float(args.get("lr", 0.05)), momentum=0.9)
    ctx.register(model, opt)
    x, y = _data(int(args.get("samples", 4096)), dim, seed=1)
    x, y = x.to(ctx.device), y.to(ctx.device)
    threshold = float(args.get("loss_threshold", 0.01))
    step_delay = float(args.get("step_delay", 0.0))  # slows a tiny model to a visible pace
    # Simulated GPU time per sample: a step then takes longer with a larger local
    # batch, as on a real GPU, so more workers make steps faster.
    sample_delay = float(args.get("sample_delay", 0.0))
    # Train at least this many steps (then on until the loss is low enough): a job
    # that lasts long enough to be grown and shrunk (examples/runtime/finetune.toml).
    min_steps = int(args.get("min_steps", 0))
    while True:
        idx = ctx.next_batch(len(x))
        loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        if step_delay or sample_delay:
            time.sleep(step_delay + sample_delay * len(idx))
        mean = ctx.step(loss.item())
        if mean is None:
            continue
        if ctx.rank == 0 and ctx.steps % 50 == 0:
            print(
                f"step {ctx.steps} loss {mean:.5f} workers {ctx.world_size} batch {ctx.batch_size}"
            )
        if mean < threshold and ctx.steps >= min_steps:
            return
