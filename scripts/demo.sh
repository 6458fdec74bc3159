#!/usr/bin/env bash
# The main job: installs what is needed, builds, brings up the local 4-node Slurm cluster and runs a job with
# --ckpt-* options, showing what every rank receives.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh > /tmp/slurm-ckpt-install.log
scripts/build.sh > /tmp/slurm-ckpt-build.log
export CKPT_BUILD_DIR=${CKPT_BUILD_DIR:-$PWD/build}
tests/cluster.sh up
eval "$(tests/cluster.sh env)"
D=${CKPT_CLUSTER_DIR:-/tmp/slurm-ckpt-cluster}

echo "== srun -N4 -n4 --ckpt-interval=15m --ckpt-keep=2: what each rank sees"
srun -N4 -n4 --ckpt-interval=15m --ckpt-keep=2 \
  bash -c 'echo "rank $SLURM_PROCID on $SLURMD_NODENAME: $(env | grep ^CKPT_ | sort | tr "\n" " ")"' | sort
echo "== a bad value is refused before anything runs"
srun -N1 --ckpt-interval=-5 true || true
echo "== the cluster stays up; stop it with: tests/cluster.sh down (logs in $D/log)"
