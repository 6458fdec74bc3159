#!/usr/bin/env bash
# Real training resumes bitwise: slurm-examples/train_ddp.py on 2 local ranks (torchrun-style environment, gloo on
# CPU) runs uninterrupted; a second run in a fresh dir is SIGKILLed (both ranks) after a checkpoint has committed,
# then run again to the end. The final weights of both runs must be identical, byte for byte. Twice: with AdamW on
# every rank, and with ZeRO-1 (--zero1: torch's ZeroRedundancyOptimizer), where each rank's shard must hold the
# optimizer state of its own partition only. Then a checkpoint of 4 ranks restored onto 3 and onto 2, against a
# reference that reshards through plain torch (below).
set -euo pipefail
SRC=${CKPT_SOURCE_DIR:?}
: "${CKPT_BUILD_DIR:?}"
source "$SRC/tests/integration/torch_lib.sh"
have_torch || { echo "test_torch_resume: needs python3-torch and a built slurm_ckpt" >&2; exit 1; }

STEPS=60
INTERVAL=10
ranks_scratch  # $work, and `pids` killed at exit


# launch NAME PROGRAM [args...]: starts ranks 0..WORLD-1 (2) of PROGRAM in the background, each logging to
# $work/NAME/rank<r>.log; their pids land in `pids`.
launch() {
  local name=$1 prog=$2
  shift 2
  mkdir -p "$work/$name"
  # Each pid is the rank itself, for the SIGKILL below (ctest's timeout bounds a hang).
  start_local_ranks "${WORLD:-2}" "$work/$name/rank" "$prog" "$@"
}

# start_ranks NAME [train_ddp args...]: train_ddp.py with its checkpoints and final weights in $work/NAME.
start_ranks() {
  local name=$1
  shift
  launch "$name" "$SRC/slurm-examples/train_ddp.py" --steps $STEPS --ckpt-interval-steps $INTERVAL \
    --ckpt-dir "$work/$name/ckpt" --out "$work/$name/final.bin" "$@"
}

# wait_ranks NAME: every rank must exit 0.
wait_ranks() {
  wait_local_ranks "$work/$1/rank" || { echo "test_torch_resume: $1 rank $failed_rank failed (above)" >&2; exit 1; }
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

# Onto other numbers of ranks: 4 data-parallel ranks train to step 20 and checkpoint, then 3, or 2, go on to step
# 40. The reference does the same with plain torch (plain_torch_reshard.py: torch.save on 4 ranks, rank r of the
# new world loads old rank r % 4's file), as a program without slurm-ckpt would; each run through slurm-ckpt must
# end with its weights, bit for bit. AdamW restores a whole replica on each rank; ZeRO-1 reads each new partition's
# state from the shards of its old owners, and its arithmetic is AdamW's.
INTERVAL=20  # step 20's checkpoint is the only one these runs need
WORLD=4 launch plain-4 "$SRC/tests/integration/plain_torch_reshard.py" --save "$work/plain-4" --steps 20
wait_ranks plain-4
for m in 3 2; do
  WORLD=$m launch plain-onto$m "$SRC/tests/integration/plain_torch_reshard.py" --load "$work/plain-4" --steps 40 \
    --out "$work/plain-onto$m/final.bin"
  wait_ranks plain-onto$m
done

# onto M FROM NAME LABEL [train_ddp args...]: FROM's checkpoint, copied, resumed on M ranks to step 40; the final
# weights must be plain torch's onto M.
onto() {
  local m=$1 from=$2 name=$3 label=$4
  shift 4
  mkdir -p "$work/$name"
  cp -a "$work/$from/ckpt" "$work/$name/ckpt"
  WORLD=$m start_ranks "$name" --steps 40 "$@"
  wait_ranks "$name"
  if ! grep -q "^train_ddp: resumed from step 20 ($m ranks" "$work/$name/rank0.log"; then
    cat "$work/$name/rank0.log" >&2
    echo "test_torch_resume: $label: $m ranks did not resume from step 20" >&2
    exit 1
  fi
  cmp "$work/plain-onto$m/final.bin" "$work/$name/final.bin" ||
    { echo "test_torch_resume: $label: other final weights than plain torch resharded onto $m ranks" >&2; exit 1; }
}

WORLD=4 start_ranks adamw-4 --steps 20
wait_ranks adamw-4
onto 3 adamw-4 adamw-onto3 "AdamW from 4 ranks onto 3"
echo "test_torch_resume: AdamW from 4 ranks onto 3: final weights identical to plain torch's \
($(cat "$work/adamw-onto3/final.bin.sha256"))"

WORLD=4 start_ranks zero1-4 --steps 20 --zero1
wait_ranks zero1-4
for m in 2 3; do
  onto $m zero1-4 zero1-onto$m "ZeRO-1 from 4 ranks onto $m" --zero1
  # Rank 1's new partition was partly other ranks' before: it must have read their shards.
  if ! read_line=$(grep -o "ZeRO-1 state of 4 ranks resharded onto $m: read [0-9]* ranges ([0-9]* bytes)" \
      "$work/zero1-onto$m/rank1.log"); then
    cat "$work/zero1-onto$m/rank1.log" >&2
    echo "test_torch_resume: ZeRO-1 from 4 ranks onto $m: rank 1 read no other shard" >&2
    exit 1
  fi
  echo "test_torch_resume: ZeRO-1 from 4 ranks onto $m: ${read_line##*: } of the other shards on rank 1; \
final weights identical to plain torch's ($(cat "$work/zero1-onto$m/final.bin.sha256"))"
done

# Bytes read at resume: each rank reads what its replica holds besides the old partitions (the model, RNG states,
# extras) and its own new partition; across the job every partition's bytes are read once, and no more.
for m in 2 3; do
  "$PY" - "$work/zero1-onto$m" "$m" <<'PYCHECK' || { echo "test_torch_resume: ZeRO-1 onto $m: bytes read at resume (above)" >&2; exit 1; }
import json, os, re, sys
run, m = sys.argv[1], int(sys.argv[2])
root = os.path.join(run, "ckpt")
manifest = json.load(open(os.path.join(root, "000000000020", "MANIFEST.json")))
shards = {s["rank"]: s["states"] for s in manifest["shards"]}
partition = lambda s: s["meta"].get("replica_group") == "rank"
expected = sum(s["length"] for r in range(m) for s in shards[r % 4] if not partition(s)) + \
    sum(s["length"] for states in shards.values() for s in states if partition(s))
read = 0
for r in range(m):
    found = re.findall(r"restored step 20 from \S+ in [0-9.]+ s \((\d+) bytes read", open(os.path.join(run, f"rank{r}.log")).read())
    assert len(found) == 1, (r, found)
    read += int(found[0])
assert read == expected, f"{m} ranks read {read} bytes at resume; one copy of what they hold is {expected}"
print(f"test_torch_resume: ZeRO-1 from 4 ranks onto {m}: {read} bytes read at resume across the ranks: each "
      "partition once, the model once per rank")
PYCHECK
done
