#!/usr/bin/env bash
# The C ABI, from a C program: errors as one "ckpt:" line, a checkpoint and a bitwise restore.
set -euo pipefail
BIN=${CKPT_BUILD_DIR:?}/tests/hooks_c_api_test
[ -x "$BIN" ] || { echo "test_hooks_c_api: $BIN is not built" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$BIN" "$work/ckpt"
