# Sourced by the node-crash benchmarks (last_words_crashes.sh, last_words_dp.sh): the source and build dirs, the
# local cluster's Slurm, torch_lib's helpers, and a trap that revives the node a run crashed (`victim`) however the
# script ends.
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CKPT_BUILD_DIR=${CKPT_BUILD_DIR:-$SRC/build}
D=${CKPT_CLUSTER_DIR:-/tmp/slurm-ckpt-cluster}
export SLURM_CONF=${SLURM_CONF:-$D/etc/slurm.conf}
source "$SRC/tests/integration/torch_lib.sh"
victim=""
trap '[ -n "$victim" ] && "$SRC/tests/cluster.sh" revive-node "$victim" > /dev/null 2>&1 || true' EXIT

# bench_work NAME: a new directory for one benchmark's runs, under the cluster's checkpoint dir.
bench_work() { mktemp -d "$D/ckpt/bench-$1.XXXXXX"; }
