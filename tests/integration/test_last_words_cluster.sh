#!/usr/bin/env bash
# Last words on the real local cluster: slurm-examples/train_dp_tp.py (DP2 x TP2 over gloo, bitwise resumable)
# on 4 nodes with `srun -N4 -n4 --ckpt-last-words=on`.
#  1. A requeueable batch job under the recovery controller, its steps under PMIx (srun --mpi=pmix: the network's
#     addresses go through one PMIx fence, and PMIx must not take the survivors down with the dead node); a node
#     crashes (SIGKILL) at a random step, with no
#     periodic checkpoint to fall back on (interval 1000 steps): the survivors detect it over their heartbeat
#     mesh, agree, and commit a terminal checkpoint of the step they were on; the controller requeues the job off
#     the dead node, it resumes from that checkpoint (at most one step lost) and ends bitwise identical to an
#     uninterrupted run. Prints the detection latency and the time from the crash to the committed checkpoint.
#  2. Two nodes holding both replicas of one tensor slice freeze (SIGSTOP: the silent case, seen only through
#     missed heartbeats): the survivors cannot hold a complete copy and write nothing; the rerun resumes from the
#     last periodic checkpoint, still bitwise identical.
#  3. Slurm cancels the step with SIGTERM, as it does after a node failure or at preemption: every rank is alive,
#     they agree on the step they are on and commit a terminal checkpoint of it; the rerun resumes from it with no
#     step lost and ends bitwise identical.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/controller_lib.sh"
source "$(dirname "$0")/torch_lib.sh"
have_torch || fail "needs python3-torch and a built slurm_ckpt"
STEPS=60
tag=$RANDOM$RANDOM
crashed_nodes=()
revive_all() {
  for n in "${crashed_nodes[@]}"; do "$CLUSTER" revive-node "$n" >/dev/null 2>&1 || true; done
  crashed_nodes=()
}

# The recovery controller, and the plugin reporting to it.
PORT=$(( ${CKPT_CONTROLLER_TEST_PORT:-16840} + 30 ))
[ -x "$CKPT_BUILD_DIR/controller/ckpt-controller" ] || fail "ckpt-controller is not built"
job=""
cleanup() {
  [ -n "$job" ] && scancel "$job" 2>/dev/null || true
  revive_all
  controller_down
}
trap cleanup EXIT
controller_up "$SCRATCH" "$PORT" > /dev/null || fail "no controller"


# train NAME INTERVAL [train_dp_tp args...]: one 4-node job writing into $SCRATCH/NAME.
train() {
  local name=$1 interval=$2
  shift 2
  mkdir -p "$SCRATCH/$name"
  MASTER_ADDR=$(rendezvous_addr) MASTER_PORT=$(free_port) \
    srun -N4 -n4 -J "lw-$name-$tag" --ckpt-interval="$interval" --ckpt-last-words=on \
    --ckpt-dir="$SCRATCH/$name/ckpt" \
    "$PY" "$CKPT_SOURCE_DIR/slurm-examples/train_dp_tp.py" --steps $STEPS --out "$SCRATCH/$name/final" "$@"
}

# train_until NAME INTERVAL AT: `train` in the background (logging to $SCRATCH/NAME.log, srun's pid in srun_pid)
# until it has logged step AT.
train_until() {
  local name=$1 interval=$2 at=$3 s
  train "$name" "$interval" --step-sleep 0.2 > "$SCRATCH/$name.log" 2>&1 &
  srun_pid=$!
  for _ in $(seq 900); do
    s=$(logged_step "$SCRATCH/$name.log")
    [ -n "$s" ] && [ "$s" -ge "$at" ] && return 0
    kill -0 "$srun_pid" 2>/dev/null || { cat "$SCRATCH/$name.log" >&2; fail "the run ended before step $at"; }
    sleep 0.05
  done
  fail "the run did not reach step $at in 45 s"
}

same_weights() {
  cmp -s "$SCRATCH/straight/final.tp0" "$SCRATCH/$1/final.tp0" && cmp -s "$SCRATCH/straight/final.tp1" "$SCRATCH/$1/final.tp1"
}

train straight 1000steps > "$SCRATCH/straight.log" 2>&1 || { cat "$SCRATCH/straight.log" >&2; fail "the uninterrupted run failed"; }
[ -s "$SCRATCH/straight/final.tp0" ] && [ -s "$SCRATCH/straight/final.tp1" ] || fail "the uninterrupted run wrote no weights"
grep -q "last words armed" "$SCRATCH/straight.log" || fail "last words were not armed"
pass "uninterrupted DP2xTP2 run on 4 nodes"

# ---- 1. one node crashes: a terminal checkpoint from the survivors, the controller requeues, the job resumes ----
# -N3-4: Slurm gives the first run all 4 nodes, the requeued run the 3 the controller did not exclude.
mkdir -p "$SCRATCH/one"
wait_nodes_idle 4  # -N3-4 takes 3 nodes while the fourth is still completing the last job
write_train_sbatch "$SCRATCH/one.sbatch" "-N3-4 -n4" train_dp_tp.py --steps $STEPS --out "$SCRATCH/one/final"
at=$((15 + RANDOM % 20))
job=$(SLURM_MPI_TYPE=pmix sbatch --parsable -J "lw-one-$tag" -o "$SCRATCH/one.log" --ckpt-interval=1000steps --ckpt-last-words=on \
  --ckpt-dir="$SCRATCH/one/ckpt" "$SCRATCH/one.sbatch" --step-sleep 0.2)
wait_logged_step "$SCRATCH/one.log" "$at" || true  # the node check below says what went wrong
[ "$(scontrol show hostnames "$(squeue -h -j "$job" -o %N)" | wc -l)" = 4 ] ||
  fail "the first run is not on 4 nodes: $(squeue -h -j "$job" -o %N)"
crash_t=$(now)
"$CLUSTER" crash-node n4
crashed_nodes+=(n4)
seen=$(logged_step "$SCRATCH/one.log")
for _ in $(seq 200); do [ -f "$SCRATCH/one/ckpt/latest" ] && break; sleep 0.05; done
committed_t=$(now)
[ -f "$SCRATCH/one/ckpt/latest" ] || { cat "$SCRATCH/one.log" >&2; fail "no terminal checkpoint 10 s after n4 crashed"; }
term=$(latest_step "$SCRATCH/one/ckpt")
grep -q '"kind": *"terminal"' "$SCRATCH/one/ckpt/$(cat "$SCRATCH/one/ckpt/latest")/MANIFEST.json" ||
  fail "the checkpoint of step $term is not terminal"
[ "$term" -ge $((seen - 1)) ] && [ "$term" -le $((seen + 1)) ] ||
  fail "terminal checkpoint at step $term; the run was at step $seen when n4 crashed"
detected=$(sed -n 's/.*last words: rank 3 is dead (.*), detected at unix \([0-9.]*\).*/\1/p' "$SCRATCH/one.log" | sort -n | sed -n 1p)
took=$(sed -n 's/.*committed the terminal checkpoint of step [0-9]*, \([0-9.]*\) s after.*/\1/p' "$SCRATCH/one.log")
[ -n "$detected" ] && [ -n "$took" ] || { cat "$SCRATCH/one.log" >&2; fail "no detection or commit line in the log"; }
detect_ms=$(awk -v a="$crash_t" -v b="$detected" 'BEGIN { printf "%.0f", (b - a) * 1000 }')
total_ms=$(awk -v a="$crash_t" -v b="$detected" -v t="$took" 'BEGIN { printf "%.0f", (b - a + t) * 1000 }')
echo "last words: crash of n4 at step ~$seen: detected after $detect_ms ms, terminal checkpoint of step $term committed $total_ms ms after the crash (poll saw it after $(awk -v a="$crash_t" -v b="$committed_t" 'BEGIN { printf "%.0f", (b - a) * 1000 }') ms)"
grep "last words:" "$SCRATCH/one.log" | sed 's/^/  /' | sed -n 1,20p
grep -q "rendezvous pmix" "$SCRATCH/one.log" || fail "the run did not find its peers through PMIx"
pass "n4 crashed at step ~$seen: terminal checkpoint of step $term from the survivors (rendezvous through PMIx)"

# The controller requeues the job off n4; the next run resumes from the terminal checkpoint and finishes.
for _ in $(seq 1200); do
  state=$(scontrol show job "$job" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
  grep -q "^run 1 " "$SCRATCH/one.log" && [ "$state" = COMPLETED ] && break
  sleep 0.25
done
"$CKPT_BUILD_DIR/controller/ckpt-controller" -c "$SCRATCH/controller.conf" history "$job" | sed 's/^/  /' | sed -n 1,20p
grep -q "^run 1 " "$SCRATCH/one.log" || { cat "$SCRATCH/one.log" >&2; fail "the controller did not requeue job $job"; }
[ "$state" = COMPLETED ] || { tail -20 "$SCRATCH/one.log" >&2; fail "the requeued job ended $state"; }
job=""
grep "^run 1 " "$SCRATCH/one.log" | grep "n4" > /dev/null && fail "the requeued run went back to the dead node n4"
grep -q "resumed from step $term " "$SCRATCH/one.log" || { cat "$SCRATCH/one.log" >&2; fail "the requeued run did not resume from step $term"; }
same_weights one || fail "final weights differ after resuming from the terminal checkpoint of step $term"
pass "the controller requeued the job off n4; it resumed from the terminal checkpoint of step $term (steps lost: $((seen > term ? seen - term : 0))); final weights bitwise identical"
revive_all
controller_down  # case 2 needs no restart

# ---- 2. both replicas of slice tp1 crash: nothing is written, the periodic checkpoint serves ----
train_until two 10steps $((25 + RANDOM % 10))
# Frozen, not killed: a killed node's sockets reset at once and the survivors would (rightly) save before the
# second node goes; frozen nodes fall silent together and only the heartbeat timeout can tell.
"$CLUSTER" freeze-node n2 &
f1=$!
"$CLUSTER" freeze-node n4 &
f2=$!
wait "$f1" "$f2"
crashed_nodes+=(n2 n4)
for _ in $(seq 600); do kill -0 "$srun_pid" 2>/dev/null || break; sleep 0.2; done
kill -0 "$srun_pid" 2>/dev/null && { kill "$srun_pid"; fail "srun still runs 2 minutes after the freeze"; }
wait "$srun_pid" && fail "the frozen run exited 0"
revive_all
sleep 2
periodic=$(latest_step "$SCRATCH/two/ckpt")
[ "$periodic" -gt 0 ] || fail "no periodic checkpoint before the freeze"
assert_contains "$SCRATCH/two.log" "last words: not writing a terminal checkpoint"
grep "last words:" "$SCRATCH/two.log" | grep -v "rank [123]:" | sed 's/^/  /' | sed -n 1,12p
grep -q '"kind": *"periodic"' "$SCRATCH/two/ckpt/$(cat "$SCRATCH/two/ckpt/latest")/MANIFEST.json" ||
  fail "the latest checkpoint is not periodic"
pass "n2 and n4 (both replicas of tp1) froze: no terminal checkpoint; periodic step $periodic stands"

train two 10steps > "$SCRATCH/two-rerun.log" 2>&1 || { cat "$SCRATCH/two-rerun.log" >&2; fail "the rerun failed"; }
grep -q "resumed from step $periodic" "$SCRATCH/two-rerun.log" || { cat "$SCRATCH/two-rerun.log" >&2; fail "the rerun did not resume from step $periodic"; }
same_weights two || fail "final weights differ after resuming from the periodic checkpoint of step $periodic"
pass "resumed from the periodic checkpoint of step $periodic; final weights bitwise identical"

# ---- 3. SIGTERM from Slurm: a terminal checkpoint of the current step, nothing lost ----
train_until three 1000steps $((10 + RANDOM % 20))
seen=$(logged_step "$SCRATCH/three.log")
scancel -s TERM -n "lw-three-$tag"
for _ in $(seq 300); do kill -0 "$srun_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$srun_pid" 2>/dev/null && { kill "$srun_pid"; fail "srun still runs 30 s after SIGTERM"; }
wait "$srun_pid" || true
assert_contains "$SCRATCH/three.log" "last words: signal 15"
[ -f "$SCRATCH/three/ckpt/latest" ] || { cat "$SCRATCH/three.log" >&2; fail "no terminal checkpoint after SIGTERM"; }
term=$(latest_step "$SCRATCH/three/ckpt")
grep -q '"kind": *"terminal"' "$SCRATCH/three/ckpt/$(cat "$SCRATCH/three/ckpt/latest")/MANIFEST.json" ||
  fail "the checkpoint of step $term is not terminal"
[ "$term" -ge "$seen" ] || fail "terminal checkpoint at step $term; the run had logged step $seen before SIGTERM"
took=$(sed -n 's/.*committed the terminal checkpoint of step [0-9]*, \([0-9.]*\) s after.*/\1/p' "$SCRATCH/three.log")
pass "SIGTERM at step ~$seen: terminal checkpoint of step $term committed $took s after the signal was seen"

train three 1000steps > "$SCRATCH/three-rerun.log" 2>&1 || { cat "$SCRATCH/three-rerun.log" >&2; fail "the rerun failed"; }
grep -q "resumed from step $term " "$SCRATCH/three-rerun.log" || { cat "$SCRATCH/three-rerun.log" >&2; fail "the rerun did not resume from step $term"; }
same_weights three || fail "final weights differ after resuming from the terminal checkpoint of step $term"
pass "resumed from the terminal checkpoint of step $term; final weights bitwise identical"
finish
