#!/usr/bin/env bash
# The main job: a real 3-node PyTorch training job on the local Slurm cluster survives an injected node crash.
# It installs and builds what is needed, starts the local 4-node cluster and the recovery controller, runs the
# training once uninterrupted for reference, then again with one node crashed mid-run: the plugin reports the
# failure, the controller requeues the job off the dead node, the job resumes from the newest complete checkpoint,
# and its final weights are compared bit for bit with the reference.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
export CKPT_BUILD_DIR=${CKPT_BUILD_DIR:-$SRC/build}

say() { printf '\n== %s\n' "$*"; }
die() { echo "demo: $*" >&2; exit 1; }

say "installing packages and building (logs in /tmp/slurm-ckpt-*.log)"
scripts/install-deps.sh > /tmp/slurm-ckpt-install.log 2>&1 || die "install failed: see /tmp/slurm-ckpt-install.log"
scripts/build.sh > /tmp/slurm-ckpt-build.log 2>&1 || die "build failed: see /tmp/slurm-ckpt-build.log"

say "starting the local cluster (munged, slurmctld, slurmd n1..n4)"
tests/cluster.sh up
eval "$(tests/cluster.sh env)"
CKPT_DEMO_KEEP=1 exec bash tests/integration/test_demo_recovery.sh
