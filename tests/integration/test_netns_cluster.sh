#!/usr/bin/env bash
# The namespace cluster (tests/cluster.sh, as every slurm test uses it) in Debian's hosts-file mode (each node's own
# name on 127.0.1.1 first; the fixture clusters use plain hosts files): four hosts, each a network namespace with an
# address, a host name and a hosts file of its own, on a private bridge.
#  - `cluster.sh status` shows four hosts with four addresses;
#  - a step on all four runs, each task on its own host name, and the address each rank would publish to its peers
#    (slurm_ckpt.inplace.address(), the native rule of ckpt/address.hpp) is its node's, never 127.0.1.1: with
#    GLOO_SOCKET_IFNAME=eth0 set as a user would, and with nothing set (the Python path once published 127.0.1.1);
#  - a 4-rank gloo all_reduce runs across the hosts;
#  - partition-node cuts n4 off while its task runs on: the task still writes the shared file system, a connect
#    to its slurmd times out (nothing refuses); heal-node brings it back;
#  - crash-node ends every process of n3's namespace, and revive-node returns it to service;
#  - restart in place with a spare after a crash, a freeze and a partition of n2 (see below).
# Its own cluster dir, ports and subnet, so the fixture clusters are left alone.
set -euo pipefail
export CKPT_CLUSTER_DIR=${CKPT_NETNS_CLUSTER_DIR:-/tmp/slurm-ckpt-netns}
export CKPT_CLUSTER_PORT=${CKPT_NETNS_CLUSTER_PORT:-18817}
export CKPT_CLUSTER_NET=netns CKPT_CLUSTER_HOSTS=debian CKPT_CLUSTER_SUBNET=${CKPT_NETNS_SUBNET:-78}
export SLURM_CONF=$CKPT_CLUSTER_DIR/etc/slurm.conf
mkdir -p "$CKPT_CLUSTER_DIR/ckpt" && chmod 1777 "$CKPT_CLUSTER_DIR/ckpt"
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/torch_lib.sh"
SUBNET=10.$CKPT_CLUSTER_SUBNET.0
[ "$(id -u)" -eq 0 ] || fail "needs root (network namespaces)"
command -v ip > /dev/null || fail "needs iproute2"
cleanup() {
  scancel --user=root > /dev/null 2>&1 || true  # this cluster's jobs: it is private to this test
  "$CLUSTER" down > /dev/null 2>&1 || true
}
trap cleanup EXIT

"$CLUSTER" up > "$SCRATCH/up.log" 2>&1 || { cat "$SCRATCH/up.log" >&2; fail "the namespace cluster did not come up"; }
"$CLUSTER" status > "$SCRATCH/status" 2>&1 || { cat "$SCRATCH/status" >&2; fail "status"; }
for n in 1 2 3 4; do
  grep -q "^n$n: host $SUBNET.1$n/24, link up" "$SCRATCH/status" || { cat "$SCRATCH/status" >&2; fail "n$n has no address of its own"; }
done
pass "four hosts with four addresses: $(grep -o "host [0-9./]*" "$SCRATCH/status" | tr '\n' ' ')"

# Each task on its own host; the address its rank publishes, with and without GLOO_SOCKET_IFNAME.
probe='import socket, os
from slurm_ckpt import inplace
addr = inplace.address()  # what the in-place stores, mailboxes and spare sockets bind and publish
print(socket.gethostname(), socket.gethostbyname(socket.gethostname()), os.environ.get("GLOO_SOCKET_IFNAME", "-"), addr)'
for gloo in eth0 ""; do
  GLOO_SOCKET_IFNAME=$gloo srun -N4 -n4 --export=ALL "$PY" -c "$probe" > "$SCRATCH/addr.$gloo" 2>&1 ||
    { cat "$SCRATCH/addr.$gloo" >&2; fail "a step across the four hosts failed"; }
  sort "$SCRATCH/addr.$gloo" | sed 's/^/  /'
  for n in 1 2 3 4; do
    grep -q "^n$n 127.0.1.1 .* $SUBNET.1$n$" "$SCRATCH/addr.$gloo" ||
      fail "n$n (its name on 127.0.1.1) would not publish its own address (GLOO_SOCKET_IFNAME='$gloo')"
  done
done
pass "each node's name resolves to 127.0.1.1, yet every rank publishes its node's address"

# gloo across the hosts, as a user sets it up beside Debian's hosts file.
cat > "$SCRATCH/allreduce.py" <<'PY'
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo", rank=int(os.environ["SLURM_PROCID"]), world_size=int(os.environ["SLURM_NTASKS"]))
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("sum", int(t.item()))
PY
MASTER_ADDR=$SUBNET.11 MASTER_PORT=29533 GLOO_SOCKET_IFNAME=eth0 srun -N4 -n4 --export=ALL "$PY" "$SCRATCH/allreduce.py" \
  > "$SCRATCH/allreduce.out" 2>&1 || { cat "$SCRATCH/allreduce.out" >&2; fail "gloo across the hosts failed"; }
[ "$(grep -c '^sum 10$' "$SCRATCH/allreduce.out")" = 4 ] || { cat "$SCRATCH/allreduce.out" >&2; fail "all_reduce gave the wrong sum"; }
pass "a 4-rank gloo all_reduce across the four hosts"

# A partition: n4 cut off while its task runs on and writes the shared file system.
mkdir -p "$SCRATCH/beat" && chmod 777 "$SCRATCH/beat"
srun -N1 -w n4 bash -c "while :; do date +%s.%N > $SCRATCH/beat/n4; sleep 0.2; done" > /dev/null 2>&1 &
beat=$!
for _ in $(seq 100); do [ -s "$SCRATCH/beat/n4" ] && break; sleep 0.1; done
[ -s "$SCRATCH/beat/n4" ] || fail "the task on n4 did not start"
"$CLUSTER" partition-node n4 2> /dev/null
sleep 1.5
before=$(cat "$SCRATCH/beat/n4"); sleep 1; after=$(cat "$SCRATCH/beat/n4")
[ "$before" != "$after" ] || fail "n4's task stopped writing the shared file system when its link was cut"
[ -n "$(ip netns pids "ckpt$CKPT_CLUSTER_SUBNET-n4")" ] || fail "n4's processes died with its link"
reach() { "$PY" -c "import socket, sys
try:
    socket.create_connection(('$SUBNET.14', $((CKPT_CLUSTER_PORT + 1))), timeout=2).close(); print('connected')
except socket.timeout:
    print('timed out')
except OSError as e:
    print('refused' if e.errno == 111 else e)"; }
[ "$(reach)" = "timed out" ] || fail "a connect to cut-off n4's slurmd did not time out: $(reach)"
"$CLUSTER" heal-node n4 2> /dev/null
for _ in $(seq 30); do [ "$(reach)" = connected ] && break; sleep 0.2; done
[ "$(reach)" = connected ] || fail "n4's slurmd is not reachable after the heal"
kill "$beat" 2> /dev/null || true
pass "partition-node n4: its task wrote on, a connect timed out (nothing refused); heal-node: reachable again"

# A crash: every process of n3's namespace ends; revive returns it to service.
srun -N1 -w n3 sleep 300 > /dev/null 2>&1 &
sleeper=$!
for _ in $(seq 50); do [ "$(ip netns pids "ckpt$CKPT_CLUSTER_SUBNET-n3" | wc -l)" -ge 3 ] && break; sleep 0.1; done
"$CLUSTER" crash-node n3 2> /dev/null
sleep 0.5
[ -z "$(ip netns pids "ckpt$CKPT_CLUSTER_SUBNET-n3")" ] || fail "crash-node left processes in n3's namespace"
"$CLUSTER" revive-node n3 2> /dev/null || fail "revive-node n3"
srun -N1 -w n3 hostname | grep -qx n3 || fail "n3 does not run steps after its revival"
pass "crash-node n3 ended every process of its namespace; revive-node returned it to service"
kill "$sleeper" 2> /dev/null || true

# Restart in place across the hosts, beside Debian's hosts file, with GLOO_SOCKET_IFNAME=eth0 as a user sets it: 3
# training nodes and a spare; n2 fails mid-run by a crash, a freeze (every process of it stopped) or a partition
# (its link cut, its processes live on); the spare takes its rank over, the first step after the fault comes within
# 3 s, and the final weights equal an uninterrupted run's. The frozen node thaws and the cut one is healed after
# the run: their stale rank changes nothing in the checkpoint dir. (Before the one address rule every rank timed
# out on rank 0's store at 127.0.1.1.)
STEPS=40
FIRST_STEP_BOUND_S=3
cat > "$SCRATCH/inplace.sbatch" <<JOB
#!/bin/bash
#SBATCH --no-kill --ckpt-last-words=on
export PYTHONPATH=$PYTHONPATH CKPT_HEARTBEAT_TIMEOUT=1s GLOO_SOCKET_IFNAME=eth0
$CKPT_BUILD_DIR/ckpt-run/ckpt-run --spares 1 srun -N3 --ntasks-per-node=1 $PY $CKPT_SOURCE_DIR/slurm-examples/train_ddp.py \\
  --steps $STEPS --ckpt-interval-steps 10 --step-sleep 0.1 --log-every 1 --log-time "\$@"
JOB
resolution() { "$CKPT_BUILD_DIR/cli/ckpt" latest "$1" 2>&1 | head -1; }
inplace_run() {  # NAME [FAULT]: one run into $SCRATCH/NAME; FAULT (crash-node, freeze-node, partition-node) hits n2
  local name=$1 fault=${2:-} job fault_t first_t took before
  mkdir -p "$SCRATCH/$name"
  job=$(sbatch --parsable -N4 -J "netns-$name" -o "$SCRATCH/$name/log" --ckpt-dir="$SCRATCH/$name/ckpt" \
    "$SCRATCH/inplace.sbatch" --out "$SCRATCH/$name/final")
  if [ -n "$fault" ]; then
    for _ in $(seq 1500); do grep -q "^train_ddp: step 15 " "$SCRATCH/$name/log" 2>/dev/null && break; sleep 0.05; done
    grep -q "^train_ddp: step 15 " "$SCRATCH/$name/log" || { cat "$SCRATCH/$name/log" >&2; fail "$name: training never reached step 15"; }
    fault_t=$(date +%s.%N)
    "$CLUSTER" "$fault" n2 2> /dev/null
  fi
  for _ in $(seq 1500); do [ -s "$SCRATCH/$name/final" ] && break; squeue -h -j "$job" | grep -q . || break; sleep 0.1; done
  [ -s "$SCRATCH/$name/final" ] || { tail -30 "$SCRATCH/$name/log" >&2; fail "$name: no final weights"; }
  scancel "$job" 2> /dev/null || true
  [ -n "$fault" ] || return 0
  grep -q "takes rank 1 over" "$SCRATCH/$name/log" || { tail -30 "$SCRATCH/$name/log" >&2; fail "$name: the spare did not take n2's rank over in place"; }
  # The first step completed after the spare joined: the step lines after the recovery's, t= on rank 0's clock.
  first_t=$(awk '/takes rank 1 over|in-place recovery 1/ { after = 1 } after && /^train_ddp: step / { sub(/.*t=/, ""); print; exit }' "$SCRATCH/$name/log")
  [ -n "$first_t" ] || { tail -30 "$SCRATCH/$name/log" >&2; fail "$name: no step after the recovery"; }
  took=$(awk -v a="$fault_t" -v b="$first_t" 'BEGIN { printf "%.2f", b - a }')
  awk -v t="$took" -v b="$FIRST_STEP_BOUND_S" 'BEGIN { exit !(t <= b) }' || fail "$name: the first step came $took s after the fault (bound $FIRST_STEP_BOUND_S s)"
  cmp -s "$SCRATCH/reference/final" "$SCRATCH/$name/final" || fail "$name: the weights after the in-place recovery differ"
  # The stale side wakes (thaw, heal): nothing it does changes which checkpoint a restart would use.
  before=$(resolution "$SCRATCH/$name/ckpt")
  [ "$fault" != partition-node ] || "$CLUSTER" heal-node n2 2> /dev/null
  "$CLUSTER" revive-node n2 2> /dev/null || true
  for _ in $(seq 30); do
    [ "$(resolution "$SCRATCH/$name/ckpt")" = "$before" ] || fail "$name: the stale rank of n2 changed the checkpoint dir: '$before' -> '$(resolution "$SCRATCH/$name/ckpt")'"
    sleep 0.1
  done
  "$CKPT_BUILD_DIR/cli/ckpt" verify "$SCRATCH/$name/ckpt" > /dev/null 2>&1 || fail "$name: ckpt verify failed after n2 came back"
  pass "restart in place across hosts ($fault of n2, debian hosts files, GLOO_SOCKET_IFNAME=eth0): first step $took s after the fault (<= $FIRST_STEP_BOUND_S s), bitwise identical; n2 back, the dir unchanged ($before)"
}
inplace_run reference
inplace_run crashed crash-node
inplace_run frozen freeze-node
inplace_run cut partition-node
finish
