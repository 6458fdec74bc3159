#!/usr/bin/env python3
"""The report of bench/inplace/run.sh: per run and as medians, the time from the failure to the first step
completed after it, split into phases, the steps lost, and bitwise identity with the uninterrupted run.

    bench/inplace/report.py WORK_DIR

Phases (unix times from the recovery root's "in-place recovery {...}" line, and the failure's injection time):
  detection     failure injected -> the root's last words caught it
  agreement     -> the decision (the terminal checkpoint's step, its writers)
  last words    -> the terminal checkpoint is committed (or given up)
  re-formation  -> the next generation's group formed (plan, spare claimed, store, gloo mesh)
  state load    -> restore() returned (the Checkpointer made again, the checkpoint read and loaded)
  first step    -> the first step after the failure completed
"""
import json
import os
import re
import statistics
import sys

PHASES = [("detection", "failed_unix", "detect"), ("agreement", "detect", "decided"),
          ("last words", "decided", "last_words_done"), ("re-formation", "last_words_done", "group"),
          ("state load", "group", "restored"), ("first step", "restored", "first_step")]
LINE = re.compile(r"in-place recovery (\{.*\})")
STEP_TIME = re.compile(r"^train_ddp: step (\d+) loss \S+ t=([0-9.]+)", re.M)
# Each rank's restore: what it read from the checkpoint dir and what it found in memory (a run restores once, after
# the failure: its first start has nothing to restore).
RESTORED = re.compile(r"^ckpt: rank \d+: restored step \d+ from .* \((\d+) bytes read, (\d+) found in memory\)$", re.M)
MIB = 1 << 20


def read_run(path, reference):
    with open(os.path.join(path, "failure.json")) as f:
        failure = json.load(f)
    with open(os.path.join(path, "log"), errors="replace") as f:
        log = f.read()
    m = LINE.search(log)
    mode = failure["mode"] + ("" if failure.get("state", "memory") == "memory" else f" ({failure['state']})")
    row = {"name": os.path.basename(path), "mode": mode, "victim": failure["victim"]}
    restores = [(int(a), int(b)) for a, b in RESTORED.findall(log)]
    row["read_mib"] = sum(a for a, _ in restores) / MIB
    row["memory_mib"] = sum(b for _, b in restores) / MIB
    digest = ""
    if os.path.exists(os.path.join(path, "final.sha256")):
        with open(os.path.join(path, "final.sha256")) as f:
            digest = f.read().strip()
    row["bitwise"] = bool(digest) and digest == reference
    # The first step completed after the failure, from the step lines' times (any path).
    after = [float(t) for _, t in STEP_TIME.findall(log) if float(t) > failure["failed_unix"]]
    row["first_step_after"] = after[0] - failure["failed_unix"] if after else None
    row["requeued"] = bool(re.search(r"^run 1 on", log, re.M))
    row["relaunched"] = "ckpt-run: relaunch 1: the node steps started" in log
    if not m:
        row["recovered"] = False
        return row
    times = dict(json.loads(m.group(1)), failed_unix=failure["failed_unix"])
    row["recovered"] = True
    row["phases"] = {name: times[b] - times[a] for name, a, b in PHASES}
    row["total"] = times["first_step"] - failure["failed_unix"]
    resumed = [int(s) for s in re.findall(r"^train_ddp: resumed from step (\d+)", log, re.M)]
    # The log may lag the ranks by a step: a checkpoint ahead of the last logged step lost nothing.
    row["steps_lost"] = max(0, failure["step_at_failure"] - resumed[-1]) if resumed else None
    return row


def main():
    work = sys.argv[1]
    with open(os.path.join(work, "reference", "final.sha256")) as f:
        reference = f.read().strip()
    runs = sorted((d for d in os.listdir(work) if os.path.exists(os.path.join(work, d, "failure.json"))),
                  key=lambda d: (re.sub(r"\d+", "", d), int(re.sub(r"\D+", "", d) or 0)))
    rows = [read_run(os.path.join(work, d), reference) for d in runs]
    names = [p[0] for p in PHASES]
    print(f"{'run':10s} {'node':4s} " + " ".join(f"{n:>12s}" for n in names) +
          f" {'total':>8s} {'lost':>4s} {'read MiB':>9s} {'mem MiB':>8s} bitwise")
    for r in rows:
        if not r["recovered"]:
            took = f"{r['first_step_after']:.3f} s" if r["first_step_after"] is not None else "never"
            how = "requeued" if r["requeued"] else "relaunched in the allocation" if r["relaunched"] else "no requeue"
            print(f"{r['name']:10s} {r['victim']:4s} not in place ({how}): "
                  f"first step after the failure {took}; read {r['read_mib']:.1f} MiB; bitwise {r['bitwise']}")
            continue
        print(f"{r['name']:10s} {r['victim']:4s} " + " ".join(f"{r['phases'][n]:12.3f}" for n in names) +
              f" {r['total']:8.3f} {r['steps_lost'] if r['steps_lost'] is not None else '?':>4}"
              f" {r['read_mib']:9.1f} {r['memory_mib']:8.1f} {r['bitwise']}")
    for mode in sorted({r["mode"] for r in rows}):
        done = [r for r in rows if r["mode"] == mode and r["recovered"]]
        all_runs = [r for r in rows if r["mode"] == mode]
        if not done:
            took = [r["first_step_after"] for r in all_runs if r["first_step_after"] is not None]
            print(f"{mode}: no run recovered in place ({len(all_runs)} runs, {sum(r['requeued'] for r in all_runs)} "
                  f"requeued, {sum(r['relaunched'] for r in all_runs)} relaunched in the allocation); median failure -> first step {statistics.median(took) if took else float('nan'):.3f} s; "
                  f"read {statistics.median(r['read_mib'] for r in all_runs):.1f} MiB (median); bitwise {sum(r['bitwise'] for r in all_runs)}/{len(all_runs)}")
            continue
        med = {n: statistics.median(r["phases"][n] for r in done) for n in names}
        total = statistics.median(r["total"] for r in done)
        lost = [r["steps_lost"] for r in done if r["steps_lost"] is not None]
        print(f"{mode}: {len(done)}/{len(all_runs)} recovered in place; median failure -> first step {total:.3f} s "
              f"(max {max(r['total'] for r in done):.3f}); " + ", ".join(f"{n} {med[n]:.3f}" for n in names) +
              f"; steps lost max {max(lost) if lost else '?'}; read {statistics.median(r['read_mib'] for r in done):.2f}"
              f" MiB, in memory {statistics.median(r['memory_mib'] for r in done):.1f} MiB (medians); bitwise {sum(r['bitwise'] for r in all_runs)}"
              f"/{len(all_runs)}")


def floors(work):
    """The physical floors in the same run: one step (median gap of the reference's step lines) and, for a
    freeze, the heartbeat timeout (no message tells of a frozen node: only silence)."""
    with open(os.path.join(work, "reference", "log"), errors="replace") as f:
        times = [float(t) for _, t in STEP_TIME.findall(f.read())]
    step = statistics.median(b - a for a, b in zip(times, times[1:])) if len(times) > 2 else float("nan")
    print(f"floors: one step {step:.3f} s (uninterrupted run, median); a freeze is seen no sooner than the "
          f"heartbeat timeout; a crash at once (a reset or EOF)")


if __name__ == "__main__":
    main()
    floors(sys.argv[1])
