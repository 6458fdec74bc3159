#!/usr/bin/env python3
"""Reads bench/straggler/run.sh's work dir and prints both rules on the same windows: the false flags of the noise
phase, and each slow run's detection latency in steps (from the slowdown to the end of the window that flagged).

slurm-ckpt's rule is what the root did (its `straggler:` lines). The single-window rule (nvidia-resiliency-ext's
straggler detector: a rank whose relative score, the best median over its own, falls below 0.7 in one report) is
applied here to the windows the root logged (`pace:` lines, CKPT_LOG=debug)."""
import re
import statistics
import sys
from pathlib import Path

WINDOW_STEPS = 4  # core's straggler::Policy default, which run.sh keeps
THRESHOLD = 0.7
PACE = re.compile(r"pace: window (\d+): best ([\d.]+) s \(rank (\d+)\), slowest ([\d.]+) s \(rank (\d+)\), "
                  r"score ([\d.]+), (\d+) ranks")
FLAG = re.compile(r"straggler: node (\S+) runs at ([\d.]+) of the job's best for \d+ windows, steps \d+-(\d+) "
                  r"\(rank (\d+)\)")


def windows(log):
    out = []
    for line in log.splitlines():
        m = PACE.search(line)
        if m:
            out.append({"window": int(m[1]), "worst_rank": int(m[5]), "score": float(m[6]),
                        "worst_s": float(m[4])})
    return out


def flags(log):
    return [(m[1], float(m[2]), int(m[3]), int(m[4])) for m in map(FLAG.search, log.splitlines()) if m]


def main(work):
    work = Path(work)
    noise = (work / "noise" / "log").read_text(errors="replace")
    w = windows(noise)
    if not w:
        sys.exit("no pace lines in the noise phase's log: was CKPT_LOG=debug passed?")
    single = sum(1 for x in w if x["score"] < THRESHOLD)
    ours = len(flags(noise))
    scores = sorted(x["score"] for x in w)
    print(f"noise: {len(w)} windows ({len(w) * WINDOW_STEPS} steps) on a loaded host, no node slowed; "
          f"window score median {statistics.median(scores):.3f}, lowest {scores[0]:.3f}")
    print(f"  false flags: slurm-ckpt {ours}, single-window rule {single}")

    ours_lat, single_lat = [], []
    for run in sorted(work.glob("slow*")):
        log = (run / "log").read_text(errors="replace")
        m = re.search(r"from step (\d+) on", (run / "slowed").read_text())
        at = int(m[1])
        f = [x for x in flags(log) if x[2] + 1 > at]
        ours_lat.append(f[0][2] + 1 - at if f and f[0][3] == 1 else None)
        first = next((x for x in windows(log) if (x["window"] + 1) * WINDOW_STEPS > at
                      and x["score"] < THRESHOLD and x["worst_rank"] == 1), None)
        single_lat.append((first["window"] + 1) * WINDOW_STEPS - at if first else None)
        early = [x for x in flags(log) if x[2] + 1 <= at]
        print(f"{run.name}: slowed at step {at}; slurm-ckpt flagged after {ours_lat[-1]} steps"
              f"{' (named ' + f[0][0] + ')' if f else ''}, the single-window rule after {single_lat[-1]} steps"
              f"{'; flagged before the slowdown: ' + str(early) if early else ''}")
    got = [x for x in ours_lat if x is not None]
    got_single = [x for x in single_lat if x is not None]
    print(f"detection, median steps after the slowdown: slurm-ckpt {statistics.median(got) if got else 'none'} "
          f"({len(got)}/{len(ours_lat)} runs), single-window rule "
          f"{statistics.median(got_single) if got_single else 'none'} ({len(got_single)}/{len(single_lat)} runs)")


if __name__ == "__main__":
    main(sys.argv[1])
