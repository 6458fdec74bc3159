#!/usr/bin/env bash
# One user cannot starve others' failure reports (docs/security.md). An unprivileged user floods the controller with
# tens of thousands of events, each signed by their own MUNGE credential, from 200 connections at once: for their
# own job, each naming a new step and node (the record once grew with every one and was rewritten whole each
# time), and for another user's job that the controller does not track (each once cost a root Slurm lookup).
# Meanwhile another user's job fails: its task writes the time and exits 1, the plugin reports it. The controller
# must record that failure within 1 s of the exit, and the report must not be lost (the plugin asks again when the
# controller is busy).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/controller_lib.sh"
[ -x "$CKPT_BUILD_DIR/controller/ckpt-controller" ] || fail "ckpt-controller is not built"
PORT=$(( ${CKPT_CONTROLLER_TEST_PORT:-16840} + 80 ))
MUNGE_SOCKET=$CKPT_CLUSTER_DIR/munge/munge.socket
COUNT=${CKPT_FLOOD_EVENTS:-40000}
CONNECTIONS=${CKPT_FLOOD_CONNECTIONS:-200}
flooder="" victim="" flood="" untracked=""
cleanup() {
  [ -n "$flood" ] && pkill -u "$TEST_USER" -f event_flood.py 2>/dev/null || true
  for j in $flooder $victim $untracked; do scancel "$j" 2>/dev/null || true; done
  controller_down
}
trap cleanup EXIT

controller_up "$SCRATCH" "$PORT" > /dev/null || fail "no controller"
install -d -o "$TEST_USER" -m 755 "$SCRATCH/flooder" "$SCRATCH/victim-out"
flooder=$(cd /tmp && runuser -u "$TEST_USER" -- sbatch --parsable -N1 -w n1 -J flooder --ckpt-interval=1h \
  --ckpt-dir="$SCRATCH/flooder/ckpt" -o /dev/null --wrap "srun sleep 300")
wait_job_state "$flooder" RUNNING 30
for _ in $(seq 100); do ctl history "$flooder" 2> /dev/null | grep -q "job_start from n1 (step 0)" && break; sleep 0.1; done
# Root's job without checkpoint options: Slurm knows it, the controller does not track it.
untracked=$(sbatch --parsable -N1 -w n3 -J untracked -o /dev/null --wrap "sleep 300")
wait_job_state "$untracked" RUNNING 30

# The flood, as the unprivileged test user: signed first, then sent from $CONNECTIONS connections.
uid=$(id -u "$TEST_USER")
(cd /tmp && exec runuser -u "$TEST_USER" -- "$PY" "$CKPT_SOURCE_DIR/tests/integration/event_flood.py" \
  "$CONTROLLER_URL" "$MUNGE_SOCKET" "$flooder,$untracked" "$uid" "$COUNT" "$CONNECTIONS" 90 "$SCRATCH/flooder/halfway") \
  > "$SCRATCH/flood.log" 2>&1 &
flood=$!
for _ in $(seq 1200); do grep -q "^sending from" "$SCRATCH/flood.log" && break; sleep 0.05; done
grep -q "^sending from" "$SCRATCH/flood.log" || fail "the flood did not start: $(cat "$SCRATCH/flood.log")"

# The victim, during the flood: root's job on n2, its task fails halfway through it (the flooder's record has grown
# by then, where records grow).
cat > "$SCRATCH/victim.sbatch" <<JOB
#!/bin/bash
srun bash -c 'while [ ! -e $SCRATCH/flooder/halfway ]; do sleep 0.02; done; date +%s.%N >> $SCRATCH/victim-out/exit-time; exit 1'
JOB
chmod 755 "$SCRATCH/victim.sbatch"
victim=$(sbatch --parsable -N1 -w n2 -J victim --no-requeue --ckpt-interval=1h --ckpt-dir="$SCRATCH/victim-ckpt" -o /dev/null \
  "$SCRATCH/victim.sbatch")
for _ in $(seq 1800); do [ -s "$SCRATCH/victim-out/exit-time" ] && break; sleep 0.05; done
[ -s "$SCRATCH/victim-out/exit-time" ] || fail "the victim's task never exited"
for _ in $(seq 300); do ctl history "$victim" 2> /dev/null | grep -q "failure reported" && break; sleep 0.05; done
wait "$flood" 2> /dev/null || true; flood=""
cat "$SCRATCH/flood.log"
ctl history "$victim" > "$SCRATCH/victim.history" 2>&1 || true
line=$(grep -m1 "transition running -> failing: failure reported" "$SCRATCH/victim.history") ||
  { cat "$SCRATCH/victim.history" >&2; fail "the victim's failure report was lost under the flood"; }
seen=$(date -d "$(echo "$line" | awk '{print $1}')" +%s.%N)
exited=$(head -1 "$SCRATCH/victim-out/exit-time")
delay=$(awk -v a="$exited" -v b="$seen" 'BEGIN { printf "%.3f", b - a }')
accepted=$(ctl history "$flooder" 2> /dev/null | grep -c "event      job_start" || true)
echo "victim's failure recorded $delay s after its task exited, during a flood of $COUNT signed events ($accepted of them in the flooder's history)"
awk -v d="$delay" 'BEGIN { exit !(d < 1.0) }' || fail "another user's flood delayed the failure report by $delay s (bound 1 s)"
from=$(sed -n 's/^sending from \([0-9.]*\)$/\1/p' "$SCRATCH/flood.log")
until=$(sed -n 's/^sent [0-9]* until \([0-9.]*\):.*/\1/p' "$SCRATCH/flood.log")
[ -n "$from" ] && [ -n "$until" ] || fail "the flood did not run: $(cat "$SCRATCH/flood.log")"
awk -v a="$from" -v b="$until" -v t="$exited" 'BEGIN { exit !(a < t && t < b) }' ||
  fail "the victim failed at $exited, outside the flood ($from to $until): the test shows nothing; raise CKPT_FLOOD_EVENTS"
pass "under $COUNT events of $TEST_USER from $CONNECTIONS connections, root's failure was recorded after $delay s (< 1 s)"
finish
