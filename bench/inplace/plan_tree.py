"""How a recovery's plan reaches the survivors, at many ranks on one host (a benchmark, not a test).

Every rank hosts its mailbox store, as under `ckpt-run --spares`; the root posts the next generation's plan in its
own, and each survivor takes it as slurm_ckpt.torch.run does (restart._plan_of_tree): from its parent in the
heartbeat network's tree (ckpt/overlay.hpp: groups of 8, leaders in a binary tree; _native.inplace.recovery_role),
posting it on for its own children. The baseline is the star: every survivor waits in the root's mailbox, as
before the tree. Ranks are threads, RANKS / PROCS per process. Prints, per shape, the time from the post until
the last survivor had the plan (median of REPEAT rounds), the root's clients, the tree's depth, and the physical
floor: one store round trip on this host times the depth.

    PYTHONPATH=build/python python3 bench/inplace/plan_tree.py [--ranks 1024] [--procs 8] [--shapes tree,star]
"""
import argparse
import datetime
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time

import torch.distributed as dist

from slurm_ckpt import _native, inplace, restart

_core = _native.inplace


def sources(world, rank, shape):
    """Whose mailboxes survivor `rank` waits on (no rank lost, rank 0 the root)."""
    if shape == "star":
        return [0]
    failure = _core.Failure()
    return _core.recovery_role(world, failure, rank, False).sources


def root_clients(world, shape):
    return sum(1 for r in range(1, world) if sources(world, r, shape)[0] == 0)


def membership(root_dir, rank, world):
    env = {"CKPT_INPLACE_ID": "bench", "CKPT_INPLACE_WORLD": str(world), "CKPT_DIR": root_dir,
           "SLURMD_NODENAME": f"h{rank}", "SLURM_PROCID": "0", "CKPT_INPLACE_RANK_BASE": str(rank)}
    return inplace.Membership(inplace.Launch(env))


def host(proc, procs, world, root_dir, shape, rounds, out):
    """One process: the ranks r with r % procs == proc, each with its mailbox; one thread per survivor per round."""
    ranks = [r for r in range(world) if r % procs == proc]
    members = {r: membership(root_dir, r, world) for r in ranks}
    boxes = {r: restart._Mailbox(members[r].secret()) for r in ranks}
    for r in ranks:
        members[r].publish_mailbox(r, 0, boxes[r].addr, boxes[r].port)
    current = _core.Plan()
    got = []
    for generation in range(1, rounds + 1):
        times = {}

        def take(r):
            restart._plan_of_tree(members[r], boxes[r], generation, r, sources(world, r, shape), current, 60)
            times[r] = time.time()

        threads = [threading.Thread(target=take, args=(r,)) for r in ranks if r != 0]
        for t in threads:
            t.start()
        ready = os.path.join(root_dir, f"ready-{generation}-{proc}")
        open(ready, "w").close()
        if 0 in ranks:  # the root: posts once every process waits
            while len([n for n in os.listdir(root_dir) if n.startswith(f"ready-{generation}-")]) < procs:
                time.sleep(0.01)
            time.sleep(0.2)  # the threads are in their waits
            posted = time.time()
            plan = _core.Plan()
            plan.generation, plan.world, plan.addr, plan.port = generation, world, "127.0.0.1", 1
            boxes[0].post(generation, plan)
            with open(os.path.join(root_dir, f"posted-{generation}"), "w") as f:
                f.write(repr(posted))
        for t in threads:
            t.join()
        got.append(max(times.values()) if times else 0.0)
    with open(out, "w") as f:
        json.dump(got, f)
    # Every mailbox stays up until all processes are done: a child in another process may still need it.
    open(os.path.join(root_dir, f"done-{proc}"), "w").close()
    while len([n for n in os.listdir(root_dir) if n.startswith("done-")]) < procs:
        time.sleep(0.05)


def round_trip_s(repeat=200):
    """One set + get on a TCPStore on this host: the cost of a hop."""
    server = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=10), wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, None, False, datetime.timedelta(seconds=10))
    samples = []
    for i in range(repeat):
        t0 = time.perf_counter()
        server.set(f"k{i}", "v")
        client.get(f"k{i}")
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def depth(world, shape):
    deepest = 0
    for r in range(1, world):
        hops, at = 0, r
        while at != 0:
            at, hops = sources(world, at, shape)[0], hops + 1
        deepest = max(deepest, hops)
    return deepest


def measure(world, procs, shape, rounds):
    with tempfile.TemporaryDirectory() as root_dir:
        membership(root_dir, 0, world).secret()
        ctx = multiprocessing.get_context("spawn")
        outs = [os.path.join(root_dir, f"out-{p}.json") for p in range(procs)]
        workers = [ctx.Process(target=host, args=(p, procs, world, root_dir, shape, rounds, outs[p]))
                   for p in range(procs)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if any(w.exitcode != 0 for w in workers):
            sys.exit(f"plan_tree: a host process failed ({shape})")
        last = [max(json.load(open(o))[g] for o in outs) for g in range(rounds)]
        posted = [float(open(os.path.join(root_dir, f"posted-{g + 1}")).read()) for g in range(rounds)]
        return statistics.median(t - p for t, p in zip(last, posted))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--procs", type=int, default=8)
    p.add_argument("--shapes", default="tree,star")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    hop = round_trip_s()
    print(f"plan_tree: {args.ranks} ranks in {args.procs} processes on this host; one store round trip "
          f"{hop * 1e3:.2f} ms (median)")
    results = {}
    for shape in args.shapes.split(","):
        d = depth(args.ranks, shape)
        clients = root_clients(args.ranks, shape)
        t = measure(args.ranks, args.procs, shape, args.repeat)
        results[shape] = (t, clients)
        print(f"  {shape:>5}: root's clients {clients:5d}, depth {d}, last survivor "
              f"{t * 1e3:8.1f} ms after the post (median of {args.repeat}); floor {d * hop * 1e3:.2f} ms")
    if "star" in results and "tree" in results:
        (t, c), (ts, cs) = results["tree"], results["star"]
        print(f"  tree / star: {t / ts:.2f}x the time, {c / cs:.3f}x the root's clients")


if __name__ == "__main__":
    main()
