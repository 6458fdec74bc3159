#!/usr/bin/env bash
# A straggler without a spare: slurm-examples/train_ddp.py (DP over gloo, its forward and backward passes timed as
# the rank's own work) runs on three nodes as a requeueable batch job under the recovery controller, with last
# words on and --ckpt-straggler=0.5,exclude. One node of the three is held to a quarter of the CPU its task used
# (cluster.sh slow-node), its daemons not.
#  - Before the slowdown nothing is flagged. After it, the root of the heartbeat tree names that node within 24
#    steps, in one `ckpt:` line, and reports it to the controller.
#  - The controller records it: a history line, the job's slow nodes (GET /v1/jobs/ID, which the status page
#    shows), ckpt_controller_slow_node_events_total in /metrics; it leaves the node out of the job's next runs
#    and never marks it DOWN or drains it on the user's word.
#  - A rank's crash on another node then requeues the job, and the next run is placed without the slow node.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/controller_lib.sh"
source "$(dirname "$0")/torch_lib.sh"
have_torch || fail "needs python3-torch and a built slurm_ckpt"
[ -x "$CKPT_BUILD_DIR/controller/ckpt-controller" ] || fail "ckpt-controller is not built"
DETECT_BOUND_STEPS=24
tag=$RANDOM$RANDOM
PORT=$(( ${CKPT_CONTROLLER_TEST_PORT:-16840} + 60 ))
job=""
slow=""
cleanup() {
  [ -n "$job" ] && scancel "$job" 2>/dev/null || true
  [ -n "$slow" ] && "$CLUSTER" unslow-node "$slow" > /dev/null 2>&1 || true
  controller_down
}
trap cleanup EXIT
controller_up "$SCRATCH" "$PORT" > /dev/null || fail "no controller"

mkdir -p "$SCRATCH/slow"
write_train_sbatch "$SCRATCH/slow.sbatch" "-N3 -n3" train_ddp.py --steps 100000 --log-every 1 --d-model 96 \
  --out "$SCRATCH/slow/final"
# CKPT_LAYOUT declares the pure data parallelism, which arms last words and with them the heartbeat network. The
# threshold is 0.5, below the default 0.7: under CI's load a healthy rank read 0.69 for 3 windows once, and false
# flags are bench/straggler's to measure; a node held to a quarter of its CPU scores well below it.
job=$(CKPT_LAYOUT=dp=3 sbatch --parsable -J "straggler-$tag" -o "$SCRATCH/slow.log" --ckpt-interval=1000steps \
  --ckpt-last-words=on --ckpt-straggler=0.5,exclude --ckpt-dir="$SCRATCH/slow/ckpt" "$SCRATCH/slow.sbatch")
wait_logged_step "$SCRATCH/slow.log" 25 || { cat "$SCRATCH/slow.log" >&2; fail "the job did not reach step 25"; }
mapfile -t nodes < <(scontrol show hostnames "$(squeue -h -j "$job" -o %N)")
[ "${#nodes[@]}" = 3 ] || fail "the first run is not on 3 nodes: ${nodes[*]}"
slow=${nodes[1]}
other=${nodes[2]}

grep -q "ckpt: .*straggler:" "$SCRATCH/slow.log" && fail "a node was flagged before any was slowed: $(grep straggler: "$SCRATCH/slow.log")"
pass "no node flagged in the first 25 steps of three even nodes"

# A quarter of the CPU its task used, measured now: at half of it, under CI's load, the first windows after the
# slowdown scored near 0.5 and detection took 31 steps once.
share=$("$CLUSTER" task-cpu "$slow" 2) || fail "cannot measure the CPU of $slow's task"
factor=$(awk -v s="$share" 'BEGIN { f = s / 4; if (f < 0.05) f = 0.05; printf "%.3f", f }')
"$CLUSTER" slow-node "$slow" "$factor" > "$SCRATCH/slow-node.out" 2>&1 || { cat "$SCRATCH/slow-node.out" >&2; fail "slow-node failed"; }
slowed_at=$(logged_step "$SCRATCH/slow.log")  # the quota holds from here on at the latest
echo "$slow's task used $share of a CPU; held to $factor from step ~$slowed_at"

line=""
for _ in $(seq 1200); do
  line=$(grep -m1 "ckpt: .*straggler: node " "$SCRATCH/slow.log" || true)
  [ -n "$line" ] && break
  sleep 0.05
done
[ -n "$line" ] || { tail -20 "$SCRATCH/slow.log" >&2; fail "no straggler was reported within 60 s of the slowdown"; }
echo "$line"
case $line in *"node $slow runs at "*) ;; *) fail "the report names another node than $slow: $line" ;; esac
last=$(sed -n 's/.*, steps [0-9]*-\([0-9]*\) (rank.*/\1/p' <<< "$line")
[ -n "$last" ] || fail "the report names no steps: $line"
took=$((last + 1 - slowed_at))
[ "$took" -le "$DETECT_BOUND_STEPS" ] || fail "detected $took steps after the slowdown (bound $DETECT_BOUND_STEPS)"
pass "$slow reported $took steps after it was slowed (<= $DETECT_BOUND_STEPS)"

for _ in $(seq 100); do ctl history "$job" 2>/dev/null | grep -q "slow node $slow" && break; sleep 0.1; done
ctl history "$job" > "$SCRATCH/history.txt" 2>&1
assert_contains "$SCRATCH/history.txt" "slow node $slow"
controller_get "/v1/jobs/$job" > "$SCRATCH/job.json" || fail "GET /v1/jobs/$job failed"
"$PY" - "$SCRATCH/job.json" "$slow" <<'PYCHECK' || fail "the job's record does not list $slow as slow and excluded: $(cat "$SCRATCH/job.json")"
import json, sys
job = json.load(open(sys.argv[1]))
slow = [s for s in job.get("slow_nodes", []) if s.get("node") == sys.argv[2]]
assert slow and 0 < slow[0]["score"] < 0.5 and slow[0]["action"] == "exclude", job.get("slow_nodes")
excluded = job.get("excluded_nodes", job.get("exclude", []))
assert sys.argv[2] in excluded, excluded
PYCHECK
controller_get /metrics > "$SCRATCH/metrics.txt" || fail "GET /metrics failed"
grep -Eq '^ckpt_controller_slow_node_events_total[{]action="exclude"[}] [1-9]' "$SCRATCH/metrics.txt" ||
  fail "no slow-node event in /metrics: $(grep slow_node "$SCRATCH/metrics.txt")"
sinfo -h -n "$slow" -o '%T' | grep -Eqi 'down|drain' && fail "$slow was marked $(sinfo -h -n "$slow" -o '%T') on a user's word"
pass "the controller recorded $slow as slow (history, job record, /metrics) and excludes it; it is $(sinfo -h -n "$slow" -o '%T'), not DOWN"

# A crash elsewhere: the next run leaves the slow node out.
"$CLUSTER" kill-tasks "$other" > /dev/null 2>&1 || fail "could not kill the task on $other"
for _ in $(seq 1200); do grep -q "^run 1 " "$SCRATCH/slow.log" && break; sleep 0.05; done
run1=$(grep -m1 "^run 1 " "$SCRATCH/slow.log") || { ctl history "$job" >&2; fail "the job did not run again within 60 s of the crash"; }
echo "$run1"
nodes1=$(scontrol show hostnames "$(sed -n 's/^run 1 on \(.*\), resuming from step .*/\1/p' <<< "$run1")")
grep -qx "$slow" <<< "$nodes1" && fail "the next run was placed on the slow node $slow: $run1"
pass "the next run is on $(echo $nodes1), without $slow"
