#!/usr/bin/env python3
"""bench_async: what a checkpoint costs the training loop, against a synchronous save and the physical limits.

With --gib of model state (float32 parameters; 1 GiB by default), measured in one run:
  (a) the stall of a synchronous torch.save of the state dict (made durable with fsync, as a checkpoint must be);
  (b) the stall of slurm_ckpt's asynchronous snapshot: after_step() plus before_update(), with no compute in between
      (the worst case: training has nothing to overlap the copy with), and the same inside the compute loop below;
  (c) a bare single-threaded memcpy of the same bytes into warm memory (the physical floor of any snapshot);
  the persist time against the disk's sequential write bandwidth measured here (write + fsync, as the store writes,
  and O_DIRECT); the slowdown of a single-threaded compute loop when checkpoints come every >= 10 persist times
  (blocks with and without a checkpoint alternate, ABBA, against drift); staging vs state.

    PYTHONPATH=<build>/python /usr/bin/python3 bench/bench_async.py [--gib 1] [--dir /tmp/bench]

Times are medians of --reps runs. The machine is shared and noisy: read the ratios.
"""
import argparse
import ctypes
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

import slurm_ckpt.torch

MIB = 1 << 20


def parse_args():
    p = argparse.ArgumentParser(description="asynchronous checkpoint stall vs torch.save, memcpy and the disk")
    p.add_argument("--gib", type=float, default=1.0, help="GiB of model state")
    p.add_argument("--dir", default=None, help="where to write (default: a temp dir under $TMPDIR)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tensor-mib", type=int, default=64, help="size of each parameter tensor")
    p.add_argument("--loop-pairs", type=int, default=2, help="pairs of loop blocks with and without a checkpoint")
    return p.parse_args()


def median_time(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class Model(torch.nn.Module):
    def __init__(self, total_bytes, tensor_bytes):
        super().__init__()
        n, rest = divmod(total_bytes, tensor_bytes)
        sizes = [tensor_bytes] * n + ([rest] if rest else [])
        self.params = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.rand(s // 4)) for s in sizes])  # rand touches every page

    def nbytes(self):
        return sum(p.numel() * p.element_size() for p in self.params)


def disk_bandwidth(dir_, nbytes, chunk=64 * MIB):
    """Sequential write + fsync (the store's path) and O_DIRECT, in bytes/s."""
    src = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT wants
    src.write(os.urandom(MIB) * (chunk // MIB))
    view = memoryview(src)
    results = {}
    for name, flags in (("write+fsync", 0), ("O_DIRECT", os.O_DIRECT)):
        path = os.path.join(dir_, f"disk-{name}.bin")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flags, 0o600)
        t0 = time.perf_counter()
        done = 0
        while done < nbytes:
            done += os.write(fd, view[: min(chunk, nbytes - done)] if flags == 0 else view)
        os.fsync(fd)
        results[name] = done / (time.perf_counter() - t0)
        os.close(fd)
        os.unlink(path)
    view.release()
    src.close()
    return results


def torch_save_stall(model, dir_, reps, durable=True):
    path = os.path.join(dir_, "torch_save.pt")

    def save():
        with open(path, "wb") as f:
            torch.save(model.state_dict(), f)
            if durable:
                f.flush()
                os.fsync(f.fileno())

    t = median_time(save, reps)
    os.unlink(path)
    return t


def memcpy_floor(model, reps):
    dst = [torch.empty_like(p) for p in model.params]
    for d in dst:
        d.fill_(1)  # fault the destination in: the floor is a warm copy

    def copy():
        for d, p in zip(dst, model.params):
            ctypes.memmove(d.data_ptr(), p.data_ptr(), p.numel() * p.element_size())

    copy()
    return median_time(copy, reps)


def args_keep():
    # More than the measured checkpoints: no retention pass (which re-reads the newest checkpoint to verify it)
    # runs in the background while the next stall is measured.
    return 100


def wait_persisted(cp, snapshots):
    while cp.stats()["persisted"] + cp.stats()["failed"] < snapshots or cp.stats()["committed"] < snapshots:
        time.sleep(0.005)


def async_stall(model, dir_, reps):
    """Stall per checkpoint with nothing to overlap: after_step (snapshot starts) + before_update (copy ends)."""
    cp = slurm_ckpt.torch.Checkpointer(model, None, dir=os.path.join(dir_, "ckpt"), interval="1steps",
                                       keep=args_keep(), signals=False, log="warn")
    cp.restore()
    wait_persisted(cp, 0)
    stalls, persists, commits = [], [], []
    with torch.no_grad():
        for step in range(1, reps + 2):
            t0 = time.perf_counter()
            cp.after_step(step)
            cp.before_update()
            stall = time.perf_counter() - t0
            model.params[0][0] += 1  # the update
            wait_persisted(cp, step)
            s = cp.stats()
            if step > 1:  # the first one also pays for the first write of the shard file's pages
                stalls.append(stall)
                persists.append(s["last_persist_s"])
                commits.append(s["last_commit_s"])
    s = cp.stats()
    cp.close()
    return statistics.median(stalls), statistics.median(persists), statistics.median(commits), s


def compute_step(a, b, iters):
    for _ in range(iters):
        torch.mm(a, b)


def loop_slowdown(model, dir_, persist_s, pairs):
    """A single-threaded compute loop with an update of every tensor per step. Blocks of one checkpoint interval
    (>= 10 persist times) alternate, with one checkpoint at the start of a block or none, in ABBA order so that
    the load of other processes drifting over the run cancels out. Returns (slowdown, in-loop stall per checkpoint,
    step seconds, steps per interval, stats, seconds without, seconds with)."""
    a, b = torch.rand(384, 384), torch.rand(384, 384)
    t0 = time.perf_counter()
    compute_step(a, b, 20)
    per_mm = (time.perf_counter() - t0) / 20
    iters = max(1, int(0.05 / per_mm))  # ~50 ms steps
    step_s = median_time(lambda: compute_step(a, b, iters), 5)
    interval = max(1, int(10 * persist_s / step_s) + 1)
    cp = slurm_ckpt.torch.Checkpointer(model, None, dir=os.path.join(dir_, "loop"), interval="1000000000steps",
                                       signals=False, log="warn")
    cp.restore()
    step = 0
    spent = {False: 0.0, True: 0.0}
    with torch.no_grad():
        for pair in range(pairs):
            for with_ckpt in ((False, True) if pair % 2 == 0 else (True, False)):
                t = time.perf_counter()
                for i in range(interval):
                    compute_step(a, b, iters)
                    cp.before_update()
                    for p in model.params:
                        p[:16] += 1  # the update touches every tensor
                    step += 1
                    if with_ckpt and i == 0:
                        cp.save(step)  # what after_step does when a checkpoint is due
                    else:
                        cp.after_step(step)
                spent[with_ckpt] += time.perf_counter() - t
    s = cp.stats()
    cp.close()
    stall = s["total_stall_s"] / max(1, s["snapshots"])
    return ((spent[True] - spent[False]) / spent[False], stall, step_s, interval, s, spent[False], spent[True])


def main():
    args = parse_args()
    torch.set_num_threads(1)  # a training process's compute thread; copy and persist threads use the rest
    root = args.dir or tempfile.mkdtemp(prefix="bench_async-")
    os.makedirs(root, exist_ok=True)
    nbytes = int(args.gib * (1 << 30)) // 4 * 4
    print(f"bench_async: {nbytes / (1 << 30):.2f} GiB of state in {nbytes // (args.tensor_mib * MIB)} tensors, "
          f"{os.cpu_count()} CPUs, writing to {root}", flush=True)
    model = Model(nbytes, args.tensor_mib * MIB)
    state = model.nbytes()
    try:
        disk = disk_bandwidth(root, state)
        print(f"  disk sequential write:   write+fsync {disk['write+fsync'] / 1e9:.2f} GB/s, "
              f"O_DIRECT {disk['O_DIRECT'] / 1e9:.2f} GB/s", flush=True)
        t_save = torch_save_stall(model, root, args.reps)
        t_save_cache = torch_save_stall(model, root, args.reps, durable=False)
        print(f"  (a) torch.save + fsync:  {t_save:.3f} s stall (without fsync, not durable: {t_save_cache:.3f} s)",
              flush=True)
        t_async, t_persist, t_commit, s = async_stall(model, root, args.reps)
        print(f"  (b) async snapshot:      {t_async:.3f} s stall; persist {t_persist:.3f} s "
              f"({state / t_persist / 1e9:.2f} GB/s), commit done {t_commit:.3f} s after the snapshot", flush=True)
        t_memcpy = memcpy_floor(model, args.reps)
        print(f"  (c) memcpy (1 thread):   {t_memcpy:.3f} s ({state / t_memcpy / 1e9:.2f} GB/s)", flush=True)
        slow, loop_stall, step_s, interval, ls, base, with_ckpt = loop_slowdown(model, root, t_persist,
                                                                                args.loop_pairs)
        print(f"  loop: steps of {step_s * 1000:.1f} ms, blocks of {interval} steps ({interval * step_s:.1f} s = "
              f"{interval * step_s / t_persist:.1f}x persist): {base:.2f} s in {args.loop_pairs} blocks without, "
              f"{with_ckpt:.2f} s in {args.loop_pairs} with a checkpoint each ({ls['backpressure_waits']} "
              f"back-pressure waits); stall per checkpoint in the loop {loop_stall:.3f} s", flush=True)
        staging = s["staging_bytes"]

        disk_best = max(disk.values())
        rows = [
            ("async stall / torch.save", t_async / t_save, "<= 0.05", t_async / t_save <= 0.05),
            ("  the same, stall in the loop", loop_stall / t_save, "<= 0.05", loop_stall / t_save <= 0.05),
            ("async stall / memcpy", t_async / t_memcpy, "<= 1.3", t_async / t_memcpy <= 1.3),
            ("persist bw / disk bw (write+fsync)", (state / t_persist) / disk["write+fsync"], ">= 0.8",
             (state / t_persist) / disk["write+fsync"] >= 0.8),
            ("persist bw / disk bw (best of both)", (state / t_persist) / disk_best, ">= 0.8",
             (state / t_persist) / disk_best >= 0.8),
            ("loop slowdown", slow, "<= 0.02", slow <= 0.02),
            ("staging bytes / state bytes", staging / state, "<= 1 + small", staging <= state + 16 * MIB),
        ]
        print("bench_async: ratios")
        for name, value, target, ok in rows:
            print(f"  {name:38s} {value:8.3f}   target {target:13s} {'met' if ok else 'MISSED'}")
        print(f"  (staging {staging} bytes for {state} bytes of state: +{staging - state} bytes)")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
