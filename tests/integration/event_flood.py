"""A user's flood of the recovery controller with events signed by their own MUNGE credentials
(tests/integration/test_security_event_flood.sh): COUNT job_start events, made with libmunge (ctypes), naming the
JOBS (comma-separated) in turn, each with a step and a node of its own, then posted from THREADS connections at once, as fast as the controller takes
them, for SECONDS or until all are sent. MARK is created halfway (half sent, or 35 s in, whichever is first): the
moment another user's job is to fail. Prints "signed N", "sending from <unix time>", then "sent N until <unix
time>: <status counts>".

    python3 event_flood.py URL MUNGE_SOCKET JOBS UID COUNT THREADS SECONDS MARK
"""
import collections
import ctypes
import json
import sys
import threading
import time
import urllib.error
import urllib.request

url, socket_path, uid, count, threads, seconds = sys.argv[1], sys.argv[2], int(sys.argv[4]), int(sys.argv[5]), \
    int(sys.argv[6]), float(sys.argv[7])
jobs = [int(j) for j in sys.argv[3].split(",")]
mark = sys.argv[8]
munge = ctypes.CDLL("libmunge.so.2")
munge.munge_ctx_create.restype = ctypes.c_void_p
munge.munge_ctx_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]
munge.munge_encode.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
MUNGE_OPT_SOCKET = 8  # munge.h
ctx = munge.munge_ctx_create()
munge.munge_ctx_set(ctx, MUNGE_OPT_SOCKET, socket_path.encode())
creds = []
for i in range(count):
    # Each names a new step and a new node: a record that keeps them all grows with the flood.
    event = {"v": 1, "type": "job_start", "job_id": jobs[i % len(jobs)], "step_id": i, "restart_count": 0,
             "node": f"flood{i}",
             "uid": uid, "time": time.time()}
    payload = json.dumps(event).encode()
    cred = ctypes.c_char_p()
    if munge.munge_encode(ctypes.byref(cred), ctx, payload, len(payload)) != 0:
        sys.exit("cannot encode a credential")
    creds.append(cred.value)
print(f"signed {len(creds)}", flush=True)

statuses = collections.Counter()
lock = threading.Lock()
end = time.monotonic() + seconds


def blast(mine):
    for cred in mine:
        if time.monotonic() > end:
            return
        try:
            req = urllib.request.Request(url + "/v1/events", data=cred, headers={"Content-Type": "text/plain"})
            with urllib.request.urlopen(req, timeout=5) as r:
                status = r.status
        except urllib.error.HTTPError as e:
            status = e.code
        except OSError:
            status = 0
        with lock:
            statuses[status] += 1


def halfway():
    started = time.monotonic()
    while True:
        with lock:
            sent = sum(statuses.values())
        if sent >= count // 2 or time.monotonic() - started >= 35:
            open(mark, "w").close()
            return
        time.sleep(0.01)


workers = [threading.Thread(target=blast, args=(creds[i::threads],)) for i in range(threads)]
print(f"sending from {time.time():.3f}", flush=True)
watcher = threading.Thread(target=halfway, daemon=True)
watcher.start()
for w in workers:
    w.start()
for w in workers:
    w.join()
print(f"sent {sum(statuses.values())} until {time.time():.3f}: {dict(statuses)}", flush=True)
