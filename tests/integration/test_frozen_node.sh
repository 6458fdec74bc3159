#!/usr/bin/env bash
# A node that hangs, on a cluster whose SlurmdTimeout (120 s) is far longer than a recovery may take.
# slurm-examples/train_dp_tp.py (DP2 x TP2 over gloo, bitwise resumable) runs as a requeueable batch job under the
# recovery controller, with last words on and no periodic checkpoint (interval 1000 steps).
#  1. Freeze: one node's slurmd, slurmstepd and rank are SIGSTOPped mid-run. Its kernel still accepts connections,
#     so only silence tells. The survivors commit a terminal checkpoint and end (their teardown would wait on the
#     frozen peer for ever: the library ends them after CKPT_EXIT_GRACE). The controller asks the silent node's
#     slurmd RPCs, finds it hung, marks it DOWN, requeues the job without it and records a node failure. The job
#     must run again within 20 s of the freeze and lose at most one step.
#     Then the node thaws while the new run trains: its stale rank of the old run wakes up in a checkpoint dir a
#     newer run owns. Nothing it does may change which checkpoint a restart would use, and the final weights must
#     equal an uninterrupted run's bit for bit.
#  2. Crash: the same with the node's processes killed (its slurmd refuses connections): same bounds.
#  3. Two nodes frozen at once (n3 and n4, a whole data-parallel replica, as a switch takes them) in a job that
#     accepts 2 to 4 nodes: both found hung, both DOWN, the job requeued on the two nodes left: same bounds.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/controller_lib.sh"
source "$(dirname "$0")/torch_lib.sh"
have_torch || fail "needs python3-torch and a built slurm_ckpt"
[ -x "$CKPT_BUILD_DIR/controller/ckpt-controller" ] || fail "ckpt-controller is not built"
STEPS=70
BOUND_S=20
tag=$RANDOM$RANDOM
PORT=$(( ${CKPT_CONTROLLER_TEST_PORT:-16840} + 40 ))
job=""
victims=()

cleanup() {
  [ -n "$job" ] && scancel "$job" 2>/dev/null || true
  for v in "${victims[@]}"; do "$CLUSTER" revive-node "$v" > /dev/null 2>&1 || true; done
  controller_down  # writes slurm.conf back with the default SlurmdTimeout
  scontrol reconfigure > /dev/null 2>&1 || true
}
trap cleanup EXIT

# The site opts in to marking hung nodes DOWN (off by default: see test_security_controller.sh slurmd-flood).
CKPT_CONTROLLER_CONF_EXTRA="down_hung_nodes = yes" CKPT_CLUSTER_SLURMD_TIMEOUT=120 controller_up "$SCRATCH" "$PORT" \
  > /dev/null || fail "no controller"
scontrol reconfigure
for _ in $(seq 50); do [ "$(slurmd_timeout)" = 120 ] && break; sleep 0.2; done
[ "$(slurmd_timeout)" = 120 ] || fail "SlurmdTimeout is $(slurmd_timeout), not 120"

same_weights() {
  cmp -s "$SCRATCH/straight/final.tp0" "$SCRATCH/$1/final.tp0" && cmp -s "$SCRATCH/straight/final.tp1" "$SCRATCH/$1/final.tp1"
}

# Slow is not hung: with every core of the host busy (8 spinning processes at nice 0 for the CPUs slurmd shares),
# slurmd still answers the controller's RPC within its timeout.
ask() { timeout 5 "$CKPT_BUILD_DIR/controller/ckpt-controller" --ask-slurmd "$1"; }
ask n2 > "$SCRATCH/ask.out" || fail "n2's slurmd did not answer an RPC: $(cat "$SCRATCH/ask.out")"
hogs=()
for _ in 1 2 3 4 5 6 7 8; do (end=$((SECONDS + 4)); while [ $SECONDS -lt $end ]; do :; done) & hogs+=($!); done
slowest=0
for _ in 1 2 3; do
  t0=$(now)
  ask n2 > "$SCRATCH/ask.out" || { kill "${hogs[@]}" 2>/dev/null; fail "n2's slurmd did not answer under load: $(cat "$SCRATCH/ask.out")"; }
  slowest=$(awk -v a="$t0" -v b="$(now)" -v s="$slowest" 'BEGIN { t = b - a; print (t > s ? t : s) }')
done
wait "${hogs[@]}" 2>/dev/null || true
awk -v s="$slowest" 'BEGIN { exit !(s < 1.0) }' || fail "under load n2's slurmd took $slowest s to answer (the controller waits 1 s)"
pass "slurmd of a loaded host answers the controller's RPC (slowest of 3: $(printf '%.3f' "$slowest") s, limit 1 s): $(cat "$SCRATCH/ask.out")"

# The reference: the same training, uninterrupted.
mkdir -p "$SCRATCH/straight"
MASTER_ADDR=$(rendezvous_addr) MASTER_PORT=$(free_port) \
  srun -N4 -n4 -J "fz-straight-$tag" --ckpt-interval=1000steps --ckpt-last-words=on --ckpt-dir="$SCRATCH/straight/ckpt" \
  "$PY" "$CKPT_SOURCE_DIR/slurm-examples/train_dp_tp.py" --steps $STEPS --out "$SCRATCH/straight/final" \
  > "$SCRATCH/straight.log" 2>&1 || { cat "$SCRATCH/straight.log" >&2; fail "the uninterrupted run failed"; }
pass "uninterrupted DP2xTP2 run on 4 nodes (SlurmdTimeout=120)"

# ends_bitwise NAME: waits for the recovered job to end; it must complete with the uninterrupted run's weights.
ends_bitwise() {
  local name=$1 state=""
  for _ in $(seq 900); do
    state=$(scontrol show job "$job" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    [ "$state" = COMPLETED ] || [ "$state" = FAILED ] || [ "$state" = CANCELLED ] && break
    sleep 0.2
  done
  [ "$state" = COMPLETED ] || { tail -30 "$SCRATCH/$name.log" >&2; fail "$name: the recovered job ended $state"; }
  job=""
  same_weights "$name" || fail "$name: final weights differ from the uninterrupted run's"
}

# one_failure NAME HOW [NODE...]: a 4-node job (sbatch $SPEC, -N3-4 -n4 unless set); the nodes (n4 unless named)
# fail by HOW (freeze-node or crash-node) at once, at a random step.
one_failure() {
  local name=$1 how=$2 at seen fail_t run1_t took term dir v min
  shift 2
  victims=("${@:-n4}")
  dir=$SCRATCH/$name
  mkdir -p "$dir"
  wait_nodes_idle 4  # -N3-4 takes 3 nodes while the fourth is still completing the last job
  write_train_sbatch "$SCRATCH/$name.sbatch" "${SPEC:--N3-4 -n4}" train_dp_tp.py --steps $STEPS --out "$dir/final"
  at=$((15 + RANDOM % 20))
  job=$(sbatch --parsable -J "fz-$name-$tag" -o "$SCRATCH/$name.log" --ckpt-interval=1000steps --ckpt-last-words=on \
    --ckpt-dir="$dir/ckpt" "$SCRATCH/$name.sbatch" --step-sleep 0.2)
  wait_logged_step "$SCRATCH/$name.log" "$at" || true  # the node check below says what went wrong
  [ "$(scontrol show hostnames "$(squeue -h -j "$job" -o %N)" | wc -l)" = 4 ] ||
    fail "$name: the first run is not on 4 nodes: $(squeue -h -j "$job" -o %N)"
  fail_t=$(now)
  for v in "${victims[@]}"; do "$CLUSTER" "$how" "$v" > /dev/null; done
  seen=$(logged_step "$SCRATCH/$name.log")
  for _ in $(seq 600); do grep -q "^run 1 " "$SCRATCH/$name.log" && break; sleep 0.05; done
  run1_t=$(now)
  grep -q "^run 1 " "$SCRATCH/$name.log" || { ctl history "$job" >&2; fail "$name: the job did not run again within 30 s"; }
  took=$(since "$fail_t" "$run1_t")
  term=$(sed -n 's/^run 1 on .*, resuming from step \([0-9]*\)$/\1/p' "$SCRATCH/$name.log")
  echo "$name of ${victims[*]} at step ~$seen: running again after $took s: $(grep '^run 1 ' "$SCRATCH/$name.log")"
  ctl history "$job" | grep -E "decision|recovery|action" | sed 's/^/  /' | sed -n 1,14p
  awk -v t="$took" -v b="$BOUND_S" 'BEGIN { exit !(t <= b) }' || fail "$name: running again took $took s (bound $BOUND_S s)"
  [ -n "$term" ] || fail "$name: the new run has no checkpoint to resume from"
  grep -q '"kind": *"terminal"' "$dir/ckpt/$(printf '%020d' "$term")/MANIFEST.json" 2>/dev/null ||
    grep -q '"kind": *"terminal"' "$dir/ckpt/$(cat "$dir/ckpt/latest")/MANIFEST.json" ||
    fail "$name: step $term is not the survivors' terminal checkpoint"
  [ "$term" -ge $((seen - 1)) ] || fail "$name: resumed from step $term; the run was at step $seen (more than 1 step lost)"
  ctl history "$job" | grep -q "node failure" || { ctl history "$job" >&2; fail "$name: the ending is not a node failure"; }
  for v in "${victims[@]}"; do
    scontrol show hostnames "$(grep '^run 1 ' "$SCRATCH/$name.log" | sed -n 's/^run 1 on \(.*\), resuming.*/\1/p')" |
      grep -qx "$v" && fail "$name: the new run went back to $v"
    ctl history "$job" | grep -q "excluding.*\b$v\b" || { ctl history "$job" >&2; fail "$name: $v was not excluded"; }
    sinfo -h -n "$v" -o '%T' | grep -qi down || fail "$name: $v is $(sinfo -h -n "$v" -o '%T'), not down"
  done
  pass "$name: running again after $took s (<= $BOUND_S s, SlurmdTimeout 120 s) from the terminal checkpoint of step $term (run at step ~$seen); ${victims[*]} excluded and down; recorded as a node failure"
}

# ---- 1. freeze ------------------------------------------------------------------------------------------------
one_failure frozen freeze-node
grep -q "ending it with exit status 75" "$SCRATCH/frozen.log" ||
  { cat "$SCRATCH/frozen.log" >&2; fail "no survivor was ended after its last words (its teardown waited on n4)"; }
ctl history "$job" | grep -q "n4 hung (port open, 0 of" || { ctl history "$job" >&2; fail "the controller did not find n4 hung"; }
ask n4 > "$SCRATCH/ask.out" && fail "frozen n4's slurmd answered an RPC: $(cat "$SCRATCH/ask.out")"
echo "frozen n4: its slurmd answers no RPC (ckpt-controller --ask-slurmd n4 waited 5 s)"
pass "survivors ended within CKPT_EXIT_GRACE of their last words; the controller found n4's slurmd hung by RPC"

# Thaw n4 while the new run trains: its stale rank of run 0 wakes up.
resolution() { "$CKPT_BUILD_DIR/cli/ckpt" latest "$SCRATCH/frozen/ckpt" 2>&1 | head -1; }
for _ in $(seq 600); do [ -n "$(logged_step "$SCRATCH/frozen.log")" ] && grep -q "resumed from step" "$SCRATCH/frozen.log" && break; sleep 0.05; done
before=$(resolution)
kill -CONT $(cat "$CKPT_CLUSTER_DIR/run/frozen-n4") 2>/dev/null || true
rm -f "$CKPT_CLUSTER_DIR/run/frozen-n4"
echo "thawed n4 while run 1 trains; a restart would use: $before"
for _ in $(seq 900); do
  state=$(scontrol show job "$job" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
  [ "$state" = COMPLETED ] || [ "$state" = FAILED ] || [ "$state" = CANCELLED ] && break
  [ "$(resolution)" = "$before" ] || fail "the checkpoint a restart would use changed while run 1 trained: '$before' -> '$(resolution)'"
  sleep 0.2
done
[ "$state" = COMPLETED ] || { tail -30 "$SCRATCH/frozen.log" >&2; fail "the recovered job ended $state"; }
after=$(resolution)
[ "$after" = "$before" ] || fail "the checkpoint a restart would use changed: '$before' -> '$after'"
job=""
same_weights frozen || fail "final weights differ after the freeze and thaw"
pass "n4 thawed during run 1: the checkpoint dir's resolution stayed '$before'; final weights bitwise identical"
"$CLUSTER" revive-node n4 > /dev/null
victims=()

# ---- 2. crash -------------------------------------------------------------------------------------------------
one_failure crashed crash-node
ends_bitwise crashed
pass "crash of n4: final weights bitwise identical"
"$CLUSTER" revive-node n4 > /dev/null
victims=()

# ---- 3. two nodes frozen at once ---------------------------------------------------------------------------------
SPEC="-N2-4 -n4" one_failure frozen2 freeze-node n3 n4
for v in n3 n4; do
  ctl history "$job" | grep -q "$v hung (port open, 0 of" || { ctl history "$job" >&2; fail "the controller did not find $v hung"; }
done
grep "^run 1 " "$SCRATCH/frozen2.log" | grep -q "on n\[1-2\]" || fail "run 1 is not on n1 and n2: $(grep '^run 1 ' "$SCRATCH/frozen2.log")"
ends_bitwise frozen2
pass "n3 and n4 frozen at once: both found hung, the job went on on n1 and n2; final weights bitwise identical"
finish
