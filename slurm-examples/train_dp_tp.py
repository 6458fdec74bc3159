#!/usr/bin/env python3
"""Data parallel x tensor parallel training on gloo, bitwise resumable: the example for last words.

Ranks form a dp x tp grid (rank = dp_index * tp + tp_index). Each tensor-parallel rank holds one slice of a
row-parallel MLP, y = sum_t relu(x W1_t^T) W2_t^T: the slices' partial outputs are summed with an all_reduce over
the TP group, and the gradient of each slice is exact. Replicas (same tp index) reduce their gradients with one
all_reduce per parameter over the DP group, in a fixed order, so a resumed run rounds exactly like an
uninterrupted one. The data is a pure function of (seed, step, dp index); there is no dropout, so the RNG holds no
state that differs between replicas (a rank may resume from another replica's terminal shard).

The checkpointer is told the layout (layout=dict(dp=.., tp=.., pp=1), coord=...), so with CKPT_LAST_WORDS=on the
survivors of a dead rank or node write a terminal checkpoint when they still hold every slice, and where each slice
lies in the whole weights (chunks=...), so a checkpoint restores onto another --tp and world size. Under
`ckpt-run --spares N` the loop runs through slurm_ckpt.torch.run: the survivors stay alive, and a spare takes a dead
rank over from that checkpoint (restart in place).
"""
import argparse
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist

import slurm_ckpt.torch


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt-dir", default=None, help="checkpoint root (default: CKPT_DIR)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size; dp = world / tp")
    p.add_argument("--out", default="final_weights.bin", help="the dp-0 rank of slice t writes <out>.tp<t>")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--d-in", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--d-out", type=int, default=8)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (lower it for a wide --hidden)")
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--log-time", action="store_true", help="end each log line with t=<unix seconds> (benchmarks)")
    return p.parse_args()


def batch(args, step, dp_index):
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + dp_index)
    x = torch.randn(args.batch, args.d_in, generator=g)
    teacher = torch.Generator().manual_seed(args.seed)
    w = torch.randn(args.d_out, args.d_in, generator=teacher)
    return x, torch.tanh(x @ w.t())


def train(args, in_place=False):
    """The training loop; the default process group is formed already (by main, or by slurm_ckpt.torch.run)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.tp:
        raise SystemExit(f"train_dp_tp: world size {world} is not a multiple of tp {args.tp}")
    tp, dp = args.tp, world // args.tp
    tp_index, dp_index = rank % tp, rank // tp
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    # Every rank creates every group, in the same order (torch.distributed requires it).
    tp_groups = [dist.new_group([d * tp + t for t in range(tp)]) for d in range(dp)]
    dp_groups = [dist.new_group([d * tp + t for d in range(dp)]) for t in range(tp)]
    tp_group, dp_group = tp_groups[dp_index], dp_groups[tp_index]

    torch.manual_seed(args.seed * 100 + tp_index)  # slices differ; replicas of a slice are identical
    shard = args.hidden // tp
    model = torch.nn.Sequential(torch.nn.Linear(args.d_in, shard, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(shard, args.d_out, bias=False))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    params = list(model.parameters())
    extra = {"samples_seen": 0}
    # Where this rank's slices lie in the whole weights: a checkpoint then restores onto another tp as well.
    chunks = {"0.weight": {"global_shape": [args.hidden, args.d_in], "offset": [tp_index * shard, 0]},
              "2.weight": {"global_shape": [args.d_out, args.hidden], "offset": [0, tp_index * shard]}}
    cp = slurm_ckpt.torch.Checkpointer(model, optimizer, extra=extra, dir=args.ckpt_dir,
                                       layout=dict(dp=dp, tp=tp, pp=1, zero1=False),
                                       coord=dict(dp=dp_index, tp=tp_index, pp=0), chunks=chunks)
    stamp = (lambda: (f"t={time.time():.3f}",)) if args.log_time else (lambda: ())
    say = (lambda *a: print("train_dp_tp:", *a, *stamp(), flush=True)) if rank == 0 else (lambda *a: None)
    start = cp.restore()
    say(f"resumed from step {start}" if start else "starting at step 0",
        f"(dp {dp} x tp {tp}, checkpoints every {cp.config['interval'] if cp.enabled else 'never'},"
        f" last words {'on' if cp.enabled and cp.config['last_words'] else 'off'})")
    step = start
    try:
        for step in range(start, args.steps):
            x, target = batch(args, step, dp_index)
            partial = model(x)
            total = partial.detach().clone()
            dist.all_reduce(total, group=tp_group)
            y = partial + (total - partial.detach())  # the forward value of the sum, the gradient of this slice
            loss = ((y - target) ** 2).mean()
            loss.backward()
            for p in params:  # one all_reduce per parameter, always in this order
                dist.all_reduce(p.grad, group=dp_group)
                p.grad.div_(dp)
            cp.before_update()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            extra["samples_seen"] += args.batch * dp
            if (step + 1) % args.log_every == 0:
                say(f"step {step + 1} loss {loss.item():.6f}")
            if cp.after_step(step + 1):  # right after the update: until then this rank counts as mid-update
                say(f"stopped after step {step + 1} with a terminal checkpoint")
                cp.close()
                return 0
            if args.step_sleep:
                time.sleep(args.step_sleep)
    except Exception as e:  # a peer died: the collective failed
        if in_place:
            raise  # run() takes part in the last words and forms the group again
        print(f"train_dp_tp: rank {rank}: training failed after step {step}: {e}", file=sys.stderr, flush=True)
        try:
            cp.abort()  # takes part in the last words
        except Exception as e2:
            print(f"train_dp_tp: rank {rank}: close: {e2}", file=sys.stderr, flush=True)
        return 1
    cp.close()
    if dp_index == 0:
        blob = b"".join(t.detach().contiguous().numpy().tobytes() for t in model.state_dict().values())
        with open(f"{args.out}.tp{tp_index}", "wb") as f:
            f.write(blob)
        print(f"train_dp_tp: done after step {args.steps}: slice tp{tp_index} sha256 "
              f"{hashlib.sha256(blob).hexdigest()}", flush=True)
    dist.barrier()
    return 0


def main():
    args = parse_args()
    if os.environ.get("CKPT_INPLACE_ID"):
        # Started by `ckpt-run --spares N`: run() forms the group, and forms it again with a spare in a dead rank's
        # place; train() is re-entered in this same process.
        return slurm_ckpt.torch.run(train, args, in_place=True)
    slurm_ckpt.torch.init_process_group("gloo", alone=True)  # rank 0's host: MASTER_ADDR, else the step's first
    status = train(args)
    if status == 0:
        dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
