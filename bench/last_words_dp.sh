#!/usr/bin/env bash
# The catchable fraction of last words at a realistic state size, on the real local cluster (a benchmark, not a
# test). Runs slurm-examples/train_ddp.py on 3 nodes (pure data parallelism, CKPT_LAYOUT=dp=3, no periodic
# checkpoint) with MIB of extra parameters per rank (AdamW: three times that in the checkpoint), N times; each time
# one of its nodes is crashed at a random moment of a random step, so the crash falls in the all-reduce, the update
# or between, as often as each takes. A run is caught when the survivors commit a terminal checkpoint at most one
# step behind the step they had reached.
#
# The rule before survivors let a pure data-parallel update end is counted in the same runs: a run whose survivors
# had to let their update end ("let the update of step N end before reporting") was caught mid-update, which that
# rule disqualified.
#
# MODE zero1: the optimizer state sharded (ZeroRedundancyOptimizer, --zero1) and the memory tier on (a memory
# checkpoint every step, each rank's copy on the next node): the dead rank's optimizer shard exists only in its
# partner's copy, so without the tier no run is caught. Counts the runs whose terminal checkpoint took the dead
# rank's shard from that copy.
#   bench/last_words_dp.sh [MIB] [N] [dp|zero1]  (default 256 MiB, 20 runs, dp; cluster up; CKPT_BUILD_DIR or build/)
set -euo pipefail
MIB=${1:-256}
N=${2:-20}
MODE=${3:-dp}
case $MODE in
  dp) mode_args=(--ckpt-last-words=on) train_args=() ;;
  zero1) mode_args=(--ckpt-last-words=on --ckpt-memory=4G) train_args=(--zero1) ;;
  *) echo "last_words_dp: MODE '$MODE': expected dp or zero1" >&2; exit 2 ;;
esac
source "$(dirname "$0")/crash_lib.sh"
WORK=$(bench_work lwdp)

printf '%4s %5s %9s %9s %6s %9s %7s %7s\n' run node reached terminal lost finished caught copy > "$WORK/table"
for i in $(seq "$N"); do
  run=$WORK/run$i
  mkdir -p "$run"
  victim=n$((1 + RANDOM % 3))
  # shellcheck disable=SC2097,SC2098
  CKPT_LAYOUT=$([ "$MODE" = dp ] && echo dp=3) MASTER_ADDR=$(rendezvous_addr) MASTER_PORT=$(free_port) \
    srun -N3 -n3 -w 'n[1-3]' -J "bench-lwdp-$i" --ckpt-interval=100000steps "${mode_args[@]}" \
    --ckpt-dir="$run/ckpt" "$PY" "$SRC/slurm-examples/train_ddp.py" "${train_args[@]}" --steps 100000 --log-every 1 \
    --log-time --extra-mib "$MIB" --out "$run/final" > "$run/log" 2>&1 &
  pid=$!
  # Past the first steps, then a random moment inside a step: the step time is measured from the log.
  for _ in $(seq 2400); do
    s=$(logged_step "$run/log"); [ -n "$s" ] && [ "$s" -ge 4 ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  step_s=$(sed -n 's/^train_ddp: step [0-9]* .* t=\([0-9.]*\)$/\1/p' "$run/log" | tail -2 |
    awk 'NR == 1 { a = $1 } NR == 2 { print $1 - a }')
  sleep "$(awk -v s="${step_s:-1}" -v r="$RANDOM" 'BEGIN { printf "%.3f", s * (2 + r / 32768) }')"
  reached=$(logged_step "$run/log")
  "$SRC/tests/cluster.sh" crash-node "$victim" > /dev/null 2>&1
  for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  "$SRC/tests/cluster.sh" revive-node "$victim" > /dev/null 2>&1
  # The step the survivors had reached: the last one logged (rank 0 logs; when rank 0 died, the step before the
  # crash as this script saw it).
  after=$(logged_step "$run/log")
  [ -n "$after" ] && [ "$after" -gt "${reached:-0}" ] && reached=$after
  term=$(sed 's/^0*//; s/^$/0/' "$run/ckpt/latest" 2>/dev/null || echo none)
  finished=no copy=no
  grep -q "last words: let the update of step [0-9]* end before reporting" "$run/log" && finished=yes
  grep -q "last words: wrote rank [0-9]*'s terminal shard of step [0-9]* from its partner copy" "$run/log" && copy=yes
  if [ "$term" = none ]; then
    printf '%4s %5s %9s %9s %6s %9s %7s %7s\n' "$i" "$victim" "$reached" - - "$finished" no "$copy" >> "$WORK/table"
  else
    lost=$(( reached > term ? reached - term : 0 ))
    caught=$([ "$lost" -le 1 ] && echo yes || echo no)
    printf '%4s %5s %9s %9s %6s %9s %7s %7s\n' "$i" "$victim" "$reached" "$term" "$lost" "$finished" "$caught" \
      "$copy" >> "$WORK/table"
  fi
  rm -rf "$run/ckpt"  # MIB x 3 per rank: the disk is not the measurement
done
victim=""
cat "$WORK/table"
if [ "$MODE" = dp ]; then
  awk -v mib="$MIB" 'NR > 1 { n++; if ($7 == "yes") { c++; if ($6 == "no") old++ } }
    END { printf "%d MiB per rank: caught %d of %d (%.0f%%); under the rule that disqualified an update in progress, %d of %d (%.0f%%)\n",
      mib, c, n, 100 * c / n, old, n, 100 * old / n }' "$WORK/table"
else
  awk -v mib="$MIB" 'NR > 1 { n++; if ($7 == "yes") c++; if ($4 != "-") { t++; lost[$5]++ }; if ($8 == "yes") p++ }
    END { printf "ZeRO-1, %d MiB per rank, memory tier: caught %d of %d (%.0f%%); a terminal checkpoint in %d, the dead rank'"'"'s shard from its partner copy in %d; steps lost:", mib, c, n, 100 * c / n, t, p
      sep = " "; for (k in lost) { printf "%s%s in %d", sep, k, lost[k]; sep = ", " }
      print "; without the tier none (the shard is nowhere else)" }' "$WORK/table"
fi
echo "(runs kept in $WORK)"
