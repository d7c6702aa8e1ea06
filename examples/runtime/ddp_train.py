"""A plain PyTorch DDP training script: it imports nothing from deepboot.

It runs under torchrun as it is::

    torchrun --nproc-per-node 2 ddp_train.py --checkpoint-dir /tmp/ddp-ckpt

and under deepboot as a command job (ddp_train.toml), which starts one process per
GPU with torchrun's environment and restarts the group at every resize; the script
resumes from its own checkpoint either way.

What it does: linear regression on synthetic data (a fixed seed, so every rank builds
the same dataset), ``DistributedSampler`` for each rank's share, a global batch kept
whatever the world size, a checkpoint every ``--checkpoint-every`` steps (written by
rank 0, atomically) and at the end. It stops once the job has processed
``--target-samples`` samples. ``--sample-time`` sleeps that many seconds per sample of
the rank's micro-batch: simulated GPU time, so more ranks go faster.

Each line it prints says the step and the samples so far, so its log shows where a
restart resumed: ``resumed at step S (N samples) on W ranks``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

FEATURES = 16
DATASET = 4096


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint-dir", required=True, help="where checkpoints go (and resume from)")
    p.add_argument("--target-samples", type=int, default=20_000, help="stop after this many")
    p.add_argument("--batch-size", type=int, default=24, help="global batch per step")
    p.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    p.add_argument("--print-every", type=int, default=5, help="steps between progress lines")
    p.add_argument("--sample-time", type=float, default=0.0, help="seconds of work per sample")
    p.add_argument("--lr", type=float, default=0.05)
    return p.parse_args()


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(DATASET, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    y = x @ w + 0.01 * torch.randn(DATASET, 1, generator=g)
    return TensorDataset(x, y)


def save(path: Path, state: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # a reader (or a restart) never sees half a checkpoint


def main() -> None:
    args = parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")  # env:// (torchrun's variables)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1).to(device)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    ckpt = Path(args.checkpoint_dir) / "ddp_train.pt"
    step = samples = 0
    if ckpt.exists():
        state = torch.load(ckpt, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, samples = int(state["step"]), int(state["samples"])
    if rank == 0:
        print(f"resumed at step {step} ({samples} samples) on {world} ranks", flush=True)
    local = max(args.batch_size // world, 1)
    data = dataset()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=7)
    loader = DataLoader(data, batch_size=local, sampler=sampler, drop_last=True)
    loss_fn = torch.nn.MSELoss()

    def checkpoint() -> None:
        if rank == 0:
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            save(ckpt, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "step": step, "samples": samples})  # fmt: skip

    while samples < args.target_samples:
        sampler.set_epoch(samples // DATASET)
        for x, y in loader:
            loss = loss_fn(ddp(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if args.sample_time:
                time.sleep(args.sample_time * local)
            step += 1
            samples += local * world
            if rank == 0 and step % args.print_every == 0:
                print(f"step {step} samples {samples} loss {loss.item():.5f} ranks {world}",
                      flush=True)  # fmt: skip
            if step % args.checkpoint_every == 0:
                checkpoint()
            if samples >= args.target_samples:
                break
    checkpoint()
    if rank == 0:
        print(f"done at step {step} ({samples} samples)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
