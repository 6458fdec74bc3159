#!/usr/bin/env bash
# Real training resumes bitwise: slurm-examples/train_ddp.py on 2 local ranks (torchrun-style environment, gloo on
# CPU) runs uninterrupted; a second run in a fresh dir is SIGKILLed (both ranks) after a checkpoint has committed,
# then run again to the end. The final weights of both runs must be identical, byte for byte. Twice: with AdamW on
# every rank, and with ZeRO-1 (--zero1: torch's ZeroRedundancyOptimizer), where each rank's shard must hold the
# optimizer state of its own partition only. Then ZeRO-1 from 4 ranks onto 2, against AdamW (below).
set -euo pipefail
SRC=${CKPT_SOURCE_DIR:?}
: "${CKPT_BUILD_DIR:?}"
source "$SRC/tests/integration/torch_lib.sh"
have_torch || { echo "test_torch_resume: needs python3-torch and a built slurm_ckpt" >&2; exit 1; }

STEPS=60
INTERVAL=10
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT


# start_ranks NAME [train_ddp args...]: starts ranks 0..WORLD-1 (2) in the background; their pids land in `pids`.
start_ranks() {
  local name=$1 port world=${WORLD:-2}
  shift
  port=$(free_port)
  pids=()
  for r in $(seq 0 $((world - 1))); do
    # No wrapper process: the pid must be the rank itself, for the SIGKILL below (ctest's timeout bounds a hang).
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r \
      "$PY" "$SRC/slurm-examples/train_ddp.py" --steps $STEPS --ckpt-interval-steps $INTERVAL \
      --ckpt-dir "$work/$name/ckpt" --out "$work/$name/final.bin" "$@" >"$work/$name/rank$r.log" 2>&1 &
    pids+=($!)
  done
}

# wait_ranks NAME: both ranks must exit 0.
wait_ranks() {
  local name=$1 r=0 p
  for p in "${pids[@]}"; do
    if ! wait "$p"; then
      echo "test_torch_resume: $name rank $r failed:" >&2
      tail -20 "$work/$name/rank$r.log" >&2
      exit 1
    fi
    r=$((r + 1))
  done
  pids=()
}


# resume_round LABEL [train_ddp args...]: the uninterrupted run, the killed one, its rerun, the weights compared.
resume_round() {
  mkdir -p "$work/$1-straight" "$work/$1-killed"

  echo "test_torch_resume: $1: uninterrupted run of $STEPS steps"
  start_ranks "$1-straight" "${@:2}"
  wait_ranks "$1-straight"
  [ -s "$work/$1-straight/final.bin" ] || { echo "test_torch_resume: $1: the uninterrupted run wrote no weights" >&2; exit 1; }

  echo "test_torch_resume: $1: second run, SIGKILLed after a checkpoint has committed"
  start_ranks "$1-killed" --step-sleep 0.1 "${@:2}"
  deadline=$((SECONDS + 240))
  until [ "$(latest_step "$work/$1-killed/ckpt")" -ge 20 ]; do
    if [ $SECONDS -ge $deadline ]; then echo "test_torch_resume: $1: no checkpoint committed in time" >&2; exit 1; fi
    sleep 0.1
  done
  kill -9 "${pids[@]}"
  { wait "${pids[@]}"; } 2>/dev/null || true
  for p in "${pids[@]}"; do
    if kill -0 "$p" 2>/dev/null; then echo "test_torch_resume: $1: rank pid $p survived SIGKILL" >&2; exit 1; fi
  done
  pids=()
  killed_at=$(latest_step "$work/$1-killed/ckpt")
  if [ -e "$work/$1-killed/final.bin" ] || [ "$killed_at" -ge $STEPS ]; then
    echo "test_torch_resume: $1: the run finished before it was killed; nothing was tested" >&2
    exit 1
  fi
  [ -f "$work/$1-killed/ckpt/$(cat "$work/$1-killed/ckpt/latest")/MANIFEST.json" ] ||
    { echo "test_torch_resume: $1: latest names a checkpoint without a manifest" >&2; exit 1; }
  echo "test_torch_resume: $1: killed with step $killed_at committed"

  echo "test_torch_resume: $1: rerun to the end"
  start_ranks "$1-killed" "${@:2}"
  wait_ranks "$1-killed"
  resumed=$(sed -n 's/^train_ddp: resumed from step \([0-9]*\).*/\1/p' "$work/$1-killed/rank0.log")
  if [ -z "$resumed" ] || [ "$resumed" -lt "$killed_at" ]; then
    echo "test_torch_resume: $1: the rerun did not resume from step $killed_at (log says '${resumed:-nothing}')" >&2
    cat "$work/$1-killed/rank0.log" >&2
    exit 1
  fi

  if ! cmp "$work/$1-straight/final.bin" "$work/$1-killed/final.bin"; then
    echo "test_torch_resume: $1: final weights differ after a kill and resume from step $resumed" >&2
    exit 1
  fi
  echo "test_torch_resume: $1: resumed from step $resumed; final weights identical ($(cat "$work/$1-killed/final.bin.sha256"))"
}

resume_round adamw

resume_round zero1 --zero1
# ZeRO-1: the manifest says so, and the two shards split AdamW's state between them, none holding all of it.
"$PY" - "$work/zero1-killed/ckpt" <<'PYCHECK' || { echo "test_torch_resume: zero1: the shards do not split the optimizer state" >&2; exit 1; }
import json, os, sys
root = sys.argv[1]
m = json.load(open(os.path.join(root, open(os.path.join(root, "latest")).read().strip(), "MANIFEST.json")))
assert m["layout"]["zero1"] is True, m["layout"]
groups = {(s["name"].split("/", 1)[0], s["meta"].get("replica_group")) for shard in m["shards"]
          for s in shard["states"] if "shape" in s["meta"]}
assert groups == {("model", "dp"), ("optim", "rank")}, groups  # the model is replicated, each partition its own
optim = [sum(s["length"] for s in shard["states"] if s["name"].startswith("optim/")) for shard in m["shards"]]
model = sum(s["length"] for s in m["shards"][0]["states"] if s["name"].startswith("model/") and s["meta"].get("kind") == "param")
assert len(optim) == 2 and all(0 < o < 2 * model for o in optim), (optim, model)
assert sum(optim) >= 2 * model, (optim, model)  # exp_avg and exp_avg_sq of every parameter, across both
print(f"test_torch_resume: zero1: optimizer state {optim[0]} + {optim[1]} bytes across the ranks, parameters {model}")
PYCHECK

# ZeRO-1 onto another number of ranks: 4 ranks train to step 20, then 2 go on from their checkpoint to the end,
# each reading its new partition's state from the shards of its old owners. The reference is the same with AdamW
# on every rank, whose whole state any rank restores (a pure data-parallel replica): ZeRO-1's arithmetic is AdamW's,
# so the weights must be the same, bit for bit.
onto_two() {  # LABEL [train_ddp args...]
  mkdir -p "$work/$1"
  WORLD=4 start_ranks "$1" --steps 20 "${@:2}"
  wait_ranks "$1"
  start_ranks "$1" "${@:2}"
  wait_ranks "$1"
  grep -q "^train_ddp: resumed from step 20 " "$work/$1/rank0.log" ||
    { cat "$work/$1/rank0.log" >&2; echo "test_torch_resume: $1: 2 ranks did not resume from step 20" >&2; exit 1; }
}
onto_two reshard-ref
onto_two reshard --zero1
grep -q "ZeRO-1 state of 4 ranks resharded onto 2: read" "$work/reshard/rank1.log" ||
  { cat "$work/reshard/rank1.log" >&2; echo "test_torch_resume: reshard: rank 1 read no other shard" >&2; exit 1; }
cmp "$work/reshard-ref/final.bin" "$work/reshard/final.bin" ||
  { echo "test_torch_resume: ZeRO-1 resharded from 4 ranks onto 2 ended with other weights than AdamW" >&2; exit 1; }
echo "test_torch_resume: ZeRO-1 from 4 ranks onto 2: $(grep -o "read [0-9]* ranges ([0-9]* bytes)" "$work/reshard/rank1.log") \
of the other shards on rank 1; final weights identical to AdamW's ($(cat "$work/reshard/final.bin.sha256"))"
