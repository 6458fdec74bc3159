#!/usr/bin/env bash
# Real training resumes bitwise: slurm-examples/train_ddp.py on 2 local ranks (torchrun-style environment, gloo on
# CPU) runs uninterrupted; a second run in a fresh dir is SIGKILLed (both ranks) after a checkpoint has committed,
# then run again to the end. The final weights of both runs must be identical, byte for byte.
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


# start_ranks NAME [train_ddp args...]: starts rank 0 and 1 in the background; their pids land in `pids`.
start_ranks() {
  local name=$1 port
  shift
  port=$(free_port)
  pids=()
  for r in 0 1; do
    # No wrapper process: the pid must be the rank itself, for the SIGKILL below (ctest's timeout bounds a hang).
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r \
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


mkdir -p "$work/straight" "$work/killed"

echo "test_torch_resume: uninterrupted run of $STEPS steps"
start_ranks straight
wait_ranks straight
[ -s "$work/straight/final.bin" ] || { echo "test_torch_resume: the uninterrupted run wrote no weights" >&2; exit 1; }

echo "test_torch_resume: second run, SIGKILLed after a checkpoint has committed"
start_ranks killed --step-sleep 0.1
deadline=$((SECONDS + 240))
until [ "$(latest_step "$work/killed/ckpt")" -ge 20 ]; do
  if [ $SECONDS -ge $deadline ]; then echo "test_torch_resume: no checkpoint committed in time" >&2; exit 1; fi
  sleep 0.1
done
kill -9 "${pids[@]}"
{ wait "${pids[@]}"; } 2>/dev/null || true
for p in "${pids[@]}"; do
  if kill -0 "$p" 2>/dev/null; then echo "test_torch_resume: rank pid $p survived SIGKILL" >&2; exit 1; fi
done
pids=()
killed_at=$(latest_step "$work/killed/ckpt")
if [ -e "$work/killed/final.bin" ] || [ "$killed_at" -ge $STEPS ]; then
  echo "test_torch_resume: the run finished before it was killed; nothing was tested" >&2
  exit 1
fi
[ -f "$work/killed/ckpt/$(cat "$work/killed/ckpt/latest")/MANIFEST.json" ] ||
  { echo "test_torch_resume: latest names a checkpoint without a manifest" >&2; exit 1; }
echo "test_torch_resume: killed with step $killed_at committed"

echo "test_torch_resume: rerun to the end"
start_ranks killed
wait_ranks killed
resumed=$(sed -n 's/^train_ddp: resumed from step \([0-9]*\).*/\1/p' "$work/killed/rank0.log")
if [ -z "$resumed" ] || [ "$resumed" -lt "$killed_at" ]; then
  echo "test_torch_resume: the rerun did not resume from step $killed_at (log says '${resumed:-nothing}')" >&2
  cat "$work/killed/rank0.log" >&2
  exit 1
fi

if ! cmp "$work/straight/final.bin" "$work/killed/final.bin"; then
  echo "test_torch_resume: final weights differ after a kill and resume from step $resumed" >&2
  exit 1
fi
echo "test_torch_resume: resumed from step $resumed; final weights identical ($(cat "$work/killed/final.bin.sha256"))"
