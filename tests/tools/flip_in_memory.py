#!/usr/bin/env python3
"""flip_in_memory.py PID SHARD [EXCLUDE...]: a bit flip in a running process's memory, as failing DRAM makes one.

Picks a 64-byte window of SHARD (a shard file of the checkpoint dir) that appears in no EXCLUDE file, finds every
place it occurs in the writable memory of process PID (/proc/PID/maps and /proc/PID/mem, as root) and flips one
bit in the middle of each. The EXCLUDE files are what PID holds of its own (its shard of the same step): a window
found there would hit PID's own state rather than the copy it keeps of SHARD's rank.

Prints the window's offset in SHARD and the number of places flipped; exits 1 when no window was found in PID's
memory (nothing flipped: the test that uses this cannot pass by accident).
"""
import random
import sys

WINDOW = 64
TRIES = 200      # windows drawn
CANDIDATES = 4   # windows searched for (each search reads PID's whole writable memory)
MAX_REGION = 8 << 30  # regions larger than this are reservations, not a kept copy


def writable_regions(pid):
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            path = fields[5] if len(fields) > 5 else ""
            if fields[1].startswith("rw") and not path.startswith("[v") and hi - lo <= MAX_REGION:
                yield lo, hi


def find_all(mem, regions, needle):
    hits = []
    for lo, hi in regions:
        at = lo
        while at < hi:
            size = min(64 << 20, hi - at)
            try:
                mem.seek(at)
                chunk = mem.read(size + WINDOW - 1 if at + size < hi else size)
            except OSError:
                break
            i = chunk.find(needle)
            while i >= 0:
                hits.append(at + i)
                i = chunk.find(needle, i + 1)
            at += size
    return sorted(set(hits))


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    pid, shard, excludes = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    data = open(shard, "rb").read()
    others = [open(f, "rb").read() for f in excludes]
    regions = list(writable_regions(pid))
    rng = random.Random(len(data))
    searched = 0
    with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
        for _ in range(TRIES):
            if searched == CANDIDATES:
                break
            offset = rng.randrange(len(data) // 4, len(data) - WINDOW)
            window = data[offset:offset + WINDOW]
            if len(set(window)) < WINDOW // 2 or any(window in o for o in others):
                continue  # padding, or bytes PID holds of its own
            searched += 1
            hits = find_all(mem, regions, window)
            if not hits:
                continue
            for at in hits:
                mem.seek(at + WINDOW // 2)
                byte = mem.read(1)[0]
                mem.seek(at + WINDOW // 2)
                mem.write(bytes([byte ^ 0x10]))
            print(f"flipped one bit at {len(hits)} place(s) of the bytes at offset {offset} of {shard}")
            return 0
    print(f"none of {searched} windows of {shard} found in the memory of process {pid}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
