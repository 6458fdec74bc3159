#!/usr/bin/env bash
# The CUDA backend and the NCCL watcher on a real GPU; reports itself skipped (77) where the library has no CUDA or
# no GPU is attached.
set -euo pipefail
BIN=${CKPT_BUILD_DIR:?}/tests/hooks_gpu_test
NCCL_BIN=${CKPT_BUILD_DIR:?}/tests/hooks_nccl_gpu_test
if [ ! -x "$BIN" ]; then
  echo "test_hooks_gpu: built without CUDA; skipped"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$BIN" "$work/ckpt"  # exits 77 without a GPU, which ends this test as skipped
if [ -x "$NCCL_BIN" ]; then
  "$NCCL_BIN" "$work/nccl"
else
  echo "test_hooks_gpu: FAIL: CUDA is built but the NCCL test is not (NCCL library or header missing)"
  exit 1
fi
