#!/usr/bin/env python3
"""bench/scale/report.py OUT: the table of bench/scale/run.sh's results, each figure fitted against N.

Reads OUT/n<N>/{train,resume,freeze}/ (rank-R.txt lines of bench_scale_rank, the srun log, strace files of the traced
ranks, the phase file run.sh wrote, the checkpoint dir's listing) and prints a Markdown table: one row per figure,
one column per N, then the log-log slope between the smallest and the largest N that have the figure, the least
squares slope over every N, and the value extrapolated to 16,384 ranks from the largest N along that slope.
"""
import math
import os
import re
import statistics
import sys

TARGET = 16384


def read_kv_line(text):
    return {m.group(1): m.group(2).strip('"') for m in re.finditer(r'(\w+)=("[^"]*"|\S+)', text)}


def number(value):
    """A figure of a rank line; None when absent or negative (bench_scale_rank writes -1 for "not measured")."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if v >= 0 else None


def load_phase(path):
    phase = {"path": path, "ranks": {}, "log": "", "meta": {}, "strace": {}, "listing": []}
    if not os.path.isdir(path):
        return None
    for name in os.listdir(path):
        m = re.fullmatch(r"rank-(\d+)\.txt", name)
        if m:
            with open(os.path.join(path, name)) as f:
                phase["ranks"][int(m.group(1))] = read_kv_line(f.read())
    if os.path.exists(os.path.join(path, "log")):
        with open(os.path.join(path, "log"), errors="replace") as f:
            phase["log"] = f.read()
    if os.path.exists(os.path.join(path, "phase")):
        with open(os.path.join(path, "phase")) as f:
            for line in f:
                key, _, value = line.strip().partition("=")
                phase["meta"][key] = value
    strace_dir = os.path.join(path, "strace")
    if os.path.isdir(strace_dir):
        for name in os.listdir(strace_dir):
            m = re.fullmatch(r"rank-(\d+)", name)
            if m:
                with open(os.path.join(strace_dir, name), errors="replace") as f:
                    phase["strace"][int(m.group(1))] = f.read().splitlines()
    if os.path.exists(os.path.join(path, "ckpt-listing")):
        with open(os.path.join(path, "ckpt-listing")) as f:
            phase["listing"] = [line.split(" ", 2) for line in f.read().splitlines()]
    return phase


def open_meta(out):
    """The run's meta file (run.sh's command, date, machine and settings); "" when absent."""
    try:
        with open(os.path.join(out, "meta")) as f:
            return f.read()
    except OSError:
        return ""


STRACE_LINE = re.compile(r"^\d+\s+(\d+\.\d+)\s+(\w+)\(")


def fs_ops(lines, ckpt_dir, t_from, t_to):
    """Syscalls of one traced rank that touch the checkpoint dir (by path or by the fd's path) in [t_from, t_to)."""
    total, control = 0, 0
    for line in lines:
        if "resumed>" in line:
            continue
        m = STRACE_LINE.match(line)
        if not m or ckpt_dir not in line:
            continue
        t = float(m.group(1))
        if t_from <= t < t_to:
            total += 1
            # The control dir's request polling; records gathered up the tree are checkpoint work.
            if "/.control/" in line and "/.control/gathered-" not in line:
                control += 1
    return total, control


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def checkpoint_size(listing):
    """Bytes and files of the newest complete checkpoint in a listing ('y size path' lines): the step dir `latest`
    names, else the largest step dir."""
    dirs = {}
    for entry in listing:
        if len(entry) != 3 or entry[0] != "f":
            continue
        parts = entry[2].split("/")
        if len(parts) < 3 or parts[1].startswith("."):
            continue
        d = dirs.setdefault(parts[1], [0, 0])
        d[0] += int(entry[1])
        d[1] += 1
    if not dirs:
        return None, None
    name = max(dirs, key=lambda k: (dirs[k][1], k))
    return dirs[name][0], dirs[name][1]


def failure_rows(row, n, phase, what, name):
    """The figures of a run in which run.sh killed or froze a rank (or every rank of a node: victim "a-b"): who saw
    it, how soon, the last words, and whether every rank restored its state bitwise."""
    victim, t_kill = phase["meta"].get("victim"), number(phase["meta"].get("t_kill"))
    ranks = phase["ranks"]
    row[f"{name}: ranks restored bitwise (state checked against a replay)"] = (
        f"{sum(1 for r in ranks.values() if r.get('state_ok') == '1')}/{len(ranks)}")
    if not (victim and t_kill):
        row[f"{what}: survivors that logged its death"] = "none: the run ended before the marker step"
        return
    first, _, last = victim.partition("-")
    victims = set(range(int(first), int(last or first) + 1))
    deaths = [(int(s), int(r), float(t)) for s, r, t in re.findall(
        r"ckpt: rank (\d+): last words: rank (\d+) is dead \([^)]*\), detected at unix ([0-9.]+)", phase["log"])]
    # Per survivor, when it first learnt of a victim's death.
    first_seen = {}
    for s, r, t in deaths:
        if r in victims and s not in victims:
            first_seen[s] = min(t, first_seen.get(s, t))
    seen = list(first_seen.values())
    commits = [float(x) for x in re.findall(r"committed the terminal checkpoint of step \d+, ([0-9.]+) s after",
                                             phase["log"])]
    # A rank declared dead before the kill is a false death. After it, survivors that wrote their part leave
    # without a goodbye and their peers log them as dead too: the end of the job, not a failure.
    row[f"{what}: survivors that logged its death"] = f"{len(seen)}/{n - len(victims)}"
    row[f"{name}: false deaths (declared before the {'kill' if what.startswith('killed') else 'freeze'})"] = len(
        {r for _, r, t in deaths if r not in victims and t < t_kill})
    if seen:
        row[f"detection latency of a {what}, first survivor (s)"] = min(seen) - t_kill
        row[f"detection latency of a {what}, median survivor (s)"] = statistics.median(seen) - t_kill
        row[f"detection latency of a {what}, last survivor (s)"] = max(seen) - t_kill
    row[f"{what}: last-words commits"] = len(commits)
    row[f"last-words commit latency after a {what} (s after detection)"] = commits[0] if commits else None
    row[f"{name}: srun exit status"] = phase["meta"].get("rc")


def analyse(n, train, resume, freeze):
    row = {}
    ranks = train["ranks"] if train else {}
    ckpt_dir = (train or resume or {"meta": {}})["meta"].get("ckpt_dir", "")
    if train:
        row["train: ranks that trained to the last step"] = \
            f"{sum(1 for r in ranks.values() if r.get('end_step') == r.get('target') and r.get('stopped') == '0')}/{n}"
        row["train: ranks stopped by last words"] = sum(1 for r in ranks.values() if r.get("stopped") == "1")
        row["train: ranks failed"] = sum(1 for r in ranks.values() if r.get("failed") == "1")
        row["train: srun exit status"] = train["meta"].get("rc")
        before, after = (train["meta"].get(k, "-").split(" ")[0] for k in ("loadavg_start", "loadavg_end"))
        row["train: 1-min load average before / after"] = f"{before} / {after}"
        dead = re.findall(r"last words: rank (\d+) is dead", train["log"])
        row["train: false deaths (ranks declared dead / lines)"] = f"{len(set(dead))} / {len(dead)}"
        row["train: step reached (median rank)"] = median(number(r.get("end_step")) for r in ranks.values())
        row["train: terminal checkpoints written"] = len(re.findall(r"committed the terminal checkpoint", train["log"]))
        row["train: error lines"] = len(re.findall(r"(?m)^.*(error|fail|cannot)", train["log"], re.I))
        row["CPU per rank while training (% of a core)"] = median(number(r.get("cpu_pct")) for r in ranks.values())
        row["TCP connections per rank (after open)"] = median(number(r.get("tcp_conns_open")) for r in ranks.values())
        conns = [number(r.get("tcp_conns_open")) for r in ranks.values() if number(r.get("tcp_conns_open")) is not None]
        # A group leader carries its members and its tree links: the busiest rank, not only the median one.
        row["TCP connections per rank (after open, busiest rank)"] = max(conns) if conns else None
        # At the end of training: the memory tier's partner links (one out, one in) are made at the first copy.
        row["TCP connections per rank (end of training)"] = median(number(r.get("tcp_conns_end")) for r in ranks.values())
        ends = [number(r.get("tcp_conns_end")) for r in ranks.values() if number(r.get("tcp_conns_end")) is not None]
        row["TCP connections per rank (end of training, busiest rank)"] = max(ends) if ends else None
        row["TCP data segments sent per rank per s (measured)"] = median(
            number(r.get("segs_out_per_s")) for r in ranks.values())
        row["TCP data segments received per rank per s (measured)"] = median(
            number(r.get("segs_in_per_s")) for r in ranks.values())
        sent = [number(r.get("segs_out_per_s")) for r in ranks.values() if number(r.get("segs_out_per_s")) is not None]
        row["TCP data segments sent per rank per s (busiest rank)"] = max(sent) if sent else None
        if "last_words=off" not in open_meta(os.path.dirname(os.path.dirname(train["path"]))) and conns:
            # One heartbeat per link per 100 ms (heartbeat.hpp).
            row["heartbeats per rank per s, documented: links x 10/s (busiest rank)"] = max(conns) * 10.0
        per_message = []
        for r in ranks.values():
            cpu, sent, got = (number(r.get(k)) for k in ("cpu_pct", "segs_out_per_s", "segs_in_per_s"))
            if cpu is not None and sent and got:
                per_message.append(cpu / 100 / (sent + got) * 1e6)
        row["CPU per message sent or received (us; all of the rank's CPU over its messages)"] = median(per_message)
        row["steps per s while training"] = median(number(r.get("steps_per_s")) for r in ranks.values())
        row["open time, no checkpoint (s, median)"] = median(number(r.get("open_restore_s")) for r in ranks.values())
        r0 = ranks.get(0, {})
        row["periodic commit latency (s, rank 0 median)"] = number(r0.get("commit_median_s"))
        row["periodic commits seen by rank 0"] = number(r0.get("commits"))
        size, files = checkpoint_size(train["listing"])
        row["checkpoint size (bytes, all shards)"] = size
        row["files per checkpoint per rank"] = files / n if files else None
        for rank_label, pick in (("rank 0", lambda k: k == 0), ("other ranks", lambda k: k != 0)):
            start, per_ckpt, per_step = [], [], []
            for k, lines in train["strace"].items():
                if not pick(k) or k not in ranks:
                    continue
                r = ranks[k]
                t_open, t_train, t_end = (number(r.get(x)) for x in ("t_open", "t_train", "t_end"))
                start.append(fs_ops(lines, ckpt_dir, 0, t_train)[0])
                # The polling of the control dir while training, per step; every other operation from the first
                # step to the exit (the last checkpoint persists while the program closes), per checkpoint.
                _, control = fs_ops(lines, ckpt_dir, t_train, t_end)
                total, control_all = fs_ops(lines, ckpt_dir, t_train, math.inf)
                steps = number(r.get("end_step")) - number(r.get("resume_step"))
                ckpts = number(r.get("snapshots")) or 1
                per_step.append(control / steps if steps else None)
                per_ckpt.append((total - control_all) / ckpts)
            row[f"FS ops at start, fresh ({rank_label})"] = median(start)
            row[f"FS ops per checkpoint, data ({rank_label})"] = median(per_ckpt)
            row[f"FS ops per step, control dir ({rank_label})"] = median(per_step)
    if resume:
        rr = resume["ranks"]
        row["resume: ranks with results"] = f"{len(rr)}/{n}"
        row["open+restore time (s, median)"] = median(number(r.get("open_restore_s")) for r in rr.values())
        row["open+restore time (s, max)"] = max((number(r.get("open_restore_s")) for r in rr.values()), default=None)
        size = row.get("checkpoint size (bytes, all shards)")
        rchar = [number(r.get("rchar")) for r in rr.values()]
        restore = {k: number(r.get("rchar_restore")) for k, r in rr.items() if r.get("rchar_restore") is not None}
        if size and rchar:
            row["bytes read across open+restore per rank / checkpoint size"] = statistics.median(rchar) / size
        if size and restore:
            # Ranks killed later in this run never report: each is counted as the median rank that did.
            typical = statistics.median(restore.values())
            total = sum(restore.values()) + typical * (n - len(restore))
            row["bytes read by restore, all ranks / checkpoint size"] = total / size
            row["bytes read by restore per rank / its share of the checkpoint"] = typical * n / size
        starts = []
        for k, lines in resume["strace"].items():
            if k != 0 and k in rr:
                starts.append(fs_ops(lines, ckpt_dir, 0, number(rr[k].get("t_train")))[0])
        row["FS ops at start, resuming (other ranks)"] = median(starts)
        if 0 in resume["strace"] and 0 in rr:
            row["FS ops at start, resuming (rank 0)"] = fs_ops(resume["strace"][0], ckpt_dir, 0,
                                                               number(rr[0].get("t_train")))[0]
        failure_rows(row, n, resume, "killed rank", "resume")
    if freeze:
        failure_rows(row, n, freeze, "frozen rank", "freeze")
    return row


def slope(points):
    points = [(n, v) for n, v in points if isinstance(v, (int, float)) and v is not None and v > 0]
    if len(points) < 2:
        return None, None
    (n0, v0), (n1, v1) = points[0], points[-1]
    ends = math.log(v1 / v0) / math.log(n1 / n0)
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(v) for _, v in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    lsq = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else None
    return ends, lsq


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, int) or float(v).is_integer() and abs(v) >= 1:
        return f"{int(v)}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


FITTED = ("CPU per rank", "CPU per message", "TCP connections", "TCP data segments", "heartbeats per rank",
          "open+restore time", "open time", "periodic commit latency", "bytes read", "FS ops",
          "detection latency", "last-words commit latency", "files per checkpoint")


def table(out):
    """Every figure per size, the healthy sizes, and per fitted figure (ends slope, lsq slope, value at TARGET)."""
    sizes = sorted(int(d[1:]) for d in os.listdir(out) if re.fullmatch(r"n\d+", d))
    rows, order = {}, []
    for n in sizes:
        row = analyse(n, *(load_phase(os.path.join(out, f"n{n}", phase)) for phase in ("train", "resume", "freeze")))
        for key, value in row.items():
            if key not in rows:
                rows[key] = {}
                order.append(key)
            rows[key][n] = value
    # A size is healthy when its training run went to the end without a false death. The fits use healthy sizes
    # only: a run that collapsed measures its collapse, not the protocol's cost.
    healthy = [n for n in sizes if rows.get("train: false deaths (ranks declared dead / lines)", {}).get(n) == "0 / 0"
               and rows.get("train: ranks that trained to the last step", {}).get(n) == f"{n}/{n}"]
    fits = {}
    for key in order:
        if not key.startswith(FITTED):
            continue
        points = [(n, v) for n, v in ((n, rows[key].get(n)) for n in sizes)
                  if n in healthy and isinstance(v, (int, float))]
        ends, lsq = slope(points)
        positive = [(n, v) for n, v in points if v and v > 0]
        extrapolated = None
        if lsq is not None and positive:
            n_last, v_last = positive[-1]
            extrapolated = v_last * (TARGET / n_last) ** lsq
        fits[key] = (ends, lsq, extrapolated)
    return sizes, healthy, rows, order, fits


def main():
    out = sys.argv[1]
    sizes, healthy, rows, order, fits = table(out)
    if os.path.exists(os.path.join(out, "meta")):
        with open(os.path.join(out, "meta")) as f:
            for line in f:
                print(f"    {line.rstrip()}")
        print()
    print("| figure | " + " | ".join(f"N={n}" if n in healthy else f"N={n} (collapsed)" for n in sizes) +
          " | slope, healthy N (ends) | slope, healthy N (lsq) | at 16,384 (extrapolated) |")
    print("|---|" + "---:|" * len(sizes) + "---:|---:|---:|")
    for key in order:
        values = [rows[key].get(n) for n in sizes]
        ends, lsq, extrapolated = fits.get(key, (None, None, None))
        print(f"| {key} | " + " | ".join(fmt(v) for v in values) +
              f" | {fmt(ends) if ends is not None else '-'} | {fmt(lsq) if lsq is not None else '-'} | "
              f"{fmt(extrapolated) if extrapolated is not None else '-'} |")
    print()
    print(f"Healthy sizes (trained to the end, no false death): {', '.join(map(str, healthy)) or 'none'}. Slopes are "
          "d log(figure) / d log(N) over them (ends: smallest to largest; lsq: least squares); the last column is "
          "EXTRAPOLATED from the largest healthy N along the least-squares slope, not measured.")

if __name__ == "__main__":
    main()
