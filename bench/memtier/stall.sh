#!/usr/bin/env bash
# The memory tier's cost per step (a benchmark, not a test): slurm-examples/train_ddp.py as 2 local ranks
# (torchrun-style, each told it runs on a node of its own: SLURMD_NODENAME, LOCAL_WORLD_SIZE=1, so each keeps the
# other's copy) with MIB of extra parameters per rank (AdamW: three times that in each checkpoint), last words on,
# no periodic checkpoint; once without the memory tier and once with a memory checkpoint every INTERVAL steps,
# ROUNDS times each, alternating. Prints the median step time of each (steps 6 on), their ratio, and the floor: one
# memcpy of a rank's state (weights and AdamW's moments) on this host, measured in the same run.
#   bench/memtier/stall.sh [MIB] [STEPS] [ROUNDS] [INTERVAL]
#   (default 256 MiB, 25 steps, 2 rounds, every step; CKPT_BUILD_DIR or build/)
set -euo pipefail
MIB=${1:-256}
STEPS=${2:-25}
ROUNDS=${3:-2}
INTERVAL=${4:-1}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$SRC/bench/memtier/floor.sh"
export PYTHONPATH=${CKPT_BUILD_DIR:-$SRC/build}/python${PYTHONPATH:+:$PYTHONPATH}
WORK=$(mktemp -d /tmp/bench-memtier.XXXXXX)

run() {  # run MODE ROUND: one job of 2 ranks; its step times appended to $WORK/MODE.times
  local mode=$1 out=$WORK/$1-$2 port=$((20000 + RANDOM % 10000)) r
  mkdir -p "$out"
  for r in 0 1; do
    env MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      SLURMD_NODENAME=bench-node$r CKPT_DIR="$out/ckpt" CKPT_INTERVAL=100000steps CKPT_LAST_WORDS=on \
      CKPT_LAYOUT=dp=2 CKPT_MEMORY="$([ "$mode" = tier ] && echo 4G || echo off)" CKPT_MEMORY_INTERVAL=$INTERVAL \
      /usr/bin/python3 "$SRC/slurm-examples/train_ddp.py" --steps "$STEPS" --log-every 1 --log-time \
      --extra-mib "$MIB" --out "$out/final" > "$out/r$r.log" 2>&1 &
  done
  wait
  sed -n 's/^train_ddp: step \([0-9]*\) .* t=\([0-9.]*\)$/\1 \2/p' "$out/r0.log" |
    awk 'NR > 1 && $1 >= 6 { print $2 - p } { p = $2 }' >> "$WORK/$mode.times"
}
median() { sort -n "$1" | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

for i in $(seq "$ROUNDS"); do run plain "$i"; run tier "$i"; done
plain=$(median "$WORK/plain.times")
tier=$(median "$WORK/tier.times")
floor=$(memcpy_floor $((3 * MIB)))
echo "memtier stall: ${MIB} MiB extra per rank, $((STEPS - 5)) steps x $ROUNDS rounds: median step $plain s without," \
  "$tier s with a memory checkpoint every $INTERVAL step(s) (ratio $(awk -v a="$tier" -v b="$plain" 'BEGIN { printf "%.2f", a / b }'));" \
  "floor: one memcpy of a rank's state $floor s (its share of the step: $(awk -v f="$floor" -v b="$plain" 'BEGIN { printf "%.2f", f / b }'))"
grep -h "partner\|memory tier" "$WORK"/tier-*/r*.log | sort | uniq -c | sed -n 1,6p
rm -rf "$WORK"
