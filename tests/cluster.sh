#!/usr/bin/env bash
# The local Slurm test cluster: real munged, slurmctld and four slurmd (n1..n4) on this host, as root.
# Every config, state, log, port and pid lives under one private directory ($CKPT_CLUSTER_DIR), and only the
# processes started here are ever stopped (by the pids they wrote).
#
#   cluster.sh up | down | status | env
#   cluster.sh on nX CMD...      run CMD on nX's network (its namespace; in one-host mode, here)
#   cluster.sh addr [nX]         the address nX has for its peers (without nX: this host's, as the nodes reach it:
#                                where a controller or a fake one listens for the plugin and ckpt-run)
#   cluster.sh shm nX            where this host sees nX's /dev/shm (its own memory file system in namespace mode)
#   cluster.sh crash-node nX     SIGKILL nX's slurmd, its slurmstepds and their tasks (a dead host)
#   cluster.sh freeze-node nX    SIGSTOP the same set (a silent host: only timeouts can tell)
#   cluster.sh hang-tasks nX     SIGSTOP only the job tasks on nX (a hung rank): slurmd and slurmstepd answer on
#   cluster.sh kill-tasks nX     SIGKILL only the job tasks on nX (a crashed rank on a healthy node)
#   cluster.sh task-pids nX      the pids of the job tasks on nX (what hang-tasks and kill-tasks act on)
#   cluster.sh slow-node nX FACTOR  give the job tasks on nX FACTOR of one CPU between them (the cgroup cpu
#                                controller's quota), as a throttled or noisy node would; what they start later
#                                inherits it
#   cluster.sh unslow-node nX    lift it (revive-node and down lift it too)
#   cluster.sh task-cpu nX [SECONDS]  the CPUs the job tasks on nX use between them, measured over SECONDS (2)
#   cluster.sh revive-node nX    bring nX back (SIGCONT, or restart slurmd) and return it to service
#   cluster.sh partition-node nX [SIDE]  cut nX's link (namespace mode only): its processes live on; nobody reaches
#                                them but the nodes cut to the same SIDE
#   cluster.sh heal-node nX      bring the link back
#
# Each node is a host of its own (CKPT_CLUSTER_NET=netns, the default where namespaces are allowed): a network
# namespace with its own IPv4 address on a bridge (10.<CKPT_CLUSTER_SUBNET, 77>.0.0/24, the bridge .1 in this namespace for slurmctld and controllers,
# nodes .11-.14), its own host name (a UTS namespace), its own /dev/shm (a tmpfs in its mount namespace: what a
# node keeps in memory is its own, and a node that crashes and comes back has lost it) and its own /etc/hosts
# (bind-mounted):
# CKPT_CLUSTER_HOSTS=plain (names resolve to the nodes' addresses) or debian (each node's own name on 127.0.1.1
# first, as Debian's installer writes it). munge and the checkpoint dirs stay shared, as on a real cluster. A
# node's processes are those in its namespace (ip netns pids), never found by scanning the host. Where namespaces
# are refused (no root, no iproute2), or with CKPT_CLUSTER_NET=host, the four slurmd share this host and 127.0.0.1;
# `up` says so once. The mode chosen is kept in $D/net for the other commands and the tests. Each node has
# CKPT_CLUSTER_CPUS CPUs as Slurm counts them (default 4; 8 for eight ranks a node).
set -euo pipefail

D=${CKPT_CLUSTER_DIR:-/tmp/slurm-ckpt-cluster}
BASE_PORT=${CKPT_CLUSTER_PORT:-16817}
NODES=(n1 n2 n3 n4)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SOURCE_DIR=${CKPT_SOURCE_DIR:-$(dirname "$HERE")}
PLUGIN=${CKPT_SPANK_PLUGIN:-${CKPT_BUILD_DIR:-$SOURCE_DIR/build}/spank/spank_ckpt.so}
TEST_USER=${CKPT_TEST_USER:-ckptuser}
export SLURM_CONF=$D/etc/slurm.conf
NET=${CKPT_CLUSTER_NET:-auto}
[ "$NET" = auto ] && [ -f "$D/net" ] && NET=$(cat "$D/net")
HOSTS_MODE=${CKPT_CLUSTER_HOSTS:-plain}
CPUS=${CKPT_CLUSTER_CPUS:-4}  # each node's CPUs as Slurm counts them (8: eight ranks a node, as a GPU node runs)
SUBNET=10.${CKPT_CLUSTER_SUBNET:-77}.0
BRIDGE=ckbr${CKPT_CLUSTER_SUBNET:-77}
BRIDGE_ADDR=$SUBNET.1

say() { echo "cluster: $*" >&2; }
die() { say "$*"; exit 1; }

# A zombie is not alive: a daemon killed a moment ago stays one until its parent (here often a container's pid 1)
# reaps it, and a cluster brought up then would take it for running.
pid_alive() {
  local stat
  [ -n "${1:-}" ] && stat=$(cat "/proc/$1/stat" 2> /dev/null) || return 1
  stat=${stat##*) }
  [ "${stat:0:1}" != Z ]
}
pid_of() { [ -f "$1" ] && cat "$1" 2>/dev/null || true; }

# The slurmstepd processes of node $1: those listening on a socket under that node's spool dir.
stepd_pids_of_node() {
  local node=$1 inodes pid
  inodes=$(awk -v p="$D/spool/$node/" 'NR > 1 && index($8, p) == 1 { print $7 }' /proc/net/unix | sort -u)
  [ -n "$inodes" ] || return 0
  for pid in $(pgrep -x slurmstepd || true); do
    if ls -l "/proc/$pid/fd" 2>/dev/null | grep -oE 'socket:\[[0-9]+\]' | tr -dc '0-9\n' | grep -xF "$inodes" > /dev/null; then
      echo "$pid"
    fi
  done
}

# Every process under the given pids (their tasks and the tasks' children).
descendants() {
  local pid child
  for pid in "$@"; do
    for child in $(pgrep -P "$pid" || true); do
      echo "$child"
      descendants "$child"
    done
  done
}

# Namespace mode: a node's namespace, its host-side link and its address.
netns_of() { echo "ckpt${CKPT_CLUSTER_SUBNET:-77}-$1"; }
link_of() { echo "ckv${CKPT_CLUSTER_SUBNET:-77}${1#n}"; }
addr_of() { echo "$SUBNET.$((10 + ${1#n}))"; }

node_pids() {
  local node=$1 stepds
  if [ "$NET" = netns ]; then
    ip netns pids "$(netns_of "$node")" 2>/dev/null || true
    return 0
  fi
  stepds=$(stepd_pids_of_node "$node")
  pid_of "$D/run/slurmd-$node.pid"
  if [ -n "$stepds" ]; then
    echo "$stepds"
    # shellcheck disable=SC2086
    descendants $stepds
  fi
}

write_configs() {
  mkdir -p "$D"/{etc,state,log,run,lib,munge} "$D/ckpt"
  chmod 755 "$D" "$D/etc" "$D/lib" "$D/munge"
  chmod 1777 "$D/ckpt"  # like /tmp: every test user keeps its own checkpoint dirs here
  for n in "${NODES[@]}"; do mkdir -p "$D/spool/$n" "$D/tmp/$n"; done

  [ -f "$D/etc/munge.key" ] || { dd if=/dev/urandom of="$D/etc/munge.key" bs=1024 count=1 status=none; }
  chmod 400 "$D/etc/munge.key"
  [ -f "$D/etc/jwt.key" ] || { dd if=/dev/urandom of="$D/etc/jwt.key" bs=32 count=1 status=none; }
  chmod 600 "$D/etc/jwt.key"

  # A copy of the plugin under test, replaced atomically so running steps keep the one they mapped; or, with
  # CKPT_CLUSTER_PLUGSTACK_PLUGIN, the plugin as an installed site names it (spank_ckpt.so: Slurm's PluginDir).
  local plugstack_plugin=${CKPT_CLUSTER_PLUGSTACK_PLUGIN:-}
  if [ -z "$plugstack_plugin" ]; then
    [ -f "$PLUGIN" ] || die "plugin not built: $PLUGIN (build first, or set CKPT_SPANK_PLUGIN)"
    install -m 755 "$PLUGIN" "$D/lib/.spank_ckpt.so.new"
    mv -f "$D/lib/.spank_ckpt.so.new" "$D/lib/spank_ckpt.so"
    plugstack_plugin=$D/lib/spank_ckpt.so
  fi

  cat > "$D/etc/plugstack.conf" <<CONF
required $plugstack_plugin allowed_dirs=$D/ckpt dir=$D/ckpt/%u/%j min_interval=1s ${CKPT_CLUSTER_PLUGIN_ARGS:-}
CONF

  local host ctl_addr=127.0.0.1 node_lines
  host=$(hostname -s)
  node_lines="NodeName=n[1-4] NodeHostname=$host NodeAddr=127.0.0.1 Port=$((BASE_PORT + 1))-$((BASE_PORT + 4)) CPUs=$CPUS RealMemory=2000 State=UNKNOWN"
  if [ "$NET" = netns ]; then
    ctl_addr=$BRIDGE_ADDR
    node_lines=""
    for n in "${NODES[@]}"; do
      node_lines+="NodeName=$n NodeHostname=$n NodeAddr=$(addr_of "$n") Port=$((BASE_PORT + 1)) CPUs=$CPUS RealMemory=2000 State=UNKNOWN"$'\n'
    done
  fi
  cat > "$SLURM_CONF" <<CONF
# Generated by tests/cluster.sh; edit the script, not this file.
ClusterName=ckpttest
SlurmctldHost=$host($ctl_addr)
SlurmctldPort=$BASE_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$D/munge/munge.socket
CredType=cred/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$D/etc/jwt.key
StateSaveLocation=$D/state
# Job ids of their own per cluster (their first port's): in one-host mode two test clusters share /dev/shm, where a
# job's node tier is named by its id, and a job's prolog and epilog remove that name.
FirstJobId=$((BASE_PORT * 100))
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# proctrack/pgid, like cgroup on a real site, reaches an srun orphaned by its dying batch script: with
# linuxproc that srun outlives a requeue and, KillWait+2 s later, cancels the next run's step of the same id.
ProctrackType=${CKPT_CLUSTER_PROCTRACK:-proctrack/pgid}
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
PlugStackConfig=$D/etc/plugstack.conf
TmpFS=$D/tmp/%n
JobRequeue=1
# Short enough that failure tests finish in seconds, long enough for a loaded 2-core machine.
SlurmdTimeout=${CKPT_CLUSTER_SLURMD_TIMEOUT:-10}
KillWait=5
MessageTimeout=10
MinJobAge=600
ReturnToService=2
InactiveLimit=0
SlurmdParameters=config_overrides
$node_lines
PartitionName=debug Nodes=n[1-4] Default=YES MaxTime=INFINITE State=UP
CONF
}

ensure_test_user() {
  # One unprivileged user for the tests that check ownership and permissions.
  id "$TEST_USER" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$TEST_USER"
}

# Runs a daemon with only stdin, stdout and stderr: an inherited fd (a test's flock on the cluster, a pipe of
# ctest's) would otherwise stay open in the daemon for as long as it lives.
daemon() {
  (
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      [ "$fd" -gt 2 ] && eval "exec $fd>&-" 2>/dev/null
    done
    exec "$@"
  )
}

start_munged() {
  pid_alive "$(pid_of "$D/munge/munged.pid")" && return 0
  rm -f "$D/munge/munge.socket" "$D/munge/munge.socket.lock"
  daemon munged --force --socket="$D/munge/munge.socket" --key-file="$D/etc/munge.key" \
    --pid-file="$D/munge/munged.pid" --log-file="$D/log/munged.log" --seed-file="$D/munge/munged.seed"
  for _ in $(seq 50); do [ -S "$D/munge/munge.socket" ] && break; sleep 0.1; done
  munge -S "$D/munge/munge.socket" -n | unmunge -S "$D/munge/munge.socket" >/dev/null || die "munged does not work"
}

start_slurmctld() {
  pid_alive "$(pid_of "$D/run/slurmctld.pid")" && return 0
  daemon slurmctld -f "$SLURM_CONF" -i
}

start_slurmd() {
  local node=$1 orphans
  pid_alive "$(pid_of "$D/run/slurmd-$node.pid")" && return 0
  if [ "$NET" = netns ]; then
    # With no slurmd, whatever still runs on the node is a killed run's (tasks whose stepd died with it).
    orphans=$(node_pids "$node")
    # shellcheck disable=SC2086
    [ -n "$orphans" ] && kill -KILL $orphans 2>/dev/null || true
    # Its own host: the node's namespace, host name and hosts file (`ip netns exec` would remount /sys and hide
    # the cgroup mounts slurmd 22.05 needs; nsenter does not).
    daemon nsenter --net="/run/netns/$(netns_of "$node")" unshare --uts --mount --propagation private sh -c \
      "mount --bind '$D/etc/hosts-$node' /etc/hosts && mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm &&
       hostname $node && exec slurmd -f '$SLURM_CONF' -N $node"
    return 0
  fi
  daemon slurmd -f "$SLURM_CONF" -N "$node"
}

# Namespace mode: the bridge in this namespace and one namespace per node, with a veth link, an address, a
# default route through the bridge and a hosts file of its own. Idempotent.
make_network() {
  local n ns link
  ip link show "$BRIDGE" > /dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  ip addr replace "$BRIDGE_ADDR/24" dev "$BRIDGE"  # replace: idempotent, as every step here
  ip link set "$BRIDGE" up
  for n in "${NODES[@]}"; do
    ns=$(netns_of "$n") link=$(link_of "$n")
    [ -e "/run/netns/$ns" ] || ip netns add "$ns"
    if ! ip link show "$link" > /dev/null 2>&1; then
      ip link add "$link" type veth peer name "$link-p"
      ip link set "$link-p" netns "$ns"
      ip netns exec "$ns" ip link set "$link-p" name eth0
      ip link set "$link" master "$BRIDGE"
    fi
    ip link set "$link" up
    ip netns exec "$ns" sh -c "ip link set lo up; ip link set eth0 up
      ip addr replace $(addr_of "$n")/24 dev eth0
      ip route replace default via $BRIDGE_ADDR"
    {
      [ "$HOSTS_MODE" = debian ] && echo "127.0.1.1 $n"
      echo "127.0.0.1 localhost"
      echo "$BRIDGE_ADDR $(hostname -s)"
      for m in "${NODES[@]}"; do echo "$(addr_of "$m") $m"; done
    } > "$D/etc/hosts-$n"
  done
}

remove_network() {
  local n
  for n in "${NODES[@]}"; do
    ip netns del "$(netns_of "$n")" 2> /dev/null || true
    ip link del "$(link_of "$n")" 2> /dev/null || true
  done
  ip link del "$BRIDGE" 2> /dev/null || true
  for n in 1 2 3 4 5 6 7 8 9; do ip link del "$(side_bridge "$n")" 2> /dev/null || true; done
}

wait_for_nodes() {
  local want=${1:-4} n=0
  for _ in $(seq 120); do
    n=$(sinfo -h -N -o '%N %T' 2>/dev/null | awk '$2 ~ /^(idle|mixed|allocated)$/' | wc -l || true)
    [ "$n" -ge "$want" ] && return 0
    sleep 0.5
  done
  sinfo -N >&2 || true
  die "only $n of $want nodes are up (logs in $D/log)"
}

# A slurmctld started afresh recovers the jobs its state dir saved: a run that was killed leaves its jobs there, and
# requeued, they would start again beside the next run's tests and hold its nodes. A cluster that comes up runs
# none of them.
cancel_recovered_jobs() {
  local jobs
  jobs=$(squeue -h -o %i 2>/dev/null || true)
  [ -n "$jobs" ] || return 0
  # shellcheck disable=SC2086
  scancel $jobs 2>/dev/null || true
  for _ in $(seq 60); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.5; done
  say "cancelled $(wc -w <<< "$jobs") job(s) left from a run before: $(echo $jobs)"
}

netns_allowed() { command -v ip > /dev/null && ip netns add ckpt-probe-$$ 2> /dev/null && ip netns del ckpt-probe-$$; }

cmd_up() {
  if [ "$NET" = auto ]; then
    if netns_allowed; then NET=netns; else
      NET=host
      say "network namespaces are refused here (needs root and iproute2): the four nodes share this host and 127.0.0.1"
    fi
  elif [ "$NET" = netns ]; then
    netns_allowed || die "CKPT_CLUSTER_NET=netns: network namespaces are refused here (needs root and iproute2)"
  fi
  write_configs
  echo "$NET" > "$D/net"
  [ "$NET" = netns ] && make_network
  ensure_test_user
  start_munged
  local fresh=0
  pid_alive "$(pid_of "$D/run/slurmctld.pid")" || fresh=1
  start_slurmctld
  for n in "${NODES[@]}"; do start_slurmd "$n"; done
  for n in "${NODES[@]}"; do scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true; done
  wait_for_nodes 4
  [ $fresh -eq 1 ] && cancel_recovered_jobs
  if [ "$NET" = netns ]; then
    say "up: 4 hosts in $D, network $SUBNET.0/24 ($HOSTS_MODE hosts files; export SLURM_CONF=$SLURM_CONF)"
  else
    say "up: 4 nodes in $D (export SLURM_CONF=$SLURM_CONF)"
  fi
}

# stop_pid_files FILE...: the daemons these pid files name get SIGTERM together (each may take seconds to shut
# down), SIGKILL after 5 s; the files are removed.
stop_pid_files() {
  local file pid alive pids=()
  for file in "$@"; do
    pid=$(pid_of "$file")
    if pid_alive "$pid"; then
      kill -CONT "$pid" 2>/dev/null || true
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  for _ in $(seq 50); do
    alive=0
    for pid in "${pids[@]}"; do pid_alive "$pid" && alive=1; done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do pid_alive "$pid" && kill -KILL "$pid" 2>/dev/null || true; done
  rm -f "$@"
}

cmd_down() {
  [ -d "$D" ] || { say "down: nothing at $D"; return 0; }
  local n pids slurmds=()
  for n in "${NODES[@]}"; do
    cmd_unslow_node "$n"
    if [ "$NET" = netns ]; then
      pids=$(node_pids "$n")
    else
      pids=$(stepd_pids_of_node "$n"; descendants $(stepd_pids_of_node "$n"))
    fi
    # shellcheck disable=SC2086
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
    slurmds+=("$D/run/slurmd-$n.pid")
  done
  stop_pid_files "${slurmds[@]}"
  stop_pid_files "$D/run/slurmrestd.pid" "$D/run/slurmctld.pid"
  stop_pid_files "$D/munge/munged.pid"
  [ "$NET" = netns ] && remove_network
  rm -f "$D/net"
  say "down (logs kept in $D/log)"
}

cmd_status() {
  local rc=0 name file
  for name in munged slurmctld slurmd-n1 slurmd-n2 slurmd-n3 slurmd-n4; do
    case $name in
      munged) file=$D/munge/munged.pid ;;
      *) file=$D/run/$name.pid ;;
    esac
    if pid_alive "$(pid_of "$file")"; then echo "$name running (pid $(pid_of "$file"))"; else echo "$name stopped"; rc=1; fi
  done
  if [ $rc -eq 0 ] && [ "$NET" = netns ]; then
    for n in "${NODES[@]}"; do
      echo "$n: host $(ip netns exec "$(netns_of "$n")" ip -4 -o addr show dev eth0 | awk '{print $4}'), link $(cat "/sys/class/net/$(link_of "$n")/operstate" 2>/dev/null || echo missing)"
    done
  fi
  [ $rc -eq 0 ] && sinfo -N
  return $rc
}

# Namespace mode: a cut link. The node's processes run on and keep the shared file system; nobody reaches them
# and they reach nobody (connects and RPCs time out, nothing is refused).
# With a SIDE (a small number), the node's link moves to that side's own bridge instead: nodes cut to the same side
# reach each other and nothing else (a symmetric split: partition-node n3 1; partition-node n4 1).
side_bridge() { echo "ckbr${CKPT_CLUSTER_SUBNET:-77}s$1"; }
cmd_partition_node() {
  [ "$NET" = netns ] || die "partition-node needs CKPT_CLUSTER_NET=netns"
  local node=$1 side=${2:-} link
  link=$(link_of "$node")
  if [ -z "$side" ]; then
    ip link set "$link" down
    say "cut $node off the network ($(addr_of "$node")); its processes run on"
    return 0
  fi
  case $side in [1-9]) ;; *) die "partition-node: side '$side' is not 1-9" ;; esac
  ip link show "$(side_bridge "$side")" > /dev/null 2>&1 || ip link add "$(side_bridge "$side")" type bridge
  ip link set "$(side_bridge "$side")" up
  ip link set "$link" master "$(side_bridge "$side")"
  say "cut $node ($(addr_of "$node")) to side $side: it reaches only the nodes cut to that side"
}
cmd_heal_node() {
  [ "$NET" = netns ] || die "heal-node needs CKPT_CLUSTER_NET=netns"
  ip link set "$(link_of "$1")" master "$BRIDGE"
  ip link set "$(link_of "$1")" up
  say "healed $1's link"
}

cmd_crash_node() {
  local node=$1 pids
  pids=$(node_pids "$node" | sort -u)
  [ -n "$pids" ] || die "crash-node: nothing of $node is running"
  # A host stops whole at one instant. Signals sent one by one leave the last ones running while the first die
  # (this shell can be descheduled between two kills): stopped first, none of them acts on a peer's death.
  # shellcheck disable=SC2086
  kill -STOP $pids 2>/dev/null || true
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
  rm -f "$D/run/slurmd-$node.pid"
  say "crashed $node (pids $(echo $pids))"
}

cmd_freeze_node() {
  local node=$1 pids
  pids=$(node_pids "$node" | sort -u)
  [ -n "$pids" ] || die "freeze-node: nothing of $node is running"
  echo "$pids" > "$D/run/frozen-$node"
  # shellcheck disable=SC2086
  kill -STOP $pids 2>/dev/null || true
  say "froze $node (pids $(echo $pids))"
}

# The job tasks on a node: its processes but slurmd and slurmstepd (and, in one-host mode, those under its stepds).
task_pids_of_node() {
  local pid comm
  for pid in $(node_pids "$1" | sort -u); do
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
    case $comm in slurmd | slurmstepd) ;; *) echo "$pid" ;; esac
  done
}

cmd_hang_tasks() {
  local node=$1 pids
  pids=$(task_pids_of_node "$node")
  [ -n "$pids" ] || die "hang-tasks: no job task runs on $node"
  echo "$pids" > "$D/run/frozen-$node"
  # shellcheck disable=SC2086
  kill -STOP $pids 2>/dev/null || true
  say "hung the tasks on $node (pids $(echo $pids)); its slurmd and slurmstepd answer on"
}

cmd_task_cpu() {
  local node=$1 seconds=${2:-2} pids a b t0 t1
  pids=$(task_pids_of_node "$node")
  [ -n "$pids" ] || die "task-cpu: no job task runs on $node"
  ticks() { local t=0 pid; for pid in $pids; do t=$((t + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0))); done; echo $t; }
  a=$(ticks); t0=$(date +%s.%N); sleep "$seconds"; b=$(ticks); t1=$(date +%s.%N)
  awk -v d=$((b - a)) -v hz="$(getconf CLK_TCK)" -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.3f\n", d / hz / (t1 - t0) }'
}

cmd_kill_tasks() {
  local node=$1 pids
  pids=$(task_pids_of_node "$node")
  [ -n "$pids" ] || die "kill-tasks: no job task runs on $node"
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
  say "killed the tasks on $node (pids $(echo $pids))"
}

# The cpu controller: cgroup v1's hierarchy, or the unified one (v2) where that is all there is.
cpu_root() {
  if [ -f /sys/fs/cgroup/cpu/cgroup.procs ]; then echo /sys/fs/cgroup/cpu
  elif [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then echo /sys/fs/cgroup
  fi
}
slow_group() { echo "$(cpu_root)/ckpt-slow-$(basename "$D")-$1"; }  # one per cluster and node

cmd_slow_node() {
  local node=$1 factor=$2 root group pids pid quota
  quota=$(awk -v f="$factor" 'BEGIN { if (f !~ /^[0-9]*[.]?[0-9]+$/ || f <= 0 || f > 64) exit 1; printf "%d", f * 100000 }') ||
    die "slow-node: FACTOR '$factor': expected a fraction of one CPU above 0, like 0.5"
  root=$(cpu_root)
  [ -n "$root" ] || die "slow-node: no cgroup cpu controller under /sys/fs/cgroup"
  pids=$(task_pids_of_node "$node")
  [ -n "$pids" ] || die "slow-node: no job task runs on $node"
  group=$(slow_group "$node")
  mkdir -p "$group"
  if [ -f "$group/cpu.max" ]; then
    echo "$quota 100000" > "$group/cpu.max"
  else
    echo 100000 > "$group/cpu.cfs_period_us"
    echo "$quota" > "$group/cpu.cfs_quota_us"
  fi
  for pid in $pids; do
    # Where it was, to go back to; a task that ended meanwhile is skipped.
    [ -f "$D/run/slow-$node.from" ] || awk -F: '$2 ~ /(^|,)cpu(,|$)/ || ($1 == 0 && $2 == "") { print $3; exit }' \
      "/proc/$pid/cgroup" > "$D/run/slow-$node.from" 2>/dev/null || true
    echo "$pid" > "$group/cgroup.procs" 2>/dev/null || true
  done
  say "slowed the tasks on $node to $factor of a CPU (pids $(echo $pids))"
}

cmd_unslow_node() {
  local node=$1 group back pid
  group=$(slow_group "$node")
  [ -n "$(cpu_root)" ] && [ -d "$group" ] || return 0
  back="$(cpu_root)$(cat "$D/run/slow-$node.from" 2>/dev/null || echo /)"
  [ -f "$back/cgroup.procs" ] || back=$(cpu_root)
  for pid in $(cat "$group/cgroup.procs" 2>/dev/null); do echo "$pid" > "$back/cgroup.procs" 2>/dev/null || true; done
  rmdir "$group" 2>/dev/null || true
  rm -f "$D/run/slow-$node.from"
  say "lifted the CPU limit of the tasks on $node"
}

cmd_revive_node() {
  local node=$1
  cmd_unslow_node "$node"
  if [ -f "$D/run/frozen-$node" ]; then
    # shellcheck disable=SC2046
    kill -CONT $(cat "$D/run/frozen-$node") 2>/dev/null || true
    rm -f "$D/run/frozen-$node"
  fi
  start_slurmd "$node"
  for _ in $(seq 60); do
    scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
    sinfo -h -n "$node" -o '%T' | grep -E '^(idle|mixed|allocated)$' > /dev/null && { say "revived $node"; return 0; }
    sleep 0.5
  done
  die "revive-node: $node did not come back"
}

cmd_on() {
  local node=${1:?node}
  shift
  case $node in n[1-4]) ;; *) die "on: no node $node" ;; esac
  [ "$NET" = netns ] || exec "$@"
  exec nsenter --net="/run/netns/$(netns_of "$node")" "$@"
}

cmd_shm() {
  local node=${1:?node} pid
  case $node in n[1-4]) ;; *) die "shm: no node $node" ;; esac
  [ "$NET" = netns ] || { echo /dev/shm; return 0; }
  pid=$(pid_of "$D/run/slurmd-$node.pid")
  pid_alive "$pid" || die "shm: $node's slurmd is not running"
  echo "/proc/$pid/root/dev/shm"  # its mount namespace's view, from here
}

cmd_addr() {
  if [ "$NET" = auto ]; then  # not up yet: the mode `up` will choose
    if netns_allowed; then NET=netns; else NET=host; fi
  fi
  if [ "$NET" != netns ]; then echo 127.0.0.1
  elif [ -z "$1" ]; then echo "$BRIDGE_ADDR"
  else
    case $1 in n[1-4]) addr_of "$1" ;; *) die "addr: no node $1" ;; esac
  fi
}

case ${1:-} in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) echo "export SLURM_CONF=$SLURM_CONF" ;;
  addr) cmd_addr "${2:-}" ;;
  on) shift; cmd_on "$@" ;;
  shm) cmd_shm "${2:-}" ;;
  crash-node) cmd_crash_node "${2:?node}" ;;
  freeze-node) cmd_freeze_node "${2:?node}" ;;
  hang-tasks) cmd_hang_tasks "${2:?node}" ;;
  kill-tasks) cmd_kill_tasks "${2:?node}" ;;
  task-pids) task_pids_of_node "${2:?node}" ;;
  task-cpu) cmd_task_cpu "${2:?node}" "${3:-2}" ;;
  slow-node) cmd_slow_node "${2:?node}" "${3:?factor}" ;;
  unslow-node) cmd_unslow_node "${2:?node}" ;;
  revive-node) cmd_revive_node "${2:?node}" ;;
  partition-node) cmd_partition_node "${2:?node}" "${3:-}" ;;
  heal-node) cmd_heal_node "${2:?node}" ;;
  *) echo "usage: $0 up|down|status|env|addr [NODE]|on NODE CMD...|shm NODE|crash-node NODE|freeze-node NODE|hang-tasks NODE|kill-tasks NODE|slow-node NODE FACTOR|unslow-node NODE|task-cpu NODE [SECONDS]|revive-node NODE|partition-node NODE [SIDE]|heal-node NODE" >&2; exit 2 ;;
esac
