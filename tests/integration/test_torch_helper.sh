#!/usr/bin/env bash
# The PyTorch helper (slurm_ckpt.torch) from the build tree: bitwise restore, resume, notices, errors.
set -euo pipefail
PY=${CKPT_PYTHON:-/usr/bin/python3}
export PYTHONPATH=${CKPT_BUILD_DIR:?}/python${PYTHONPATH:+:$PYTHONPATH}
"$PY" -c 'import torch, slurm_ckpt.torch' || { echo "test_torch_helper: needs python3-torch and a built slurm_ckpt" >&2; exit 1; }
cd "$(mktemp -d)"
trap 'rm -rf "$PWD"' EXIT
"$PY" "${CKPT_SOURCE_DIR:?}/tests/hooks/torch_helper_test.py"
