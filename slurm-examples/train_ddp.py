#!/usr/bin/env python3
"""Data-parallel training of a small transformer with slurm-ckpt: deterministic, and bitwise resumable.

Every rank holds the whole model; gradients are summed with dist.all_reduce over gloo on CPU, in buckets of
consecutive parameters that are the same at every step. (DistributedDataParallel is not bitwise-resumable: it rebuilds its gradient buckets after the
first iteration, so the first step after a restart sums in another order and rounds differently.) The data stream
is a pure function of (seed, step, rank), so a run resumed from step S sees exactly the batches an uninterrupted run
sees from S on; dropout's RNG state travels in the checkpoint.

Launch with srun (SLURM_PROCID, SLURM_NTASKS; the SPANK plugin exports CKPT_*), or locally torchrun-style:
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 RANK=0 WORLD_SIZE=2 python3 train_ddp.py --ckpt-dir /tmp/ck &
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 RANK=1 WORLD_SIZE=2 python3 train_ddp.py --ckpt-dir /tmp/ck
Rank 0 writes the final weights to --out (raw bytes of the state dict in order) and their sha256 to --out.sha256.
A run that stops for a terminal checkpoint (time limit, SIGTERM, SIGUSR1/2) exits 0 without final weights; run it
again to continue.
"""
import argparse
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import slurm_ckpt.torch


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="train until this many steps are done")
    p.add_argument("--ckpt-interval-steps", type=int, default=None,
                   help="checkpoint every N steps (default: CKPT_INTERVAL)")
    p.add_argument("--ckpt-dir", default=None, help="checkpoint dir (default: CKPT_DIR)")
    p.add_argument("--out", default="final_weights.bin", help="rank 0 writes the final weights here")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (slows a test run)")
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--log-time", action="store_true",
                   help="end each step line and the start line with t=<unix seconds> (benchmarks)")
    p.add_argument("--log-stall", action="store_true",
                   help="each rank prints how long checkpoints held each step (benchmarks)")
    p.add_argument("--zero1", action="store_true",
                   help="shard the optimizer state across ranks (torch's ZeroRedundancyOptimizer over AdamW)")
    p.add_argument("--extra-mib", type=int, default=0,
                   help="MiB of float32 parameters more, trained like the rest (benchmarks at realistic state sizes)")
    return p.parse_args()


class TinyTransformer(torch.nn.Module):
    def __init__(self, vocab, d_model, layers, seq_len, extra_mib=0):
        super().__init__()
        # State of a realistic size: parameters that join the loss with a tiny weight, so that they have a gradient,
        # are all-reduced and updated (with AdamW's two moments, three times their size in the checkpoint). In blocks
        # of 16 MiB, as a model's layers are: ZeRO-1 partitions whole parameters, and spreads blocks evenly.
        self.extra = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.zeros(min(16, extra_mib - at) << 18)) for at in range(0, extra_mib, 16)]
        ) if extra_mib else None
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.pos = torch.nn.Parameter(torch.zeros(seq_len, d_model))
        layer = torch.nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=2 * d_model, dropout=0.1,
                                                 batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers)
        self.head = torch.nn.Linear(d_model, vocab)
        mask = torch.triu(torch.full((seq_len, seq_len), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask)

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        out = self.head(self.encoder(h, mask=self.mask))
        return out if self.extra is None else out + 1e-9 * sum(p.sum() for p in self.extra)


def batch(args, step, rank, world):
    """The batch of `rank` at `step`: a pure function of the seed, the step and the rank (resumable)."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * world + rank)
    # A learnable stream: each sequence counts up from a random start with a random stride, modulo vocab.
    start = torch.randint(args.vocab, (args.batch, 1), generator=g)
    stride = torch.randint(1, 4, (args.batch, 1), generator=g)
    seq = (start + stride * torch.arange(args.seq_len + 1)) % args.vocab
    return seq[:, :-1], seq[:, 1:]


def build(args):
    """[model, optimizer], the same on every rank. Under ckpt-run --spares this is run()'s `warm`: a spare
    builds them while it waits, and a survivor keeps them from one generation to the next. ZeRO-1's optimizer
    partitions over the process group, which exists only inside train(): None here, made there (zero1_optimizer)."""
    torch.set_num_threads(1)  # one thread: the same reduction order inside every kernel, every run
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = TinyTransformer(args.vocab, args.d_model, args.layers, args.seq_len, args.extra_mib)
    if args.zero1:
        return [model, None]
    return [model, torch.optim.AdamW(model.parameters(), lr=3e-3)]


# Gradients are summed in buckets of up to 64 KiB: gloo's cost per all_reduce on CPU is larger than this model's
# compute, and one call a parameter made it most of a step. Larger buckets would save little more, and keep a large
# send in flight when a peer is lost (docs/inplace.md, "A thread that cannot unwind").
BUCKET_BYTES = 64 << 10


def average_gradients(params, world, group=None):
    """Averages every parameter's gradient over the `world` ranks of `group`: consecutive parameters are laid end to
    end in buckets, always the same ones in the same order, so that every run and every resumed run rounds alike."""
    def reduce(bucket):
        grads = [p.grad for p in bucket]
        flat = grads[0] if len(grads) == 1 else torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        flat.div_(world)
        if len(grads) > 1:
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()

    bucket, size = [], 0
    for p in params:
        nbytes = p.grad.numel() * p.grad.element_size()
        if bucket and size + nbytes > BUCKET_BYTES:
            reduce(bucket)
            bucket, size = [], 0
        bucket.append(p)
        size += nbytes
    if bucket:
        reduce(bucket)


def zero1_optimizer(model, kept):
    """ZeRO-1 (each rank keeps AdamW's state of its own partition of the parameters) over the default group. A
    survivor of a restart in place keeps its optimizer, and with it its partition's state, bound to the new
    generation's group (same world, same rank: the same partition)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    if kept is not None:
        kept.process_group = dist.distributed_c10d._get_default_group()
        return kept
    return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=3e-3)


def train(args, in_place=False, warm=None):
    """The training loop; the default process group, when there is one, is formed already. `warm`: the model and
    optimizer build() made before this generation (restart in place)."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    model, optimizer = warm if warm is not None else build(args)
    if args.zero1:
        if not dist.is_initialized():
            raise SystemExit("train_ddp: --zero1 needs a process group (more than one rank)")
        optimizer = zero1_optimizer(model, optimizer)
        if warm is not None:
            warm[1] = optimizer
    optimizer.zero_grad(set_to_none=True)  # a step that a failure cut short may have left gradients
    torch.manual_seed(args.seed + 1 + rank)  # dropout differs per rank, and its state is checkpointed
    params = list(model.parameters())

    interval = f"{args.ckpt_interval_steps}steps" if args.ckpt_interval_steps else None
    extra = {"samples_seen": 0}  # the data position; the stream itself needs only the step
    # In place, a spare that takes a rank over may restore another replica's terminal shard: the layout is declared
    # (pure data parallelism) so that last words can write one, and dropout is seeded per (step, rank) below.
    # (ZeRO-1's layout the Checkpointer finds itself.)
    layout = {"dp": world} if in_place and not args.zero1 and not os.environ.get("CKPT_LAYOUT") else None
    cp = slurm_ckpt.torch.Checkpointer(model, optimizer, extra=extra, dir=args.ckpt_dir, interval=interval,
                                       layout=layout)
    say = (lambda *a: print("train_ddp:", *a, flush=True)) if rank == 0 else (lambda *a: None)
    if not cp.enabled:
        say("no checkpoint dir (--ckpt-dir or CKPT_DIR): training without checkpoints")
    start = cp.restore()
    first_generation = os.environ.get("CKPT_INPLACE_GENERATION_BASE", "0")  # ckpt-run's relaunch counts on
    if start == 0 and warm is not None and os.environ.get("CKPT_INPLACE_GENERATION", "0") != first_generation:
        # A survivor re-entering with nothing to resume from: the initial state, as a fresh process has it
        model.load_state_dict(build(args)[0].state_dict())
        optimizer.state.clear()
        if args.zero1:
            optimizer.optim.state.clear()  # ZeRO-1's partition: the state its local optimizer holds
        torch.manual_seed(args.seed + 1 + rank)
    say(f"resumed from step {start}" if start else "starting at step 0",
        f"({world} ranks, checkpoints every {cp.config['interval'] if cp.enabled else 'never'})"
        + (f" t={time.time():.3f}" if args.log_time else ""))

    stopped = False
    step = start
    stalled = 0.0
    for step in range(start, args.steps):
        if in_place:
            torch.manual_seed((args.seed + 1) * 1_000_003 + step * world + rank)
        tokens, targets = batch(args, step, rank, world)
        with cp.section():  # this rank's own work, timed to find a slow node (the all-reduce waits for it)
            loss = F.cross_entropy(model(tokens).reshape(-1, args.vocab), targets.reshape(-1))
            loss.backward()
        if world > 1:
            average_gradients(params, world)
        cp.before_update()  # the guard: the last checkpoint's snapshot has copied the weights
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        extra["samples_seen"] += args.batch * world
        if (step + 1) % args.log_every == 0:
            say(f"step {step + 1} loss {loss.item():.4f}" + (f" t={time.time():.3f}" if args.log_time else ""))
        if cp.after_step(step + 1):
            stopped = True
            break
        if args.log_stall:
            stats = cp.stats()
            stalled, before = stats["total_stall_s"], stalled
            print(f"train_ddp: rank {rank} step {step + 1} stall {stalled - before:.4f} memory checkpoints"
                  f" {stats['memory_checkpoints']} partner copies {stats['partner_copies']}", flush=True)
        if args.step_sleep:  # outside the update: last words can write the state of a rank that sleeps
            time.sleep(args.step_sleep)
    cp.close()
    if stopped:
        say(f"stopped after step {step + 1} with a terminal checkpoint; run again to continue")
        return 0
    if rank == 0:
        blob = b"".join(t.detach().contiguous().numpy().tobytes() for t in model.state_dict().values())
        with open(args.out, "wb") as f:
            f.write(blob)
        digest = hashlib.sha256(blob).hexdigest()
        with open(args.out + ".sha256", "w") as f:
            f.write(digest + "\n")
        say(f"done after step {args.steps}: final weights sha256 {digest} in {args.out}")
    return 0


def main():
    args = parse_args()
    if os.environ.get("CKPT_INPLACE_ID"):
        # Started by `ckpt-run --spares N`: run() forms the group, and forms it again after a peer dies, with a
        # spare in the dead rank's place; train() is re-entered in this same process.
        return slurm_ckpt.torch.run(train, args, in_place=True, warm=lambda: build(args))
    _, world = slurm_ckpt.torch.init_process_group("gloo")  # rank 0's host: MASTER_ADDR, else the step's first
    status = train(args)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
