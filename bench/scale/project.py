#!/usr/bin/env python3
"""What the measured curves mean at 16,384 ranks: the effective training time under one failure every 3 h.

Usage: bench/scale/project.py OUT [--ckpt CKPT] [--mtbf 3h] [--catchable 0.8] [--cost 0.2s] [--relaunch 13.5s]

Reads a bench/scale/run.sh result dir, takes each per-failure figure at 16,384 ranks (extrapolated along its
measured log-log slope, bench/scale/report.py), and runs `ckpt simulate` with them:
  restart = detection of a frozen rank (last survivor) + last-words commit + relaunch + open+restore (slowest rank)
where relaunch is what Slurm and the controller take to start the job again (not measured by this benchmark: the
frozen_node test measures it on the local cluster, 13.5 s: decision 3.0 s and Slurm 10.4 s). --cost is the
checkpoint cost training sees (the snapshot it waits for); the persist runs in the background.
Prints the inputs, the command and the simulator's answer."""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

DURATION = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(text):
    for unit in ("ms", "s", "m", "h", "d"):
        if text.endswith(unit) and text[: -len(unit)].replace(".", "", 1).isdigit():
            return float(text[: -len(unit)]) * DURATION[unit]
    raise argparse.ArgumentTypeError(f"'{text}' is not a duration such as 30s or 3h")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--ckpt", default=os.path.join(os.environ.get("CKPT_BUILD_DIR", "build"), "cli", "ckpt"))
    ap.add_argument("--mtbf", default="3h")
    ap.add_argument("--catchable", type=float, default=0.8)
    ap.add_argument("--cost", default="0.2s")
    ap.add_argument("--relaunch", default="13.5s")
    args = ap.parse_args()
    _, healthy, rows, _, fits = report.table(args.out)

    def at_target(prefix):
        # Along the slope, but never below the largest value measured: a falling slope over noisy points must
        # not promise a detection faster than the silence limit.
        for key, (_, _, value) in fits.items():
            if key.startswith(prefix) and value is not None:
                measured = [v for n, v in rows[key].items() if n in healthy and isinstance(v, (int, float))]
                return key, max([value] + measured)
        sys.exit(f"bench/scale/project.py: no healthy measurement of '{prefix}' in {args.out}")

    parts = [at_target("detection latency of a frozen rank, last survivor"),
             at_target("last-words commit latency after a frozen rank"),
             ("relaunch (argument)", seconds(args.relaunch)),
             at_target("open+restore time (s, max)")]
    restart = sum(v for _, v in parts)
    print(f"Measured at N = {', '.join(map(str, healthy))}; each figure at {report.TARGET:,} ranks along its slope "
          "(at least the largest measured):")
    for key, value in parts:
        print(f"  {value:8.3f} s  {key}")
    print(f"  {restart:8.3f} s  restart, in all")
    cmd = [args.ckpt, "simulate", "--cost", args.cost, "--mtbf", args.mtbf, "--restart", f"{restart:.3f}s",
           "--catchable", str(args.catchable), "--json"]
    print("$ " + " ".join(cmd))
    result = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    for p in result["policies"]:
        print(f"  {p['policy']:>10}: goodput {p['goodput'] * 100:.2f}% (model {p['model_goodput'] * 100:.2f}%), "
              f"interval {p['interval_s']:.0f} s: {p['goodput'] * 24:.2f} h of training per day")


if __name__ == "__main__":
    main()
