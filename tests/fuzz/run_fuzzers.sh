#!/usr/bin/env bash
# run_fuzzers.sh SECONDS: builds the libFuzzer targets with clang in a scratch build dir and runs each for
# SECONDS. Exits non-zero when a target cannot be built or finds a crash (the input is kept as an artifact).
# CKPT_FUZZ_BUILD_DIR overrides the build dir (default: build-fuzz in the source tree).
set -euo pipefail
renice -n 19 $$ > /dev/null  # CPU work beside the timed cluster tests (ctest -j): the lowest priority

seconds="${1:-}"
if [[ ! "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: run_fuzzers.sh SECONDS" >&2
  exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$(cd "$here/../.." && pwd)"
build="${CKPT_FUZZ_BUILD_DIR:-$src/build-fuzz}"
for tool in clang clang++ cmake; do
  command -v "$tool" >/dev/null || { echo "run_fuzzers: $tool not found" >&2; exit 1; }
done

mkdir -p "$build"
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCKPT_BUILD_FUZZERS=ON -DCKPT_BUILD_SPANK=OFF -DCKPT_WITH_CUDA=OFF >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log" >&2; echo "run_fuzzers: configure failed" >&2; exit 1; }
cmake --build "$build" -j"$(nproc)" --target fuzz_manifest fuzz_record

status=0
for target in manifest record; do
  corpus="$build/fuzz/corpus-$target"
  artifacts="$build/fuzz/artifacts-$target/"
  mkdir -p "$corpus" "$artifacts"
  echo "run_fuzzers: fuzz_$target for ${seconds}s"
  if ! "$build/fuzz/fuzz_$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -dict="$here/store.dict" -artifact_prefix="$artifacts" "$corpus" "$here/corpus/$target" \
      >"$build/fuzz/fuzz_$target.log" 2>&1; then
    tail -n 40 "$build/fuzz/fuzz_$target.log" >&2
    echo "run_fuzzers: fuzz_$target FAILED; inputs in $artifacts" >&2
    status=1
    continue
  fi
  grep -E '^(stat::number_of_executed_units|Done )' "$build/fuzz/fuzz_$target.log" || true
  echo "run_fuzzers: fuzz_$target ok"
done
exit $status
