# Shared helpers for the integration tests (sourced). Every test runs against the real local cluster or real files.
set -euo pipefail

CKPT_CLUSTER_DIR=${CKPT_CLUSTER_DIR:-/tmp/slurm-ckpt-cluster}
CKPT_SOURCE_DIR=${CKPT_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
CKPT_BUILD_DIR=${CKPT_BUILD_DIR:-$CKPT_SOURCE_DIR/build}
export SLURM_CONF=${SLURM_CONF:-$CKPT_CLUSTER_DIR/etc/slurm.conf}
CLUSTER=$CKPT_SOURCE_DIR/tests/cluster.sh
TEST_USER=${CKPT_TEST_USER:-ckptuser}
TEST_NAME=$(basename "${BASH_SOURCE[1]:-$0}" .sh)
source "$(dirname "${BASH_SOURCE[0]}")/python.sh"
source "$(dirname "${BASH_SOURCE[0]}")/free_port.sh"

# A fresh scratch dir for this test under the cluster's shared checkpoint area, removed on success.
SCRATCH=$(mktemp -d "$CKPT_CLUSTER_DIR/ckpt/$TEST_NAME.XXXXXX" 2>/dev/null || mktemp -d "/tmp/$TEST_NAME.XXXXXX")
chmod 755 "$SCRATCH"

fail() {
  echo "FAIL: $TEST_NAME: $*" >&2
  echo "(scratch kept in $SCRATCH)" >&2
  exit 1
}
# Each line says when in the test it passed (seconds since the start): where a slow test spends its time.
pass() { echo "ok [${SECONDS}s]: $*"; }

# assert_contains FILE TEXT: FILE holds TEXT literally.
assert_contains() { grep -qF -- "$2" "$1" || { echo "--- $1:" >&2; cat "$1" >&2; fail "expected '$2' in $1"; }; }
assert_not_contains() { ! grep -qF -- "$2" "$1" || { cat "$1" >&2; fail "did not expect '$2' in $1"; }; }

# expect_fail CMD...: the command must exit non-zero; its stderr is left in $SCRATCH/err.
expect_fail() {
  if "$@" >"$SCRATCH/out" 2>"$SCRATCH/err"; then
    cat "$SCRATCH/out" "$SCRATCH/err" >&2
    fail "expected failure: $*"
  fi
}

# wait_job_state JOB REGEX [TIMEOUT]: wait until the job's state matches.
wait_job_state() {
  local job=$1 want=$2 timeout=${3:-60} state=""
  for _ in $(seq $((timeout * 4))); do
    state=$(scontrol show job "$job" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    [[ $state =~ $want ]] && return 0
    sleep 0.25
  done
  fail "job $job is '$state', expected $want"
}

# wait_nodes_idle N [TIMEOUT]: wait until N nodes are idle and responding. srun returns while its nodes still
# complete the job; a job allowed fewer nodes (-N3-4) submitted then starts without the ones still completing.
wait_nodes_idle() {
  local want=$1 timeout=${2:-30}
  for _ in $(seq $((timeout * 10))); do
    # Not `sinfo -t idle`: it lists nodes that are still completing a job too.
    [ "$(sinfo -h -N -r -o '%N %T' | awk '$2 == "idle" { print $1 }' | sort -u | wc -l)" -ge "$want" ] && return 0
    sleep 0.1
  done
  fail "fewer than $want nodes idle after ${timeout} s: $(sinfo -h -N -o '%N %T' | tr '\n' ' ')"
}

# now: this host's clock, seconds since the epoch; since A B: B - A in seconds, one decimal.
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
# The cluster's SlurmdTimeout, in seconds.
slurmd_timeout() { scontrol show config | sed -n 's/^SlurmdTimeout *= *\([0-9]*\) sec.*/\1/p'; }

finish() {
  rm -rf "$SCRATCH"
  echo "PASS: $TEST_NAME"
}
