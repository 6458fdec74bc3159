#!/usr/bin/env bash
# Real training on the real local cluster: `srun -N4 -n4 --mpi=pmix --ckpt-interval=10steps --ckpt-dir=...`
# runs slurm-examples/train_ddp.py (plugin settings) to the end; a second run (address files, not PMIx) has node n3
# crashed mid-run after a checkpoint committed, and is run again (the plugin hands it the checkpoint). The final
# weights must be bitwise identical to the uninterrupted run's.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/torch_lib.sh"
have_torch || fail "needs python3-torch and a built slurm_ckpt"
STEPS=60
tag=$RANDOM$RANDOM


# train NAME [train_ddp args...]: one 4-node job writing into $SCRATCH/NAME.
train() {
  local name=$1
  shift
  mkdir -p "$SCRATCH/$name"
  MASTER_ADDR=$(rendezvous_addr) MASTER_PORT=$(free_port) \
    srun -N4 -n4 --mpi=pmix -J "hooks-$name-$tag" --ckpt-interval=10steps --ckpt-dir="$SCRATCH/$name/ckpt" \
    "$PY" "$CKPT_SOURCE_DIR/slurm-examples/train_ddp.py" --steps $STEPS --out "$SCRATCH/$name/final.bin" "$@"
}

train straight > "$SCRATCH/straight.log" 2>&1 || { cat "$SCRATCH/straight.log" >&2; fail "the uninterrupted run failed"; }
[ -s "$SCRATCH/straight/final.bin" ] || fail "the uninterrupted run wrote no weights"
grep -q "rendezvous pmix" "$SCRATCH/straight.log" || fail "the uninterrupted run did not find its peers through PMIx"
pass "uninterrupted 4-node run (rendezvous through PMIx): $(cat "$SCRATCH/straight/final.bin.sha256")"

# The crashed run's ranks find each other through address files; the others take the default under --mpi=pmix,
# PMIx.
CKPT_LOG=debug CKPT_RENDEZVOUS=files train crashed --step-sleep 0.3 > "$SCRATCH/crashed.log" 2>&1 &
srun_pid=$!
for _ in $(seq 900); do
  [ "$(latest_step "$SCRATCH/crashed/ckpt")" -ge 20 ] && break
  kill -0 "$srun_pid" 2>/dev/null || { cat "$SCRATCH/crashed.log" >&2; fail "the run ended before a checkpoint"; }
  sleep 0.2
done
[ "$(latest_step "$SCRATCH/crashed/ckpt")" -ge 20 ] || fail "no checkpoint committed in time"
grep -q "rendezvous files" "$SCRATCH/crashed.log" || fail "the job did not use the address files"
"$CLUSTER" crash-node n3
crashed_at=$(latest_step "$SCRATCH/crashed/ckpt")
for _ in $(seq 600); do kill -0 "$srun_pid" 2>/dev/null || break; sleep 0.2; done
if kill -0 "$srun_pid" 2>/dev/null; then
  kill "$srun_pid"
  fail "srun still runs 2 minutes after n3 crashed"
fi
wait "$srun_pid" && fail "the crashed run exited 0"
"$CLUSTER" revive-node n3
[ ! -e "$SCRATCH/crashed/final.bin" ] || fail "the crashed run finished before the crash; nothing was tested"
[ "$crashed_at" -lt $STEPS ] || fail "the crashed run had committed its last step"
pass "n3 crashed with step $crashed_at committed"

train crashed > "$SCRATCH/rerun.log" 2>&1 || { cat "$SCRATCH/rerun.log" >&2; fail "the rerun failed"; }
resumed=$(sed -n 's/^train_ddp: resumed from step \([0-9]*\).*/\1/p' "$SCRATCH/rerun.log")
[ -n "$resumed" ] && [ "$resumed" -ge "$crashed_at" ] ||
  { cat "$SCRATCH/rerun.log" >&2; fail "the rerun did not resume from step $crashed_at (log: '${resumed:-nothing}')"; }
cmp "$SCRATCH/straight/final.bin" "$SCRATCH/crashed/final.bin" ||
  fail "final weights differ after a node crash and a resume from step $resumed"
pass "resumed from step $resumed after the crash; final weights bitwise identical"
finish
