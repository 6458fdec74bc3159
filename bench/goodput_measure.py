#!/usr/bin/env python3
"""Measures the runs of bench/goodput.sh from their batch logs and kill times, in the simulator's terms.

    goodput_measure.py [--memory NAME ...] STEP_S STEPS NAME LOG KILLS [NAME LOG KILLS ...]  ->  JSON on stdout

Each LOG is train_dp_tp.py's or train_ddp.py's with --log-time (rank 0's lines end with t=<unix seconds>), plus
the batch script's "run N on ..." lines and libckpt's lines; each KILLS holds "<unix seconds> <pid>" per injected
failure. STEP_S is the step time of the run without checkpoints or failures: the useful work of a job is
STEPS x STEP_S.

The accounting matches `ckpt simulate`'s, so that its prediction can be held against what happened:
  - a run (one start of the job) warms up over its first WARMUP steps (gloo connections, allocator, caches); that
    time beyond the step time belongs to the start-up, not to the work or to checkpoints;
  - the job starts when run 0 has warmed up (less the steps it did), and ends at the last step;
  - a restart R runs from a kill to the moment the next run has warmed up (less the steps it did), or to the next
    kill when that comes first: detection, last words, the requeue, Python and gloo start-up, the restore;
  - with checkpointing on, every step pays a little (polling the coordinator; the other ranks' persists), so the
    step time seen in the runs is the pooled median of their steps; the checkpoint cost δ is what the steps of a
    run took beyond that, per checkpoint (the step cut short by a kill is lost work, as in the simulator);
  - failure times are the kills, relative to the start;
  - a restart in place (a start with no "run N on" line of the batch script before it: the same allocation and
    processes) is counted apart from the requeues, as R_in;
  - a run named with --memory took memory checkpoints: its steps are left out of the pooled step time. With one
    every step, what its median step took beyond that is the memory checkpoint's stall δ_m. Where its log counts
    them (train_ddp.py --log-stall: rank 0's "memory checkpoints N" after each step), its steps per memory
    checkpoint k are that count's, and δ_m is k times what its mean step took beyond the pooled step (with
    `--ckpt-memory-interval=auto` most steps carry none, and the median would miss the others). A terminal
    checkpoint whose last words wrote a shard from staging or from a partner copy was caught from the memory tier.
  - a failure whose last words found its step committed already (a periodic checkpoint of that step) was caught.
Pooled over the runs it reports that step time, δ (median over runs), R (median over the requeues) and R_in
(median over the restarts in place).
"""
import json
import re
import statistics
import sys

WARMUP = 3
STEP = re.compile(r"^train_(?:dp_tp|ddp): step (\d+) loss \S+ t=([0-9.]+)$")
# A failure the last words caught: they committed its terminal checkpoint, or found its step committed already (a
# periodic checkpoint of that very step), which the survivors resume from as well.
TERMINAL = re.compile(r"last words: (?:committed the terminal checkpoint of step (\d+),|step (\d+) is committed already)")
FROM_MEMORY = re.compile(r"last words: wrote .*terminal shard of step (\d+) from (?:staging|its partner copy)")
START = re.compile(r"^train_(?:dp_tp|ddp): (?:starting at|resumed from) step (\d+) .* t=([0-9.]+)$")
ALLOCATION = re.compile(r"^run \d+ on ")
MEMORY_COUNT = re.compile(r"^train_ddp: rank 0 step \d+ stall \S+ memory checkpoints (\d+) ")


def read_run(log, kills_file):
    kills = sorted(float(line.split()[0]) for line in open(kills_file) if line.strip())
    runs = []  # per start: the times of its step lines
    in_place = []  # per start: whether it began in the allocation and processes of the one before
    new_allocation = True
    checkpoints = 0
    terminal = []  # the steps of the committed terminal checkpoints
    from_memory = set()  # steps whose terminal checkpoint took a shard from the memory tier
    memory = [0, 0]  # rank 0's steps counted, memory checkpoints among them (its count restarts per Checkpointer)
    count = 0
    for line in open(log, errors="replace"):
        line = line.rstrip("\n")
        if m := STEP.match(line):
            if runs:
                runs[-1].append((float(m.group(2)), int(m.group(1))))
        elif ALLOCATION.match(line):
            new_allocation = True
        elif START.match(line):
            runs.append([])
            in_place.append(not new_allocation)
            new_allocation = False
        elif "committed periodic checkpoint" in line:
            checkpoints += 1
        elif m := TERMINAL.search(line):
            terminal.append(int(m.group(1) or m.group(2)))
        elif m := FROM_MEMORY.search(line):
            from_memory.add(int(m.group(1)))
        elif m := MEMORY_COUNT.match(line):
            now = int(m.group(1))
            memory[0] += 1
            memory[1] += now - count if now >= count else now
            count = now
    return kills, runs, in_place, checkpoints, terminal, from_memory, memory


def measure(name, log, kills_file, step_s, steps):
    kills, runs, in_place, checkpoints, terminal, from_memory, memory = read_run(log, kills_file)
    last = [t for run in runs for t, s in run if s == steps]
    if not last:
        raise SystemExit(f"goodput_measure: {log}: the job did not reach step {steps}")
    # A run's steps between kills: the durations after its warm-up are its working steps.
    warmed = []  # per run: when it was warm (time of its WARMUP-th step line less WARMUP step times), or None
    durations = []
    for run in runs:
        warmed.append(run[WARMUP - 1][0] - WARMUP * step_s if len(run) >= WARMUP else None)
        for (t0, _), (t1, _) in zip(run[WARMUP - 1:], run[WARMUP:]):
            if not any(t0 < k < t1 for k in kills):
                durations.append(t1 - t0)
    if warmed[0] is None:
        raise SystemExit(f"goodput_measure: {log}: the first run did not warm up")
    start, end = warmed[0], max(last)
    restarts, restarts_in_place = [], []
    for i, k in enumerate(kills):
        after = [w for w in warmed if w is not None and w > k]
        if after:
            finish = min(after[0], kills[i + 1]) if i + 1 < len(kills) else after[0]
            # How the job came back: the first start after the kill.
            first = next((j for j, run in enumerate(runs) if run and run[0][0] > k), None)
            (restarts_in_place if first is not None and in_place[first] else restarts).append(max(0.0, finish - k))
    return {
        "name": name,
        "wall_s": end - start,
        "goodput": steps * step_s / (end - start),
        "failures": len(kills),
        "checkpoints": checkpoints,
        "terminal_checkpoints": len(terminal),
        "terminal_from_memory": sum(1 for s in terminal if s in from_memory),
        "restarts_s": restarts,
        "restarts_in_place_s": restarts_in_place,
        "failure_times": [round(k - start, 3) for k in kills],
        "durations": durations,
        # steps per memory checkpoint, where the log counts them
        "memory_every_steps": memory[0] / memory[1] if memory[1] else None,
    }


def main():
    args = sys.argv[1:]
    memory = set()
    while args[:1] == ["--memory"]:
        memory.add(args[1])
        args = args[2:]
    step_s, steps = float(args[0]), int(args[1])
    args = args[2:]
    runs = [measure(args[i], args[i + 1], args[i + 2], step_s, steps) for i in range(0, len(args), 3)]
    step_seen = statistics.median(d for r in runs if r["name"] not in memory for d in r["durations"])
    # Runs whose memory checkpoints the log counts come last: their mean step holds the periodic checkpoints' cost
    # too, δ of the other runs per checkpoint, which is taken out of the memory tier's stall.
    counted = [r for r in runs if r["name"] in memory and r["memory_every_steps"] is not None]
    for r in [r for r in runs if r not in counted] + counted:
        durations = r.pop("durations")
        every = r.pop("memory_every_steps") or 1.0
        stall = 0.0  # per step, on average
        if r in counted and durations:
            periodic = [x["cost_s"] for x in runs if x not in counted and x.get("cost_s") is not None]
            share = (statistics.median(periodic) if periodic else 0.0) * r["checkpoints"] / len(durations)
            stall = max(0.0, statistics.mean(durations) - step_seen - share)
        elif r["name"] in memory and durations:
            stall = max(0.0, statistics.median(durations) - step_seen)
        if r["name"] in memory:
            r["memory_every_steps"] = every
            r["memory_cost_s"] = stall * every  # per memory checkpoint
        excess = sum(d - step_seen - stall for d in durations)
        r["cost_s"] = max(0.0, excess / r["checkpoints"]) if r["checkpoints"] and r not in counted else None
    costs = [r["cost_s"] for r in runs if r["cost_s"] is not None]
    restarts = [x for r in runs for x in r["restarts_s"]]
    in_place = [x for r in runs for x in r["restarts_in_place_s"]]
    print(json.dumps({
        "step_s": step_s,
        "steps": steps,
        "step_seen_s": step_seen,
        "cost_s": statistics.median(costs) if costs else 0.0,
        "restart_s": statistics.median(restarts) if restarts else 0.0,
        "inplace_restart_s": statistics.median(in_place) if in_place else 0.0,
        "runs": runs,
    }, indent=1))


if __name__ == "__main__":
    main()
