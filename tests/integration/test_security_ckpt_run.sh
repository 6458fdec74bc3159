#!/usr/bin/env bash
# ckpt-run trusts only the real controller (docs/security.md). It runs on compute nodes, where any user may bind the
# controller's port on the node's loopback (here n1's). A stranger's fake controller there answers the job owner's ckpt-run with
# "gave-up" (which once killed the step), with a relaunch decision naming a step and nodes, with a view signed by
# the stranger's own MUNGE credential, and with mistyped fields (which once crashed ckpt-run). In every case the
# step runs to its end and the job succeeds: ckpt-run believes only answers signed by root or SlurmUser, bound to
# its request and to the body.
source "$(dirname "$0")/lib.sh"
RUN=$CKPT_BUILD_DIR/ckpt-run/ckpt-run
[ -x "$RUN" ] || fail "ckpt-run is not built"
MUNGE_SOCKET=$CKPT_CLUSTER_DIR/munge/munge.socket
fake="" job=""
cleanup() {
  [ -n "$fake" ] && pkill -u nobody -f "fake_controller.py" 2>/dev/null || true
  [ -n "$job" ] && scancel "$job" 2>/dev/null || true
}
trap cleanup EXIT

for mode in gave-up relaunch self-signed mistyped; do
  port=$(free_port)
  (cd /tmp && exec "$CLUSTER" on n1 runuser -u nobody -- "$PY" "$CKPT_SOURCE_DIR/tests/integration/fake_controller.py" \
    "$port" "$mode" "$MUNGE_SOCKET") > "$SCRATCH/fake-$mode.log" 2>&1 &
  fake=$!
  for _ in $(seq 50); do "$CLUSTER" on n1 curl -s -o /dev/null "http://127.0.0.1:$port/healthz" && break; sleep 0.1; done
  out=$SCRATCH/$mode.out
  install -o "$TEST_USER" -m 644 /dev/null "$out"
  cat > "$SCRATCH/$mode.sbatch" <<JOB
#!/bin/bash
export CKPT_CONTROLLER_URL=http://127.0.0.1:$port
exec $RUN srun -N1 -n1 bash -c 'sleep 4; echo step-finished'
JOB
  chmod 755 "$SCRATCH/$mode.sbatch"
  job=$(cd /tmp && runuser -u "$TEST_USER" -- sbatch --parsable -N1 -w n1 -J "fake-$mode" -o "$out" --open-mode=append \
    "$SCRATCH/$mode.sbatch")
  wait_job_state "$job" '^(COMPLETED|FAILED|CANCELLED|TIMEOUT)$' 60
  state=$(scontrol show job "$job" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
  job=""
  pkill -u nobody -f "fake_controller.py $port" 2>/dev/null || true; wait "$fake" 2>/dev/null || true; fake=""
  grep -q "^GET /v1/jobs/" "$SCRATCH/fake-$mode.log" ||
    { cat "$SCRATCH/fake-$mode.log" "$SCRATCH/$mode.out" >&2; fail "$mode: ckpt-run never asked the fake controller (nothing shown)"; }
  [ "$state" = COMPLETED ] && grep -q step-finished "$SCRATCH/$mode.out" ||
    { cat "$SCRATCH/$mode.out" >&2; fail "$mode: the fake controller stopped the job ($state)"; }
  grep -q "ignoring the answer from http://127.0.0.1:$port" "$SCRATCH/$mode.out" ||
    { cat "$SCRATCH/$mode.out" >&2; fail "$mode: ckpt-run did not say it ignored the unsigned answer"; }
  pass "$mode: a stranger's fake controller was asked $(grep -c '^GET' "$SCRATCH/fake-$mode.log") times and changed nothing; the step finished"
done
grep -h "ignoring the answer" "$SCRATCH"/*.out | sort -u | sed 's/^/  /' | head -4
finish
