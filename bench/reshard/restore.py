#!/usr/bin/env python3
"""One rank of bench/reshard/run.sh: restores a checkpoint of slurm-examples/train_ddp.py onto this world size and
prints one line with the restore's time and bytes; or (--consolidated FILE) does the same through plain torch.

  slurm-ckpt:   the model and optimizer train_ddp.build() makes, slurm_ckpt.torch.Checkpointer(...).restore().
  --consolidated FILE: the same model and optimizer loaded with torch.load from FILE, which holds the whole model
                and the whole optimizer state (ZeroRedundancyOptimizer.consolidate_state_dict on one rank, then
                torch.save): what a program without slurm-ckpt does to change the number of ranks; every rank
                reads the whole file and keeps its own partition.
Any other argument is train_ddp.py's. Launch torchrun-style (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "slurm-examples"))
import slurm_ckpt.torch  # noqa: E402
import train_ddp  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--consolidated", metavar="FILE")
    p.add_argument("--save-consolidated", metavar="FILE", help="after restoring, rank 0 writes FILE (the baseline's)")
    mine, rest = p.parse_known_args()
    sys.argv[1:] = rest
    args = train_ddp.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optimizer = train_ddp.build(args)
    cp = None  # created before the clock starts: the restore alone is timed
    if not mine.consolidated:
        cp = slurm_ckpt.torch.Checkpointer(model, optimizer, extra={"samples_seen": 0}, dir=args.ckpt_dir)
    dist.barrier()
    t0 = time.monotonic()
    if mine.consolidated:
        state = torch.load(mine.consolidated)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])  # ZeroRedundancyOptimizer keeps its own partition
        read, step = os.path.getsize(mine.consolidated), state["step"]
    else:
        step = cp.restore()
        read = cp.stats()["restore_read_bytes"]
    seconds = time.monotonic() - t0
    dist.barrier()
    job_s = time.monotonic() - t0
    print(f"reshard: rank {rank} of {world}: step {step}, {read} bytes read in {seconds:.3f} s "
          f"(all ranks done in {job_s:.3f} s)", flush=True)
    if mine.save_consolidated:
        optimizer.consolidate_state_dict(to=0)
        if rank == 0:
            torch.save({"model": model.state_dict(), "optim": optimizer.state_dict(), "step": step},
                       mine.save_consolidated)
    dist.barrier()
    if cp is not None:
        cp.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
