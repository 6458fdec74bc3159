#!/usr/bin/env bash
# A node cut off the network mid-run and healed 15 s later, on the requeue path: slurm-examples/train_dp_tp.py (DP=3,
# --tp 1) as a requeueable batch job on 3 of the 4 hosts under the recovery controller (default config), last words
# on, no periodic checkpoint. The cut node's rank lives on and sees the other two die; they see it die.
#  - The two survivors hold the majority: they claim and commit a terminal checkpoint and exit 75 naming the cut
#    node (the lone rank behind the cut, a minority, claims later and finds the claim taken).
#  - The controller's probe of the cut node times out (nothing refuses), so it is excluded but not marked DOWN by
#    the controller; the requeue waits for Slurm to give the node up (SlurmdTimeout) before the old run ends.
#  - One new run, never on the healed node: running again within SlurmdTimeout + 10 s of the cut, at most one step
#    lost, recorded as a node failure with the node excluded; final weights bitwise equal to an uninterrupted run.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/controller_lib.sh"
source "$(dirname "$0")/torch_lib.sh"
have_torch || fail "needs python3-torch and a built slurm_ckpt"
[ "$("$CLUSTER" addr)" != 127.0.0.1 ] || fail "needs the namespace cluster (its nodes share one host here)"
STEPS=70
tag=$RANDOM$RANDOM
PORT=$(( ${CKPT_CONTROLLER_TEST_PORT:-16840} + 60 ))
job="" victim=""
cleanup() {
  [ -n "$job" ] && scancel "$job" 2>/dev/null || true
  if [ -n "$victim" ]; then "$CLUSTER" heal-node "$victim" > /dev/null 2>&1 || true; "$CLUSTER" revive-node "$victim" > /dev/null 2>&1 || true; fi
  controller_down
}
trap cleanup EXIT
controller_up "$SCRATCH" "$PORT" > /dev/null || fail "no controller"
timeout_s=$(slurmd_timeout)
BOUND_S=$((timeout_s + 10))

mkdir -p "$SCRATCH/straight" "$SCRATCH/cut"
MASTER_ADDR=$(rendezvous_addr) MASTER_PORT=$(free_port) \
  srun -N3 -n3 -J "prq-straight-$tag" --ckpt-interval=1000steps --ckpt-last-words=on --ckpt-dir="$SCRATCH/straight/ckpt" \
  "$PY" "$CKPT_SOURCE_DIR/slurm-examples/train_dp_tp.py" --tp 1 --steps $STEPS --out "$SCRATCH/straight/final" \
  > "$SCRATCH/straight.log" 2>&1 || { cat "$SCRATCH/straight.log" >&2; fail "the uninterrupted run failed"; }
pass "uninterrupted DP=3 run on 3 hosts"

write_train_sbatch "$SCRATCH/cut.sbatch" "-N3 -n3" train_dp_tp.py --tp 1 --steps $STEPS --out "$SCRATCH/cut/final"
job=$(sbatch --parsable -J "prq-$tag" -o "$SCRATCH/cut.log" --ckpt-interval=1000steps --ckpt-last-words=on \
  --ckpt-dir="$SCRATCH/cut/ckpt" "$SCRATCH/cut.sbatch" --step-sleep 0.2)
wait_logged_step "$SCRATCH/cut.log" $((15 + RANDOM % 15)) || { cat "$SCRATCH/cut.log" >&2; fail "the run did not start training"; }
nodes=$(scontrol show hostnames "$(squeue -h -j "$job" -o %N)")
batch=$(squeue -h -j "$job" -o %B)
victim=$(echo "$nodes" | grep -vx "$batch" | tail -1)
cut_t=$(now)
"$CLUSTER" partition-node "$victim" 2> /dev/null
seen=$(logged_step "$SCRATCH/cut.log")
echo "cut $victim (of $(echo $nodes), batch host $batch) at step ~$seen; healing it 15 s later"
healed="" run1_t=""
for _ in $(seq 1200); do
  if [ -z "$healed" ] && [ "$(since "$cut_t" "$(now)" | cut -d. -f1)" -ge 15 ]; then
    "$CLUSTER" heal-node "$victim" 2> /dev/null
    healed=$(since "$cut_t" "$(now)")
  fi
  [ -z "$run1_t" ] && grep -q "^run 1 " "$SCRATCH/cut.log" && run1_t=$(now)
  [ -n "$run1_t" ] && [ -n "$healed" ] && break
  sleep 0.05
done
[ -n "$run1_t" ] || { ctl history "$job" >&2; fail "the job did not run again within 60 s of the cut"; }
took=$(since "$cut_t" "$run1_t")
echo "running again $took s after the cut (healed after $healed s): $(grep '^run 1 ' "$SCRATCH/cut.log")"
ctl history "$job" | grep -E "decision|recovery|action|transition" | sed 's/^/  /' | sed -n 1,16p
grep "^run 1 " "$SCRATCH/cut.log" | grep -q "$victim" && fail "the new run went back to $victim"
ctl history "$job" | grep -q "node failure" || { ctl history "$job" >&2; fail "the ending is not a node failure"; }
ctl history "$job" | grep -q "excluding $victim" || { ctl history "$job" >&2; fail "$victim was not excluded"; }
! ctl history "$job" | grep -q "preempt" || { ctl history "$job" >&2; fail "the ending was recorded as a preemption"; }
awk -v t="$took" -v b="$BOUND_S" 'BEGIN { exit !(t <= b) }' ||
  fail "running again $took s after the cut (bound: SlurmdTimeout $timeout_s s + 10 s)"
term=$(sed -n 's/^run 1 on .*, resuming from step \([0-9]*\)$/\1/p' "$SCRATCH/cut.log")
[ -n "$term" ] && [ "$term" -ge $((seen - 1)) ] || fail "resumed from step '$term'; the run was at step $seen"
pass "running again $took s after the cut (bound $BOUND_S s), from the terminal checkpoint of step $term (cut at ~$seen); $victim excluded, the new run elsewhere; a node failure"

wait_job_state "$job" '^(COMPLETED|FAILED|CANCELLED)$' 180
state=$(scontrol show job "$job" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
[ "$state" = COMPLETED ] || { tail -30 "$SCRATCH/cut.log" >&2; fail "the recovered job ended $state"; }
restarts=$(scontrol show job "$job" | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p')
[ "$restarts" = 1 ] || { ctl history "$job" >&2; fail "the job ran $((restarts + 1)) times; one new run expected"; }
job=""
cmp -s "$SCRATCH/straight/final.tp0" "$SCRATCH/cut/final.tp0" || fail "final weights differ after the partition"
"$CKPT_BUILD_DIR/cli/ckpt" verify "$SCRATCH/cut/ckpt" > "$SCRATCH/verify" 2>&1 || { cat "$SCRATCH/verify" >&2; fail "ckpt verify"; }
pass "one new run (Restarts=1), never on the healed node; ckpt verify passes; final weights bitwise identical"
finish
