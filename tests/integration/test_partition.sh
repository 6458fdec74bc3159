#!/usr/bin/env bash
# A symmetric partition of a pure data-parallel job: DP=4 (slurm-examples/train_dp_tp.py --tp 1) on n1..n4 with last
# words on and no periodic checkpoint; mid-run n3 and n4 are cut to a side of their own (cluster.sh partition-node
# nX 1): they reach each other and nothing else, and every process lives on. Each side sees the other die, and each
# holds a whole replica, so each side's decider wants to write a terminal checkpoint into the same shared dir.
#  - Exactly one side writes: the first decider to claim the run's terminal checkpoint (.control/last-words-*.claim)
#    writes, the other logs that it is claimed already and writes nothing; both sides' ranks leave. Split in halves,
#    the side without the lowest ranks hears from no decider in time (its new root is across the cut) and writes
#    nothing; split {n1} | {n2,n3,n4}, both sides decide to write and the claim must stop one.
#  - The checkpoint left is complete and verified (`ckpt verify`), at most one step behind the cut, and holds only
#    the winning side's shards; a new run resumes from it and ends bitwise equal to an uninterrupted run.
#  - The {n1} | {n2,n3,n4} split runs with the memory tier on (--ckpt-memory): a partner copy in flight across the cut
#    holds no decision up.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/torch_lib.sh"
have_torch || fail "needs python3-torch and a built slurm_ckpt"
[ "$("$CLUSTER" addr)" != 127.0.0.1 ] || fail "needs the namespace cluster (its nodes share one host here)"
STEPS=60
tag=$RANDOM$RANDOM
run_pid=""
cleanup() {
  [ -n "$run_pid" ] && kill "$run_pid" 2>/dev/null || true
  scancel -n "part-$tag" 2>/dev/null || true
  for n in n3 n4; do "$CLUSTER" heal-node "$n" > /dev/null 2>&1 || true; done
  for n in n3 n4; do "$CLUSTER" revive-node "$n" > /dev/null 2>&1 || true; done
}
trap cleanup EXIT
train() {  # NAME [srun options...]: DP=4 on the four hosts, one output file per task on the shared file system
  local name=$1
  shift
  mkdir -p "$SCRATCH/$name"
  MASTER_ADDR=$(rendezvous_addr) MASTER_PORT=$(free_port) srun -N4 -n4 -J "part-$tag" --ckpt-interval=1000steps \
    --ckpt-last-words=on ${MEMORY:+--ckpt-memory=$MEMORY} --ckpt-dir="$SCRATCH/$name/ckpt" -o "$SCRATCH/$name/out-%t" "$@" \
    "$PY" "$CKPT_SOURCE_DIR/slurm-examples/train_dp_tp.py" --tp 1 --steps $STEPS --out "$SCRATCH/$name/final" \
    --step-sleep 0.2
}
same_weights() { cmp -s "$SCRATCH/straight/final.tp0" "$SCRATCH/$1/final.tp0"; }

train straight || { cat "$SCRATCH"/straight/out-* >&2; fail "the uninterrupted run failed"; }
pass "uninterrupted DP=4 run on 4 hosts"

# split NAME SIDE_NODES...: a DP=4 run whose SIDE_NODES are cut to a side of their own mid-run; exactly one side
# commits a terminal checkpoint, and a new run resumes from it bitwise. MUST_CLAIM=yes: both sides decide (each sees
# every rank of the other die), so the other side must find the claim taken.
split() {
  local name=$1 n committers claim winner loser term steps
  shift
  train "$name" > "$SCRATCH/$name.srun" 2>&1 &
  run_pid=$!
  at=$((12 + RANDOM % 15))
  wait_logged_step "$SCRATCH/$name/out-0" "$at" || { cat "$SCRATCH/$name"/out-* >&2; fail "$name: the run did not reach step $at"; }
  for n in "$@"; do "$CLUSTER" partition-node "$n" 1 2> /dev/null; done
  seen=$(logged_step "$SCRATCH/$name/out-0")
  echo "$name: cut $* to a side of their own at step ~$seen"
  # Every rank of both sides leaves on its own (the exit grace): the winners after their commit, the others after
  # finding the claim taken or no decision in time.
  for _ in $(seq 300); do
    [ "$(grep -l "ending it with exit status 75" "$SCRATCH/$name"/out-* | wc -l)" -ge 4 ] && break
    sleep 0.1
  done
  grep -h "last words: \(writing\|committed\|the terminal\|no decision\)" "$SCRATCH/$name"/out-* | sed 's/^/  /'
  if [ -n "${MEMORY:-}" ]; then
    [ "$(grep -l "memory tier: a checkpoint in memory every 1 step(s)" "$SCRATCH/$name"/out-* | wc -l)" -ge 1 ] ||
      { tail -n 8 "$SCRATCH/$name"/out-* >&2; fail "$name: the memory tier did not start"; }
  fi
  committers=$(grep -l "last words: committed the terminal checkpoint" "$SCRATCH/$name"/out-* || true)
  [ "$(echo "$committers" | grep -c .)" = 1 ] ||
    { tail -n 8 "$SCRATCH/$name"/out-* >&2; fail "$name: not exactly one side committed a terminal checkpoint"; }
  claim=$(ls "$SCRATCH/$name"/ckpt/.control/last-words-*.claim 2>/dev/null | head -1 || true)
  [ -n "$claim" ] || fail "$name: the side that wrote holds no claim"
  winner=$(sed -n 's/.*"rank":\([0-9]*\).*/\1/p' "$claim")
  [ "${committers##*-}" = "$winner" ] || fail "$name: rank ${committers##*-} committed, but rank $winner holds the claim"
  loser=$(grep -l "claimed already" "$SCRATCH/$name"/out-* || true)
  if [ "${MUST_CLAIM:-}" = yes ]; then
    [ "$(echo "$loser" | grep -c .)" = 1 ] || { tail -n 8 "$SCRATCH/$name"/out-* >&2; fail "$name: the other side did not find the claim taken"; }
    pass "$name: both sides decided to write; rank $winner claimed the run's terminal checkpoint and wrote it, rank ${loser##*-} found it claimed and wrote nothing"
  else
    pass "$name: rank $winner's side claimed and wrote the terminal checkpoint; the other side wrote nothing ($(grep -l "claimed already" "$SCRATCH/$name"/out-* > /dev/null && echo "it found the claim taken" || echo "no decision reached it"))"
  fi

  for n in "$@"; do "$CLUSTER" heal-node "$n" 2> /dev/null; done
  for _ in $(seq 600); do kill -0 "$run_pid" 2>/dev/null || break; sleep 0.1; done
  kill "$run_pid" 2>/dev/null || true
  wait "$run_pid" 2>/dev/null || true
  run_pid=""
  for n in "$@"; do "$CLUSTER" revive-node "$n" > /dev/null 2>&1 || fail "revive-node $n"; done

  "$CKPT_BUILD_DIR/cli/ckpt" verify "$SCRATCH/$name/ckpt" > "$SCRATCH/verify" 2>&1 || { cat "$SCRATCH/verify" >&2; fail "$name: ckpt verify failed"; }
  term=$(latest_step "$SCRATCH/$name/ckpt")
  grep -q '"kind": *"terminal"' "$SCRATCH/$name/ckpt/$(cat "$SCRATCH/$name/ckpt/latest")/MANIFEST.json" ||
    fail "$name: step $term is not a terminal checkpoint"
  [ "$term" -ge $((seen - 1)) ] || fail "$name: the terminal checkpoint is of step $term; the run was at step $seen"
  steps=$(find "$SCRATCH/$name/ckpt" -mindepth 1 -maxdepth 1 -name '0*' | wc -l)
  [ "$steps" = 1 ] || { ls -la "$SCRATCH/$name/ckpt" >&2; fail "$name: $steps step dirs left; one terminal checkpoint expected"; }
  train "$name" > "$SCRATCH/$name.resume" 2>&1 || { tail -n 20 "$SCRATCH/$name"/out-* >&2; fail "$name: the resumed run failed"; }
  grep -q "resumed from step $term" "$SCRATCH/$name/out-0" || fail "$name: the new run did not resume from step $term"
  same_weights "$name" || fail "$name: final weights differ after the partition"
  pass "$name: the one checkpoint left (step $term, cut at ~$seen) is terminal and verified; a new run resumed from it, bitwise equal to the uninterrupted run"
}

split halves n3 n4          # {n1,n2} | {n3,n4}
# With the memory tier on: partner copies cross the cut too, and their links hang there as the heartbeats' do.
MUST_CLAIM=yes MEMORY=256M split alone n1   # {n1} | {n2,n3,n4}: n1's rank 0 holds a whole replica too
finish
