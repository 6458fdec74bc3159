#!/usr/bin/env bash
# cluster.sh slow-node: a node made slow for the straggler tests. A job's busy task on n2 gets a quarter of a CPU
# (the cgroup cpu controller's quota) and uses no more than that, while n2's slurmd and slurmstepd stay outside
# the limit; unslow-node lifts it and the task is back where it was. A bad factor is refused with one line naming
# it, and changes nothing.
source "$(dirname "$0")/lib.sh"
job=""
cleanup() {
  [ -n "$job" ] && scancel "$job" 2>/dev/null || true
  "$CLUSTER" unslow-node n2 > /dev/null 2>&1 || true
}
trap cleanup EXIT

job=$(sbatch --parsable -w n2 -N1 -n1 -o "$SCRATCH/busy.out" --wrap 'srun sh -c "while :; do :; done"')
wait_job_state "$job" RUNNING 60 || fail "the busy job did not start"
sleep 1  # its task is up

if "$CLUSTER" slow-node n2 fast > "$SCRATCH/bad.out" 2>&1; then fail "slow-node took FACTOR 'fast'"; fi
assert_contains "$SCRATCH/bad.out" "FACTOR 'fast'"
[ "$(grep -c . "$SCRATCH/bad.out")" -eq 1 ] || fail "a bad factor gave more than one line: $(cat "$SCRATCH/bad.out")"

"$CLUSTER" slow-node n2 0.25 > "$SCRATCH/slow.out" 2>&1 || { cat "$SCRATCH/slow.out" >&2; fail "slow-node failed"; }
group=""
for g in /sys/fs/cgroup/cpu/ckpt-slow-*-n2 /sys/fs/cgroup/ckpt-slow-*-n2; do [ -d "$g" ] && group=$g; done
[ -n "$group" ] || fail "no cgroup for n2's tasks"
pids=$(cat "$group/cgroup.procs")
[ -n "$pids" ] || fail "n2's tasks are not in its group"
for pid in $pids; do
  case $(cat "/proc/$pid/comm") in slurmd | slurmstepd) fail "slow-node limited n2's $(cat "/proc/$pid/comm")" ;; esac
done
ticks() { local t=0 pid; for pid in $pids; do t=$((t + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0))); done; echo $t; }
hz=$(getconf CLK_TCK)
a=$(ticks); t0=$(now); sleep 3; b=$(ticks); t1=$(now)
share=$(awk -v d=$((b - a)) -v hz="$hz" -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.3f", d / hz / (t1 - t0) }')
echo "n2's tasks used $share of a CPU under a quota of 0.25"
awk -v s="$share" 'BEGIN { exit !(s <= 0.32) }' || fail "n2's tasks used $share of a CPU, above the 0.25 quota"
awk -v s="$share" 'BEGIN { exit !(s >= 0.05) }' || fail "n2's tasks used $share of a CPU: the busy task does not run"
pass "the job's tasks on n2 get a quarter of a CPU, its daemons none of the limit"

"$CLUSTER" unslow-node n2 > /dev/null 2>&1 || fail "unslow-node failed"
[ ! -d "$group" ] || fail "unslow-node left $group"
for pid in $pids; do
  grep -q "ckpt-slow" "/proc/$pid/cgroup" && fail "task $pid is still in the slow group"
done
pass "unslow-node lifts the limit"
