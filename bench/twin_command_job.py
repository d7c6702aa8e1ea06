"""The twin's command job: ``bench/twin_job.py``'s work as a plain torchrun script.

Same network, data, fixed total batch and simulated GPU time per sample as the
ElasticContext job, but written the way a team's own script is: ``init_process_group``
from torchrun's environment, ``DistributedSampler``-free shards of a fixed dataset,
a checkpoint of (model, optimizer, step) every ``--checkpoint-every`` steps written by
rank 0, resumed at start. deepboot resizes it by restart; it loses the steps since
its last checkpoint each time. Its one deepboot line is the optional progress report
(a no-op anywhere else), which gives the controller its step and throughput, as the
twin's simulator needs them.

    torchrun --nproc-per-node 2 bench/twin_command_job.py --total-steps 20 --checkpoint-dir D
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from deepboot.elastic import report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--total-steps", type=int, required=True)
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--batch", type=int, default=48, help="global batch (divisible by ranks)")
    p.add_argument("--sample-delay", type=float, default=0.02)
    p.add_argument("--checkpoint-every", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dim = 16
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(dim, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    ckpt = Path(args.checkpoint_dir) / "twin.pt"
    step = 0
    if ckpt.exists():
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = int(state["step"])
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2048, dim, generator=g)
    y = torch.tanh(x @ torch.randn(dim, 1, generator=g))
    local = args.batch // world
    if rank == 0:
        print(f"resumed at step {step} on {world} ranks", flush=True)
    while step < args.total_steps:
        start = (step * args.batch + rank * local) % (len(x) - local)
        xb, yb = x[start : start + local], y[start : start + local]
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        time.sleep(args.sample_delay * local)
        for param in model.parameters():
            assert param.grad is not None
            dist.all_reduce(param.grad)
            param.grad /= world
        opt.step()
        step += 1
        report(samples=step * args.batch, batch_size=args.batch, step=step, loss=loss.item())
        if rank == 0 and step % args.checkpoint_every == 0:
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            tmp = ckpt.with_suffix(".tmp")
            torch.save(
                {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp
            )
            os.replace(tmp, ckpt)
    if rank == 0:
        print(f"done: {step} steps at batch {args.batch}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
