#!/usr/bin/env bash
# The PyTorch helper (slurm_ckpt.torch) from the build tree: bitwise restore, resume, notices, errors.
set -euo pipefail
: "${CKPT_BUILD_DIR:?}"
source "${CKPT_SOURCE_DIR:?}/tests/integration/torch_lib.sh"
have_torch || { echo "test_torch_helper: needs python3-torch and a built slurm_ckpt" >&2; exit 1; }
cd "$(mktemp -d)"
trap 'rm -rf "$PWD"' EXIT
"$PY" "${CKPT_SOURCE_DIR:?}/tests/hooks/torch_helper_test.py"
