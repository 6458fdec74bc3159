#!/usr/bin/env bash
# A survivor whose teardown waits on a lost peer still ends in bounded time. Two ranks (dp=2) with last words on;
# rank 1 is frozen (SIGSTOP) mid-run. Rank 0 must see the silence, commit a terminal checkpoint (it holds a full
# replica), and, its program hanging in teardown, be ended by the library CKPT_EXIT_GRACE later with exit status
# 75. With CKPT_EXIT_GRACE=0s the library leaves the program alone. No cluster.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/torch_lib.sh"
"$PY" -c 'import slurm_ckpt' || { echo "test_hooks_exit_grace: needs the built slurm_ckpt module" >&2; exit 1; }
trap 'kill -CONT $(jobs -p) 2>/dev/null || true; kill -KILL $(jobs -p) 2>/dev/null || true' EXIT
hooks=$CKPT_SOURCE_DIR/tests/hooks

# run NAME GRACE: both ranks; rank 1 frozen after 10 steps; rank 0's exit status and seconds from freeze to exit.
run() {
  local name=$1 grace=$2 t0 rc=0
  "$PY" "$hooks/stuck_teardown_rank.py" "$SCRATCH/$name" 1 400 "$grace" 60 > "$SCRATCH/$name-1.log" 2>&1 &
  rank1=$!
  "$PY" "$hooks/stuck_teardown_rank.py" "$SCRATCH/$name" 0 400 "$grace" 60 > "$SCRATCH/$name-0.log" 2>&1 &
  rank0=$!
  for _ in $(seq 400); do grep -q "^rank 1 step 10$" "$SCRATCH/$name-1.log" 2>/dev/null && break; sleep 0.05; done
  grep -q "^rank 1 step 10$" "$SCRATCH/$name-1.log" || { cat "$SCRATCH/$name-"*.log >&2; fail "$name: no training"; }
  kill -STOP "$rank1"
  t0=$(date +%s.%N)
  for _ in $(seq 300); do kill -0 "$rank0" 2>/dev/null || break; sleep 0.05; done
  took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if kill -0 "$rank0" 2>/dev/null; then
    status=running
    kill -KILL "$rank0"
  else
    wait "$rank0" || rc=$?
    status=$rc
  fi
  kill -KILL "$rank1" 2>/dev/null || true
  wait 2>/dev/null || true
}

run ended 1s
[ "$status" = 75 ] || { cat "$SCRATCH/ended-0.log" >&2; fail "rank 0 ended with '$status', expected 75"; }
assert_contains "$SCRATCH/ended-0.log" "last words: committed the terminal checkpoint"
assert_contains "$SCRATCH/ended-0.log" "ending it with exit status 75"
assert_not_contains "$SCRATCH/ended-0.log" "teardown returned"
awk -v t="$took" 'BEGIN { exit !(t < 8) }' || fail "rank 0 ended $took s after the freeze (bound 8 s)"
pass "rank 1 frozen: rank 0 committed its last words and was ended $took s after the freeze (grace 1 s), status 75"

run left 0s
[ "$status" = running ] || { cat "$SCRATCH/left-0.log" >&2; fail "with CKPT_EXIT_GRACE=0s rank 0 ended ($status)"; }
assert_contains "$SCRATCH/left-0.log" "last words: committed the terminal checkpoint"
assert_not_contains "$SCRATCH/left-0.log" "ending it with exit status"
pass "CKPT_EXIT_GRACE=0s: the library left the hanging program alone for 15 s"
finish
