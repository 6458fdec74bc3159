#!/usr/bin/env bash
# proctrack/linuxproc ends a step by walking slurmstepd's process tree, and a process whose parent died falls out
# of it: an srun left by a requeued batch script then outlives the run and cancels the next run's step. Under
# linuxproc the plugin makes each batch step's slurmstepd a subreaper, so such orphans stay in the tree and end
# with the step. The cluster runs with linuxproc for this test only and goes back to its usual tracking after.
source "$(dirname "$0")/lib.sh"
restore() { "$CLUSTER" down > /dev/null 2>&1 || true; "$CLUSTER" up > /dev/null 2>&1 || true; }
trap restore EXIT
"$CLUSTER" down > /dev/null
CKPT_CLUSTER_PROCTRACK=proctrack/linuxproc "$CLUSTER" up > /dev/null
grep -q "ProctrackType.*proctrack/linuxproc" <<< "$(scontrol show config)" || fail "the cluster did not start with linuxproc"

# orphan_after_cancel NAME SBATCH-ARGS...: a batch job whose script leaves an orphan, cancelled; prints whether
# the orphan outlived the job ("alive" or "ended").
orphan_after_cancel() {
  local name=$1 pidfile=$SCRATCH/$1.pid id pid
  shift
  id=$(sbatch --parsable -N1 -o "$SCRATCH/$name.out" "$@" \
    --wrap "( sleep 600 & echo \$! > $pidfile ); exec sleep 600")
  for _ in $(seq 120); do [ -s "$pidfile" ] && break; sleep 0.25; done
  [ -s "$pidfile" ] || fail "$name: the orphan did not start"
  pid=$(cat "$pidfile")
  scancel "$id"
  wait_job_state "$id" 'CANCELLED|COMPLETED|FAILED' 60
  for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    echo alive
  else
    echo ended
  fi
}

# Without the plugin's settings the step is Slurm's alone: the orphan escapes it (what made requeues unsafe).
[ "$(orphan_after_cancel plain)" = alive ] || fail "under linuxproc an orphan was ended without the plugin; nothing to show"
pass "without the plugin, linuxproc loses an orphan of the batch script"

# With checkpointing on, the batch step adopts it, and it ends with the job.
[ "$(orphan_after_cancel adopted --ckpt-dir="$SCRATCH/ckpt-%j")" = ended ] || fail "the orphan outlived its batch step"
grep -rqF "this batch step adopts the processes its script orphans" "$CKPT_CLUSTER_DIR"/log/slurmd-n*.log ||
  fail "the plugin did not say it adopts orphans under linuxproc"
pass "with the plugin, the batch step's orphans end with it"

# The controller says it too.
printf 'listen = 127.0.0.1:16899\ndatabase = %s/ctl.db\n' "$SCRATCH" > "$SCRATCH/controller.conf"
"$CKPT_BUILD_DIR/controller/ckpt-controller" -c "$SCRATCH/controller.conf" check-config > "$SCRATCH/check" 2>&1 ||
  { cat "$SCRATCH/check" >&2; fail "check-config failed"; }
assert_contains "$SCRATCH/check" "warning: Slurm's ProctrackType=proctrack/linuxproc"
pass "ckpt-controller check-config warns about linuxproc"
finish
