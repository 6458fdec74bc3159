#!/usr/bin/env bash
# A user cannot get a node marked DOWN (docs/security.md). An unprivileged user holds hundreds of idle connections
# to n2's slurmd, which starves its RPCs while its kernel still accepts, and lets a task of their own n1+n2 job fail
# on n1. The controller probes the silent n2 and finds it hung (no RPC answered): with the default site policy
# (down_hung_nodes = no) n2 is only excluded from that job's next run. It is not marked DOWN, `sinfo -R` stays
# empty and another user's job on n2 runs on. The flood must be shown to work (the controller's own RPC to n2
# times out during it), else the test proves nothing and fails.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/controller_lib.sh"
[ -x "$CKPT_BUILD_DIR/controller/ckpt-controller" ] || fail "ckpt-controller is not built"
PORT=$(( ${CKPT_CONTROLLER_TEST_PORT:-16840} + 60 ))
CONNECTIONS=${CKPT_FLOOD_CONNECTIONS:-600}
victim="" attacker="" flood=""
cleanup() {
  [ -n "$flood" ] && pkill -u "$TEST_USER" -f slurmd_flood.py 2>/dev/null || true
  for j in $victim $attacker; do scancel "$j" 2>/dev/null || true; done
  controller_down
  scontrol update nodename=n2 state=resume > /dev/null 2>&1 || true
}
trap cleanup EXIT

controller_up "$SCRATCH" "$PORT" > /dev/null || fail "no controller"
grep -q down_hung_nodes "$SCRATCH/controller.conf" && fail "the test needs the default down_hung_nodes"
[ -z "$(sinfo -h -R)" ] || fail "nodes are down or drained before the test: $(sinfo -h -R)"

# Another user's job (root's) on n2.
victim=$(sbatch --parsable -N1 -n1 -w n2 -J flood-victim -o /dev/null --wrap "sleep 600")
wait_job_state "$victim" RUNNING 30

# The attacker's own job, on n1 and n2: its task on n1 fails when the attacker says so, the one on n2 runs on.
go=$SCRATCH/attacker/go
install -d -o "$TEST_USER" -m 755 "$SCRATCH/attacker"
cat > "$SCRATCH/attack.sbatch" <<JOB
#!/bin/bash
srun -N2 -n2 bash -c 'if [ "\$SLURM_NODEID" = 0 ]; then while [ ! -e $go ]; do sleep 0.2; done; exit 1; fi; sleep 300'
JOB
chmod 755 "$SCRATCH/attack.sbatch"
attacker=$(cd /tmp && runuser -u "$TEST_USER" -- sbatch --parsable -N2 -w n1,n2 --requeue -J flood-attack \
  --ckpt-interval=1h --ckpt-dir="$SCRATCH/attacker/ckpt" -o /dev/null "$SCRATCH/attack.sbatch")
wait_job_state "$attacker" RUNNING 30
for _ in $(seq 100); do squeue -h -s -j "$attacker" -o %i | grep -q "^$attacker\.0$" && break; sleep 0.2; done
sleep 1

# The flood, as the unprivileged test user.
slurmd_port=$(scontrol show node n2 | sed -n 's/.*Port=\([0-9]*\).*/\1/p' | head -1)
addr=$(scontrol show node n2 | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p' | head -1)
[ -n "$slurmd_port" ] || slurmd_port=$(( ${CKPT_CLUSTER_PORT:-16817} + 2 ))
(cd /tmp && exec runuser -u "$TEST_USER" -- "$PY" "$CKPT_SOURCE_DIR/tests/integration/slurmd_flood.py" \
  "$addr" "$slurmd_port" "$CONNECTIONS" 90) > "$SCRATCH/flood.log" 2>&1 &
flood=$!
for _ in $(seq 100); do grep -q holding "$SCRATCH/flood.log" && break; sleep 0.1; done
grep -q holding "$SCRATCH/flood.log" || fail "the flood did not start: $(cat "$SCRATCH/flood.log")"
sleep 2
if timeout 5 "$CKPT_BUILD_DIR/controller/ckpt-controller" --ask-slurmd n2 > "$SCRATCH/ask.out" 2>&1; then
  fail "n2's slurmd still answers RPCs under $CONNECTIONS idle connections: the flood shows nothing ($(cat "$SCRATCH/ask.out"))"
fi
pass "$CONNECTIONS idle connections from $TEST_USER to n2's slurmd ($addr:$slurmd_port) starve its RPCs"

# The attacker's task on n1 fails while n2 is flooded: n2 is silent and gets probed.
runuser -u "$TEST_USER" -- touch "$go"
for _ in $(seq 240); do ctl history "$attacker" 2> /dev/null | grep -q "probed" && break; sleep 0.25; done
ctl history "$attacker" > "$SCRATCH/history" 2>&1 || true
grep -q "probed" "$SCRATCH/history" || { cat "$SCRATCH/history" "$SCRATCH/controller.log" >&2; fail "the controller never probed the attacker's silent node"; }
grep -q "n2 hung" "$SCRATCH/history" || { cat "$SCRATCH/history" >&2; fail "the controller did not find n2 hung: the flood did not reach its probe"; }
sleep 3  # a DOWN would have been sent by now
pkill -u "$TEST_USER" -f slurmd_flood.py 2>/dev/null || true; flood=""
sed 's/^/  /' "$SCRATCH/history" | sed -n 1,12p

state=$(sinfo -h -n n2 -o '%T')
[ -z "$(sinfo -h -R)" ] || fail "a user's flood got nodes marked down or drained: $(sinfo -h -R)"
case $state in *down*|*drain*|*fail*) fail "n2 is $state after the flood" ;; esac
[ "$(squeue -h -j "$victim" -o %T)" = RUNNING ] || fail "the other user's job on n2 is $(squeue -h -j "$victim" -o %T)"
grep -q "excluding n2\|exclude.*n2" "$SCRATCH/history" || { cat "$SCRATCH/history" >&2; fail "n2 was not excluded from the attacker's next run"; }
pass "n2 found hung under the flood, excluded from the attacker's job only: not DOWN (sinfo -R empty), the other user's job runs on"
finish
