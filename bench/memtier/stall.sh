#!/usr/bin/env bash
# The memory tier's cost per step (a benchmark, not a test): slurm-examples/train_ddp.py as 2 local ranks
# (torchrun-style, each told it runs on a node of its own: SLURMD_NODENAME, LOCAL_WORLD_SIZE=1, so each keeps the
# other's copy) with MIB of extra parameters per rank (AdamW: three times that in each checkpoint), last words on,
# no periodic checkpoint; once without the memory tier and once with a memory checkpoint every INTERVAL steps,
# ROUNDS times each, alternating. Prints the median step time of each (steps 6 on), their ratio, and the floor: one
# memcpy of a rank's state (weights and AdamW's moments) on this host, measured in the same run, and the median
# time the checkpoints held a step (the stall: the snapshot and its guard, the Checkpointer's own count).
# DEVICE_S > 0 adds DEVICE_S seconds a step without CPU (train_ddp.py --step-sleep): the share of a GPU node's step
# in which the device computes and the host's cores are free for the copies, as they are not when this host's
# cores do all of the training.
#   bench/memtier/stall.sh [MIB] [STEPS] [ROUNDS] [INTERVAL] [DEVICE_S]
#   (default 256 MiB, 25 steps, 2 rounds, every step, 0; CKPT_BUILD_DIR or build/)
set -euo pipefail
MIB=${1:-256}
STEPS=${2:-25}
ROUNDS=${3:-2}
INTERVAL=${4:-1}
DEVICE_S=${5:-0}
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
      /usr/bin/python3 "$SRC/slurm-examples/train_ddp.py" --steps "$STEPS" --log-every 1 --log-time --log-stall \
      --step-sleep "$DEVICE_S" --extra-mib "$MIB" --out "$out/final" > "$out/r$r.log" 2>&1 &
  done
  wait
  sed -n 's/^train_ddp: step \([0-9]*\) .* t=\([0-9.]*\)$/\1 \2/p' "$out/r0.log" |
    awk 'NR > 1 && $1 >= 6 { print $2 - p } { p = $2 }' >> "$WORK/$mode.times"
  cat "$out"/r*.log | sed -n 's/^train_ddp: rank [0-9]* step \([0-9]*\) stall \([0-9.]*\) .*/\1 \2/p' |
    awk '$1 >= 6 { print $2 }' >> "$WORK/$mode.stalls"
  grep -h "^train_ddp: rank [0-9]* step $STEPS stall" "$out"/r*.log >> "$WORK/$mode.counts"
}
median() { sort -n "$1" | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

for i in $(seq "$ROUNDS"); do run plain "$i"; run tier "$i"; done
plain=$(median "$WORK/plain.times")
tier=$(median "$WORK/tier.times")
floor=$(memcpy_floor $((3 * MIB)))
stall=$(median "$WORK/tier.stalls")
echo "memtier stall: ${MIB} MiB extra per rank, $((STEPS - 5)) steps x $ROUNDS rounds, $DEVICE_S s a step without CPU:" \
  "median step $plain s without," \
  "$tier s with a memory checkpoint every $INTERVAL step(s) (ratio $(awk -v a="$tier" -v b="$plain" 'BEGIN { printf "%.2f", a / b }'));" \
  "floor: one memcpy of a rank's state $floor s (its share of the step: $(awk -v f="$floor" -v b="$plain" 'BEGIN { printf "%.2f", f / b }'));" \
  "stall, median per step of both ranks: $stall s ($(awk -v s="$stall" -v b="$plain" 'BEGIN { printf "%.3f", s / b }') of the step without)"
sed 's/.* step [0-9]* stall [0-9.]* /at the end, each rank and round: /' "$WORK/tier.counts" | sort | uniq -c
grep -h "^ckpt: .*memory tier\|^ckpt: .*partner" "$WORK"/tier-*/r*.log | sort | uniq -c | sed -n 1,6p
rm -rf "$WORK"
