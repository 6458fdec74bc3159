"""A user's flood of a node's slurmd: holds COUNT idle TCP connections to HOST:PORT, opening a new one whenever
slurmd closes one, for SECONDS. Sends nothing, so each connection holds one of slurmd's threads until its
message timeout. Prints "holding N" once COUNT are open, then runs until killed or the time is up.

    python3 slurmd_flood.py HOST PORT COUNT SECONDS
"""
import selectors
import socket
import sys
import time


def connect(host, port):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex((host, port))
    return s


def main():
    host, port, count, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    sel = selectors.DefaultSelector()
    for _ in range(count):
        sel.register(connect(host, port), selectors.EVENT_READ)
    print(f"holding {count}", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for key, _ in sel.select(timeout=0.2):
            s = key.fileobj
            try:
                alive = s.recv(1, socket.MSG_PEEK) != b""
            except BlockingIOError:
                alive = True
            except OSError:
                alive = False
            if not alive:  # slurmd closed it (its message timeout): open another at once
                sel.unregister(s)
                s.close()
                sel.register(connect(host, port), selectors.EVENT_READ)


if __name__ == "__main__":
    main()
