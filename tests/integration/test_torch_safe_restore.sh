#!/usr/bin/env bash
# A checkpoint cannot make the Python restore run code; a DDP job declares its layout for last words. No cluster.
set -euo pipefail
: "${CKPT_BUILD_DIR:?}"
source "${CKPT_SOURCE_DIR:?}/tests/integration/torch_lib.sh"
have_torch || { echo "test_torch_safe_restore: needs python3-torch and a built slurm_ckpt" >&2; exit 1; }
cd "$(mktemp -d)"
trap 'rm -rf "$PWD"' EXIT
"$PY" "${CKPT_SOURCE_DIR:?}/tests/hooks/torch_safe_restore_test.py"
