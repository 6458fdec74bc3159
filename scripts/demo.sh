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
D=${CKPT_CLUSTER_DIR:-/tmp/slurm-ckpt-cluster}
DEMO=$D/ckpt/demo
PORT=${CKPT_DEMO_PORT:-16850}
STEPS=${CKPT_DEMO_STEPS:-80}
PY=/usr/bin/python3

say() { printf '\n== %s\n' "$*"; }
die() { echo "demo: $*" >&2; exit 1; }

say "installing packages and building (logs in /tmp/slurm-ckpt-*.log)"
scripts/install-deps.sh > /tmp/slurm-ckpt-install.log 2>&1 || die "install failed: see /tmp/slurm-ckpt-install.log"
scripts/build.sh > /tmp/slurm-ckpt-build.log 2>&1 || die "build failed: see /tmp/slurm-ckpt-build.log"
export PYTHONPATH=$CKPT_BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}

say "starting the local cluster (munged, slurmctld, slurmd n1..n4) and the recovery controller"
CKPT_CLUSTER_PLUGIN_ARGS="controller=http://127.0.0.1:$PORT" tests/cluster.sh up
eval "$(tests/cluster.sh env)"
rm -rf "$DEMO"
mkdir -p "$DEMO/reference" "$DEMO/job"
cat > "$DEMO/controller.conf" <<CONF
listen = 127.0.0.1:$PORT
database = $DEMO/controller.db
munge_socket = $D/munge/munge.socket
backend = libslurm
settle = 200ms
reconcile_interval = 1s
CONF
setsid "$CKPT_BUILD_DIR/controller/ckpt-controller" -c "$DEMO/controller.conf" run > "$DEMO/controller.log" 2>&1 &
ctl_pid=$!
cleanup() {
  kill "$ctl_pid" 2>/dev/null || true
  [ -n "${victim:-}" ] && tests/cluster.sh revive-node "$victim" > /dev/null 2>&1 || true
}
trap cleanup EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/healthz" > /dev/null && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$PORT/healthz" > /dev/null || die "the controller did not start: $(tail -5 "$DEMO/controller.log")"
ctl() { "$CKPT_BUILD_DIR/controller/ckpt-controller" -c "$DEMO/controller.conf" "$@"; }

# One training job: 3 nodes, one rank each, a checkpoint every 10 steps. Rank 0's rendezvous port changes with
# every run so a restarted job never meets the previous run's sockets.
cat > "$DEMO/train.sbatch" <<JOB
#!/bin/bash
#SBATCH -N3 --ntasks-per-node=1 --requeue --open-mode=append
#SBATCH --ckpt-interval=10steps --ckpt-keep=2
export MASTER_ADDR=127.0.0.1 MASTER_PORT=\$((20000 + SLURM_JOB_ID % 2000 * 8 + \${SLURM_RESTART_COUNT:-0}))
echo "run \${SLURM_RESTART_COUNT:-0} on \$SLURM_JOB_NODELIST, resuming from step \${CKPT_RESUME_STEP:-none}"
srun $PY $SRC/slurm-examples/train_ddp.py --steps $STEPS --log-every 20 "\$@"
JOB

say "reference: the same training without a failure"
sbatch -W -o "$DEMO/reference/out" --ckpt-dir="$DEMO/reference/ckpt" "$DEMO/train.sbatch" --out "$DEMO/reference/final.bin" > /dev/null
[ -s "$DEMO/reference/final.bin.sha256" ] || die "the reference run failed: $(tail "$DEMO/reference/out")"
echo "reference weights: $(cat "$DEMO/reference/final.bin.sha256")"

say "the job: the same training, and a node will crash in the middle of it"
job=$(sbatch --parsable -o "$DEMO/job/out" --ckpt-dir="$DEMO/job/ckpt" "$DEMO/train.sbatch" \
  --out "$DEMO/job/final.bin" --step-sleep 0.15)
echo "submitted job $job"
latest() { [ -f "$DEMO/job/ckpt/latest" ] && sed 's/^0*//; s/^$/0/' "$DEMO/job/ckpt/latest" || echo 0; }
for _ in $(seq 600); do [ "$(latest)" -ge 30 ] && break; sleep 0.2; done
[ "$(latest)" -ge 30 ] || die "no checkpoint at step 30 in time: $(tail "$DEMO/job/out")"
victim=$(scontrol show hostnames "$(squeue -h -j "$job" -o %N)" | sed -n 2p)
echo "checkpoint step $(latest) is committed; crashing node $victim (its slurmd, slurmstepd and rank die)"
t0=$(date +%s.%N)
tests/cluster.sh crash-node "$victim"

for _ in $(seq 600); do grep -q "^run 1 " "$DEMO/job/out" 2>/dev/null && break; sleep 0.1; done
t1=$(date +%s.%N)
grep -q "^run 1 " "$DEMO/job/out" || die "the job did not run again: $(ctl history "$job")"
printf 'job %s is running again %.1f s after the crash: %s\n' "$job" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$(grep '^run 1 ' "$DEMO/job/out")"
for _ in $(seq 900); do
  state=$(scontrol show job "$job" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
  [ "$state" = COMPLETED ] || [ "$state" = FAILED ] || [ "$state" = CANCELLED ] && break
  sleep 0.2
done
[ "$state" = COMPLETED ] || die "the job ended $state: $(tail "$DEMO/job/out")"

say "what the controller did"
ctl history "$job" || true

say "result"
ref=$(cut -d' ' -f1 "$DEMO/reference/final.bin.sha256")
got=$(cut -d' ' -f1 "$DEMO/job/final.bin.sha256")
echo "reference final weights: $ref"
echo "recovered final weights: $got"
if [ "$ref" = "$got" ] && cmp -s "$DEMO/reference/final.bin" "$DEMO/job/final.bin"; then
  echo "IDENTICAL: the job survived the crash of $victim and finished bit for bit as if nothing had happened"
else
  die "the final weights differ"
fi
echo "(the cluster stays up; stop it with tests/cluster.sh down; logs in $D/log and $DEMO)"
