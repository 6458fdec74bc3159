#!/usr/bin/env python3
"""The reference for a data-parallel checkpoint restored onto another number of ranks, with plain torch only.

slurm-examples/train_ddp.py's model, data and optimizer, trained the way its train() trains them (no checkpoint
library), saved with torch.save and loaded with torch.load: what a program without slurm-ckpt would do. A run of
train_ddp.py that resumes through slurm-ckpt onto M ranks must end with exactly these final weights.

  --save DIR: every rank trains steps 0..--steps-1, then writes DIR/rank<r>.pt (model, optimizer, RNG, step).
  --load DIR: rank r of any world takes old rank r % (ranks saved)'s replica, trains on to --steps, and rank 0
              writes the final weights to --out as train_ddp.py does.
Any other argument is train_ddp.py's. Launch torchrun-style (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).
"""
import argparse
import glob
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "slurm-examples"))
import train_ddp  # noqa: E402  (its model, data and optimizer: the reference must not drift from them)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save", metavar="DIR")
    mode.add_argument("--load", metavar="DIR")
    mine, rest = p.parse_known_args()
    sys.argv[1:] = rest
    args = train_ddp.parse_args()  # the rest, with train_ddp.py's defaults
    if args.zero1:
        raise SystemExit("plain_torch_reshard: AdamW only (ZeRO-1's arithmetic is the same)")

    dist.init_process_group("gloo")  # env://, as train_ddp.py forms it
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optimizer = train_ddp.build(args)
    torch.manual_seed(args.seed + 1 + rank)  # dropout's stream per rank, as train_ddp.train seeds it
    start = 0
    if mine.load:
        saved = len(glob.glob(os.path.join(mine.load, "rank*.pt")))
        state = torch.load(os.path.join(mine.load, f"rank{rank % saved}.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        torch.set_rng_state(state["rng"])
        start = state["step"]

    params = list(model.parameters())
    for step in range(start, args.steps):  # train_ddp.train's step, without the checkpointer
        tokens, targets = train_ddp.batch(args, step, rank, world)
        loss = F.cross_entropy(model(tokens).reshape(-1, args.vocab), targets.reshape(-1))
        loss.backward()
        train_ddp.average_gradients(params, world)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if mine.save:
        os.makedirs(mine.save, exist_ok=True)
        torch.save({"model": model.state_dict(), "optim": optimizer.state_dict(), "rng": torch.get_rng_state(),
                    "step": args.steps}, os.path.join(mine.save, f"rank{rank}.pt"))
    elif rank == 0:
        with open(args.out, "wb") as f:
            f.write(b"".join(t.detach().contiguous().numpy().tobytes() for t in model.state_dict().values()))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
