#!/usr/bin/env bash
# A second death while a job recovers in place (a benchmark, not a test): train_ddp.py as 3 ranks and 2 spares on
# this host (tests/integration/inplace_local_lib.sh, as test_inplace_local runs them), at the default join timeout.
# Rank 2 is killed; then, per case, the spare that takes it over dies at once after its claim (`replacement`) or
# 50 ms after it (`replacement-late`: its group formed, its heartbeat mesh not yet), or rank 1 dies as soon as the
# terminal checkpoint is committed (`survivor`). Prints per run, and as medians, the seconds from the first death's
# detection to the first step of the generation that finally formed, and whether the final weights are bitwise
# those of an uninterrupted run. -b DIR runs each case with the slurm_ckpt package in DIR too, in the same run
# (a copy of an earlier build's python/ dir: the library before).
#   bench/inplace/second_death.sh [-n RUNS (3)] [-b PYTHON_DIR_BEFORE]
set -euo pipefail
RUNS=3 BEFORE=""
while getopts "n:b:" o; do
  case $o in
    n) RUNS=$OPTARG ;; b) BEFORE=$OPTARG ;;
    *) sed -n '2,10p' "$0" >&2; exit 2 ;;
  esac
done
SRC=$(cd "$(dirname "$0")/../.." && pwd)
export CKPT_SOURCE_DIR=$SRC CKPT_BUILD_DIR=${CKPT_BUILD_DIR:-$SRC/build}
source "$SRC/tests/integration/torch_lib.sh"
source "$SRC/tests/integration/inplace_local_lib.sh"
W=$(mktemp -d /tmp/bench_second_death.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done' EXIT
fail() { echo "second_death: $*" >&2; exit 1; }
AFTER=$CKPT_BUILD_DIR/python
export JOIN_TIMEOUT=15  # the default: what a job without CKPT_INPLACE_JOIN_TIMEOUT waits

launch reference 0
[ -s "$W/reference/final" ] || fail "the uninterrupted run wrote no weights (logs in $W/reference)"

# one LIBRARY CASE RUN: prints "LIBRARY CASE SECONDS bitwise|DIFFERS"
one() {
  local lib=$1 case=$2 name="$1-$2-$3" first last
  local path=$AFTER
  [ "$lib" = before ] && path=$BEFORE
  case $case in
    replacement) PYTHONPATH=$path KILL_REPLACEMENT=0 launch "$name" 2 2 KILL 10 ;;
    replacement-late) PYTHONPATH=$path KILL_REPLACEMENT=0.05 launch "$name" 2 2 KILL 10 ;;
    survivor) PYTHONPATH=$path KILL_SURVIVOR=1 launch "$name" 2 2 KILL 12 ;;
  esac
  first=$(grep -ho 'detected at unix [0-9.]*' "$W/$name/log0" | head -1 | awk '{print $4}')
  last=$(grep -h 'in-place recovery {' "$W/$name"/log* | grep -o '"first_step": *[0-9.]*' | tail -1 | sed 's/.*: *//')
  [ -n "$first" ] && [ -n "$last" ] || { echo "$lib $case - (no recovery: logs in $W/$name)"; return; }
  echo "$lib $case $(awk -v a="$first" -v b="$last" 'BEGIN {printf "%.2f", b - a}') $(
    cmp -s "$W/reference/final" "$W/$name/final" && echo bitwise || echo DIFFERS)"
}

libs=after
[ -n "$BEFORE" ] && libs="before after"
for run in $(seq "$RUNS"); do
  for lib in $libs; do
    for case in replacement survivor replacement-late; do one "$lib" "$case" "$run"; done
  done
done | tee "$W/runs"
echo "medians (s), first death detected -> first step of the generation that formed:"
for lib in $libs; do
  for case in replacement survivor replacement-late; do
    awk -v l="$lib" -v c="$case" '$1 == l && $2 == c && $3 != "-" {print $3}' "$W/runs" | sort -n |
      awk -v l="$lib" -v c="$case" '{v[NR] = $1}
        END {if (NR) printf "  %-6s %-17s %6.2f (%d runs)\n", l, c, v[int((NR + 1) / 2)], NR}'
  done
done
rm -rf "$W"
