#!/usr/bin/env bash
# Runs every test: installs the packages, builds, and runs ctest (unit, slurm, torch; gpu tests report
# themselves skipped where no GPU is present). The slurm tests bring two local 4-node clusters up and down and
# run as two chains beside the other tests (CKPT_TEST_JOBS, default 3, tests at a time). Ends with the ten
# slowest tests of the run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build=${CKPT_BUILD_DIR:-$PWD/build}
log=$build/ctest-output.log
set +e
ctest --test-dir "$build" --output-on-failure --timeout 900 -j"${CKPT_TEST_JOBS:-3}" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
echo "the ten slowest tests (seconds):"
# A report, never the verdict: awk reads all of it (a `head` closing the pipe early made sort die of SIGPIPE, and
# pipefail gave the run exit code 141), and nothing here changes the exit code.
sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: (.*[^ .]) \.+ *[^ ].* ([0-9]+\.[0-9]+) sec$/\2 \1/p' "$log" |
  sort -rn | awk 'NR <= 10 { printf "  %8.1f  %s\n", $1, substr($0, index($0, " ") + 1) }' || true
exit "$rc"
