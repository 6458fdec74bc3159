#!/usr/bin/env bash
# A rank that hangs while its host is fine (a stuck kernel, a collective that never returns): on n4 only the job's
# task is SIGSTOPped (cluster.sh hang-tasks); its slurmd and slurmstepd answer on. slurm-examples/train_dp_tp.py
# (DP2 x TP2 over gloo, bitwise resumable) runs as a requeueable batch job under the recovery controller with its
# default config (down_hung_nodes off), last words on and no periodic checkpoint.
#  - The survivors commit a terminal checkpoint, record where the lost rank ran (.control/peer-lost.json) and exit
#    75. srun would wait for the stuck task for ever; the controller finds n4's slurmd answering, reads the
#    survivors' record, ends the run and requeues the job without n4: running again within 20 s of the hang, its
#    first step within 25 s, at most one step lost, recorded as a node failure, n4 excluded and never marked DOWN.
#  - The stuck process of the old run is woken by Slurm's kill (SIGCONT, SIGTERM): nothing it does changes which
#    checkpoint a restart would use, and the final weights equal an uninterrupted run's bit for bit.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/controller_lib.sh"
source "$(dirname "$0")/torch_lib.sh"
have_torch || fail "needs python3-torch and a built slurm_ckpt"
[ -x "$CKPT_BUILD_DIR/controller/ckpt-controller" ] || fail "ckpt-controller is not built"
STEPS=70
RUNNING_BOUND_S=20
STEP_BOUND_S=25
tag=$RANDOM$RANDOM
PORT=$(( ${CKPT_CONTROLLER_TEST_PORT:-16840} + 50 ))
job=""
cleanup() {
  [ -n "$job" ] && scancel "$job" 2>/dev/null || true
  "$CLUSTER" revive-node n4 > /dev/null 2>&1 || true
  controller_down
}
trap cleanup EXIT
controller_up "$SCRATCH" "$PORT" > /dev/null || fail "no controller"
resolution() { "$CKPT_BUILD_DIR/cli/ckpt" latest "$SCRATCH/hung/ckpt" 2>&1 | head -1; }

mkdir -p "$SCRATCH/straight" "$SCRATCH/hung"
MASTER_ADDR=$(rendezvous_addr) MASTER_PORT=$(free_port) \
  srun -N4 -n4 -J "hung-straight-$tag" --ckpt-interval=1000steps --ckpt-last-words=on --ckpt-dir="$SCRATCH/straight/ckpt" \
  "$PY" "$CKPT_SOURCE_DIR/slurm-examples/train_dp_tp.py" --steps $STEPS --out "$SCRATCH/straight/final" \
  > "$SCRATCH/straight.log" 2>&1 || { cat "$SCRATCH/straight.log" >&2; fail "the uninterrupted run failed"; }
pass "uninterrupted DP2xTP2 run on 4 nodes"

wait_nodes_idle 4  # -N3-4 takes 3 nodes while the fourth is still completing the last job
write_train_sbatch "$SCRATCH/hung.sbatch" "-N3-4 -n4" train_dp_tp.py --steps $STEPS --out "$SCRATCH/hung/final"
at=$((15 + RANDOM % 20))
job=$(sbatch --parsable -J "hung-$tag" -o "$SCRATCH/hung.log" --ckpt-interval=1000steps --ckpt-last-words=on \
  --ckpt-dir="$SCRATCH/hung/ckpt" "$SCRATCH/hung.sbatch" --step-sleep 0.2)
wait_logged_step "$SCRATCH/hung.log" "$at" || true
[ "$(scontrol show hostnames "$(squeue -h -j "$job" -o %N)" | wc -l)" = 4 ] ||
  fail "the first run is not on 4 nodes: $(squeue -h -j "$job" -o %N)"
hang_t=$(now)
"$CLUSTER" hang-tasks n4 > "$SCRATCH/hang.out" 2>&1 || { cat "$SCRATCH/hang.out" >&2; fail "could not hang n4's task"; }
stuck=$(cat "$CKPT_CLUSTER_DIR/run/frozen-n4")
seen=$(logged_step "$SCRATCH/hung.log")
"$CKPT_BUILD_DIR/controller/ckpt-controller" --ask-slurmd n4 > "$SCRATCH/ask.out" 2>&1 ||
  fail "n4's slurmd does not answer with only its task stopped: $(cat "$SCRATCH/ask.out")"
echo "n4's task stopped at step ~$seen (pids $(echo $stuck)); its slurmd answers: $(cat "$SCRATCH/ask.out")"

for _ in $(seq 800); do grep -q "^run 1 " "$SCRATCH/hung.log" && break; sleep 0.05; done
running_t=$(now)
grep -q "^run 1 " "$SCRATCH/hung.log" || { ctl history "$job" >&2; fail "the job did not run again within 40 s of the hang"; }
for _ in $(seq 800); do grep -q "resumed from step" "$SCRATCH/hung.log" && [ "$(logged_step "$SCRATCH/hung.log")" -gt "$seen" ] 2>/dev/null && break; sleep 0.05; done
step_t=$(now)
took=$(since "$hang_t" "$running_t")
first=$(since "$hang_t" "$step_t")
echo "running again after $took s, a step beyond the hang after $first s: $(grep '^run 1 ' "$SCRATCH/hung.log")"
ctl history "$job" | grep -E "decision|recovery|action|failing" | sed 's/^/  /' | sed -n 1,14p
grep -q "ending it with exit status 75" "$SCRATCH/hung.log" || fail "no survivor was ended after its last words"
ctl history "$job" | grep -q "hung there" || { ctl history "$job" >&2; fail "the controller did not find the rank on n4 hung"; }
ctl history "$job" | grep -q "node failure" || { ctl history "$job" >&2; fail "the ending is not a node failure"; }
ctl history "$job" | grep -q "excluding n4" || { ctl history "$job" >&2; fail "n4 was not excluded"; }
grep "^run 1 " "$SCRATCH/hung.log" | grep -q "n4" && fail "the new run went back to n4"
sinfo -h -n n4 -o '%T' | grep -qi down && fail "n4 was marked DOWN on a user's word (it is $(sinfo -h -n n4 -o '%T'))"
awk -v t="$took" -v b="$RUNNING_BOUND_S" 'BEGIN { exit !(t <= b) }' || fail "running again took $took s (bound $RUNNING_BOUND_S s)"
awk -v t="$first" -v b="$STEP_BOUND_S" 'BEGIN { exit !(t <= b) }' || fail "the first step came $first s after the hang (bound $STEP_BOUND_S s)"
term=$(sed -n 's/^run 1 on .*, resuming from step \([0-9]*\)$/\1/p' "$SCRATCH/hung.log")
[ -n "$term" ] && [ "$term" -ge $((seen - 1)) ] || fail "resumed from step '${term}'; the run was at step $seen (more than 1 step lost)"
pass "running again after $took s (<= $RUNNING_BOUND_S s), first step after $first s (<= $STEP_BOUND_S s), from the terminal checkpoint of step $term (hung at ~$seen); n4 excluded, $(sinfo -h -n n4 -o '%T'), not DOWN; a node failure"

# The old run's stuck process: Slurm's kill woke it (SIGCONT, SIGTERM) and ended it; it changed nothing.
before=$(resolution)
# shellcheck disable=SC2086
kill -CONT $stuck 2>/dev/null || true
alive=""
for _ in $(seq 100); do
  alive=$(for p in $stuck; do kill -0 "$p" 2>/dev/null && echo "$p"; done || true)
  [ -z "$alive" ] && break
  sleep 0.1
done
[ -z "$alive" ] || fail "the stuck process of the old run still lives 10 s after the new run started: $alive"
for _ in $(seq 900); do
  state=$(scontrol show job "$job" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
  [ "$state" = COMPLETED ] || [ "$state" = FAILED ] || [ "$state" = CANCELLED ] && break
  [ "$(resolution)" = "$before" ] || fail "the checkpoint a restart would use changed while run 1 trained: '$before' -> '$(resolution)'"
  sleep 0.2
done
[ "$state" = COMPLETED ] || { tail -30 "$SCRATCH/hung.log" >&2; fail "the recovered job ended $state"; }
job=""
cmp -s "$SCRATCH/straight/final.tp0" "$SCRATCH/hung/final.tp0" && cmp -s "$SCRATCH/straight/final.tp1" "$SCRATCH/hung/final.tp1" ||
  fail "final weights differ after the hang"
"$CKPT_BUILD_DIR/cli/ckpt" verify "$SCRATCH/hung/ckpt" > "$SCRATCH/verify" 2>&1 || { cat "$SCRATCH/verify" >&2; fail "ckpt verify"; }
pass "the stuck process of run 0 is gone and changed nothing (a restart would use: $before); ckpt verify passes; final weights bitwise identical"
finish
