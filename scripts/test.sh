#!/usr/bin/env bash
# Runs every test: installs the packages, builds, and runs ctest (unit, slurm, torch; gpu tests report
# themselves skipped where no GPU is present). The slurm tests bring the local 4-node cluster up and down.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
ctest --test-dir "${CKPT_BUILD_DIR:-$PWD/build}" --output-on-failure --timeout 900 "$@"
