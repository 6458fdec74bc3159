#!/usr/bin/env bash
# Builds the hooks stress test with ThreadSanitizer in a scratch build dir and runs it; a TSAN report fails it.
# First a control run without the guard must produce a report: proof that this harness would see a real one.
# Then the unit tests of the threads the stress test does not start run under TSAN too (ckpt_thread_tests): the last
# words (heartbeat mesh, agreement, terminal writes, with a rank SIGKILLed in a child process), the NCCL watcher and
# the pace tree of the straggler detector.
set -euo pipefail
# Its build and its runs are CPU work with no time bound: at the lowest priority they take what the cluster tests
# running beside it (ctest -j) leave, and never slow those.
renice -n 19 $$ > /dev/null
SRC=${CKPT_SOURCE_DIR:?}
SCRATCH=${CKPT_TSAN_BUILD_DIR:-${CKPT_BUILD_DIR:-/tmp}/hooks-tsan}
mkdir -p "$SCRATCH"
echo "test_hooks_tsan: building hooks_stress with -fsanitize=thread in $SCRATCH"
# -O1 -g1 (ThreadSanitizer's advice, with line tables for its reports): the build takes 3.1 min of a 2-core host
# against 4.9 min at RelWithDebInfo, and the runs take as long (their time is waits, not code).
cmake -S "$SRC" -B "$SCRATCH" -DCMAKE_BUILD_TYPE=None \
  "-DCMAKE_C_FLAGS=-fsanitize=thread -O1 -g1" "-DCMAKE_CXX_FLAGS=-fsanitize=thread -O1 -g1" \
  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread \
  -DCKPT_BUILD_SPANK=OFF -DCKPT_WITH_CUDA=OFF -DCKPT_BUILD_PYTHON=OFF >"$SCRATCH/configure.log" 2>&1 ||
  { cat "$SCRATCH/configure.log" >&2; exit 1; }
cmake --build "$SCRATCH" --target hooks_stress ckpt_thread_tests -j"$(nproc)" >"$SCRATCH/build.log" 2>&1 ||
  { tail -50 "$SCRATCH/build.log" >&2; exit 1; }
BIN=$SCRATCH/tests/hooks_stress
# grep -c reads all its input: grep -q would close the pipe early and pipefail would report nm's SIGPIPE.
instrumented() { [ "$(nm "$@" 2>/dev/null | grep -c __tsan_)" -gt 0 ]; }
instrumented "$BIN" || { echo "test_hooks_tsan: $BIN is not instrumented" >&2; exit 1; }
instrumented -D "$SCRATCH/hooks/libckpt.so" || { echo "test_hooks_tsan: libckpt.so is not instrumented" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 ${TSAN_OPTIONS:-}"

set +e
"$BIN" --dir "$work/control" --ranks 1 --steps 40 --mib 1 --interval 2steps --min-checkpoints 1 --no-guard \
  >"$work/control.log" 2>&1
rc=$?
set -e
if [ "$rc" -ne 66 ] || ! grep -q "WARNING: ThreadSanitizer: data race" "$work/control.log"; then
  echo "test_hooks_tsan: the unguarded control run gave no TSAN report (exit $rc); the check would be blind" >&2
  tail -20 "$work/control.log" >&2
  exit 1
fi
echo "test_hooks_tsan: control run without the guard reported a race, as it must"

"$BIN" --dir "$work/steps" --ranks 2 --steps 400 --mib 1 --interval 5steps --min-checkpoints 80
# Timed checkpoints are asked for a few steps ahead, and the request crosses the heartbeat network. At the lowest
# priority, under TSAN and beside the cluster tests, that can take longer than two 3 ms steps: a lead of 40 steps
# gives it 120 ms.
"$BIN" --dir "$work/time" --ranks 2 --steps 800 --mib 1 --interval 1s --step-us 3000 --lead 40 --min-checkpoints 2
"$BIN" --dir "$work/notice" --ranks 2 --steps 100000 --mib 1 --interval 20steps --notice-at 60 --min-checkpoints 3
"$BIN" --dir "$work/inline" --ranks 1 --steps 40 --mib 1 --interval 3steps --copy-threads 0 --min-checkpoints 13
# die_after_fork=0: the last-words tests fork a child that plays the rank to be killed; it starts threads of its own.
TSAN_OPTIONS="$TSAN_OPTIONS die_after_fork=0" "$SCRATCH/tests/ckpt_thread_tests" >"$work/unit.log" 2>&1 ||
  { tail -60 "$work/unit.log" >&2; echo "test_hooks_tsan: the last-words, NCCL and pace unit tests failed under TSAN" >&2; exit 1; }
tail -2 "$work/unit.log"
echo "test_hooks_tsan: no ThreadSanitizer report"
