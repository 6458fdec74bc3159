#!/usr/bin/env bash
# ckpt export of a slurm_ckpt.torch checkpoint, read back by an independent safetensors reader and stock
# torch.load (tests/hooks/export_test.py). No cluster.
set -euo pipefail
: "${CKPT_BUILD_DIR:?}"
source "${CKPT_SOURCE_DIR:?}/tests/integration/torch_lib.sh"
have_torch || { echo "test_export: needs python3-torch and a built slurm_ckpt" >&2; exit 1; }
export CKPT_CLI=$CKPT_BUILD_DIR/cli/ckpt
[ -x "$CKPT_CLI" ] || { echo "test_export: $CKPT_CLI is not built" >&2; exit 1; }
cd "$(mktemp -d)"
trap 'rm -rf "$PWD"' EXIT
TMPDIR=$PWD "$PY" "${CKPT_SOURCE_DIR:?}/tests/hooks/export_test.py"
