"""A stranger on the node attacks a job's in-place TCP stores (tests/integration/test_inplace_local.sh): for each
ADDR:PORT given (the ranks' mailboxes, generation 0's store) it connects as a TCPStore client, which needs no
secret, plants plans and rendezvous keys under the names torch and a naive design would use, tries to read the
job's, and keeps its connections open until killed. To each spare:ADDR:PORT (an idle spare's claim socket) it sends
a claim with a guessed token, then holds a silent connection. Before that, every target gets malformed bytes on raw
connections: a line of 5,000 `[` (RecursionError in a JSON parser), binary garbage, a store header claiming a 1 TiB
key, and a line longer than any message. Prints one line per target.

    python3 store_stranger.py ADDR:PORT ... spare:ADDR:PORT ...
"""
import datetime
import json
import socket
import struct
import sys
import time

import torch.distributed as dist

FORGED = {"world": 3, "addr": "10.6.6.6", "port": 6666, "root": 0, "lost": [0, 1, 2], "step": 0,
          "takeover": {"0": "evil.0"}, "generation": 1, "abandon": "a stranger says so"}
NAMES = ["plan/1", "plan/2", "taken/1", "joined/0", "joined/1", "formed/0", "alive/0", "0", "1", "2"]


MALFORMED = [b"[" * 5000 + b"\n", bytes(range(256)) * 64, b"\x00" + struct.pack("<Q", 1 << 40) + b"xx",
             b"{" * 100000 + b"x" * (2 << 20)]


def send_malformed(addr, port):
    """Each malformed payload on a connection of its own; the peer may close early, which is its right."""
    for payload in MALFORMED:
        try:
            with socket.create_connection((addr, port), timeout=3) as conn:
                conn.sendall(payload)
                time.sleep(0.05)
        except OSError:
            pass


def main():
    clients = []
    for target in sys.argv[1:]:
        host_port = target[len("spare:"):] if target.startswith("spare:") else target
        m_addr, m_port = host_port.rsplit(":", 1)
        send_malformed(m_addr, int(m_port))
        print(f"{target}: sent {len(MALFORMED)} malformed payloads", flush=True)
        if target.startswith("spare:"):
            addr, port = target[len("spare:"):].rsplit(":", 1)
            with socket.create_connection((addr, int(port)), timeout=3) as conn:
                conn.sendall(json.dumps({"token": "0" * 32, "generation": 1, "rank": 0, "plan": FORGED}).encode()
                             + b"\n")
            clients.append(socket.create_connection((addr, int(port)), timeout=3))  # and says nothing
            print(f"{target}: sent a claim with a guessed token; holding a silent connection", flush=True)
            continue
        addr, port = target.rsplit(":", 1)
        try:
            store = dist.TCPStore(addr, int(port), None, False, datetime.timedelta(seconds=3))
        except (RuntimeError, OSError) as e:
            print(f"{target}: cannot connect: {e}", flush=True)
            continue
        clients.append(store)
        for name in NAMES:
            store.set(name, json.dumps(FORGED))
        read = []
        for name in ("plan/0", "plan/3", "gen-1.plan", "secret", "mailbox-0"):
            try:
                store.wait([name], datetime.timedelta(milliseconds=100))
                read.append(name)
            except RuntimeError:
                pass
        print(f"{target}: planted {len(NAMES)} keys; read {read or 'nothing'}", flush=True)
    print("stranger: holding its connections", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
