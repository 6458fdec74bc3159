#!/usr/bin/env bash
# Restart in place on the real local cluster (a benchmark, not a test): slurm-examples/train_ddp.py on 3 nodes
# plus 1 spare under `ckpt-run --spares 1` (one step per node, --no-kill) and the recovery controller. Each run
# kills (crash: SIGKILL), freezes (SIGSTOP) or cuts off (partition: its link down, its processes running on; the
# namespace cluster only) one training node at a random step; the survivors stay alive, the spare takes the lost
# node's rank over, and training goes on in the same processes. A cut-off node's link comes back once training
# ended: its rank must change nothing. The baseline, mode
# `requeue`, is the same crash without a spare (a 3-node allocation): the survivors hand over, and the controller
# requeues the job off the dead node. Mode `shrink` is the same crash without a spare under --ckpt-shrink=on: the
# survivors go on in place as 2 data-parallel replicas (its weights differ from the reference's by design: the
# global batch changed). Mode `stuck` is the crash with the spare where rank 0 (the recovery's root) cannot unwind
# after the peer loss (tests/integration/stuck_train.py blocks it, as gloo blocks a survivor caught in a send it
# never fails): the survivors give up in place and ckpt-run relaunches the node steps inside the allocation, the
# spare node in the dead one's place (the requeue it replaced is mode `requeue`); `stuck-partition` is the same
# with the node cut off instead of crashed (its step runs on where Slurm cannot reach it; the relaunch's epoch fences
# its rank out of the checkpoint dir; its link comes back once training ended). Prints per run and as medians the time from the failure to the first
# completed step after it, split (in place) into detection, agreement, last words, group re-formation, state load
# and first step; the floors (the heartbeat timeout, one step); the steps lost; and whether the final weights
# are bitwise identical to an uninterrupted run's; and the bytes the ranks read from the checkpoint dir at the
# restore, against those they found in memory (-s runs each mode once per state source: `memory`, the default,
# where a recovered generation takes the survivors' state from memory, and `files`, every rank reading its shard;
# -x adds MiB of parameters per rank: train_ddp.py --extra-mib, three times that with AdamW's state). -z trains
# with ZeRO-1 (train_ddp.py --zero1: each rank alone holds AdamW's state of its partition of the parameters,
# whole ones) and the memory tier (--ckpt-memory, a checkpoint in memory every step, its copy on the
# next node's rank) instead of periodic checkpoints: the replacement's state comes from the partner's copy. -p runs
# that many ranks on each node (1; a GPU node runs one per GPU): the spare takes over all of the lost node's ranks.
#   bench/inplace/run.sh [-n RUNS] [-r REQUEUE_RUNS (3)] [-m "crash freeze partition requeue shrink stuck stuck-partition"] [-t HEARTBEAT_TIMEOUT]
#                        [-s "memory files"] [-x EXTRA_MIB] [-z] [-p RANKS_PER_NODE] [-o DIR]
# (cluster up; CKPT_BUILD_DIR set or build/ in the source tree). The batch host (n1) is never the victim: its
# failure ends the batch script, and with it any Slurm job; that case takes the requeue path.
set -euo pipefail
RUNS=10 REQUEUE_RUNS=3 MODES="crash freeze partition requeue" HB=1s OUT="" STATES=memory EXTRA=0 ZERO1="" PER_NODE=1
while getopts "n:r:m:t:o:s:x:zp:" o; do
  case $o in
    n) RUNS=$OPTARG ;; r) REQUEUE_RUNS=$OPTARG ;; m) MODES=$OPTARG ;; t) HB=$OPTARG ;; o) OUT=$OPTARG ;;
    s) STATES=$OPTARG ;; x) EXTRA=$OPTARG ;; z) ZERO1=1 ;; p) PER_NODE=$OPTARG ;;
    *) sed -n '2,30p' "$0" >&2; exit 2 ;;
  esac
done
SRC=$(cd "$(dirname "$0")/../.." && pwd)
export CKPT_BUILD_DIR=${CKPT_BUILD_DIR:-$SRC/build}
D=${CKPT_CLUSTER_DIR:-/tmp/slurm-ckpt-cluster}
export SLURM_CONF=${SLURM_CONF:-$D/etc/slurm.conf}
source "$SRC/tests/integration/torch_lib.sh"
CKPT_SOURCE_DIR=$SRC CKPT_CLUSTER_DIR=$D
source "$SRC/tests/integration/controller_lib.sh"
"$SRC/tests/cluster.sh" up > /dev/null  # first, so that the run dir can live under the cluster's checkpoint area
WORK=${OUT:-$(mktemp -d "$D/ckpt/bench-inplace.XXXXXX")}
mkdir -p "$WORK"
chmod 755 "$WORK"
STEPS=60
# How long a run may take: 2 minutes, and 2 s more per MiB of extra state and rank on a node (a 256 MiB run's step
# takes about 2 s here with 1 rank a node, its all-reduce and AdamW on 2 cores).
WAIT_S=$((120 + 2 * EXTRA * PER_NODE))
# -z: no periodic checkpoint; the memory tier's budget is two snapshots in staging and two copies of a ward's state
# (1 + 2/3 times the extra parameters per rank under ZeRO-1 over 3 ranks), with room for the model.
TRAIN_ARGS="--ckpt-interval-steps 10" SBATCH_ARGS=()
if [ -n "$ZERO1" ]; then
  TRAIN_ARGS="--ckpt-interval-steps 100000 --zero1"
  SBATCH_ARGS=(--ckpt-memory=$((8 * EXTRA + 256))M)
fi
victim="" job="" mode=""
# Brings the victim back: its link first when it was cut off, then its daemons and its state in Slurm.
restore_victim() {
  case "$mode" in partition | stuck-partition) "$SRC/tests/cluster.sh" heal-node "$victim" > /dev/null 2>&1 ;; esac
  "$SRC/tests/cluster.sh" revive-node "$victim" > /dev/null 2>&1
}
cleanup() {
  [ -n "$job" ] && scancel "$job" 2>/dev/null || true
  [ -n "$victim" ] && restore_victim || true
  controller_down
}
trap cleanup EXIT
controller_up "$WORK" "${CKPT_BENCH_CONTROLLER_PORT:-16870}" > /dev/null || { echo "no controller" >&2; exit 1; }

cat > "$WORK/job.sbatch" <<JOB
#!/bin/bash
#SBATCH --no-kill --requeue --open-mode=append
export PYTHONPATH=$PYTHONPATH CKPT_HEARTBEAT_TIMEOUT=$HB CKPT_CONTROLLER_URL=$CONTROLLER_URL
echo "run \${SLURM_RESTART_COUNT:-0} on \$SLURM_JOB_NODELIST"
$CKPT_BUILD_DIR/ckpt-run/ckpt-run --spares 1 srun -N3 --ntasks-per-node=$PER_NODE $PY $SRC/slurm-examples/train_ddp.py \\
  --steps $STEPS $TRAIN_ARGS --step-sleep 0.1 --log-every 1 --log-time --extra-mib $EXTRA "\$@"
JOB
sed "s|slurm-examples/train_ddp.py|tests/integration/stuck_train.py|" "$WORK/job.sbatch" > "$WORK/stuck.sbatch"

# submit NAME NODES [SBATCH OPTION...]: the job into $WORK/NAME (log, ckpt, final weights); sets `job`.
submit() {
  mkdir -p "$WORK/$1"
  local script=$WORK/job.sbatch
  case "${mode:-}" in stuck | stuck-partition) script=$WORK/stuck.sbatch ;; esac
  job=$(STUCK_RANK=0 CKPT_INPLACE_STATE=${state:-memory} sbatch --parsable -N "$2" --ntasks-per-node="$PER_NODE" -J "bench-inplace-$1" -o "$WORK/$1/log" \
    --ckpt-last-words=on --ckpt-dir="$WORK/$1/ckpt" "${SBATCH_ARGS[@]}" "${@:3}" "$script" --out "$WORK/$1/final")
}
wait_done() {
  for _ in $(seq $((WAIT_S * 5))); do squeue -h -j "$job" 2>/dev/null | grep -q . || return 0; sleep 0.2; done
  scancel "$job"
  return 1
}
logged() { { sed -n 's/^train_ddp: step \([0-9]*\) .*/\1/p' "$1" 2>/dev/null || true; } | tail -1; }

submit reference 4
wait_done
[ -s "$WORK/reference/final.sha256" ] || { cat "$WORK/reference/log" >&2; echo "the uninterrupted run failed" >&2; exit 1; }
echo "reference: $(cat "$WORK/reference/final.sha256")"
[ "$EXTRA" -gt 0 ] && rm -rf "$WORK/reference/ckpt" "$WORK/reference/final"

for state in $STATES; do
for mode in $MODES; do
  runs=$RUNS
  [ "$mode" = requeue ] && runs=$REQUEUE_RUNS
  for i in $(seq "$runs"); do
    name=$mode$i
    [ "$STATES" = memory ] || name=$mode-$state$i
    at=$((15 + RANDOM % 20))
    victim=n$((2 + RANDOM % 2))
    nodes=4 action=$mode-node options=()
    [ "$mode" = requeue ] && nodes=3 action=crash-node victim=n3  # no spare; Slurm gives n1..n3
    [ "$mode" = shrink ] && nodes=3 action=crash-node victim=n3 options=(--ckpt-shrink=on)
    [ "$mode" = stuck ] && action=crash-node
    [ "$mode" = stuck-partition ] && action=partition-node
    submit "$name" $nodes "${options[@]}"
    for _ in $(seq $((WAIT_S * 50))); do
      s=$(logged "$WORK/$name/log"); [ -n "$s" ] && [ "$s" -ge "$at" ] && break
      sleep 0.02
    done
    seen=$(logged "$WORK/$name/log")
    t0=$(date +%s.%N)
    "$SRC/tests/cluster.sh" "$action" "$victim" > /dev/null 2>&1
    echo "{\"mode\": \"$mode\", \"state\": \"$state\", \"extra_mib\": $EXTRA, \"ranks_per_node\": $PER_NODE, \"zero1\": ${ZERO1:-0}, \"victim\": \"$victim\", \"failed_unix\": $t0, \"step_at_failure\": ${seen:-0}, \"heartbeat_timeout\": \"$HB\"}" \
      > "$WORK/$name/failure.json"
    # Training ends before Slurm has given up on the victim: revive it then, so the job can complete.
    for _ in $(seq $((WAIT_S * 5))); do
      [ -s "$WORK/$name/final.sha256" ] || ! squeue -h -j "$job" 2>/dev/null | grep -q . && break
      sleep 0.2
    done
    restore_victim
    wait_done || echo "$name: the job did not end in $WAIT_S s" >&2
    victim=""
    echo "$name: $(grep -c '^train_ddp: step' "$WORK/$name/log") step lines, $(grep -o 'in-place recovery [0-9]*:.*' "$WORK/$name/log" | head -1)"
    # At -x sizes a run leaves gigabytes (two checkpoints of three ranks, the final weights); the report reads
    # only the log, the failure record and the weights' digest.
    [ "$EXTRA" -gt 0 ] && rm -rf "$WORK/$name/ckpt" "$WORK/$name/final"
  done
done
done
"$PY" "$SRC/bench/inplace/report.py" "$WORK"
