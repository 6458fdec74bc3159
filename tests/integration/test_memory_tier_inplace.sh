#!/usr/bin/env bash
# Restart in place of a ZeRO-1 job from the memory tier, on the real local cluster: slurm-examples/train_ddp.py
# --zero1 (each rank alone holds AdamW's state of its partition) on 3 nodes with one spare node, under
# `ckpt-run --spares 1`, --ckpt-memory (a checkpoint in memory every step, its copy on the next node's rank), no
# periodic checkpoint. Four ranks a node: a training node crashes (SIGKILL) at a random step, and its 4 ranks die
# while their copies of the last memory step travel (some may have arrived, others not):
#  - the survivors write the terminal checkpoint, each dead rank's shard from the copy its partner holds (a step
#    whose copies all arrived: the holders keep the copy before the newest whole too);
#  - the spare node's 4 ranks take the dead ones over in place, each receiving its copy from the partner;
#  - every rank restores that step reading nothing from the checkpoint dir (each survivor from its live state or
#    its staging's snapshots, the replacement from the partner's copy, every range checked against the
#    checkpoint's checksums), at most one step is lost, and the final weights are bitwise identical to an uninterrupted run's.
#  A survivor whose crash caught it in ZeRO-1's parameter broadcast with a send in flight cannot go on in place
#  (gloo never fails that send): it must hand over at once, and the requeued job resume from the terminal
#  checkpoint, the dead rank's shard from its partner's copy, bitwise.
# Then, two ranks a node, a survivor that cannot unwind after the crash (tests/integration/stuck_train.py blocks it):
# the survivors give up in place, and ckpt-run relaunches the node steps inside the allocation (the spare node in
# the dead one's place), telling the controller first; every rank restores from the node tiers, nothing read,
# bitwise.
# ckpt-run's relaunch without --spares, on the controller's decision, is test_controller_*'s (scenario_relaunch:
# placement, the controller's view) and test_node_tier.sh's (the node tiers and the partner's copy at a relaunch).
# The uninterrupted runs go without the memory tier: a checkpoint in memory must not change training by a bit.
# The batch host (n1) is never the victim: its failure ends the batch script, and any Slurm job with it.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/controller_lib.sh"
source "$(dirname "$0")/torch_lib.sh"
have_torch || fail "needs python3-torch and a built slurm_ckpt"
[ -x "$CKPT_BUILD_DIR/ckpt-run/ckpt-run" ] || fail "ckpt-run is not built"
STEPS=30
PORT=$(( ${CKPT_CONTROLLER_TEST_PORT:-16840} + 60 ))
job="" victim=""
cleanup() {
  [ -n "$job" ] && scancel "$job" 2>/dev/null || true
  [ -n "$victim" ] && "$CLUSTER" revive-node "$victim" > /dev/null 2>&1 || true
  controller_down
}
trap cleanup EXIT
controller_up "$SCRATCH" "$PORT" > /dev/null || fail "no controller"

# jobs PER_NODE: $SCRATCH/PER_NODE.sbatch (the memory tier on) and PER_NODE-plain.sbatch (off), 3 nodes and a spare.
jobs() {
  inplace_job "$SCRATCH/$1.sbatch" "--ckpt-memory=256M --ckpt-interval=100000steps --ntasks-per-node=$1" \
    "--zero1 --extra-mib 8 --steps $STEPS --step-sleep 0.1 --log-every 1" "$1"
  inplace_job "$SCRATCH/$1-plain.sbatch" "--ckpt-interval=100000steps --ntasks-per-node=$1" \
    "--zero1 --extra-mib 8 --steps $STEPS --step-sleep 0.1 --log-every 1" "$1"
}
jobs 4
logged() { { sed -n 's/^train_ddp: step \([0-9]*\) .*/\1/p' "$1" 2>/dev/null || true; } | tail -1; }
# submit NAME SCRIPT: the job, into $SCRATCH/NAME; sets `job`.
submit() {
  mkdir -p "$SCRATCH/$1"
  job=$(sbatch --parsable -N 4 -J "memtier-inplace-$1" -o "$SCRATCH/$1/log" --ckpt-dir="$SCRATCH/$1/ckpt" \
    "$2" --out "$SCRATCH/$1/final")
}
wait_gone() {
  for _ in $(seq 900); do squeue -h -j "$job" 2>/dev/null | grep -q . || return 0; sleep 0.2; done
  fail "job $job did not end: $(tail -5 "$SCRATCH/$1/log")"
}
# crash_node_at_random_step NAME NODE: once run NAME logged a step from 12 to 19, NODE crashes; back in service
# once the job is over. Sets seen (the step logged before the crash) and crashed.
crash_node_at_random_step() {
  local at=$((12 + RANDOM % 8)) s
  for _ in $(seq 1500); do s=$(logged "$SCRATCH/$1/log"); [ -n "$s" ] && [ "$s" -ge "$at" ] && break; sleep 0.02; done
  seen=$(logged "$SCRATCH/$1/log")
  [ -n "$seen" ] && [ "$seen" -lt "$STEPS" ] || fail "training did not reach step $at: $(tail -3 "$SCRATCH/$1/log")"
  victim=$2 crashed=$2
  "$CLUSTER" crash-node "$victim" > /dev/null
  for _ in $(seq 900); do
    [ -s "$SCRATCH/$1/final.sha256" ] && break
    squeue -h -j "$job" 2>/dev/null | grep -q . || break
    sleep 0.2
  done
  "$CLUSTER" revive-node "$victim" > /dev/null
  victim=""
  wait_gone "$1"
}
# resumed_after_crash NAME REFERENCE DEAD...: run NAME resumed from step term >= seen - 1 (sets term), the terminal
# shard of each rank DEAD came from its partner's copy, and NAME's final weights are REFERENCE's, bitwise.
resumed_after_crash() {
  local log=$SCRATCH/$1/log d
  term=$(sed -n 's/^train_ddp: resumed from step \([0-9]*\).*/\1/p' "$log" | tail -1)
  [ -n "$term" ] && [ "$term" -ge $((seen - 1)) ] || { cat "$log" >&2; fail "crash at step $seen: resumed from step ${term:-?}"; }
  for d in "${@:3}"; do
    grep -q "last words: wrote rank $d's terminal shard of step $term from its partner copy" "$log" ||
      { grep "last words\|memory tier" "$log" >&2; fail "rank $d's terminal shard was not written from a partner copy"; }
  done
  cmp -s "$SCRATCH/$2/final" "$SCRATCH/$1/final" || fail "$1: the final weights differ from the uninterrupted run's"
}
# restore_bytes LOG RANK: read_b and live_b, the bytes RANK's restore read from the dir and found in memory.
restore_bytes() {
  local line
  line=$(grep "ckpt: rank $2: restored step [0-9]* from .* bytes read, .* found in memory)" "$1" | tail -1)
  restore_figures "$line"
  [ -n "$read_b" ] && [ -n "$live_b" ] || { grep "restored step\|ckpt:" "$1" >&2; fail "rank $2 logged no restore"; }
}

submit reference "$SCRATCH/4-plain.sbatch"
wait_gone reference
[ -s "$SCRATCH/reference/final" ] || { cat "$SCRATCH/reference/log" >&2; fail "the uninterrupted run failed"; }
grep -q "memory tier:" "$SCRATCH/reference/log" && fail "the uninterrupted run had the memory tier on"
pass "uninterrupted ZeRO-1 run without the memory tier: 3 nodes of 4 ranks train, n4 waits as the spare"

name=crash
submit $name "$SCRATCH/4.sbatch"
log=$SCRATCH/$name/log
crash_node_at_random_step $name n$((2 + RANDOM % 2))
assert_contains "$log" "memory tier: a checkpoint in memory every 1 step(s)"
if grep -q "training is stuck in a collective of generation 0" "$log"; then
  # A survivor caught in ZeRO-1's parameter broadcast with a send in flight: gloo never fails that send, so the
  # survivor cannot go on in place. It hands over at once, and ckpt-run relaunches the node steps inside the
  # allocation (the stuck case below checks the relaunch's restore in full).
  read -r -a dead <<< "$(sed -n "s/.*last words: wrote rank \([0-9]*\)'s terminal shard of step .* from its partner copy.*/\1/p" "$log" | sort -n | tr '\n' ' ')"
  assert_contains "$log" "ckpt-run: relaunch 1: the node steps started at"
  grep -q "^run 1 on" "$log" && { cat "$log" >&2; fail "a survivor was stuck, and the job was requeued"; }
  [ "${#dead[@]}" = 4 ] || { cat "$log" >&2; fail "not 4 shards from partner copies: ranks ${dead[*]}"; }
  resumed_after_crash $name reference "${dead[@]}"
  pass "crash of $crashed at step $seen caught a survivor in gloo's parameter broadcast: it handed over at once; relaunched inside the allocation from step $term (ranks ${dead[*]}'s shards from their partners' copies); bitwise identical"
else
  read -r -a dead <<< "$(sed -n "s/.*in-place recovery 1: ranks \[\([0-9, ]*\)\] lost; spares \[.*\] take them over.*/\1/p" "$log" | head -1 | tr -d ',')"
  [ "${#dead[@]}" = 4 ] || { cat "$log" >&2; fail "no in-place recovery of $crashed's 4 ranks: ${dead[*]}"; }
  resumed_after_crash $name reference "${dead[@]}"
  for r in $(seq 0 11); do
    restore_bytes "$log" $r
    echo "  rank $r$([[ " ${dead[*]} " == *" $r "* ]] && echo " (a replacement)"): $read_b bytes read, $live_b found in memory"
    [ "$live_b" -gt 8000000 ] && [ "$read_b" -eq 0 ] ||
      { grep "restored step\|ckpt:" "$log" >&2; fail "rank $r read its state from the checkpoint dir"; }
  done
  pass "crash of $crashed at step $seen: ranks ${dead[*]}'s shards from their partners' copies, in place from step $term; every rank's state from memory, nothing read; bitwise identical"
fi

# ---- a survivor that cannot unwind: ckpt-run relaunches the node steps inside the allocation ----
# Two ranks a node, as GPU nodes run them: n1 holds ranks 0 and 1, n2 ranks 2 and 3, n3 ranks 4 and 5, n4 two
# spares. stuck_train.py blocks a survivor after the peer loss, as gloo leaves one caught in a send it never fails:
# rank 0 (the recovery's root, which then writes no plan), rank 1 (beside the root, which plans the spares in and
# waits for it to join) or rank 2 (on another node), at random; n3 crashes. The stuck rank says so within 5 s of the
# last words and hands over, naming ranks 4 and 5 lost. Its node step's status says nothing of that (srun ends the
# step's other rank once one exits 75, or the other rank waits for it to join): ckpt-run acts on the survivors'
# marker and relaunches the node steps inside the allocation, not a requeue: ranks 0 to 3 on n1 and n2 again, each
# from its node tier, ranks 4 and 5 on n4, which fetch their snapshots back from the copies their partners'
# processes left. Nothing is read from the checkpoint dir, and the final weights are the uninterrupted run's, bitwise.
jobs 2
sed "s|slurm-examples/train_ddp.py|tests/integration/stuck_train.py|" "$SCRATCH/2.sbatch" > "$SCRATCH/stuck.sbatch"
submit reference-two "$SCRATCH/2-plain.sbatch"
wait_gone reference-two
[ -s "$SCRATCH/reference-two/final" ] || { cat "$SCRATCH/reference-two/log" >&2; fail "the uninterrupted run of 2 ranks a node failed"; }
name=stuck
stuck=${CKPT_TEST_STUCK_RANK:-$((RANDOM % 3))}
STUCK_RANK=$stuck submit $name "$SCRATCH/stuck.sbatch"
log=$SCRATCH/$name/log
crash_node_at_random_step $name n3
assert_contains "$log" "stuck_train: rank $stuck blocks after the peer loss"
assert_contains "$log" "rank $stuck: training is stuck in a collective of generation 0"
grep -q "ckpt-run: relaunch 1: the node steps started at .* on n1,n2,n4 without n3" "$log" ||
  { grep "ckpt-run\|srun" "$log" >&2; fail "the relaunch did not keep ranks 0 to 3 on n1 and n2 and put ranks 4 and 5 on n4"; }
grep -q "^run 1 on" "$log" && { cat "$log" >&2; fail "the stuck survivor's job was requeued, not relaunched"; }
# The controller heard of the relaunch before the steps ended: the ended steps' tasks were no new failure to it.
grep -q "job $job: .* -> relaunching: ckpt-run relaunches its node steps inside the allocation" "$SCRATCH/controller.log" &&
  grep -q "job $job: relaunching -> running: ckpt-run relaunched the step as step" "$SCRATCH/controller.log" ||
  { grep "job $job" "$SCRATCH/controller.log" >&2; fail "the controller did not follow the relaunch"; }
resumed_after_crash $name reference-two 4 5
for r in 4 5; do
  grep -q "ckpt: rank $r: memory tier: this node holds no snapshot of this rank; fetched step [0-9]* of launch .* from the copy rank [0-9]*'s node kept" "$log" ||
    { grep "memory tier\|node tier\|ckpt: rank $r" "$log" >&2; fail "rank $r, on n4, did not fetch its snapshot from its partner's node"; }
done
for r in 0 1 2 3 4 5; do
  restore_bytes "$log" $r
  echo "  rank $r: $read_b bytes read, $live_b found in memory"
  [ "$read_b" -eq 0 ] && [ "$live_b" -gt 8388608 ] ||
    { grep "restored step\|node tier\|ckpt: rank $r" "$log" >&2; fail "rank $r read its state from the checkpoint dir"; }
done
pass "2 ranks a node, rank $stuck stuck after $crashed crashed at step $seen: relaunched inside the allocation (no requeue) from step $term; ranks 0 to 3 from their node tiers, ranks 4 and 5 on n4 from their partners' copies (nothing read by any rank); bitwise identical"
