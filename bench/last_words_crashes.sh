#!/usr/bin/env bash
# Last words under randomized crashes, on the real local cluster (a benchmark, not a test).
# Runs slurm-examples/train_dp_tp.py (DP2 x TP2) on 4 nodes N times (default 20); each time one random node is
# SIGKILLed at a random step. Reports per run and as medians: detection latency (crash to the first survivor's
# detection), crash to committed terminal checkpoint, and the steps lost (step reached at the crash minus the
# terminal checkpoint's step).
#   bench/last_words_crashes.sh [N]     (cluster up; CKPT_BUILD_DIR set or build/ in the source tree)
set -euo pipefail
N=${1:-20}
source "$(dirname "$0")/crash_lib.sh"
WORK=$(bench_work lw)

printf '%4s %5s %10s %10s %12s %10s\n' run node crash_at detect_ms committed_ms steps_lost > "$WORK/table"
for i in $(seq "$N"); do
  run=$WORK/run$i
  mkdir -p "$run"
  at=$((10 + RANDOM % 25))
  victim=n$((1 + RANDOM % 4))
  MASTER_ADDR=$(rendezvous_addr) MASTER_PORT=$(free_port) srun -N4 -n4 -J "bench-lw-$i" --ckpt-interval=1000steps \
    --ckpt-last-words=on --ckpt-dir="$run/ckpt" "$PY" "$SRC/slurm-examples/train_dp_tp.py" --steps 80 \
    --step-sleep 0.2 --out "$run/final" > "$run/log" 2>&1 &
  pid=$!
  for _ in $(seq 1200); do
    s=$(logged_step "$run/log"); [ -n "$s" ] && [ "$s" -ge "$at" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  seen=$(logged_step "$run/log")
  t0=$(date +%s.%N)
  "$SRC/tests/cluster.sh" crash-node "$victim" > /dev/null 2>&1
  for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  "$SRC/tests/cluster.sh" revive-node "$victim" > /dev/null 2>&1
  detected=$(sed -n 's/.*last words: rank [0-9]* is dead (.*), detected at unix \([0-9.]*\).*/\1/p' "$run/log" | sort -n | sed -n 1p)
  took=$(sed -n 's/.*committed the terminal checkpoint of step [0-9]*, \([0-9.]*\) s after.*/\1/p' "$run/log" | sed -n 1p)
  term=$(sed 's/^0*//; s/^$/0/' "$run/ckpt/latest" 2>/dev/null || echo none)
  if [ -z "$detected" ] || [ -z "$took" ] || [ "$term" = none ]; then
    printf '%4s %5s %10s %10s %12s %10s\n' "$i" "$victim" "$seen" - - "no-ckpt" >> "$WORK/table"
    continue
  fi
  awk -v i="$i" -v n="$victim" -v s="$seen" -v a="$t0" -v b="$detected" -v t="$took" -v term="$term" \
    'BEGIN { lost = s - term; if (lost < 0) lost = 0; printf "%4s %5s %10s %10.0f %12.0f %10d\n", i, n, s, (b - a) * 1000, (b - a + t) * 1000, lost }' \
    >> "$WORK/table"
done
victim=""
cat "$WORK/table"
awk 'NR > 1 && $4 != "-" { d[++n] = $4; c[n] = $5; l[n] = $6 } NR > 1 && $4 == "-" { miss++ }
  function median(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
  END { maxl = 0; for (i = 1; i <= n; i++) if (l[i] > maxl) maxl = l[i]
    printf "runs with a terminal checkpoint: %d of %d; median detection %.0f ms, median crash-to-commit %.0f ms, steps lost max %d\n",
      n, n + miss, median(d, n), median(c, n), maxl }' "$WORK/table"
echo "(runs kept in $WORK)"
