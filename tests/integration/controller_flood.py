#!/usr/bin/env python3
"""Floods a ckpt-controller the way a hostile user could, and measures whether it stays small and answers.

usage: controller_flood.py HOST PORT PID SECONDS CREDENTIALS_FILE

While SECONDS pass: 200 slowloris connections (a byte every 0.5 s, reopened when closed), 512 MiB chunked POSTs,
512 MiB Content-Length POSTs and 1 MB header lines, each from its own threads. Meanwhile /healthz and a valid
event (one MUNGE credential per line of CREDENTIALS_FILE; the file may be empty) are timed every 0.2 s.
Prints one JSON object: peak RSS (VmHWM, KiB), the slowest answers, and how many answers were wrong.
"""
import json
import socket
import sys
import threading
import time

host, port, pid, seconds, cred_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
creds = [line.strip() for line in open(cred_file) if line.strip()]
end = time.time() + seconds
stop = threading.Event()
sent = {"chunked": 0, "length": 0, "header": 0, "slow": 0}
lock = threading.Lock()


def connect():
    s = socket.create_connection((host, port), timeout=2)
    s.settimeout(2)
    return s


def count(kind, n):
    with lock:
        sent[kind] += n


def chunked():
    chunk = b"%x\r\n" % (1 << 20) + b"x" * (1 << 20) + b"\r\n"
    while not stop.is_set():
        try:
            s = connect()
            s.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                      b"Content-Type: text/plain\r\n\r\n")
            for _ in range(512):
                if stop.is_set():
                    break
                s.sendall(chunk)
                count("chunked", len(chunk))
            s.close()
        except OSError:
            time.sleep(0.01)


def big_length():
    block = b"y" * (1 << 20)
    while not stop.is_set():
        try:
            s = connect()
            s.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (512 << 20))
            for _ in range(512):
                if stop.is_set():
                    break
                s.sendall(block)
                count("length", len(block))
            s.close()
        except OSError:
            time.sleep(0.01)


def long_header():
    line = b"X-Junk: " + b"z" * (1 << 20)
    while not stop.is_set():
        try:
            s = connect()
            s.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n")
            for _ in range(8):
                s.sendall(line)
                count("header", len(line))
            s.close()
        except OSError:
            time.sleep(0.01)


def slowloris(i):
    while not stop.is_set():
        try:
            s = connect()
            s.sendall(b"POST /v1/events HTTP/1.1\r\n")
            while not stop.is_set():
                time.sleep(0.5)
                s.sendall(b"X")
                count("slow", 1)
        except OSError:
            time.sleep(0.05)


def request(raw):
    t0 = time.time()
    try:
        s = connect()
        s.sendall(raw)
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
        s.close()
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    except (OSError, ValueError, IndexError):
        status = 0
    return status, time.time() - t0


threads = [threading.Thread(target=slowloris, args=(i,), daemon=True) for i in range(200)]
threads += [threading.Thread(target=chunked, daemon=True) for _ in range(3)]
threads += [threading.Thread(target=big_length, daemon=True) for _ in range(3)]
threads += [threading.Thread(target=long_header, daemon=True) for _ in range(2)]
for t in threads:
    t.start()
time.sleep(1.0)  # let the flood build up

worst = {"healthz": 0.0, "event": 0.0}
wrong = []
probes = 0
while time.time() < end:
    status, took = request(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    worst["healthz"] = max(worst["healthz"], took)
    if status != 200:
        wrong.append("healthz %d" % status)
    if creds:
        body = creds.pop().encode()
        status, took = request(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                               b"Content-Length: %d\r\n\r\n" % len(body) + body)
        worst["event"] = max(worst["event"], took)
        if status not in (200, 202):
            wrong.append("event %d" % status)
    probes += 1
    time.sleep(0.2)
stop.set()

hwm = 0
with open("/proc/%d/status" % pid) as f:
    for line in f:
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1])
print(json.dumps({"vm_hwm_kib": hwm, "worst_s": worst, "wrong": wrong, "probes": probes, "sent": sent}))
