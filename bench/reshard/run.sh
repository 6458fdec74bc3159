#!/usr/bin/env bash
# bench/reshard/run.sh [MIB] [M...]: a ZeRO-1 checkpoint of 4 local ranks restored onto M ranks (default 2 and 3), at
# a realistic size: slurm-examples/train_ddp.py --zero1 --extra-mib MIB (default 256), so every rank holds MIB of
# weights more and one rank AdamW's 2 x MIB of state for them. For each M, against the same bytes read by plain
# torch and the disk in the same run:
#   - slurm-ckpt: each rank reads what its replica's shard holds besides the old partitions, and its new partition
#     from the shards of their old owners (store::replica_ranges, locate_ranges): bytes read across the ranks, and
#     the restore's time (the slowest rank);
#   - plain torch: the optimizer consolidated on one rank and saved with the model in one file, which every rank of
#     the new world loads whole (ZeroRedundancyOptimizer keeps its partition): its bytes and time;
#   - the limit: one copy of what the M ranks hold (the model on each, every partition once) read at the disk's
#     sequential rate, measured here with a cold page cache.
# The page cache is dropped before every restore (root), so each reads the disk; ranks on one host share the
# cache, so plain torch's second reader of its file reads memory: its time is a floor of what it costs on a
# parallel file system, where every rank's read crosses the network.
set -euo pipefail
MIB=${1:-256}
shift || true
ONTO=${*:-2 3}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
export CKPT_BUILD_DIR=${CKPT_BUILD_DIR:-$SRC/build}
source "$SRC/tests/integration/torch_lib.sh"
have_torch || { echo "reshard: needs python3-torch and a built slurm_ckpt (CKPT_BUILD_DIR)" >&2; exit 1; }
ranks_scratch
ARGS=(--zero1 --extra-mib "$MIB" --steps 2)

drop_cache() {
  sync
  echo 3 > /proc/sys/vm/drop_caches 2>/dev/null ||
    echo "reshard: cannot drop the page cache (run as root): reads may come from memory" >&2
}

# run WORLD NAME PROGRAM [args...]: ranks 0..WORLD-1 of PROGRAM, each logging to $work/NAME.rank<r>.log; all must
# exit 0.
run() {
  local world=$1 name=$2 prog=$3
  shift 3
  start_local_ranks "$world" "$work/$name.rank" "$prog" "$@"
  wait_local_ranks "$work/$name.rank" || { echo "reshard: $name rank $failed_rank failed" >&2; exit 1; }
}

# summary NAME: "<bytes read across the ranks> <slowest rank's seconds>" from restore.py's lines.
summary() {
  cat "$work/$1".rank*.log | sed -n 's/^reshard: rank [0-9]* of [0-9]*: step [0-9]*, \([0-9]*\) bytes read in \([0-9.]*\) s.*/\1 \2/p' |
    awk '{ b += $1; if ($2 > s) s = $2 } END { printf "%.0f %.3f", b, s }'
}

echo "reshard: 4 ranks train 2 steps with ${MIB} MiB more weights each (ZeRO-1), checkpoint at step 2"
run 4 save "$SRC/slurm-examples/train_ddp.py" "${ARGS[@]}" --ckpt-interval-steps 2 --ckpt-dir "$work/ckpt" \
  --out "$work/final.bin"
step_dir=$work/ckpt/$(cat "$work/ckpt/latest")
# The baseline's file, written by 4 ranks that restored the checkpoint (the same state).
run 4 consolidate "$SRC/bench/reshard/restore.py" "${ARGS[@]}" --ckpt-dir "$work/ckpt" \
  --save-consolidated "$work/consolidated.pt"

drop_cache
t0=$(date +%s.%N)
cat "$step_dir"/* > /dev/null
disk_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')
disk_bytes=$(cat "$step_dir"/* | wc -c)
rate=$(awk -v b="$disk_bytes" -v s="$disk_s" 'BEGIN { printf "%.0f", b / s }')
echo "reshard: the checkpoint holds $disk_bytes bytes; read cold in $disk_s s ($(awk -v r="$rate" 'BEGIN { printf "%.2f", r / 1e9 }') GB/s)"

printf '%-6s %-34s %-34s %-22s\n' onto "slurm-ckpt: bytes read, s" "plain torch: bytes read, s" "limit: one copy, s"
for m in $ONTO; do
  drop_cache
  run "$m" "onto$m" "$SRC/bench/reshard/restore.py" "${ARGS[@]}" --ckpt-dir "$work/ckpt"
  drop_cache
  run "$m" "plain$m" "$SRC/bench/reshard/restore.py" "${ARGS[@]}" --consolidated "$work/consolidated.pt"
  # One copy of what the M ranks hold: each rank's replica of the model (its replica's shard less the
  # partitions), every partition once.
  one=$("$PY" - "$step_dir/MANIFEST.json" "$m" <<'PY'
import json, sys
manifest, m = json.load(open(sys.argv[1])), int(sys.argv[2])
shards = {s["rank"]: s["states"] for s in manifest["shards"]}
partition = lambda s: s["meta"].get("replica_group") == "rank"
print(sum(s["length"] for r in range(m) for s in shards[r % len(shards)] if not partition(s)) +
      sum(s["length"] for states in shards.values() for s in states if partition(s)))
PY
)
  read -r ours ours_s <<< "$(summary "onto$m")"
  read -r plain plain_s <<< "$(summary "plain$m")"
  limit_s=$(awk -v b="$one" -v r="$rate" 'BEGIN { printf "%.3f", b / r }')
  printf '%-6s %-34s %-34s %-22s\n' "$m" "$ours ($(awk -v a="$ours" -v o="$one" 'BEGIN { printf "%.2f", a / o }')x), $ours_s" \
    "$plain ($(awk -v a="$plain" -v o="$one" 'BEGIN { printf "%.2f", a / o }')x), $plain_s" "$one, $limit_s"
done
echo "reshard: reproduce with bench/reshard/run.sh $MIB $ONTO"
