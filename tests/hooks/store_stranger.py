"""A stranger on the node attacks a job's in-place TCP stores (tests/integration/test_inplace_local.sh): for each
ADDR:PORT given (the ranks' mailboxes, generation 0's store) it connects as a TCPStore client, which needs no
secret, plants plans and rendezvous keys under the names torch and a naive design would use, tries to read the
job's, and keeps its connections open until killed. To each spare:ADDR:PORT (an idle spare's claim socket) it sends
a claim with a guessed token, then holds a silent connection. Prints one line per target.

    python3 store_stranger.py ADDR:PORT ... spare:ADDR:PORT ...
"""
import datetime
import json
import socket
import sys
import time

import torch.distributed as dist

FORGED = {"world": 3, "addr": "10.6.6.6", "port": 6666, "root": 0, "lost": [0, 1, 2], "step": 0,
          "takeover": {"0": "evil.0"}, "generation": 1, "abandon": "a stranger says so"}
NAMES = ["plan/1", "plan/2", "taken/1", "joined/0", "joined/1", "formed/0", "alive/0", "0", "1", "2"]


def main():
    clients = []
    for target in sys.argv[1:]:
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
