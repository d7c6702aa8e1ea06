"""The twin's training job: a fixed amount of work, so its length is known to both
worlds (``bench/twin.py``).

A small network regresses a fixed random function; the job takes exactly
``total_steps`` optimizer steps at the total batch the job file fixes
(``batch_size = max_batch_size``, divisible by every worker count it may run on, so
every size processes the same samples per step), then returns. Each micro-batch
sleeps ``sample_delay`` seconds per sample (simulated GPU time), so a step on K
workers takes about ``batch * sample_delay / K`` seconds and more workers pay.

Progress survives resizes through the context: the step count, the model, the
optimizer and the sampler's position are kept by an AFE resize and restored from the
checkpoint by a restart, so the job always stops after ``total_steps`` steps in all.
"""

from __future__ import annotations

import time

import torch

from deepboot.elastic import ElasticContext


def train(ctx: ElasticContext) -> None:
    """Train until ``ctx.steps`` reaches ``args.total_steps`` (every rank stops at the
    same step: the step count is the job's, kept across resizes)."""
    args = ctx.args
    total = int(args["total_steps"])
    per_sample = float(args.get("sample_delay", 0.01))
    dim = 16
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(dim, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    model.to(ctx.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    ctx.register(model, opt)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2048, dim, generator=g)
    y = torch.tanh(x @ torch.randn(dim, 1, generator=g))
    x, y = x.to(ctx.device), y.to(ctx.device)
    while ctx.steps < total:
        idx = ctx.next_batch(len(x))
        loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        time.sleep(per_sample * len(idx))
        ctx.step(loss.item())
    if ctx.rank == 0:
        print(f"done: {ctx.steps} steps at batch {ctx.batch_size}")
