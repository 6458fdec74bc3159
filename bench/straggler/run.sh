#!/usr/bin/env bash
# Straggler detection on the real local cluster (a benchmark, not a test): slurm-examples/train_ddp.py on 3 nodes
# with last words on (the heartbeat network carries each window's pace) and CKPT_LOG=debug, so that rank 0 logs
# every window the root judged. Two phases:
#  - noise: MINUTES of training while a bursty CPU load runs on the host beside the nodes (a loaded host, no node
#    slower than its peers by design): every flag is a false one.
#  - slow: RUNS jobs, each with one node held to half the CPU its task used (cluster.sh slow-node) at step ~30: the
#    steps from the slowdown to the flag.
# Both phases judge the same windows by slurm-ckpt's rule (below 0.7 of the best for 3 windows in a row, the same
# rank) and by the single-window rule of nvidia-resiliency-ext's straggler detector (a relative score below 0.7
# in one report), and print both side by side (bench/straggler/report.py).
#   bench/straggler/run.sh [-m MINUTES (10)] [-n RUNS (3)] [-o DIR]
# (root; cluster up or brought up; CKPT_BUILD_DIR set or build/ in the source tree).
set -euo pipefail
MINUTES=10 RUNS=3 OUT=""
while getopts "m:n:o:" o; do
  case $o in
    m) MINUTES=$OPTARG ;; n) RUNS=$OPTARG ;; o) OUT=$OPTARG ;;
    *) sed -n '2,13p' "$0" >&2; exit 2 ;;
  esac
done
SRC=$(cd "$(dirname "$0")/../.." && pwd)
export CKPT_BUILD_DIR=${CKPT_BUILD_DIR:-$SRC/build}
D=${CKPT_CLUSTER_DIR:-/tmp/slurm-ckpt-cluster}
export SLURM_CONF=${SLURM_CONF:-$D/etc/slurm.conf}
CKPT_SOURCE_DIR=$SRC
source "$SRC/tests/integration/torch_lib.sh"
CLUSTER=$SRC/tests/cluster.sh
"$CLUSTER" up > /dev/null
WORK=${OUT:-$(mktemp -d "$D/ckpt/bench-straggler.XXXXXX")}
mkdir -p "$WORK"
chmod 755 "$WORK"
job="" slow="" load=()
cleanup() {
  [ -n "$job" ] && scancel "$job" 2>/dev/null || true
  [ -n "$slow" ] && "$CLUSTER" unslow-node "$slow" > /dev/null 2>&1 || true
  for p in "${load[@]}"; do kill -- "-$p" 2>/dev/null || true; done
}
trap cleanup EXIT

write_train_sbatch "$WORK/job.sbatch" "-N3 -n3" train_ddp.py --steps 10000000 --log-every 1 --d-model 96
# submit NAME: the job into $WORK/NAME; sets `job`.
submit() {
  mkdir -p "$WORK/$1"
  job=$(CKPT_LAYOUT=dp=3 CKPT_LOG=debug sbatch --parsable -J "bench-straggler-$1" -o "$WORK/$1/log" \
    --ckpt-interval=1000000steps --ckpt-last-words=on --ckpt-straggler=0.7 --ckpt-dir="$WORK/$1/ckpt" \
    "$WORK/job.sbatch" --out "$WORK/$1/final")
}
stop_job() { scancel "$job" 2>/dev/null || true; for _ in $(seq 300); do squeue -h -j "$job" | grep -q . || break; sleep 0.2; done; job=""; }

echo "noise: $MINUTES min of training beside a bursty load of $(nproc) busy loops on the host"
submit noise
wait_logged_step "$WORK/noise/log" 10 || { tail "$WORK/noise/log" >&2; exit 1; }
for _ in $(seq "$(nproc)"); do
  setsid bash -c 'while :; do timeout "$((1 + RANDOM % 4))" sh -c "while :; do :; done"; sleep "$((RANDOM % 3))"; done' &
  load+=("$!")
done
sleep "$((MINUTES * 60))"
for p in "${load[@]}"; do kill -- "-$p" 2>/dev/null || true; done
load=()
stop_job

for i in $(seq "$RUNS"); do
  submit "slow$i"
  wait_logged_step "$WORK/slow$i/log" 30 || { tail "$WORK/slow$i/log" >&2; exit 1; }
  mapfile -t nodes < <(scontrol show hostnames "$(squeue -h -j "$job" -o %N)")
  slow=${nodes[1]}
  share=$("$CLUSTER" task-cpu "$slow" 2)
  "$CLUSTER" slow-node "$slow" "$(awk -v s="$share" 'BEGIN { f = s / 2; if (f < 0.05) f = 0.05; printf "%.3f", f }')" > /dev/null
  echo "slowed $slow (rank 1) from step $(logged_step "$WORK/slow$i/log") on" > "$WORK/slow$i/slowed"
  wait_logged_step "$WORK/slow$i/log" "$(( $(logged_step "$WORK/slow$i/log") + 60 ))" || true
  "$CLUSTER" unslow-node "$slow" > /dev/null 2>&1 || true
  slow=""
  stop_job
done

"$PY" "$SRC/bench/straggler/report.py" "$WORK"
echo "reproduce: bench/straggler/run.sh -m $MINUTES -n $RUNS"
