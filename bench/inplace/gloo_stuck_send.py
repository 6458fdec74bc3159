#!/usr/bin/env python3
"""Does this torch's gloo fail a send whose connection closes while the send is partly written?

    gloo_stuck_send.py [--mib N] [--wait S]      (one host; starts its two processes itself)

Rank 1 posts the receive of an N MiB send from rank 0, and shuts its group's sockets 0.1 s into the transfer, as
restart in place's watchdog does to a survivor's group after a peer loss; rank 0's own watchdog shuts rank 0's
sockets a second later. Prints whether rank 0's send raised (what restart in place needs: the survivor unwinds)
or was still blocked after S seconds (gloo's TCP transport does not tell the waiter of an unbound buffer whose
write was queued partly written; it waits out the group's timeout, 30 minutes by default). Exit status 0 when
it raised, 1 when it blocked. docs/inplace.md, "A survivor that cannot unwind", says what the relaunch does about
it.
"""
import argparse
import os
import socket
import subprocess
import sys
import threading
import time


def group_sockets(before):
    """The TCP connections this process opened since `before` (fd -> target of /proc/self/fd)."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:") and before.get(int(name)) != target:
            out.append(int(name))
    return out


def shut(fds):
    for fd in fds:
        try:
            s = socket.socket(fileno=os.dup(fd))
        except OSError:  # closed since (the store's connection of the rendezvous)
            continue
        try:
            s.getpeername()
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            s.close()


def worker(rank, port, mib, wait_s):
    import torch
    import torch.distributed as dist

    before = {int(n): os.readlink(f"/proc/self/fd/{n}") for n in os.listdir("/proc/self/fd")
              if os.path.exists(f"/proc/self/fd/{n}")}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    fds = group_sockets(before)
    data = torch.ones(mib << 20, dtype=torch.uint8)
    dist.barrier()
    if rank == 1:
        into = torch.empty_like(data)
        threading.Thread(target=dist.recv, args=(into, 0), daemon=True).start()
        time.sleep(0.1)
        shut(fds)
        time.sleep(wait_s + 5)
        os._exit(0)
    threading.Timer(1.0, shut, args=(fds,)).start()
    outcome = {}

    def send():
        try:
            dist.send(data, 1)
            outcome["result"] = "returned"
        except RuntimeError as e:
            outcome["result"] = f"raised: {str(e).splitlines()[0]}"

    t0 = time.monotonic()
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    sender.join(wait_s)
    took = time.monotonic() - t0
    if "result" in outcome:
        print(f"gloo_stuck_send: the send {outcome['result']} after {took:.1f} s", flush=True)
        os._exit(0)
    print(f"gloo_stuck_send: the send is still blocked after {took:.1f} s: this gloo leaves a partly written "
          "send to a closed connection waiting for the group's timeout", flush=True)
    os._exit(1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=2048)
    p.add_argument("--wait", type=float, default=15.0)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=29611, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.rank is not None:
        return worker(a.rank, a.port, a.mib, a.wait)
    cmd = [sys.executable, __file__, "--mib", str(a.mib), "--wait", str(a.wait), "--port", str(a.port)]
    receiver = subprocess.Popen(cmd + ["--rank", "1"])
    try:
        return subprocess.call(cmd + ["--rank", "0"])
    finally:
        receiver.kill()
        receiver.wait()


if __name__ == "__main__":
    sys.exit(main())
