#!/usr/bin/env bash
# The whole story on the real cluster, as the README's main job shows it: a 3-node PyTorch training job
# (slurm-examples/train_ddp.py) loses a node mid-run. The plugin reports the failure, the recovery controller
# requeues the job off the dead node within seconds, the job resumes from the newest complete checkpoint, and its
# final weights equal an uninterrupted run's bit for bit. Headless Chromium then shows the controller's status
# page with the job's recovery (screenshot: <build>/artifacts/status-page.png), and /metrics has every series the
# Grafana dashboard and the alerting rules use. Then the fastest path: the same training with a spare node under
# `ckpt-run --spares 1` loses a node and runs again in well under a second, in place, still bit for bit.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/controller_lib.sh"
source "$(dirname "$0")/torch_lib.sh"
source "$(dirname "$0")/status_page_lib.sh"
SRC=$CKPT_SOURCE_DIR
DEMO=$SCRATCH
PORT=$(( ${CKPT_CONTROLLER_TEST_PORT:-16840} + 10 ))
STEPS=${CKPT_DEMO_STEPS:-80}
have_torch || fail "needs python3-torch and a built slurm_ckpt"
[ -x "$CKPT_BUILD_DIR/controller/ckpt-controller" ] || fail "ckpt-controller is not built"

say() { printf '\n== %s\n' "$*"; }
die() { fail "$*"; }

say "starting the local cluster (munged, slurmctld, slurmd n1..n4) and the recovery controller"
cleanup() {
  [ -n "${victim:-}" ] && "$CLUSTER" revive-node "$victim" > /dev/null 2>&1 || true
  [ -n "${job:-}" ] && scancel "$job" 2>/dev/null || true
  controller_down
}
trap cleanup EXIT
controller_up "$DEMO" "$PORT" || die "no controller"
mkdir -p "$DEMO/reference" "$DEMO/job"

# One training job: 3 nodes, one rank each, a checkpoint every 10 steps.
write_train_sbatch "$DEMO/train.sbatch" "-N3 --ntasks-per-node=1 --ckpt-interval=10steps --ckpt-keep=2" \
  train_ddp.py --steps $STEPS --log-every 20

say "reference: the same training without a failure"
sbatch -W -o "$DEMO/reference/out" --ckpt-dir="$DEMO/reference/ckpt" "$DEMO/train.sbatch" --out "$DEMO/reference/final.bin" > /dev/null
[ -s "$DEMO/reference/final.bin.sha256" ] || die "the reference run failed: $(tail "$DEMO/reference/out")"
echo "reference weights: $(cat "$DEMO/reference/final.bin.sha256")"

say "the job: the same training, and a node will crash in the middle of it"
job=$(sbatch --parsable -o "$DEMO/job/out" --ckpt-dir="$DEMO/job/ckpt" "$DEMO/train.sbatch" \
  --out "$DEMO/job/final.bin" --step-sleep 0.15)
echo "submitted job $job"
latest() { latest_step "$DEMO/job/ckpt"; }
for _ in $(seq 600); do [ "$(latest)" -ge 30 ] && break; sleep 0.2; done
[ "$(latest)" -ge 30 ] || die "no checkpoint at step 30 in time: $(tail "$DEMO/job/out")"
victim=$(scontrol show hostnames "$(squeue -h -j "$job" -o %N)" | sed -n 2p)
echo "checkpoint step $(latest) is committed; crashing node $victim (its slurmd, slurmstepd and rank die)"
t0=$(date +%s.%N)
"$CLUSTER" crash-node "$victim"

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

say "the status page in a browser, and the metrics the dashboard and the alerts use"
check_status_page "$job" "$DEMO/controller.conf"

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
say "the fastest path: a spare node and restart in place (ckpt-run --spares 1, one step per node)"
"$CLUSTER" revive-node "$victim" > /dev/null
victim=""
mkdir -p "$DEMO/inplace-reference" "$DEMO/inplace"
cat > "$DEMO/inplace.sbatch" <<JOB
#!/bin/bash
#SBATCH -N4 --no-kill --requeue --open-mode=append --ckpt-last-words=on --ckpt-interval=10steps
export PYTHONPATH=$PYTHONPATH CKPT_HEARTBEAT_TIMEOUT=1s CKPT_CONTROLLER_URL=$CONTROLLER_URL
$CKPT_BUILD_DIR/ckpt-run/ckpt-run --spares 1 srun -N3 --ntasks-per-node=1 $PY $SRC/slurm-examples/train_ddp.py \\
  --steps $STEPS --log-every 20 "\$@"
JOB
sbatch -W -o "$DEMO/inplace-reference/out" --ckpt-dir="$DEMO/inplace-reference/ckpt" "$DEMO/inplace.sbatch" \
  --out "$DEMO/inplace-reference/final.bin" > /dev/null
[ -s "$DEMO/inplace-reference/final.bin.sha256" ] || die "the in-place reference run failed: $(tail "$DEMO/inplace-reference/out")"
job=$(sbatch --parsable -o "$DEMO/inplace/out" --ckpt-dir="$DEMO/inplace/ckpt" "$DEMO/inplace.sbatch" \
  --out "$DEMO/inplace/final.bin" --step-sleep 0.15)
grep_soon() { for _ in $(seq 600); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done; return 1; }
grep_soon "$DEMO/inplace/out" "ckpt-run: 3 nodes train" || die "the job did not start: $(tail "$DEMO/inplace/out")"
grep "ckpt-run: 3 nodes train" "$DEMO/inplace/out"
for _ in $(seq 600); do [ "$(latest_step "$DEMO/inplace/ckpt")" -ge 30 ] && break; sleep 0.2; done
victim=n3
echo "checkpoint step $(latest_step "$DEMO/inplace/ckpt") is committed; crashing node $victim"
t0=$(date +%s.%N)
"$CLUSTER" crash-node "$victim"
grep_soon "$DEMO/inplace/out" "^ckpt-run: in-place recovery 1:" || die "no in-place recovery: $(tail "$DEMO/inplace/out")"
phases=$(sed -n 's/^ckpt: in-place recovery \({.*}\)$/\1/p' "$DEMO/inplace/out" | head -1)
first=$("$PY" -c "import json, sys; print(json.loads(sys.argv[1])['first_step'])" "$phases")
grep "in-place recovery 1: ranks" "$DEMO/inplace/out"
printf 'job %s is running again %.2f s after the crash, in the same allocation and processes (no requeue)\n' "$job" \
  "$(awk -v a="$t0" -v b="$first" 'BEGIN { print b - a }')"
grep_soon "$DEMO/inplace/out" "done after step" || die "the job did not finish: $(tail "$DEMO/inplace/out")"
"$CLUSTER" revive-node "$victim" > /dev/null
victim=""
ref=$(cut -d' ' -f1 "$DEMO/inplace-reference/final.bin.sha256")
got=$(cut -d' ' -f1 "$DEMO/inplace/final.bin.sha256")
echo "in-place reference final weights: $ref"
echo "recovered in place final weights: $got"
[ "$ref" = "$got" ] && cmp -s "$DEMO/inplace-reference/final.bin" "$DEMO/inplace/final.bin" ||
  die "the final weights of the in-place run differ"
echo "IDENTICAL: the job survived the crash of n3 in place and finished bit for bit as if nothing had happened"
for _ in $(seq 100); do ctl history "$job" 2>/dev/null | grep -q "(in-place)" && break; sleep 0.2; done
ctl history "$job" | grep "(in-place)" || die "the controller did not record the in-place recovery"

[ "${CKPT_DEMO_KEEP:-0}" = 1 ] && echo "(files kept in $DEMO; the cluster stays up: tests/cluster.sh down stops it)" && exit 0
finish
