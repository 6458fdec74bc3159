#!/usr/bin/env bash
# Restart in place on the real local cluster: slurm-examples/train_ddp.py on 3 nodes with one spare node, under
# `ckpt-run --spares 1` (one step per node, --no-kill) and the recovery controller.
#  1. A training node crashes (SIGKILL): the survivors write a terminal checkpoint, the spare takes the dead rank
#     over, and training goes on in the same processes, with no requeue and no relaunch: at most one step lost,
#     final weights bitwise identical to an uninterrupted run, and the controller records the recovery with the
#     path "in-place" and its phases. Every rank takes its state from memory, checked against the checkpoint's
#     checksums (a survivor its own, the replacement what a survivor sent it): only small blobs are read.
#  2. A training node freezes (SIGSTOP: only missed heartbeats tell): the same. And a rank hangs while its node is
#     fine (cluster.sh hang-tasks: only its task stopped, slurmd answers): the same; woken afterwards, the stale
#     process leaves and changes nothing.
#  3. No spare left (a 3-node allocation): the survivors exit 75, ckpt-run hands the job over, the controller
#     requeues it off the dead node, and it resumes from the terminal checkpoint, still bitwise identical.
#  4. No spare left, --ckpt-shrink=on: the survivors go on in place as 2 data-parallel replicas and finish.
# The batch host (n1) is never the victim: its failure ends the batch script, and any Slurm job with it.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/controller_lib.sh"
source "$(dirname "$0")/torch_lib.sh"
have_torch || fail "needs python3-torch and a built slurm_ckpt"
[ -x "$CKPT_BUILD_DIR/ckpt-run/ckpt-run" ] || fail "ckpt-run is not built"
STEPS=50
PORT=$(( ${CKPT_CONTROLLER_TEST_PORT:-16840} + 50 ))
job="" victim=""
cleanup() {
  [ -n "$job" ] && scancel "$job" 2>/dev/null || true
  [ -n "$victim" ] && "$CLUSTER" revive-node "$victim" > /dev/null 2>&1 || true
  controller_down
}
trap cleanup EXIT
controller_up "$SCRATCH" "$PORT" > /dev/null || fail "no controller"

inplace_job "$SCRATCH/job.sbatch" "" "--steps $STEPS --ckpt-interval-steps 10 --step-sleep 0.1 --log-every 1"
logged() { { sed -n 's/^train_ddp: step \([0-9]*\) .*/\1/p' "$1" 2>/dev/null || true; } | tail -1; }
# state_from_memory LOG STEP: at the restore of STEP in place, each survivor found its weights and optimizer state
# in its own memory and the replacement in what a survivor sent it, each checked against the checkpoint's
# checksums: only the small blobs were read from the checkpoint dir. A survivor that the last words found a step
# behind (disqualified: "at step STEP-1, not the agreed step STEP") took STEP from a survivor that holds it.
state_from_memory() {
  local r line read_b live_b
  for r in 0 1 2; do
    line=$(grep "ckpt: rank $r: restored step $2 from .* bytes read, .* found in memory)" "$1" | tail -1)
    restore_figures "$line"
    echo "rank $r: step $2: ${read_b:-?} bytes read, ${live_b:-?} found in memory" >&2
    grep -q "replica dp$r of stage pp0 disqualified: at step $(($2 - 1)), not the agreed step $2" "$1" &&
      echo "  rank $r was a step behind: a survivor at step $2 sent it the state" >&2
    [ -n "$read_b" ] && [ -n "$live_b" ] && [ "$live_b" -gt 100000 ] && [ "$read_b" -lt 65536 ] || return 1
  done
}
# submit NAME NODES [SBATCH OPTION...]: the job, into $SCRATCH/NAME; sets `job`.
submit() {
  mkdir -p "$SCRATCH/$1"
  job=$(sbatch --parsable -N "$2" -J "inplace-$1" -o "$SCRATCH/$1/log" --ckpt-dir="$SCRATCH/$1/ckpt" "${@:3}" \
    "$SCRATCH/job.sbatch" --out "$SCRATCH/$1/final")
}
wait_gone() {
  for _ in $(seq 900); do squeue -h -j "$job" 2>/dev/null | grep -q . || return 0; sleep 0.2; done
  fail "job $job did not end: $(tail -5 "$SCRATCH/$1/log")"
}
wait_weights() {
  for _ in $(seq 900); do
    [ -s "$SCRATCH/$1/final.sha256" ] && return 0
    squeue -h -j "$job" 2>/dev/null | grep -q . || break
    sleep 0.2
  done
  cat "$SCRATCH/$1/log" >&2
  fail "$1: no final weights"
}
# fail_node NAME MODE NODE: waits for a step between 15 and 30, then crashes, freezes or hangs NODE; sets `seen`.
fail_node() {
  local at=$((15 + RANDOM % 15))
  for _ in $(seq 1500); do
    s=$(logged "$SCRATCH/$1/log"); [ -n "$s" ] && [ "$s" -ge "$at" ] && break
    sleep 0.02
  done
  seen=$(logged "$SCRATCH/$1/log")
  [ -n "$seen" ] && [ "$seen" -lt "$STEPS" ] || fail "$1: training did not reach step $at: $(tail -3 "$SCRATCH/$1/log")"
  victim=$3
  case $2 in
    hang) "$CLUSTER" hang-tasks "$3" > /dev/null ;;
    *) "$CLUSTER" "$2-node" "$3" > /dev/null ;;
  esac
}
same_weights() { cmp -s "$SCRATCH/reference/final" "$SCRATCH/$1/final"; }
# recorded_in_place NAME: the controller's history of the job says the recovery was made in place.
recorded_in_place() {
  for _ in $(seq 50); do ctl history "$job" 2>/dev/null | grep -q "(in-place)" && break; sleep 0.2; done
  ctl history "$job" > "$SCRATCH/$1/history" 2>&1 || true
  assert_contains "$SCRATCH/$1/history" "(in-place)"
}

submit reference 4
wait_gone reference
[ -s "$SCRATCH/reference/final" ] || { cat "$SCRATCH/reference/log" >&2; fail "the uninterrupted run failed"; }
assert_contains "$SCRATCH/reference/log" "ckpt-run: 3 nodes train, spares n4"
pass "uninterrupted run: 3 nodes train, n4 waits as the spare"

for mode in crash freeze hang; do
  name=$mode
  node=n$((2 + RANDOM % 2))
  submit "$name" 4
  fail_node "$name" "$mode" "$node"
  wait_weights "$name"
  "$CLUSTER" revive-node "$victim" > /dev/null
  victim=""
  wait_gone "$name"
  log=$SCRATCH/$name/log
  grep -q "in-place recovery 1: ranks \[.*\] lost; spares \['n4.0'\] take them over" "$log" ||
    { cat "$log" >&2; fail "$mode of $node: no in-place recovery"; }
  assert_not_contains "$log" "run 1 on"
  resumed=$(sed -n 's/^train_ddp: resumed from step \([0-9]*\).*/\1/p' "$log" | tail -1)
  [ -n "$resumed" ] && [ "$resumed" -ge $((seen - 1)) ] ||
    fail "$mode of $node at step $seen: resumed from step ${resumed:-?} (more than one step lost)"
  same_weights "$name" || fail "$mode of $node: the final weights differ from the uninterrupted run's"
  state_from_memory "$log" "$resumed" || fail "$mode of $node: the state was read from the checkpoint dir"
  took=$(sed -n 's/.*ckpt-run: in-place recovery 1: .* training ran again \([0-9.]*\) s after.*/\1/p' "$log")
  [ -n "$took" ] || { cat "$log" >&2; fail "$mode: ckpt-run did not see the recovery complete"; }
  recorded_in_place "$name"
  pass "$mode of $node at step $seen: recovered in place from step $resumed, running again $took s after detection; bitwise identical; the controller recorded it"
done

# No spare: the requeue path.
submit nospare 3
assert_contains_soon() { for _ in $(seq 300); do grep -qF -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done; assert_contains "$1" "$2"; }
assert_contains_soon "$SCRATCH/nospare/log" "ckpt-run: 3 nodes train, no spare"
fail_node nospare crash n3
for _ in $(seq 900); do grep -q "^run 1 on" "$SCRATCH/nospare/log" 2>/dev/null && break; sleep 0.2; done
assert_contains "$SCRATCH/nospare/log" "cannot recover in place (1 ranks lost, 0 spares ready)"
assert_contains "$SCRATCH/nospare/log" "run 1 on"
wait_weights nospare
"$CLUSTER" revive-node "$victim" > /dev/null
victim=""
wait_gone nospare
same_weights nospare || fail "no spare: the final weights differ from the uninterrupted run's"
pass "no spare: crash of n3 at step $seen handed over to a requeue; the job resumed off n3 and ended bitwise identical"

# No spare, --ckpt-shrink=on: the survivors go on in place as 2 data-parallel replicas (pure data parallelism);
# no requeue, no relaunch. The arithmetic changes (the global batch), so the weights are not compared.
RUN_SPARES="" submit shrink 3 --ckpt-shrink=on  # (ckpt-run without --spares: the option alone restarts in place)
assert_contains_soon "$SCRATCH/shrink/log" "ckpt-run: 3 nodes train, no spare"
fail_node shrink crash n3
wait_weights shrink
"$CLUSTER" revive-node "$victim" > /dev/null
victim=""
wait_gone shrink
log=$SCRATCH/shrink/log
grep -q "in-place recovery 1: ranks \[2\] lost; no spare left: 2 of 3 data-parallel replicas go on" "$log" ||
  { cat "$log" >&2; fail "shrink: no recovery in place with 2 replicas"; }
assert_not_contains "$log" "run 1 on"
assert_not_contains "$log" "handing over to ckpt-run"
assert_not_contains "$log" "ckpt-run: relaunch"
resumed=$(sed -n 's/^train_ddp: resumed from step \([0-9]*\) (2 ranks,.*/\1/p' "$log" | tail -1)
[ -n "$resumed" ] && [ "$resumed" -ge $((seen - 1)) ] ||
  fail "shrink: crash at step $seen, resumed on 2 ranks from step ${resumed:-?} (more than one step lost)"
assert_contains "$log" "train_ddp: done after step $STEPS"
took=$(sed -n 's/.*ckpt-run: in-place recovery 1: ranks 2 dropped, 2 of 3 ranks go on (failed nodes: n3); training ran again \([0-9.]*\) s after.*/\1/p' "$log")
[ -n "$took" ] || { cat "$log" >&2; fail "shrink: ckpt-run did not see the recovery complete"; }
recorded_in_place shrink
pass "no spare, --ckpt-shrink=on: crash of n3 at step $seen; 2 replicas went on in place from step $resumed, $took s after detection, and finished; no requeue"
finish
