"""A stranger on the node, run as another user: tries to join a rank's heartbeat mesh as rank 0 and to start its
last words, every way it can without the job's secret. Prints one line per try: "closed" when the rank hung up
on it, "accepted" when it kept the connection. Used by test_hooks_mesh_auth.sh.

Usage: mesh_fake_peer.py <address> <port> <rendezvous dir>"""
import hashlib
import hmac
import os
import socket
import struct
import sys
import time

MAGIC = 0x636B7074
HELLO, HEARTBEAT, REPORT, PROOF = 1, 2, 3, 6
FRAME = 40                # heartbeat.hpp: struct Frame
HANDSHAKE = FRAME + 64    # a frame, a nonce and a MAC


def frame(kind, sender, a=0, flags=0):
    return struct.pack("<IiIIQQiI", kind, sender, flags, MAGIC, a, 0, sender, 0)


def outcome(sock):
    """'closed' when the other end hung up within 8 s (longer than a rank gives a handshake), else 'accepted'."""
    sock.settimeout(8.0)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return "closed"
    except socket.timeout:
        return "accepted"
    except OSError:
        return "closed"


def connect(address, port):
    return socket.create_connection((address, port), timeout=5)


def main():
    address, port, rendezvous = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    try:
        with open(os.path.join(rendezvous, "secret"), "rb") as f:
            f.read()
        print("secret: readable", flush=True)
    except OSError as e:
        print(f"secret: {e.strerror}", flush=True)

    # 1. The plain protocol: a hello claiming rank 0, then the reports that start last words.
    s = connect(address, port)
    s.sendall(frame(HELLO, 0) + frame(REPORT, 0, a=5) + frame(HEARTBEAT, 0))
    print(f"plain hello: {outcome(s)}", flush=True)
    s.close()

    # 2. The handshake with a guessed secret: hello, read the challenge, a proof under the wrong key, a report.
    s = connect(address, port)
    hello = frame(HELLO, 0) + os.urandom(32) + bytes(32)
    s.sendall(hello)
    s.settimeout(5.0)
    reply = b""
    try:
        while len(reply) < HANDSHAKE:
            chunk = s.recv(HANDSHAKE - len(reply))
            if not chunk:
                break
            reply += chunk
    except OSError:
        pass
    if len(reply) == HANDSHAKE:
        mac = hmac.new(os.urandom(32), b"slurm-ckpt mesh dial v2" + hello[:FRAME + 32] + reply[:FRAME + 32] +
                       f"{address} {port}".encode(), hashlib.sha256).digest()
        try:
            s.sendall(frame(PROOF, 0) + bytes(32) + mac + frame(REPORT, 0, a=5))
        except OSError:
            pass
    print(f"guessed secret: {outcome(s)}", flush=True)
    s.close()

    # 3. A connection that says nothing, kept open while the real rank 0 joins.
    quiet = connect(address, port)
    print("silent: open", flush=True)
    time.sleep(3)
    quiet.close()

main()
