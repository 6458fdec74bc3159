#!/usr/bin/env bash
# The CUDA backend on a real GPU; reports itself skipped (77) where the library has no CUDA or no GPU is attached.
set -euo pipefail
BIN=${CKPT_BUILD_DIR:?}/tests/hooks_gpu_test
if [ ! -x "$BIN" ]; then
  echo "test_hooks_gpu: built without CUDA; skipped"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$BIN" "$work/ckpt"
