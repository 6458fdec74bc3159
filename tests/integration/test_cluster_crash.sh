#!/usr/bin/env bash
# The node-failure helpers: crash-node kills a node's slurmd, slurmstepds and tasks for real; freeze-node stops
# them silently; revive-node brings the node back into service.
source "$(dirname "$0")/lib.sh"

# alive PID: the process exists and is not a zombie.
alive() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
# gone_within SECONDS PID...: every pid is dead within the time.
gone_within() {
  local t=$1 p; shift
  for _ in $(seq $((t * 10))); do
    for p in "$@"; do alive "$p" && continue 2; done
    return 0
  done
  return 1
}

# PMIx steps launch across all four nodes (TmpFS per node keeps their stepds apart).
srun --mpi=pmix -N4 -n4 bash -c 'echo "$SLURMD_NODENAME $PMIX_RANK"' | sort > "$SCRATCH/pmix"
[ "$(awk '{print $1}' "$SCRATCH/pmix" | sort -u | wc -l)" -eq 4 ] || fail "pmix step did not span 4 nodes"
[ "$(awk '{print $2}' "$SCRATCH/pmix" | sort -n | tr '\n' ' ')" = "0 1 2 3 " ] || fail "pmix ranks: $(cat "$SCRATCH/pmix")"
pass "srun --mpi=pmix runs across 4 nodes"

tag=$RANDOM$RANDOM
srun -N4 -n4 -J "crash-$tag" bash -c "exec -a ckpt-crash-probe-$tag sleep 300" > /dev/null 2>&1 &
srun_pid=$!
for _ in $(seq 120); do
  job=$(squeue -h -n "crash-$tag" -o %i | sed -n 1p)
  [ -n "$job" ] && [ "$(pgrep -fc "^ckpt-crash-probe-$tag" || true)" -ge 4 ] && break
  sleep 0.25
done
[ -n "${job:-}" ] || fail "probe job did not start"
n2_before=$(for p in $(pgrep -f "^ckpt-crash-probe-$tag"); do
  if tr '\0' '\n' < "/proc/$p/environ" | grep -x SLURMD_NODENAME=n2 > /dev/null; then echo "$p"; fi
done)
[ -n "$n2_before" ] || fail "no probe task on n2"

slurmd_n2=$(cat "$CKPT_CLUSTER_DIR/run/slurmd-n2.pid")
"$CLUSTER" crash-node n2
# shellcheck disable=SC2086
gone_within 5 $n2_before || fail "tasks on n2 survived the crash"
gone_within 5 "$slurmd_n2" || fail "slurmd of n2 survived the crash"
others=$(pgrep -fc "^ckpt-crash-probe-$tag" || true)
[ "$others" -eq 3 ] || fail "expected the 3 tasks on other nodes alive, found $others"
pass "crash-node n2 killed its slurmd and tasks and nothing else"

# Slurm notices on its own only after SlurmdTimeout; then the job is cancelled for node failure.
for _ in $(seq 160); do sinfo -h -n n2 -o %T | grep -iE 'down|not_responding|\*' > /dev/null && break; sleep 0.25; done
sinfo -h -n n2 -o %T | grep -iE 'down|\*' > /dev/null || fail "slurmctld never saw n2 go down"
wait "$srun_pid" 2>/dev/null || true
pass "slurmctld marked n2 down"

"$CLUSTER" revive-node n2
srun -N1 -w n2 true || fail "n2 does not run jobs after revive"
pass "revive-node n2 returned it to service"

# freeze-node: the processes stay but stop; revive continues them.
srun -N1 -w n3 -J "freeze-$tag" bash -c "exec -a ckpt-crash-probe-f$tag sleep 300" > /dev/null 2>&1 &
for _ in $(seq 80); do pgrep -f "^ckpt-crash-probe-f$tag" > /dev/null && break; sleep 0.25; done
probe=$(pgrep -f "^ckpt-crash-probe-f$tag") || fail "freeze probe did not start"
"$CLUSTER" freeze-node n3
[ "$(ps -o stat= -p "$probe" | cut -c1)" = T ] || fail "task on n3 is not stopped"
"$CLUSTER" revive-node n3
[ "$(ps -o stat= -p "$probe" | cut -c1)" != T ] || fail "task on n3 is still stopped after revive"
scancel -n "freeze-$tag"
wait 2>/dev/null || true
pass "freeze-node stops a node silently and revive-node continues it"
finish
