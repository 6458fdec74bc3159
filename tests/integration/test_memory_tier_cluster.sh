#!/usr/bin/env bash
# The memory tier on the real local cluster: slurm-examples/train_ddp.py --zero1 (torch's ZeroRedundancyOptimizer:
# each rank alone holds AdamW's state of its partition of the parameters) on 3 nodes, one rank each, last words on,
# no periodic checkpoint (interval 100000 steps). A node crashes (SIGKILL) at a random step.
#  1. Without the memory tier the dead rank's optimizer shard exists nowhere else: the survivors write nothing
#     (what every ZeRO-1 job lost before: everything since the last periodic checkpoint).
#  2. With --ckpt-memory (a memory checkpoint every step, its copy on the next node's rank): the survivors write
#     the terminal checkpoint of the last memory step, the dead rank's shard from its partner's copy, at most one
#     step behind; the rerun resumes from it and ends bitwise identical to an uninterrupted run.
#  3. A flipped bit in the copy a partner holds (as failing DRAM makes one): a periodic checkpoint every 10 steps,
#     whose copy goes to the partner too. Once step 20 is committed, the ward's tasks are stopped, one bit of the
#     copy its holder keeps is flipped in the holder's memory (/proc/PID/mem), and the ward's node crashes. The
#     holder finds the copy no longer matches its checksums and does not use it; the dead rank's shard is then
#     nowhere else in memory, and the rerun resumes every rank from the checkpoint of step 20 in the dir.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/torch_lib.sh"
have_torch || fail "needs python3-torch and a built slurm_ckpt"
STEPS=40
tag=$RANDOM$RANDOM
crashed=""
cleanup() { [ -n "$crashed" ] && "$CLUSTER" revive-node "$crashed" > /dev/null 2>&1 || true; }
trap cleanup EXIT

# train NAME [srun options...] -- [train_ddp args...]: one 3-node ZeRO-1 job writing into $SCRATCH/NAME.
train() {
  local name=$1 opts=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  mkdir -p "$SCRATCH/$name"
  MASTER_ADDR=$(rendezvous_addr) MASTER_PORT=$(free_port) \
    srun -N3 -n3 -w 'n[1-3]' -J "memtier-$name-$tag" --ckpt-interval="${INTERVAL:-100000steps}" --ckpt-last-words=on \
    --ckpt-dir="$SCRATCH/$name/ckpt" "${opts[@]}" \
    "$PY" "$CKPT_SOURCE_DIR/slurm-examples/train_ddp.py" --zero1 --steps $STEPS --out "$SCRATCH/$name/final.bin" "$@"
}

# crash NAME [srun options...]: `train` with a pause per step, one node crashed at a random step from 10 on; sets
# `seen` (the step logged before the crash) and `victim`.
crash() {
  local name=$1 at=$((10 + RANDOM % 15)) pid
  shift
  victim=n$((1 + RANDOM % 3))
  # Every step logged: with a line every 20 steps, a draw past 20 waited for step 40, the last, and crashed a
  # node of a job that had finished training.
  # --log-stall: each rank's counters each step (the Python stats() of the memory tier).
  train "$name" "$@" -- --step-sleep 0.2 --log-every 1 --log-stall > "$SCRATCH/$name.log" 2>&1 &
  pid=$!
  wait_logged_step "$SCRATCH/$name.log" "$at" || { cat "$SCRATCH/$name.log" >&2; fail "$name: no step $at"; }
  seen=$(logged_step "$SCRATCH/$name.log")
  "$CLUSTER" crash-node "$victim" > /dev/null
  crashed=$victim
  for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  "$CLUSTER" revive-node "$victim" > /dev/null
  crashed=""
  # When rank 0's node crashed, the survivors may have gone one step further than the log shows.
  local after
  after=$(logged_step "$SCRATCH/$name.log")
  [ -n "$after" ] && [ "$after" -gt "$seen" ] && seen=$after
  return 0
}

train straight -- > "$SCRATCH/straight.log" 2>&1 || { cat "$SCRATCH/straight.log" >&2; fail "the uninterrupted run failed"; }
[ -s "$SCRATCH/straight/final.bin" ] || fail "the uninterrupted run wrote no weights"
pass "uninterrupted ZeRO-1 run on 3 nodes: $(cat "$SCRATCH/straight/final.bin.sha256")"

# ---- 1. without the memory tier: nothing to write ----
crash plain
[ -f "$SCRATCH/plain/ckpt/latest" ] && { grep "last words" "$SCRATCH/plain.log" >&2; fail "plain: a checkpoint of step $(latest_step "$SCRATCH/plain/ckpt") without the memory tier"; }
grep -q "last words: not writing" "$SCRATCH/plain.log" || { cat "$SCRATCH/plain.log" >&2; fail "plain: no decision not to write"; }
grep -q " stall [0-9.]* memory checkpoints 0 partner copies 0$" "$SCRATCH/plain.log" ||
  fail "plain: no rank logged its memory tier's counters"
grep " stall [0-9.]* memory checkpoints" "$SCRATCH/plain.log" | grep -v "memory checkpoints 0 partner copies 0$" &&
  fail "plain: a memory checkpoint counted without the memory tier"
pass "without the memory tier, the crash of $victim at step ~$seen leaves no checkpoint (its optimizer shard is nowhere else)"

# ---- 2. with the memory tier: the dead rank's shard from its partner's copy ----
crash tier --ckpt-memory=256M
grep -q "memory tier: a checkpoint in memory every 1 step(s)" "$SCRATCH/tier.log" ||
  { cat "$SCRATCH/tier.log" >&2; fail "tier: the memory tier did not start"; }
for r in 0 1 2; do  # every rank counts its memory checkpoints and the copies its partner kept, step by step
  grep -q "^train_ddp: rank $r step 9 stall [0-9.]* memory checkpoints 9 partner copies [1-9]$" "$SCRATCH/tier.log" ||
    { grep " stall " "$SCRATCH/tier.log" >&2; fail "tier: rank $r's stats() did not count 9 memory checkpoints and their copies by step 9"; }
done
[ -f "$SCRATCH/tier/ckpt/latest" ] || { cat "$SCRATCH/tier.log" >&2; fail "tier: no terminal checkpoint after the crash of $victim"; }
term=$(latest_step "$SCRATCH/tier/ckpt")
grep -q '"kind": *"terminal"' "$SCRATCH/tier/ckpt/$(cat "$SCRATCH/tier/ckpt/latest")/MANIFEST.json" ||
  fail "tier: the checkpoint of step $term is not terminal"
[ "$term" -ge $((seen - 1)) ] || { grep "last words\|memory tier" "$SCRATCH/tier.log" >&2; fail "tier: terminal checkpoint at step $term; the run was at step $seen"; }
dead=$(( ${victim#n} - 1 ))
grep -q "last words: wrote rank $dead's terminal shard of step $term from its partner copy" "$SCRATCH/tier.log" ||
  { grep "last words\|memory tier" "$SCRATCH/tier.log" >&2; fail "tier: rank $dead's shard was not written from a partner copy"; }
grep "last words:\|memory tier" "$SCRATCH/tier.log" | sed 's/^/  /' | sed -n 1,16p
pass "with --ckpt-memory, the crash of $victim at step ~$seen: terminal checkpoint of step $term, rank $dead's shard from its partner's copy"

train tier -- > "$SCRATCH/tier-again.log" 2>&1 || { cat "$SCRATCH/tier-again.log" >&2; fail "tier: the rerun failed"; }
grep -q "resumed from step $term " "$SCRATCH/tier-again.log" || { cat "$SCRATCH/tier-again.log" >&2; fail "tier: the rerun did not resume from step $term"; }
# Every rank lives to the end: each snapshot found its wards' copies of the one before, none waited out the limit.
assert_not_contains "$SCRATCH/tier-again.log" "goes on without rank(s)"
cmp -s "$SCRATCH/straight/final.bin" "$SCRATCH/tier/final.bin" || fail "tier: final weights differ after resuming from step $term"
pass "resumed from the terminal checkpoint of step $term (steps lost: $((seen > term ? seen - term : 0))); final weights bitwise identical"

# ---- 3. a flipped bit in a held copy: found before use, the dir's checkpoint used instead ----
d=$((1 + RANDOM % 2))  # rank 1 or 2: their shards hold their optimizer partitions alone (rank 0's holds the weights)
victim=n$((d + 1))
holder=n$(((d + 1) % 3 + 1))  # the rank one node on keeps the copy
INTERVAL=10steps CKPT_HEARTBEAT_TIMEOUT=30s train flip --ckpt-memory=256M --ckpt-memory-interval=1000 -- \
  --step-sleep 0.2 --log-every 1 > "$SCRATCH/flip.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  [ "$(latest_step "$SCRATCH/flip/ckpt")" -ge 20 ] && [ "$(logged_step "$SCRATCH/flip.log")" -ge 22 ] && break
  sleep 0.05
done
[ "$(latest_step "$SCRATCH/flip/ckpt")" -eq 20 ] ||
  { cat "$SCRATCH/flip.log" >&2; fail "flip: latest is step $(latest_step "$SCRATCH/flip/ckpt"), not 20"; }
"$CLUSTER" hang-tasks "$victim" > /dev/null
crashed=$victim
hpid=$(for p in $("$CLUSTER" task-pids "$holder"); do case $(cat "/proc/$p/comm") in python*) echo "$p" ;; esac; done | head -1)
[ -n "$hpid" ] || fail "flip: no training process on $holder"
step_dir=$SCRATCH/flip/ckpt/$(printf %012d 20)
others=()
for r in 0 1 2; do [ "$r" -ne "$d" ] && others+=("$step_dir/rank-0000$r.shard"); done
"$PY" "$CKPT_SOURCE_DIR/tests/tools/flip_in_memory.py" "$hpid" "$step_dir/rank-0000$d.shard" "${others[@]}" ||
  fail "flip: rank $d's copy was not found in the memory of its holder on $holder"
"$CLUSTER" crash-node "$victim" > /dev/null
for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
"$CLUSTER" revive-node "$victim" > /dev/null
crashed=""
grep -q "memory tier: the copy of rank $d's step 20 no longer matches the checksum" "$SCRATCH/flip.log" ||
  { grep "last words\|memory tier" "$SCRATCH/flip.log" >&2; fail "flip: the flipped bit in rank $d's copy went unseen"; }
grep -q "from its partner copy" "$SCRATCH/flip.log" && fail "flip: a shard was written from a partner copy"
[ "$(latest_step "$SCRATCH/flip/ckpt")" -eq 20 ] || fail "flip: latest is step $(latest_step "$SCRATCH/flip/ckpt") after the crash"
{ grep "no longer matches" "$SCRATCH/flip.log"; grep "last words: not writing" "$SCRATCH/flip.log"; } | sed 's/^/  /'
grep -q "last words: not writing" "$SCRATCH/flip.log" || fail "flip: the last words did not decide against writing"
pass "a flipped bit in rank $d's copy on $holder was found before use; no shard was written from it"

INTERVAL=10steps train flip -- > "$SCRATCH/flip-again.log" 2>&1 || { cat "$SCRATCH/flip-again.log" >&2; fail "flip: the rerun failed"; }
grep -q "resumed from step 20 " "$SCRATCH/flip-again.log" || { cat "$SCRATCH/flip-again.log" >&2; fail "flip: the rerun did not resume from step 20"; }
cmp -s "$SCRATCH/straight/final.bin" "$SCRATCH/flip/final.bin" || fail "flip: final weights differ after resuming from step 20"
pass "every rank resumed from the dir's checkpoint of step 20; final weights bitwise identical"
